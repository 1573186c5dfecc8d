"""The vLLM engine for real (GPU + vLLM): life cycle and memory, weight sync from ZeRO-2/3 actors, tied
embeddings, greedy outputs against the transformers engine, log-probs against a trainer-side recompute.

Needs CUDA, vLLM and an HF model folder (``SMOLLM2_DIR``, default ``/tmp/smol_hf``; SmolLM2-135M-Instruct has tied
embeddings). vLLM runs in this process: set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the worker does the same).
Run: ``python -m pytest -m gpu tests/test_rollout_vllm_gpu.py -s`` (``-s`` prints the measured figures).
The memory checks read the device-wide figure (``cudaMemGetInfo``: vLLM's CuMem allocator is outside PyTorch's
accounting), so they need the GPU to themselves; they are skipped, with the reason, when other processes hold memory.
"""
from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch

pytestmark = pytest.mark.gpu
MODEL = os.environ.get("SMOLLM2_DIR", "/tmp/smol_hf")
BUCKET = 16 * 2**20  # several buckets for a 135M model (270 MB in bf16)
REPORT = os.environ.get("VLLM_GPU_REPORT")  # optional JSON file for the figures


def _needs():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    try:
        import vllm  # noqa: F401
    except ImportError:
        pytest.skip("needs vLLM (pip install -e .[vllm])")
    if not os.path.isfile(os.path.join(MODEL, "config.json")):
        pytest.skip(f"no HF model folder at SMOLLM2_DIR={MODEL}")


def _report(key, value):
    print(f"[vllm-gpu] {key}: {value}")
    if REPORT:
        data = json.load(open(REPORT)) if os.path.exists(REPORT) else {}
        data[key] = value
        json.dump(data, open(REPORT, "w"), indent=1)


@pytest.fixture(scope="module")
def setup():
    _needs()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29531"))
    import deepspeed
    from transformers import AutoConfig, AutoTokenizer

    from rollout import memory
    from rollout.stop_tokens import resolve_stop_token_ids
    from rollout.vllm_engine import VLLMRolloutEngine

    deepspeed.init_distributed(dist_backend="nccl")  # as the actor worker does, before vLLM starts
    torch.cuda.set_device(0)
    cfg, tok = AutoConfig.from_pretrained(MODEL), AutoTokenizer.from_pretrained(MODEL)
    stops = resolve_stop_token_ids(tok, cfg, MODEL)
    before = memory.device_used_gib()
    util = float(os.environ.get("VLLM_TEST_GPU_UTIL", "0.3"))  # less when other runs share the GPU
    engine = VLLMRolloutEngine(MODEL, eos_token_id=stops, pad_token_id=tok.pad_token_id, gpu_memory_utilization=util,
                               dtype="bfloat16", max_model_len=1024, seed=0)
    asleep = memory.device_used_gib()
    questions = ["What is 17 + 25?", "Name a colour of the sky.", "Write one word that rhymes with cat.",
                 "How many legs does a spider have?", "What is 9 times 8?", "Say hello in French.",
                 "What is the capital of Italy?", "Count from 1 to 5."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
               for q in questions]
    prompts = [p["input_ids"] if hasattr(p, "keys") else list(p) for p in prompts]
    _report("memory_gib/before_engine_and_asleep", [round(before, 2), round(asleep, 2)])
    return dict(engine=engine, cfg=cfg, tok=tok, stops=stops, prompts=prompts, asleep=asleep, before=before)


def _ds_actor(stage: int, noise: float = 0.02):
    """A DeepSpeed engine (bf16, ZeRO ``stage``) of the model with perturbed weights: the sync must carry them."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    torch.manual_seed(stage)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std() * noise)
    ds_cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                      config=ds_cfg)
    return engine


def _vllm_param_sums(worker):
    model = worker.model_runner.model
    named = dict(model.named_parameters())
    embed = next(p for n, p in named.items() if n.endswith("embed_tokens.weight"))
    head = getattr(model, "lm_head", None)
    head_w = getattr(head, "weight", None)
    return {"total": float(sum(p.double().sum() for p in named.values())),
            "embed": float(embed.double().sum()),
            "lm_head": None if head_w is None else float(head_w.double().sum()),
            "head_is_embed": head_w is not None and head_w.data_ptr() == embed.data_ptr()}


@contextlib.contextmanager
def _synced(engine, ds_engine, stage):
    """``rollout_mode`` with the actor's ZeRO parameters; yields (load_weights call sizes, memory log)."""
    from rollout.context import iter_actor_params, rollout_mode

    calls, log = [], {}
    orig = engine.load_weights

    def counting(pairs):
        pairs = list(pairs)
        calls.append(len(pairs))
        return orig(pairs)

    engine.load_weights = counting
    try:
        with rollout_mode(engine, lambda: iter_actor_params(ds_engine.module, stage, BUCKET), BUCKET,
                          memory_log=log):
            yield calls, log
    finally:
        engine.load_weights = orig


