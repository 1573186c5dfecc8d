"""The transformers rollout engine on a tiny Llama (2 layers, hidden 64) with a tokenizer built by `tokenizers`."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rollout.base import SamplingConfig, finalize_responses
from rollout.hf_engine import HFRolloutEngine, SampledTokenLogProbs, sdpa_gqa_attention_forward

WORDS = ["<s>", "</s>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "big", "red", "hat", "sun", "up"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="the"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")  # no pad token


@pytest.fixture(scope="module")
def setup():
    from transformers import LlamaConfig, LlamaForCausalLM

    tk = _tokenizer()
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    actor = LlamaForCausalLM(cfg).eval()
    engine = HFRolloutEngine.from_tokenizer(cfg, tk, device="cpu")
    engine.load_weights(actor.state_dict().items())
    prompts = [tk("<s> the cat sat on")["input_ids"], tk("<s> a dog")["input_ids"]]
    return tk, actor, engine, prompts


def _ref_log_probs(actor, prompt, resp, temperature):
    ids = torch.tensor([prompt + resp])
    with torch.no_grad():
        logits = actor(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return F.log_softmax(logits, -1).gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)


def test_pad_falls_back_to_eos_and_weights_loaded(setup):
    tk, actor, engine, prompts = setup
    assert tk.pad_token_id is None and engine.pad_id == 1 == tk.eos_token_id
    assert prompts == [[0, 2, 3, 4, 5], [0, 7, 8]]
    # tied embeddings: one tensor behind both names, equal to the actor's
    emb = engine.model.get_input_embeddings().weight
    assert engine.model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    assert torch.equal(emb, actor.get_input_embeddings().weight)


def test_log_probs_match_trainer_recompute(setup):
    tk, actor, engine, prompts = setup
    T = 0.7
    out = engine.generate(prompts, SamplingConfig(n=3, temperature=T, top_k=8, top_p=0.95, max_new_tokens=6, seed=1))
    assert out.responses.shape == (6, 6) and out.rollout_log_probs.dtype == torch.float32
    for row in range(6):
        n_valid = int(out.response_mask[row].sum())
        resp = out.responses[row, :n_valid].tolist()
        ref = _ref_log_probs(actor, prompts[row // 3], resp, T)
        torch.testing.assert_close(out.rollout_log_probs[row, :n_valid], ref, atol=1e-4, rtol=0)
        assert torch.all(out.rollout_log_probs[row, n_valid:] == 0)


def test_sampled_token_log_probs_hand_example():
    """Step t's log-prob is gathered when the id sampled at t arrives (call t+1) or at finish; one step is held."""
    logits = [torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0], [0.0, 2.0, 0.0]])]
    picked = torch.tensor([[2, 0], [0, 1]])  # (rows, steps)
    rec = SampledTokenLogProbs(0.5, rows=2, max_new_tokens=4, device="cpu")
    ids = torch.tensor([[7], [7]])
    for t, lg in enumerate(logits):
        assert rec(ids, lg) is lg  # scores pass through unchanged
        ids = torch.cat([ids, picked[:, t:t + 1]], 1)
    got = rec.finish(picked)
    want = torch.stack([F.log_softmax(lg / 0.5, -1).gather(-1, picked[:, t:t + 1]).squeeze(-1)
                        for t, lg in enumerate(logits)], 1)
    torch.testing.assert_close(got, want)
    assert got.shape == (2, 2) and rec._last is None
    bad = SampledTokenLogProbs(1.0, rows=2, max_new_tokens=4, device="cpu")
    bad(torch.tensor([[7], [7]]), logits[0])
    with pytest.raises(RuntimeError, match="2 new tokens but the log-prob recorder saw 1 steps"):
        bad.finish(picked)


def test_rows_per_generate_call_bounded_by_max_batch_size_only(setup, monkeypatch):
    """No per-step logits are kept (output_logits off), so long responses do not shrink the rows per call."""
    tk, actor, _, prompts = setup
    engine = HFRolloutEngine.from_tokenizer(actor.config, tk, device="cpu", max_batch_size=4)
    engine.load_weights(actor.state_dict().items())
    calls = []
    real = engine.model.generate

    def spy(**kw):
        calls.append((kw["input_ids"].shape[0], kw["generation_config"].output_logits))
        return real(**kw)

    monkeypatch.setattr(engine.model, "generate", spy)
    out = engine.generate(prompts, SamplingConfig(n=5, temperature=1.0, max_new_tokens=64, seed=0))
    assert out.responses.shape == (10, 64)
    assert calls == [(4, False), (4, False), (2, False)]


