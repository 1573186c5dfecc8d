"""Call protocol of the vLLM engine and of rollout_mode, with a fake vLLM ``LLM`` that records calls (peer case P19)."""
from __future__ import annotations

import types

import pytest
import torch

import rollout.memory as memory
from rollout.base import SamplingConfig
from rollout.context import iter_actor_params, rollout_mode, sync_weights
from rollout.vllm_engine import VLLMRolloutEngine


class FakeSamplingParams:
    def __init__(self, **kw):
        self.kw = kw


class FakeModel:
    def __init__(self, log, state):
        self.log, self.state = log, state

    def load_weights(self, weights):
        weights = list(weights)
        self.log.append(("load_weights", [(n, tuple(t.shape)) for n, t in weights]))
        for n, t in weights:
            self.state[n].copy_(t)


class FakeLLM:
    """Records sleep / wake_up / load_weights / generate; holds a state dict like vLLM's model."""

    def __init__(self, log, state, **kw):
        self.log, self.kw = log, kw
        self.log.append(("init", kw["enable_sleep_mode"], kw["tensor_parallel_size"]))
        self.worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=FakeModel(log, state)))

    def sleep(self, level):
        self.log.append(("sleep", level))

    def wake_up(self, tags=None):
        self.log.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.log.append(("reset_prefix_cache",))
        return getattr(self, "reset_ok", True)

    def collective_rpc(self, fn, args=()):
        return [fn(self.worker, *args)]

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.log.append(("generate", len(prompts), sampling_params.kw["n"]))
        eos = 2
        outs = []
        for p in prompts:
            comps = []
            for j in range(sampling_params.kw["n"]):
                ids = [10 + j, eos] if j == 0 else [20 + j, 21, 22]  # sample 0 stops at EOS; others hit max_tokens
                lps = [{t: types.SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)]
                comps.append(types.SimpleNamespace(token_ids=ids, logprobs=lps))
            outs.append(types.SimpleNamespace(outputs=comps))
        return outs


class Actor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)  # weight 128 B, bias 32 B (fp32)
        self.b = torch.nn.Linear(8, 8)  # weight 256 B, bias 32 B


@pytest.fixture
def setup(monkeypatch):
    log = []
    monkeypatch.setattr(memory, "empty_cache", lambda: log.append(("empty_cache",)))
    torch.manual_seed(0)
    actor = Actor()
    state = {n: torch.zeros_like(p) for n, p in actor.named_parameters()}
    engine = VLLMRolloutEngine("/nonexistent", eos_token_id=2, tensor_model_parallel_size=2,
                               llm_cls=lambda **kw: FakeLLM(log, state, **kw), sampling_params_cls=FakeSamplingParams)
    return log, actor, state, engine


def test_p19_enter_exit_order(setup):
    log, actor, state, engine = setup
    assert log == [("init", True, 2), ("sleep", 1)]  # created with sleep mode on and put to sleep at once
    log.clear()
    with rollout_mode(engine, lambda: iter_actor_params(actor, 0, 300), bucket_bytes=300,
                      offload_fn=lambda: log.append(("offload",)), reload_fn=lambda: log.append(("reload",)),
                      sleep_level=2) as eng:
        eng.generate([[1, 3]], SamplingConfig(n=1, max_new_tokens=4))
    assert log == [
        ("offload",),
        ("empty_cache",),
        ("wake_up", ("weights",)),
        ("load_weights", [("a.weight", (8, 4)), ("a.bias", (8,))]),
        ("load_weights", [("b.weight", (8, 8)), ("b.bias", (8,))]),
        ("empty_cache",),
        ("wake_up", ("kv_cache",)),
        ("generate", 1, 1),
        ("sleep", 2),
        ("empty_cache",),
        ("reload",),
    ]


def test_p19_exit_on_error_still_sleeps(setup):
    log, actor, state, engine = setup
    log.clear()
    with pytest.raises(RuntimeError, match="boom"):
        with rollout_mode(engine, lambda: actor.named_parameters(), bucket_bytes=1 << 20):
            raise RuntimeError("boom")
    assert log[-2:] == [("sleep", 1), ("empty_cache",)]
    assert log[:2] == [("empty_cache",), ("wake_up", ("weights",))]


@pytest.mark.parametrize("stage", ["weights", "kv_cache"])
def test_p19_a_failed_wake_up_still_sleeps_empties_the_cache_and_reloads(setup, monkeypatch, stage):
    log, actor, state, engine = setup
    log.clear()
    wake = engine.llm.wake_up

    def wake_up(tags=None):
        if tags == [stage]:
            raise RuntimeError("CUDA out of memory")
        wake(tags=tags)

    monkeypatch.setattr(engine.llm, "wake_up", wake_up)
    with pytest.raises(RuntimeError, match="out of memory"):
        with rollout_mode(engine, lambda: actor.named_parameters(), bucket_bytes=1 << 20,
                          offload_fn=lambda: log.append(("offload",)), reload_fn=lambda: log.append(("reload",))):
            pass
    assert log[0] == ("offload",) and log[-3:] == [("sleep", 1), ("empty_cache",), ("reload",)]


