"""The graph decode loop (``rollout.decode_loop=graph``) on a GPU, compiled with ``mode="reduce-overhead"`` (one CUDA
graph per step): the same greedy tokens as ``generate``, log-probs of the full forward, fresh Gumbel noise at every
replay (samples of softmax(logits / T) inside the graph, seeded calls repeatable), no compile and no CUDA-graph
recording at a repeated call: ``python -m pytest -m gpu tests/test_graph_decode_gpu.py`` (3 passed on an H100,
docs/benchmarks.md)."""
import pytest
import torch
import torch.nn.functional as F

from rollout.base import SamplingConfig
from rollout.compile_stats import compile_counts
from rollout.hf_engine import HFRolloutEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PROMPTS = [[0, 5, 9, 12, 3], [0, 7], [0, 20, 21, 22, 23, 24, 25], [0, 30, 31]]


def _actor(vocab: int = 512):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32, eos_token_id=1, bos_token_id=0,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).cuda().eval()


def _engine(actor, loop: str, **kw) -> HFRolloutEngine:
    engine = HFRolloutEngine(actor.config, device="cuda", dtype=torch.float32, use_static_cache=True,
                             prompt_len_multiple=16, cache_len_multiple=64, decode_loop=loop, **kw)
    engine.load_weights(actor.state_dict().items())
    return engine


@pytest.fixture(scope="module")
def actor():
    torch._dynamo.reset()
    yield _actor()
    torch._dynamo.reset()


def test_greedy_tokens_equal_generate_and_a_repeated_call_records_nothing(actor):
    sampling = SamplingConfig(n=2, do_sample=False, max_new_tokens=24)
    a = _engine(actor, "generate").generate(PROMPTS, sampling)
    graph = _engine(actor, "graph")
    b = graph.generate(PROMPTS, sampling)
    assert torch.equal(a.responses, b.responses) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=1e-4, rtol=0)
    before = compile_counts()
    c = graph.generate(PROMPTS[1:] + PROMPTS[:1], sampling)  # other prompt lengths, same buckets
    after = compile_counts()
    assert after == before, (before, after)
    assert torch.equal(c.responses[:6], b.responses[2:])


def test_sampled_log_probs_are_the_full_forwards_and_seeds_repeat(actor):
    graph = _engine(actor, "graph")
    T = 0.7
    sampling = SamplingConfig(n=4, temperature=T, top_k=50, top_p=0.95, max_new_tokens=24, seed=3)
    out = graph.generate(PROMPTS, sampling)
    assert torch.equal(out.responses, graph.generate(PROMPTS, sampling).responses)
    other = graph.generate(PROMPTS, SamplingConfig(n=4, temperature=T, top_k=50, top_p=0.95, max_new_tokens=24,
                                                   seed=4))
    assert not torch.equal(out.responses, other.responses)
    for row in range(out.responses.shape[0]):
        n = int(out.response_mask[row].sum())
        resp = out.responses[row, :n].tolist()
        ids = torch.tensor([PROMPTS[row // 4] + resp], device="cuda")
        with torch.no_grad():
            logits = actor(input_ids=ids).logits[0, len(PROMPTS[row // 4]) - 1:-1].float() / T
        ref = F.log_softmax(logits, -1).gather(-1, torch.tensor(resp, device="cuda")[:, None]).squeeze(-1)
        torch.testing.assert_close(out.rollout_log_probs[row, :n], ref.cpu(), atol=1e-4, rtol=0)


def test_each_replay_samples_softmax_with_fresh_noise():
    """A model whose logits are all 0 (lm_head zeroed): every token has probability 1/8 at every step. Columns 1 and
    2 are sampled inside the CUDA graph: their frequencies over 4,096 rows are 1/8 each, and a row repeats its token
    from one column to the next in about 1/8 of the rows (all of them if the graph replayed the same noise)."""
    actor = _actor(vocab=8)
    with torch.no_grad():
        actor.lm_head.weight.zero_()
    graph = _engine(actor, "graph", eos_token_id=[99], pad_token_id=0, max_batch_size=4096)
    out = graph.generate([[0, 3, 5]], SamplingConfig(n=4096, temperature=0.7, max_new_tokens=3, seed=0))
    for col in (1, 2):
        got = torch.bincount(out.responses[:, col], minlength=8).float() / 4096
        assert torch.all((got - 1 / 8).abs() <= 4.5 * (7 / 64 / 4096) ** 0.5 + 2e-3), got
    same = float((out.responses[:, 1] == out.responses[:, 2]).float().mean())
    assert abs(same - 1 / 8) < 0.03, same
    torch.testing.assert_close(out.rollout_log_probs, torch.full((4096, 3), -torch.log(torch.tensor(8.0)).item()))


def test_layer_regions_give_the_same_greedy_tokens_and_record_once(actor):
    """``compile_regions=True`` (one compiled decoder layer for all, rollout/compile_regions.py) under
    ``reduce-overhead``: the greedy tokens and log-probs of ``generate``; a repeated call compiles and records
    nothing."""
    sampling = SamplingConfig(n=2, do_sample=False, max_new_tokens=24)
    a = _engine(actor, "generate").generate(PROMPTS, sampling)
    graph = _engine(actor, "graph", compile_regions=True)
    b = graph.generate(PROMPTS, sampling)
    assert torch.equal(a.responses, b.responses) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=1e-4, rtol=0)
    before = compile_counts()
    graph.generate(PROMPTS[1:] + PROMPTS[:1], sampling)
    assert compile_counts() == before


@pytest.mark.parametrize("loop,regions", [("generate", False), ("graph", False), ("graph", True)])
def test_new_weights_after_each_sleep_level_are_the_ones_decoded(actor, loop, regions):
    """Sleep (level 1: weights to the CPU; level 2: discarded), wake, load other weights: the compiled step and its
    CUDA graphs decode with the loaded weights (an engine built on them gives the same greedy tokens), whichever
    storage the parameters got back."""
    sampling = SamplingConfig(n=2, do_sample=False, max_new_tokens=16)
    other = {k: v * 0.5 if v.dim() == 2 else v for k, v in actor.state_dict().items()}
    kw = dict(compile_regions=True) if regions else {}
    fresh = _engine(actor, loop, **kw)
    fresh.load_weights(other.items())
    want = fresh.generate(PROMPTS, sampling)
    eng = _engine(actor, loop, **kw)
    before = eng.generate(PROMPTS, sampling)
    for level in (1, 2, 2):
        eng.sleep(level=level)
        eng.wake_up(["weights", "kv_cache"])
        eng.load_weights(other.items())
        got = eng.generate(PROMPTS, sampling)
        assert torch.equal(got.responses, want.responses), level
        torch.testing.assert_close(got.rollout_log_probs, want.rollout_log_probs, atol=1e-4, rtol=0)
    assert not torch.equal(before.responses, want.responses)  # the weights did change what is decoded