def test_sdpa_gqa_matches_transformers_sdpa():
    """Same output as transformers' sdpa (which repeats K/V) for padding masks, causal prefill and decoding."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    for q_len, k_len, masked in ((1, 7, True), (5, 5, True), (5, 5, False), (4, 9, False), (1, 7, False)):
        q = torch.randn(2, 6, q_len, 8)
        k, v = torch.randn(2, 2, k_len, 8), torch.randn(2, 2, k_len, 8)
        mask = None
        if masked:  # left padding of row 0, causal within the keys
            mask = torch.ones(2, 1, q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
            mask[0, :, :, :2] = False
        got, _ = sdpa_gqa_attention_forward(module, q, k, v, mask, scaling=0.3)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
        assert got.shape == (2, q_len, 6, 8)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_engine_with_sdpa_gqa_gives_the_same_rollout(setup, monkeypatch):
    """rollout.attn_implementation=sdpa_gqa: same greedy tokens and log-probs for left-padded GQA prompts, through
    the registered function (2 query heads per KV head in the tiny Llama)."""
    import rollout.hf_engine as he

    tk, actor, engine, prompts = setup
    gqa = HFRolloutEngine.from_tokenizer(actor.config, tk, device="cpu", attn_implementation="sdpa_gqa")
    gqa.load_weights(actor.state_dict().items())
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(kw.get("enable_gqa"))
        return real(*a, **kw)

    monkeypatch.setattr(he.F, "scaled_dot_product_attention", spy)
    for sampling in (SamplingConfig(n=2, do_sample=False, max_new_tokens=6),
                     SamplingConfig(n=3, temperature=0.7, max_new_tokens=6, seed=3)):
        a, b = engine.generate(prompts, sampling), gqa.generate(prompts, sampling)
        assert torch.equal(a.responses, b.responses) and torch.equal(a.response_mask, b.response_mask)
        torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=1e-5, rtol=0)
    assert seen.count(True) == len(seen) // 2 and seen.count(True) > 0  # the gqa engine's calls, not the other's
    assert actor.config._attn_implementation != "sdpa_gqa"  # the caller's config is not changed


def test_attn_implementation_auto_is_sdpa_gqa_on_cuda_only(setup, monkeypatch):
    """The default ("auto"): sdpa_gqa on CUDA (3x the tokens/s of sdpa on an H200), plain sdpa on CPU. The CUDA
    branch is checked without a GPU by recording what the engine asks transformers for."""
    from transformers import AutoModelForCausalLM

    tk, actor, engine, _ = setup
    assert engine.attn_implementation == "sdpa"  # the fixture's CPU engine, built with the default
    asked = []

    def fake_from_config(config, **kw):
        asked.append(kw["attn_implementation"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", fake_from_config)
    with pytest.raises(RuntimeError, match="stop here"):
        HFRolloutEngine.from_tokenizer(actor.config, tk, device="cuda")
    assert asked == ["sdpa_gqa"]


def test_same_seed_same_samples(setup):
    _, _, engine, prompts = setup
    s = dict(n=4, temperature=1.0, max_new_tokens=8)
    a = engine.generate(prompts, SamplingConfig(seed=123, **s))
    b = engine.generate(prompts, SamplingConfig(seed=123, **s))
    c = engine.generate(prompts, SamplingConfig(seed=124, **s))
    assert torch.equal(a.responses, b.responses) and torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    assert not torch.equal(a.responses, c.responses)


def test_n_contiguous_and_left_padding(setup):
    _, _, engine, prompts = setup
    g = SamplingConfig(n=3, do_sample=False, max_new_tokens=5)
    both = engine.generate(prompts, g)
    alone0 = engine.generate(prompts[:1], SamplingConfig(n=1, do_sample=False, max_new_tokens=5))
    alone1 = engine.generate(prompts[1:], SamplingConfig(n=1, do_sample=False, max_new_tokens=5))
    # rows 0-2 are prompt 0, rows 3-5 prompt 1; the short prompt (left-padded in the batch) matches its solo run
    for r in range(3):
        assert torch.equal(both.responses[r], alone0.responses[0])
        assert torch.equal(both.responses[3 + r], alone1.responses[0])
    # sampled: each group of n shares its prompt; seeded sampling of [p0, p1] vs rows grouped the same way
    s = engine.generate(prompts, SamplingConfig(n=2, temperature=1.0, max_new_tokens=4, seed=5))
    assert s.responses.shape == (4, 4)


def test_stop_tokens_and_response_mask(setup):
    _, _, engine, prompts = setup
    greedy = engine.generate(prompts[:1], SamplingConfig(do_sample=False, max_new_tokens=6))
    toks = greedy.responses[0].tolist()
    assert greedy.response_mask[0].tolist() == [1] * (toks.index(1) + 1 if 1 in toks else 6) + \
        [0] * (6 - (toks.index(1) + 1 if 1 in toks else 6))
    stop = toks[2]  # the third greedy token becomes a stop token
    cut = toks.index(stop)
    out = engine.generate(prompts[:1], SamplingConfig(do_sample=False, max_new_tokens=6, stop_token_ids=[stop]))
    assert out.responses[0, :cut + 1].tolist() == toks[:cut + 1]
    assert out.response_mask[0].tolist() == [1] * (cut + 1) + [0] * (5 - cut)
    assert out.responses[0, cut + 1:].tolist() == [engine.pad_id] * (5 - cut)


def test_finalize_responses_hand_example():
    out = finalize_responses(torch.tensor([[5, 7, 2, 9], [3, 4, 6, 8]]), torch.full((2, 4), -1.0), [2], 0, 6)
    assert out.responses.tolist() == [[5, 7, 2, 0, 0, 0], [3, 4, 6, 8, 0, 0]]
    assert out.response_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert out.rollout_log_probs.tolist() == [[-1, -1, -1, 0, 0, 0], [-1, -1, -1, -1, 0, 0]]


def test_bad_inputs(setup):
    _, _, engine, prompts = setup
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="n must be"):
        SamplingConfig(n=0)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        engine.generate([[1], []], SamplingConfig())
    with pytest.raises(KeyError, match="nope"):
        engine.load_weights([("nope", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("lm_head.weight", torch.zeros(3, 3))])
    engine.sleep(1)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, SamplingConfig())
    engine.wake_up()


class _HostEvent:
    """torch.Event stand-in for the CPU (which has no events; its work is done when queued)."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass


