"""The boundary-keyword-argument ("fast") attention path, reviewed for regressions (CPU, fp32).

The fast path: a host-packed forward (``device=`` given, CPU inputs) on a model patched with
``apply_ulysses_patch(model, 1)`` passes ``cu_seq_lens_q`` / ``max_length_q`` (max rounded up to a power of two by
``bucket_max_seqlen``) and ``ulysses_attention_forward`` calls ``varlen_attention`` directly.

The tests cover what tests/test_kernels.py does not: sliding windows, edge-case batches, gradient checkpointing,
the critic, a wrapped model, an active SP group, a long row, bounded recompiles, and a regression found in review.
"""
from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

import patches.ulysses as ulysses_mod
import patches.varlen as varlen_mod
from patches.ulysses import UlyssesGroup, apply_ulysses_patch
from patches.varlen import varlen_attention
from trainer.forward import forward_log_probs, forward_values

from tests.logprob_utils import assert_same, compiled_pair, lp_ent_grads

C = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, head_dim=16, pad_token_id=0)
FAMILIES = {  # small sliding windows so that the window actually cuts inside the test sequences
    "llama": lambda: T.LlamaConfig(**C),
    "qwen2_sliding": lambda: T.Qwen2Config(use_sliding_window=True, sliding_window=3, max_window_layers=1, **C),
    "mistral_sw3": lambda: T.MistralConfig(sliding_window=3, **C),
    "gemma3_sw3": lambda: T.Gemma3TextConfig(sliding_window=3, **C),
    "phi3_sw3": lambda: T.Phi3Config(sliding_window=3, **C),
}


def _model(cfg, auto=T.AutoModelForCausalLM, **kw):
    torch.manual_seed(0)
    return auto.from_config(cfg, dtype=torch.float32, **kw)