def _hf_engine(cfg, stops, tok, ds_engine, stage):
    from rollout.context import iter_actor_params, sync_weights
    from rollout.hf_engine import HFRolloutEngine

    hf = HFRolloutEngine(cfg, eos_token_id=stops, pad_token_id=tok.pad_token_id, device="cuda",
                         dtype=torch.bfloat16, use_static_cache=False)
    sync_weights(hf, iter_actor_params(ds_engine.module, stage, BUCKET), BUCKET)
    return hf


def _recompute_log_probs(ds_engine, stage, prompts, out):
    """Log-probs of the generated tokens under the actor's own (bf16) forward, one row at a time."""
    import deepspeed

    module = ds_engine.module
    params = list(module.parameters())
    ctx = deepspeed.zero.GatheredParameters(params) if stage == 3 else torch.no_grad()
    diffs = []
    with ctx, torch.no_grad():
        for i, p in enumerate(prompts):
            m = out.response_mask[i].bool()
            resp = out.responses[i][m].tolist()
            ids = torch.tensor([p + resp], device="cuda")
            logits = module(input_ids=ids).logits[0, len(p) - 1:-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(resp, device="cuda")[:, None]).squeeze(-1)
            diffs.append((lp.cpu() - out.rollout_log_probs[i][m]).abs())
    return torch.cat(diffs)


def _others_gib() -> float:
    """GPU memory (GiB) held by other processes: the device-wide figure less this process's, where NVML can tell
    them apart; 0.0 where it cannot (PID namespaces hide the processes)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # no NVML binding or no access: nothing to tell
        return 0.0
    return sum((p.usedGpuMemory or 0) for p in procs if p.pid != os.getpid()) / 2**30


def test_vllm_asleep_at_creation_then_lifecycle_frees_memory(setup, cuda_deepspeed_accelerator):
    from rollout import memory
    from rollout.base import SamplingConfig

    engine, s = setup["engine"], setup
    ds = _ds_actor(2)
    with _synced(engine, ds, 2) as (calls, log):
        out = engine.generate(s["prompts"], SamplingConfig(n=2, temperature=1.0, max_new_tokens=32, seed=1))
    after = memory.device_used_gib()
    _report("memory_gib/stages", {k: round(v, 2) for k, v in log.items()})
    assert out.responses.shape == (16, 32) and out.response_mask.sum() > 0
    assert len(calls) > 1, "the weights should arrive in several buckets"
    others = _others_gib()
    if others > 1.5:
        pytest.skip(f"other processes hold {others:.1f} GiB of this GPU; the device-wide memory checks need it alone")
    assert s["asleep"] - s["before"] < 4.0, "the engine should be asleep (weights and KV cache freed) at creation"
    assert log["kv_awake"] - log["weights_synced"] > 5.0, "the KV cache should be allocated at wake"
    assert log["asleep"] < log["kv_awake"] - 5.0, "sleep should return the KV cache"
    assert after < log["kv_awake"] - 5.0
    del ds


@pytest.mark.parametrize("stage", [2, 3])
def test_vllm_sync_from_zero_matches_hf_engine(setup, stage, cuda_deepspeed_accelerator):
    from rollout.base import SamplingConfig

    engine, s = setup["engine"], setup
    ds = _ds_actor(stage)
    greedy = SamplingConfig(n=1, max_new_tokens=32, do_sample=False)
    with _synced(engine, ds, stage) as (calls, log):
        out = engine.generate(s["prompts"], greedy)
        sums = engine.llm.collective_rpc(_vllm_param_sums)[0]
    import deepspeed

    params = list(ds.module.parameters())
    with (deepspeed.zero.GatheredParameters(params) if stage == 3 else torch.no_grad()):
        actor_total = float(sum(p.detach().double().sum() for p in ds.module.parameters()))
        actor_embed = float(ds.module.get_input_embeddings().weight.double().sum())
    assert abs(sums["total"] - actor_total) <= 1e-3 * abs(actor_total) + 1e-2, (sums, actor_total)
    # tied embeddings: vLLM's lm_head is the synced embedding
    assert abs(sums["embed"] - actor_embed) <= 1e-3 * abs(actor_embed) + 1e-2
    assert sums["head_is_embed"] or abs(sums["lm_head"] - actor_embed) <= 1e-3 * abs(actor_embed) + 1e-2
    hf = _hf_engine(s["cfg"], s["stops"], s["tok"], ds, stage)
    ref = hf.generate(s["prompts"], greedy)
    same16 = [bool(torch.equal(out.responses[i, :16], ref.responses[i, :16])) for i in range(len(s["prompts"]))]
    same_first = float((out.responses[:, 0] == ref.responses[:, 0]).float().mean())
    diff = _recompute_log_probs(ds, stage, s["prompts"], out)
    _report(f"zero{stage}", {"load_weights_calls": len(calls), "greedy_rows_equal_first16": sum(same16),
                             "rows": len(same16), "first_token_agree": same_first,
                             "log_prob_diff_mean": float(diff.mean()), "log_prob_diff_max": float(diff.max())})
    assert len(calls) > 1
    assert sum(same16) >= 6, f"greedy outputs differ from the transformers engine: {same16}"
    assert float(diff.mean()) < 0.05, float(diff.mean())
    del hf, ds
