"""trainer/forward.py on one process (SP=1): packed vs padded forward, log-prob/entropy math, values, errors."""
import copy
import math

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig, MistralConfig,
                          Qwen2Config, Qwen3Config)

from patches.ulysses import apply_ulysses_patch
from trainer.forward import forward_log_probs, forward_values, log_probs_from_logits

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
              head_dim=8)
CONFIGS = {
    "llama": lambda: LlamaConfig(num_key_value_heads=4, **COMMON),
    "qwen2": lambda: Qwen2Config(num_key_value_heads=2, **COMMON),
    "qwen3": lambda: Qwen3Config(num_key_value_heads=1, **COMMON),
    "mistral": lambda: MistralConfig(num_key_value_heads=2, sliding_window=4, **COMMON),
}
P, R = 5, 4


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 96, (3, P + R), generator=g)
    mask = torch.zeros(3, P + R, dtype=torch.long)
    for i, (p, r) in enumerate([(5, 4), (2, 1), (3, 3)]):
        mask[i, P - p:P + r] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), mask[:, P:].bool()


def test_log_probs_from_logits_hand_computed():
    logits = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    lp, ent = log_probs_from_logits(logits, torch.tensor([0, 0]), temperature=1.0, calculate_entropy=True)
    assert lp.tolist() == pytest.approx([-math.log(2), 2 - math.log(math.e ** 2 + 1)], abs=1e-6)
    assert ent[0].item() == pytest.approx(math.log(2), abs=1e-6)
    lp2, ent2 = log_probs_from_logits(logits, torch.tensor([0, 0]), temperature=2.0, calculate_entropy=True)
    # z = [1, 0]: log p0 = 1 - ln(e + 1) = -0.313262; H = ln(e + 1) - e / (e + 1) = 0.582203
    assert lp2[1].item() == pytest.approx(-0.313262, abs=1e-6)
    assert ent2[1].item() == pytest.approx(0.582203, abs=1e-6)
    assert log_probs_from_logits(logits, torch.tensor([1, 1]))[1] is None
    with pytest.raises(ValueError, match="temperature"):
        log_probs_from_logits(logits, torch.tensor([0, 0]), temperature=0.0)


def test_chunked_log_probs_and_grads_equal_unchunked():
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 11, (7,))
    outs = []
    for chunk in (1024, 3):
        logits.grad = None
        lp, ent = log_probs_from_logits(logits, labels, 0.7, True, chunk_size=chunk)
        (lp.sum() + 0.5 * ent.sum()).backward()
        outs.append((lp.detach(), ent.detach(), logits.grad.clone()))
        assert lp.dtype == torch.float32
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.5])
@pytest.mark.parametrize("compiled", [False, True])
def test_log_probs_hand_backward_matches_autograd(entropy_coef, compiled):
    """The hand-written backward (d lp/dz = onehot - p, d H/dz = p (E[z] - z)) equals autograd through
    log_softmax, float64, for a few temperatures and chunk sizes, eager and through torch.compile."""
    from trainer.forward import use_compiled_log_probs

    torch.manual_seed(0)
    x = torch.randn(9, 13, dtype=torch.float64) * 3
    labels = torch.randint(0, 13, (9,))
    w_lp, w_ent = torch.randn(9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    use_compiled_log_probs(compiled)
    try:
        for temperature, chunk in ((1.0, 1024), (0.6, 4), (1.7, 1)):
            a = x.clone().requires_grad_(True)
            z = a / temperature
            logp = torch.log_softmax(z, -1)
            lp_ref = logp.gather(-1, labels[:, None])[:, 0]
            ent_ref = -(logp.exp() * logp).sum(-1)
            ((lp_ref * w_lp).sum() + entropy_coef * (ent_ref * w_ent).sum()).backward()
            b = x.clone().requires_grad_(True)
            lp, ent = log_probs_from_logits(b, labels, temperature, entropy_coef != 0, chunk_size=chunk)
            loss = (lp * w_lp.float()).sum()
            if entropy_coef:
                loss = loss + entropy_coef * (ent * w_ent.float()).sum()
                torch.testing.assert_close(ent.double(), ent_ref.detach(), atol=1e-5, rtol=0)
            loss.backward()
            torch.testing.assert_close(lp.double(), lp_ref.detach(), atol=1e-5, rtol=0)
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=0)
            assert b.grad.dtype == torch.float64
    finally:
        use_compiled_log_probs(False)