def _batch(rows, P=6, R=5, seed=0):
    """Left-padded prompts + right-padded responses; ``rows`` = [(prompt_len, response_len)]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 96, (len(rows), P + R), generator=g)
    mask = torch.zeros(len(rows), P + R, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        mask[i, P - p:P + r] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), R


@pytest.fixture
def fast_path_only(monkeypatch):
    """Make the general attention path fail, so a test proves the fast path was taken."""
    def fail(*a, **k):
        raise AssertionError("general attention path (_attention_eager) used")
    monkeypatch.setattr(ulysses_mod, "_attention_eager", fail)


EDGE_ROWS = [
    [(6, 5), (1, 0), (0, 0), (3, 0), (2, 5)],  # full, single token, fully padded, response all padded, short
    [(1, 0)],                                  # the whole batch is one token
    [(1, 1), (0, 0)],                          # two tokens + a fully padded row
    [(5, 1), (6, 5), (1, 2)],
]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fast_path_equals_padded_and_general_path_on_edge_batches(family):
    """Sliding windows (3) and edge-case rows: the fast path equals the unpatched padded forward (valid positions,
    gradients of a masked loss) and the patched general path (device=None) exactly."""
    base = _model(FAMILIES[family]())
    patched = apply_ulysses_patch(copy.deepcopy(base), 1)
    for k, rows in enumerate(EDGE_ROWS):
        ids, mask, pos, R = _batch(rows, seed=k)
        valid = mask[:, -R:].bool()
        want = lp_ent_grads(base, ids, mask, pos, R, use_remove_padding=False)
        general = lp_ent_grads(patched, ids, mask, pos, R)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ulysses_mod, "_attention_eager",
                       lambda *a, **kw: (_ for _ in ()).throw(AssertionError("general path used")))
            fast = lp_ent_grads(patched, ids, mask, pos, R, device="cpu")
        assert_same(fast, want, valid)
        assert_same(fast, general, valid, atol=0, grad_rtol=0)


@pytest.mark.parametrize("reentrant", [False, True])
def test_fast_path_with_gradient_checkpointing(reentrant, fast_path_only):
    """Training mode with gradient checkpointing (recomputed layers get the boundary kwargs again): same values and
    gradients as the unpatched padded model."""
    base = _model(FAMILIES["mistral_sw3"]())
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    base.train()
    patched = apply_ulysses_patch(copy.deepcopy(base), 1)
    ids, mask, pos, R = _batch(EDGE_ROWS[0])
    assert_same(lp_ent_grads(patched, ids, mask, pos, R, device="cpu"),
                 lp_ent_grads(base, ids, mask, pos, R, use_remove_padding=False), mask[:, -R:].bool())


def test_critic_token_classification_fast_path(fast_path_only):
    """The critic (AutoModelForTokenClassification, num_labels=1) through forward_values takes the fast path and
    equals the unpatched padded values and gradients."""
    base = _model(T.Qwen2Config(use_sliding_window=True, sliding_window=3, max_window_layers=1, num_labels=1,
                                classifier_dropout=0.0, **C), T.AutoModelForTokenClassification)
    patched = apply_ulysses_patch(copy.deepcopy(base), 1)
    ids, mask, pos, R = _batch(EDGE_ROWS[0])
    valid = mask[:, -R:].bool()
    out = []
    for m, kw in ((patched, dict(device="cpu")), (base, dict(use_remove_padding=False))):
        m.zero_grad()
        v = forward_values(m, ids, mask, pos, R, **kw)
        (v * valid).sum().backward()
        out.append((v.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(out[0][0][valid], out[1][0][valid], atol=1e-5, rtol=0)
    for n in out[1][1]:
        torch.testing.assert_close(out[0][1][n], out[1][1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_wrapped_model_gets_the_kwargs(fast_path_only):
    """A DeepSpeed-engine-like wrapper (``forward(*a, **k)``, attributes forwarded to ``.module``) reaches the fast
    path and gives the padded results."""
    class Engine(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.module = m

        def forward(self, *a, **k):
            return self.module(*a, **k)

        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.module, name)

    base = _model(FAMILIES["gemma3_sw3"]())
    engine = Engine(apply_ulysses_patch(copy.deepcopy(base), 1))
    ids, mask, pos, R = _batch(EDGE_ROWS[3])
    got = lp_ent_grads(engine, ids, mask, pos, R, device="cpu")
    got = (*got[:2], {n.removeprefix("module."): g for n, g in got[2].items()})
    assert_same(got, lp_ent_grads(base, ids, mask, pos, R, use_remove_padding=False), mask[:, -R:].bool())


def test_patched_with_one_inside_an_active_sp2_group_refuses():
    """A model patched for a fixed size 1, run by forward_log_probs inside an active SP group of size 2: no boundary
    kwargs are passed (sp.size == 2) and the general path refuses, before any collective (no silent fast path)."""
    patched = apply_ulysses_patch(_model(FAMILIES["llama"]()), 1)
    ids, mask, pos, R = _batch(EDGE_ROWS[3])
    with UlyssesGroup(group=object(), size=2, rank=0).activate():
        with pytest.raises(ValueError, match="patched for ulysses sp=1 but the active group has size 2"):
            forward_log_probs(patched, ids, mask, pos, R, device="cpu")


def test_bucketed_max_length_does_not_change_sdpa_results():
    """A 600-token row (max_length_q becomes 1024) plus short rows: the fast path equals the general path (exact
    maximum 600) bit for bit; and varlen_attention with max_seqlen 600 or 1024 is identical for the SDPA kernel."""
    q, k, v = (torch.randn(603, h, 16, generator=torch.Generator().manual_seed(h)) for h in (4, 2, 2))
    cu = torch.tensor([0, 600, 603], dtype=torch.int32)
    for window in (None, 37):
        assert torch.equal(varlen_attention(q, k, v, cu, 600, kernel="sdpa", sliding_window=window),
                           varlen_attention(q, k, v, cu, 1024, kernel="sdpa", sliding_window=window))
    patched = apply_ulysses_patch(_model(T.LlamaConfig(**{**C, "num_hidden_layers": 1})), 1)
    ids, mask, pos, R = _batch([(300, 300), (2, 3), (1, 0)], P=300, R=300)
    valid = mask[:, -R:].bool()
    with torch.no_grad():
        general = forward_log_probs(patched, ids, mask, pos, R, calculate_entropy=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ulysses_mod, "_attention_eager",
                       lambda *a, **kw: (_ for _ in ()).throw(AssertionError("general path used")))
            fast = forward_log_probs(patched, ids, mask, pos, R, calculate_entropy=True, device="cpu")
    for a, b in zip(fast, general):
        torch.testing.assert_close(a[valid], b[valid], atol=0, rtol=0)


def test_compiled_layers_recompiles_stay_bounded(monkeypatch):
    """torch.compile of the decoder layers (apply_kernel_options; backend forced to "eager": guards and graph
    breaks are the backend's business only downstream of dynamo) over many batch shapes: no graph break, at most 3
    graphs (the general shape, a 1-token row, a single sequence), values equal the uncompiled model."""
    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, backend="eager", **kw))
    with compiled_pair(apply_ulysses_patch(_model(FAMILIES["mistral_sw3"]()), 1)) as (eager, compiled, counters):
        shapes = [[(6, 5), (1, 0), (0, 0)], [(1, 0)], [(1, 1)], [(6, 5)] * 4, [(3, 2), (6, 5), (1, 1), (2, 0), (6, 5)],
                  [(0, 0), (2, 2)], [(6, 4), (6, 5)]]
        for k, rows in enumerate(shapes):
            ids, mask, pos, R = _batch(rows, seed=k)
            assert_same(lp_ent_grads(compiled, ids, mask, pos, R, device="cpu"),
                         lp_ent_grads(eager, ids, mask, pos, R, device="cpu"), mask[:, -R:].bool())
        assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])


# ---------------------------------------------------------------------------------------------- regressions
def _fake_torch_varlen_without_window_size(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, scale=None):
    """A torch build's ``varlen_attn`` with ``is_causal`` and no ``window_size`` (what patches.varlen supports)."""
    return varlen_attention(q, k, v, cu_q, max_q, scale=scale, causal=is_causal, kernel="sdpa")


def test_bucketed_max_length_keeps_a_sliding_window_that_fits_on_torch_varlen_without_window_size(monkeypatch):
    """Found by review: with a torch build whose ``varlen_attn`` has no ``window_size`` (``is_causal`` only),
    ``varlen_attention`` refuses a window shorter than ``max_seqlen``. The boundary-kwargs path rounds the maximum up
    to a power of two, so a window that is not one (Phi-3-mini: 2047) was refused for sequences that all fit in it
    (1025..2047 tokens -> 2048). ``bucket_max_seqlen(n, cap=window)`` now keeps the bound at the window when the
    sequences fit. Scaled down: window 23, longest sequence 20 (bucket 32)."""
    monkeypatch.setitem(varlen_mod._RESOLVED, "torch_varlen", (
        _fake_torch_varlen_without_window_size,
        ("query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal", "scale")))
    real_pick = varlen_mod.pick_kernel
    monkeypatch.setattr(varlen_mod, "pick_kernel",
                        lambda q, kernel="auto": "torch_varlen" if kernel == "auto" else real_pick(q, kernel))
    base = _model(T.Phi3Config(sliding_window=23, **C))
    patched = apply_ulysses_patch(copy.deepcopy(base), 1)
    ids, mask, pos, R = _batch([(10, 10), (3, 2)], P=10, R=10)  # longest sequence 20 <= window 23
    valid = mask[:, -R:].bool()
    want = lp_ent_grads(base, ids, mask, pos, R, use_remove_padding=False)
    general = lp_ent_grads(patched, ids, mask, pos, R)  # old behaviour: exact max 20, runs
    assert_same(general, want, valid)
    fast = lp_ent_grads(patched, ids, mask, pos, R, device="cpu")  # raised "sliding window unsupported" before
    assert_same(fast, want, valid)