def test_p19_a_failed_sleep_still_reloads_the_optimizer(setup, monkeypatch):
    log, actor, state, engine = setup
    log.clear()
    monkeypatch.setattr(engine.llm, "sleep", lambda level=1: (_ for _ in ()).throw(RuntimeError("sleep failed")))
    with pytest.raises(RuntimeError, match="sleep failed"):
        with rollout_mode(engine, lambda: actor.named_parameters(), bucket_bytes=1 << 20,
                          reload_fn=lambda: log.append(("reload",))):
            pass
    assert log[-1] == ("reload",)


def test_bucketed_sync_counts_and_new_weights(setup):
    log, actor, state, engine = setup
    log.clear()
    # 100-byte buckets: a.weight (128 B) alone, a.bias alone (b.weight would overflow), b.weight alone, b.bias
    calls = sync_weights(engine, actor.named_parameters(), bucket_bytes=100)
    assert calls == 4
    assert [e[1] for e in log] == [[("a.weight", (8, 4))], [("a.bias", (8,))], [("b.weight", (8, 8))],
                                   [("b.bias", (8,))]]
    # a bucket big enough for everything: one call
    log.clear()
    assert sync_weights(engine, actor.named_parameters(), bucket_bytes=1 << 20) == 1
    for n, p in actor.named_parameters():
        assert torch.equal(state[n], p.detach())
    # trainer takes a step; the engine holds the NEW weights after the next rollout_mode
    with torch.no_grad():
        actor.a.weight.add_(1.0)
    with rollout_mode(engine, lambda: actor.named_parameters(), bucket_bytes=300):
        pass
    assert torch.equal(state["a.weight"], actor.a.weight.detach())


def test_vllm_generate_maps_outputs(setup):
    log, actor, state, engine = setup
    out = engine.generate([[1, 3], [4]], SamplingConfig(n=2, max_new_tokens=4, temperature=0.5, top_k=0, seed=7))
    assert out.responses.tolist() == [[10, 2, 2, 2], [21, 21, 22, 2], [10, 2, 2, 2], [21, 21, 22, 2]]
    assert out.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]] * 2
    assert torch.allclose(out.rollout_log_probs[:2], torch.tensor([[-0.5, -1.0, 0, 0], [-0.5, -1.0, -1.5, 0]]))


def test_vllm_sampling_params_mapping(setup):
    _, _, _, engine = setup
    sp = engine._sampling_params(SamplingConfig(n=3, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5,
                                                stop_token_ids=[7], seed=1))
    assert sp.kw == dict(n=3, temperature=0.7, top_p=0.9, top_k=-1, max_tokens=5, logprobs=0, stop_token_ids=[2, 7],
                         seed=1, detokenize=False)
    assert engine._sampling_params(SamplingConfig(do_sample=False)).kw["temperature"] == 0.0


def test_zero3_one_gather_per_bucket(monkeypatch):
    import deepspeed

    gathers = []

    class FakeGather:
        def __init__(self, params):
            gathers.append(len(list(params)))

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", FakeGather)
    buckets = list(iter_actor_params(Actor(), zero_stage=3, bucket_bytes=300))
    assert gathers == [2, 2]  # one gather per bucket, not one per tensor
    assert [[n for n, _ in b] for b in buckets] == [["a.weight", "a.bias"], ["b.weight", "b.bias"]]
    with pytest.raises(ValueError, match="zero_stage"):
        list(iter_actor_params(Actor(), zero_stage=4))


def test_missing_vllm_names_install_command(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name == "vllm":
            raise ImportError("no vllm")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"pip install -e \.\[vllm\]"):
        VLLMRolloutEngine("/x", eos_token_id=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_p19_memory_returned_before_wake_up():
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()  # what other tests in this process still hold (live tensors, graph pools)
    x = torch.empty(base + 2**30, dtype=torch.uint8, device="cuda")  # larger than any free space in those: a new
    del x  # segment, which PyTorch keeps cached
    assert torch.cuda.memory_reserved() >= 2 * base + 2**30

    class Engine:
        def wake_up(self, tags=None):
            assert torch.cuda.memory_reserved() < base + 64 * 2**20, (base, torch.cuda.memory_reserved())

        def load_weights(self, named):
            list(named)

        def sleep(self, level=1):
            pass

    with rollout_mode(Engine(), lambda: [], bucket_bytes=1 << 20):
        pass


def test_an_awake_engine_drops_its_prefix_cache_after_a_weight_update(setup):
    """A rollout worker's engine stays awake between updates (separate placement): prompt prefixes cached with the
    old weights must not serve the next generation. The colocated cycle (asleep while syncing) resets in sleep."""
    from rollout.context import sync_weights

    log, actor, state, engine = setup
    engine.wake_up()
    log.clear()
    sync_weights(engine, iter_actor_params(actor, 0, 300), 300)
    assert [e[0] for e in log] == ["load_weights", "load_weights", "reset_prefix_cache"]
    engine.sleep(1)
    engine.wake_up(["weights"])
    log.clear()
    sync_weights(engine, iter_actor_params(actor, 0, 300), 300)
    assert [e[0] for e in log] == ["load_weights", "load_weights"]  # asleep KV cache: nothing cached to drop
    engine.wake_up(["kv_cache"])
    engine.llm.reset_ok = False
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        sync_weights(engine, iter_actor_params(actor, 0, 300), 300)