def test_log_probs_only_entropy_used_and_empty_input():
    torch.manual_seed(0)
    x = torch.randn(4, 5, requires_grad=True)
    lp, ent = log_probs_from_logits(x, torch.tensor([0, 1, 2, 3]), 1.0, True)
    ent.sum().backward()  # lp unused: its gradient arrives as None
    p = torch.softmax(x.detach(), -1)
    e = (p * x.detach()).sum(-1, keepdim=True)
    torch.testing.assert_close(x.grad, p * (e - x.detach()), atol=1e-6, rtol=0)
    lp0, ent0 = log_probs_from_logits(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), 1.0, True)
    assert lp0.shape == (0,) and ent0.shape == (0,)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_remove_padding_true_vs_false_agree(name):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation="sdpa", dtype=torch.float32)
    ids, mask, pos, rm = batch()
    results = []
    for rmpad, patch in ((False, False), (True, True), (False, True), (True, False)):
        m = copy.deepcopy(base)
        if patch:
            apply_ulysses_patch(m)
        lp, ent = forward_log_probs(m, ids, mask, pos, R, temperature=0.8, calculate_entropy=True,
                                    use_remove_padding=rmpad)
        ((lp * rm).sum() + (ent * rm).sum() * 0.3).backward()
        results.append((lp[rm], ent[rm], {n: p.grad for n, p in m.named_parameters()}))
    ref = results[0]
    # the padded reference equals a direct computation from the model's logits
    with torch.no_grad():
        logits = base(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, P - 1:-1] / 0.8
        direct = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None])[..., 0]
    torch.testing.assert_close(ref[0], direct[rm], atol=1e-5, rtol=0)
    for lp, ent, grads in results[1:]:
        torch.testing.assert_close(lp, ref[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ref[1], atol=1e-5, rtol=0)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref[2][n], atol=1e-5, rtol=0, msg=lambda s: f"{n}: {s}")


def test_forward_values_packed_vs_padded_and_export_roundtrip(tmp_path):
    torch.manual_seed(0)
    cfg = Qwen2Config(num_key_value_heads=2, num_labels=1, classifier_dropout=0.0, **COMMON)
    critic = AutoModelForTokenClassification.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    ids, mask, pos, rm = batch()
    ref = forward_values(critic, ids, mask, pos, R, use_remove_padding=False)
    with torch.no_grad():
        direct = critic(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, P - 1:-1, 0]
    torch.testing.assert_close(ref, direct)
    patched = apply_ulysses_patch(copy.deepcopy(critic))
    v = forward_values(patched, ids, mask, pos, R)
    assert v.shape == (3, R) and v.dtype == torch.float32
    torch.testing.assert_close(v[rm], ref[rm], atol=1e-5, rtol=0)
    patched.save_pretrained(tmp_path)  # the value head exports as a stock HF class
    again = AutoModelForTokenClassification.from_pretrained(tmp_path, attn_implementation="sdpa")
    torch.testing.assert_close(forward_values(again, ids, mask, pos, R, use_remove_padding=False), ref)


def test_forward_errors():
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation="sdpa")
    ids, mask, pos, _ = batch()
    with pytest.raises(ValueError, match="response_length"):
        forward_log_probs(m, ids, mask, pos, P + R)
    with pytest.raises(ValueError, match="position_ids must be 0"):
        forward_log_probs(m, ids, mask, torch.arange(P + R).expand(3, -1), R)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        forward_log_probs(m, ids, mask[:, 1:], pos, R)


def test_host_packed_forward_skips_transformers_packed_detection(monkeypatch):
    """With device= given, the forward is packed on the host and transformers' packed-sequence detection (a host
    sync on CUDA) is skipped; without it the detection runs as before. Both give the same log-probs."""
    import transformers.masking_utils as mu

    import patches.ulysses as ul

    torch.manual_seed(0)
    model = apply_ulysses_patch(AutoModelForCausalLM.from_config(CONFIGS["qwen2"](), dtype=torch.float32))
    seen = []
    wrapped = mu.find_packed_sequence_indices
    assert getattr(wrapped, "_ulysses_wrapped", False)
    monkeypatch.setattr(mu, "find_packed_sequence_indices",
                        lambda pos: seen.append(ul._HOST_PACKED.get()) or wrapped(pos))
    ids, mask, pos, rm = batch()
    lp_host, _ = forward_log_probs(model, ids, mask, pos, R, device="cpu")
    lp_dev, _ = forward_log_probs(model, ids, mask, pos, R)
    assert seen == [True, False]
    torch.testing.assert_close(lp_host[rm], lp_dev[rm], atol=0, rtol=0)
