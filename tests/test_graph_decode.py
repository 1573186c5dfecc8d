"""The transformers engine's graph decode loop (rollout/graph_decode.py, ``rollout.decode_loop=graph``) on CPU, with
tiny random Llama and Qwen2 models in fp32: the same tokens as ``generate``, log-probs of the full forward, samples of
softmax(logits / T), padding after a stop, one traced graph without recompiles, and the config key."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rollout.base import SamplingConfig, finalize_responses
from rollout.graph_decode import GraphDecoder, SamplingSpec, pick_tokens, top_k_filter, top_p_filter
from rollout.hf_engine import HFRolloutEngine

V = 64
PROMPTS = [[0, 5, 9, 12, 3], [0, 7], [0, 20, 21, 22, 23, 24, 25], [0, 30, 31]]


def _config(kind: str, layers: int = 2):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, bos_token_id=0, eos_token_id=1, max_position_embeddings=256)
    return LlamaConfig(tie_word_embeddings=True, **common) if kind == "llama" else Qwen2Config(**common)


def _actor(kind: str, layers: int = 2):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_config(kind, layers), attn_implementation="sdpa").eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def actor(request):
    return _actor(request.param)


def _engine(actor, **kw) -> HFRolloutEngine:
    engine = HFRolloutEngine(actor.config, device="cpu", **kw)
    engine.load_weights(actor.state_dict().items())
    return engine


def _left_pad(prompts, pad: int):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    return ids, mask


def _ref_log_probs(actor, prompt, resp, temperature):
    """log_softmax(logits / T) at the response tokens from one plain forward of prompt + response (no padding)."""
    with torch.no_grad():
        logits = actor(input_ids=torch.tensor([prompt + resp])).logits[0, len(prompt) - 1:-1].float() / temperature
    return F.log_softmax(logits, -1).gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)


def test_greedy_tokens_equal_generate_and_model_generate(actor):
    """Left-padded prompts of 2-7 tokens, two EOS ids plus a per-call stop id, rows that end at different steps and
    rows that reach max_new_tokens: the graph loop's tokens equal the generate path's and model.generate's."""
    R = 10
    free = _engine(actor, eos_token_id=[V + 1], pad_token_id=0, decode_loop="graph").generate(  # EOS: never written
        PROMPTS, SamplingConfig(do_sample=False, max_new_tokens=R)).responses
    stops = [int(free[0, 2]), int(free[2, 5]), int(free[1, 7])]  # tokens the model writes, so rows end early
    gen = _engine(actor, eos_token_id=stops[:2])
    graph = _engine(actor, eos_token_id=stops[:2], decode_loop="graph")
    sampling = SamplingConfig(n=2, do_sample=False, max_new_tokens=R, stop_token_ids=stops[2:])
    a, b = gen.generate(PROMPTS, sampling), graph.generate(PROMPTS, sampling)
    assert torch.equal(a.responses, b.responses) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=1e-5, rtol=0)
    lengths = b.response_mask.sum(1)
    assert lengths.min() < R and lengths.max() == R and len(set(lengths.tolist())) > 1

    from transformers import GenerationConfig

    ids, mask = _left_pad(PROMPTS, stops[0])
    cfg = GenerationConfig(do_sample=False, max_new_tokens=R, eos_token_id=stops, pad_token_id=stops[0])
    seq = actor.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)[:, ids.shape[1]:]
    ref = finalize_responses(seq, torch.zeros(seq.shape), stops, stops[0], R)
    assert torch.equal(b.responses[::2], ref.responses) and torch.equal(b.responses[1::2], ref.responses)
    assert torch.all(b.responses[b.response_mask == 0] == graph.pad_id)
    assert torch.all(b.rollout_log_probs[b.response_mask == 0] == 0)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(n=3, temperature=0.7, max_new_tokens=8, seed=1),
    SamplingConfig(n=3, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=8, seed=2),
    SamplingConfig(n=1, do_sample=False, max_new_tokens=8)], ids=["T0.7", "T0.7-topk-topp", "greedy"])