@pytest.mark.parametrize("stop_all", [True, False])
def test_the_stop_flag_read_one_step_late_gives_the_same_rollout(setup, monkeypatch, stop_all):
    """deferred_stop_check: transformers' DeferredStopCheck (enabled here for the CPU) runs one extra decode step when
    every row stops early and undoes it; tokens and recorded log-probs equal the per-token check's."""
    import functools

    import rollout.hf_engine as hf
    from rollout.stop_check import deferred_stop_check
    from transformers.generation import utils as gen_utils

    tk, actor, engine, prompts = setup
    stops = list(range(2, len(WORDS))) if stop_all else []  # every row ends at its first token, or none stops early
    sampling = SamplingConfig(n=2, temperature=0.9, max_new_tokens=6, seed=5, stop_token_ids=stops)
    engine.defer_stop_check = False
    plain = engine.generate(prompts, sampling)
    undone = []
    finish = gen_utils.DeferredStopCheck.finish
    monkeypatch.setattr(gen_utils.DeferredStopCheck, "finish", lambda self: undone.append(finish(self)) or undone[-1])
    monkeypatch.setattr(torch, "Event", _HostEvent)
    monkeypatch.setattr(hf, "deferred_stop_check", functools.partial(deferred_stop_check, device_types=("cpu",)))
    engine.defer_stop_check = True
    try:
        late = engine.generate(prompts, sampling)
    finally:
        engine.defer_stop_check = True
    assert undone == [1 if stop_all else 0]  # the deferred check ran, and undid its extra step when rows stopped early
    assert torch.equal(late.responses, plain.responses) and torch.equal(late.response_mask, plain.response_mask)
    assert torch.allclose(late.rollout_log_probs, plain.rollout_log_probs, atol=1e-6)
    if stop_all:
        assert int(plain.response_mask.sum(1).max()) == 1


def test_the_deferred_check_is_only_patched_inside_the_block():
    from rollout.stop_check import deferred_stop_check
    from transformers.generation.utils import DeferredStopCheck

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert not DeferredStopCheck.is_supported(cuda, None, False, False)
    with deferred_stop_check() as on:
        assert on
        assert DeferredStopCheck.is_supported(cuda, None, False, False)
        assert not DeferredStopCheck.is_supported(cuda, None, False, True)  # assisted generation: never
        assert not DeferredStopCheck.is_supported(cpu, None, False, False)
    assert not DeferredStopCheck.is_supported(cuda, None, False, False)