def test_log_probs_are_log_softmax_of_the_full_forward(actor, sampling):
    """Each log-prob is log_softmax(logits / T) of the raw logits at the token (T = 1 when greedy), recomputed from
    a plain forward of prompt + response; 0 after the row's end."""
    engine = _engine(actor, decode_loop="graph")
    out = engine.generate(PROMPTS, sampling)
    T = 1.0 if sampling.greedy else sampling.temperature
    for row in range(out.responses.shape[0]):
        n = int(out.response_mask[row].sum())
        resp = out.responses[row, :n].tolist()
        ref = _ref_log_probs(actor, PROMPTS[row // sampling.n], resp, T)
        torch.testing.assert_close(out.rollout_log_probs[row, :n], ref, atol=1e-5, rtol=0)
        assert torch.all(out.rollout_log_probs[row, n:] == 0)


def test_ignore_eos_and_seeds(actor):
    """ignore_eos: the stop ids are never written (every row runs R tokens) and the log-probs are those of the logits
    without them, as generate's min_new_tokens gives; the same seed gives the same samples, another seed others."""
    R = 8
    free = _engine(actor, decode_loop="graph").generate(PROMPTS, SamplingConfig(do_sample=False, max_new_tokens=R))
    stops = sorted({int(t) for t in free.responses[:, 1]})
    sampling = SamplingConfig(do_sample=False, max_new_tokens=R, ignore_eos=True)
    a = _engine(actor, eos_token_id=stops).generate(PROMPTS, sampling)
    graph = _engine(actor, eos_token_id=stops, decode_loop="graph")
    b = graph.generate(PROMPTS, sampling)
    assert torch.equal(a.responses, b.responses) and int(b.response_mask.sum()) == len(PROMPTS) * R
    assert not torch.isin(b.responses, torch.tensor(stops)).any()
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=1e-5, rtol=0)
    seeded = dict(n=3, temperature=1.0, max_new_tokens=R)
    x, y = (graph.generate(PROMPTS, SamplingConfig(seed=7, **seeded)) for _ in range(2))
    z = graph.generate(PROMPTS, SamplingConfig(seed=8, **seeded))
    assert torch.equal(x.responses, y.responses) and not torch.equal(x.responses, z.responses)


def _buffers(rows: int, vocab: int, temperature: float):
    return dict(step=torch.zeros((), dtype=torch.long), tokens=torch.zeros((rows, 1), dtype=torch.long),
                log_probs=torch.zeros((rows, 1)), finished=torch.zeros(rows, dtype=torch.bool),
                all_done=torch.zeros((), dtype=torch.bool), is_stop=torch.zeros(vocab, dtype=torch.bool),
                temperature=torch.tensor(temperature))


def test_sampling_is_a_sample_of_the_softmax_and_of_the_warpers():
    """4,096 rows of one step on 8 tokens: the frequencies match softmax(logits / T), after transformers' top-k /
    top-p warpers when set (within 4.5 standard errors); the log-prob is of the untruncated softmax(logits / T)."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    rows, T = 4096, 0.7
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    for top_k, top_p in ((0, 1.0), (3, 1.0), (0, 0.8), (5, 0.9)):
        scores = (logits / T)[None]
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        want = scores.softmax(-1)[0]
        buf = _buffers(rows, 8, T)
        pick_tokens(logits.expand(rows, 8), spec=SamplingSpec(False, top_k, top_p, False, 0), **buf)
        got = torch.bincount(buf["tokens"][:, 0], minlength=8).float() / rows
        tol = 4.5 * (want * (1 - want) / rows).sqrt() + 1e-3
        assert torch.all((got - want).abs() <= tol), (top_k, top_p, got, want)
        lp = F.log_softmax(logits / T, -1)[buf["tokens"][:, 0]]
        torch.testing.assert_close(buf["log_probs"][:, 0], lp)
    buf = _buffers(4, 8, 1.0)
    pick_tokens(logits.expand(4, 8), spec=SamplingSpec(True, 0, 1.0, False, 0), **buf)
    assert buf["tokens"][:, 0].tolist() == [0] * 4 and int(buf["step"]) == 1


def test_top_k_and_top_p_filters_are_transformers_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(1)
    scores = torch.randn(6, 50)
    for k in (1, 5, 50, 80):
        assert torch.equal(top_k_filter(scores, k), TopKLogitsWarper(k)(None, scores))
    for p in (0.1, 0.5, 0.95):
        assert torch.equal(top_p_filter(scores, p), TopPLogitsWarper(p)(None, scores))


def test_after_a_stop_rows_write_pad_and_the_loop_ends_early(actor):
    """Every row writes a stop id by its 2nd token: from then on pad and log-prob 0 (before finalize_responses), and
    the host, reading the flag every 2 steps one step late, stops after 3 of 12 columns."""
    decoder = GraphDecoder(actor, stop_check_every=2)
    ids, mask = _left_pad(PROMPTS, 1)
    free, _, steps = decoder.decode(ids, mask, 64, 12, [], pad_id=1, temperature=1.0, greedy=True)
    assert steps == 12
    stops = sorted({int(t) for t in free[:, 1]})
    tokens, log_probs, steps = decoder.decode(ids, mask, 64, 12, stops, pad_id=V - 1, temperature=1.0, greedy=True)
    assert steps == 3
    for r in range(len(PROMPTS)):
        end = next(i for i, t in enumerate(tokens[r].tolist()) if t in stops)
        assert end <= 1 and torch.equal(tokens[r, :end + 1], free[r, :end + 1])
        assert tokens[r, end + 1:].tolist() == [V - 1] * (11 - end) and torch.all(log_probs[r, end + 1:] == 0)
        assert torch.all(log_probs[r, :end + 1] < 0)


def test_the_step_traces_as_one_graph_and_a_prompt_length_in_the_same_bucket_does_not_recompile():
    """The decode step under torch.compile(fullgraph=True, dynamic=False) (dynamo with the CPU backend eager; the
    engine uses mode="reduce-overhead" on CUDA): one graph at the first call, none at a call with another prompt
    length in the same bucket, no graph break; the tokens equal the eager loop's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    actor = _actor("llama", layers=1)
    engine = _engine(actor, decode_loop="graph", use_static_cache=True, prompt_len_multiple=8, max_batch_size=4)
    compiled = GraphDecoder(engine.model, dict(backend="eager", fullgraph=True, dynamic=False))
    eager = GraphDecoder(engine.model)
    sampling = SamplingConfig(n=2, do_sample=False, max_new_tokens=6)
    graphs, breaks = [], sum(counters["graph_break"].values())
    for prompts in (PROMPTS[:2], PROMPTS[1:3]):  # widths 5 and 7: bucket 8; 4 rows
        engine._graph = compiled
        out = engine.generate(prompts, sampling)
        graphs.append(int(counters["stats"]["unique_graphs"]))
        engine._graph = eager
        assert torch.equal(out.responses, engine.generate(prompts, sampling).responses)
    assert graphs[1] == graphs[0] >= 1 and sum(counters["graph_break"].values()) == breaks


def test_sampled_step_with_top_k_and_top_p_traces_as_one_graph():
    """The sampled step (Gumbel noise, top-k, top-p sort) also compiles as one graph, through AOT autograd's
    functionalization of its in-place buffer updates (backend aot_eager)."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    actor = _actor("qwen2", layers=1)
    decoder = GraphDecoder(actor, dict(backend="aot_eager", fullgraph=True, dynamic=False))
    ids, mask = _left_pad(PROMPTS, 1)
    before = int(counters["stats"]["unique_graphs"])
    tokens, _, steps = decoder.decode(ids, mask, 16, 4, [1], 1, 0.7, False, top_k=10, top_p=0.9)
    assert steps == 4 and tokens.shape == (4, 4) and int(counters["stats"]["unique_graphs"]) == before + 1


def test_models_the_graph_loop_does_not_run_are_refused():
    from transformers import MistralConfig, Qwen2VLConfig

    from rollout.graph_decode import graph_decode_unsupported

    assert graph_decode_unsupported(_config("qwen2")) is None
    assert "vision-language" in graph_decode_unsupported(Qwen2VLConfig())
    assert "StaticSlidingWindowLayer" in graph_decode_unsupported(MistralConfig(num_hidden_layers=1))
    with pytest.raises(ValueError, match="decode_loop='graph' does not run cache layers other than full attention"):
        HFRolloutEngine(MistralConfig(num_hidden_layers=1, vocab_size=V), device="cpu", decode_loop="graph")
    with pytest.raises(ValueError, match=r"decode_loop='graf'; expected one of \['auto', 'generate', 'graph'\]"):
        HFRolloutEngine(_config("llama"), device="cpu", decode_loop="graf")


def test_auto_runs_the_graph_loop_on_cuda_with_a_static_cache_for_the_models_it_runs():
    """decode_loop=auto (the default): graph on CUDA with a static cache for a text model with full-attention layers;
    generate on the CPU, without a static cache, and for vision-language or sliding-window models; an explicit
    choice is kept."""
    from transformers import MistralConfig, Qwen2VLConfig

    from rollout.graph_decode import resolve_decode_loop

    assert resolve_decode_loop("auto", _config("qwen2"), on_cuda=True, static_cache=True) == "graph"
    assert resolve_decode_loop("auto", _config("llama"), on_cuda=True, static_cache=True) == "graph"
    assert resolve_decode_loop("auto", _config("qwen2"), on_cuda=False, static_cache=True) == "generate"
    assert resolve_decode_loop("auto", _config("qwen2"), on_cuda=True, static_cache=False) == "generate"
    assert resolve_decode_loop("auto", Qwen2VLConfig(), on_cuda=True, static_cache=True) == "generate"
    assert resolve_decode_loop("auto", MistralConfig(num_hidden_layers=1), on_cuda=True, static_cache=True) == "generate"
    assert resolve_decode_loop("generate", _config("qwen2"), on_cuda=True, static_cache=True) == "generate"
    assert resolve_decode_loop("graph", _config("qwen2"), on_cuda=False, static_cache=False) == "graph"
    assert HFRolloutEngine(_config("llama", layers=1), device="cpu").decode_loop == "generate"
    assert HFRolloutEngine(_config("llama", layers=1), device="cpu", use_static_cache=True).decode_loop == "generate"


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.e2e_utils import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


def test_the_decode_loop_key_reaches_the_engine_and_is_checked_before_start(monkeypatch):
    """actor_rollout_ref.rollout.decode_loop: build_engine passes it to the engine; a bad value, and graph for a
    vision-language model, are one line before any worker starts; under rollout=vllm it is warned as unused."""
    from transformers import Qwen2VLConfig

    import rollout.hf_engine as he
    from rollout.hf_engine import DECODE_LOOPS
    from trainer.config.rollout import DECODE_LOOPS as CONFIG_LOOPS, RolloutConfig
    from trainer.config_preflight import check_decode_loop
    from trainer.launch import ConfigError, validate
    from trainer.unused_settings import unused_setting_warnings
    from trainer.workers.actor import build_engine

    assert CONFIG_LOOPS == DECODE_LOOPS
    cfg = _cfg("actor_rollout_ref.rollout.decode_loop=graph")
    rc = RolloutConfig.from_dict(cfg["actor_rollout_ref"]["rollout"], "actor_rollout_ref.rollout")
    seen = {}
    monkeypatch.setattr(he.HFRolloutEngine, "__init__", lambda self, *a, **kw: seen.update(kw))
    build_engine(SimpleNamespace(rollout=rc), _config("llama"), "unused", [1], 1, torch.device("cpu"), "cpu",
                 torch.float32, 0)
    assert seen["decode_loop"] == "graph"
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.rollout.decode_loop='graf'; expected auto") as bad:
        validate(_cfg("actor_rollout_ref.rollout.decode_loop=graf"))
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match="decode_loop=graph: the graph decode loop does not run a vision-language"):
        check_decode_loop(cfg, Qwen2VLConfig())
    check_decode_loop(cfg, _config("qwen2"))
    check_decode_loop(_cfg(), Qwen2VLConfig())  # auto: nothing to check (generate for this model)
    assert _cfg()["actor_rollout_ref"]["rollout"]["decode_loop"] == "auto"
    warned = unused_setting_warnings(_cfg("rollout=vllm", "+actor_rollout_ref.rollout.decode_loop=graph"))
    assert any("decode_loop=graph: ignored: a setting of actor_rollout_ref.rollout.name=hf" in w for w in warned)


def test_the_rollout_bench_times_both_decode_loops(tmp_path, monkeypatch):
    """tools/bench/rollout.py --decode-loop generate,graph: one row per loop on one engine, with ms per decode step
    (seconds / the longest response of each chunk)."""
    import json

    from tools.bench import rollout as bench

    monkeypatch.setattr(bench, "random_config", lambda name: _config("llama", layers=1))
    out = tmp_path / "r.json"
    bench.main(["--prompts", "3", "--n", "2", "--new-tokens", "4", "--min-prompt", "2", "--max-prompt", "4",
                "--skip-plain", "--skip-sync", "--engine-calls", "1", "--decode-loop", "generate,graph",
                "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["decode_loop"] for r in rows] == ["generate", "graph"]
    for r in rows:
        assert r["tokens"] > 0 and r["decode_steps"] == 4 and r["ms_per_decode_step"] > 0
    assert bench.decode_steps(torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]), rows_per_call=2) == 2 + 3


def test_a_step_that_is_not_one_graph_is_compiled_again_without_fullgraph(monkeypatch, caplog):
    """fullgraph=True fails on a graph break: one warning, then fullgraph=False (several graphs) and the same
    tokens as the eager loop."""
    import logging

    import rollout.graph_decode as gd

    torch._dynamo.reset()
    real = gd.decode_step

    def broken(*args):
        torch._dynamo.graph_break()
        return real(*args)

    actor = _actor("llama", layers=1)
    ids, mask = _left_pad(PROMPTS[:2], 1)
    want = GraphDecoder(actor).decode(ids, mask, 16, 3, [1], 1, 1.0, True)[0]
    monkeypatch.setattr(gd, "decode_step", broken)
    decoder = GraphDecoder(actor, dict(backend="eager", fullgraph=True, dynamic=False))
    with caplog.at_level(logging.WARNING, logger="rollout.graph_decode"):
        got = decoder.decode(ids, mask, 16, 3, [1], 1, 1.0, True)[0]
    assert torch.equal(got, want) and decoder.compile_kwargs["fullgraph"] is False
    assert len(caplog.records) == 1 and "the decode step is not one graph" in caplog.records[0].message
