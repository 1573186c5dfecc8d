"""The actor worker builds the vLLM engine through the engine's real constructor (vLLM faked)."""
import types

import torch

import rollout.vllm_engine as vllm_engine
from trainer.workers.actor import ActorRolloutRefWorker


def test_actor_builds_vllm_engine_asleep_with_config_values(monkeypatch):
    made = {}

    class LLM:
        def __init__(self, **kw):
            made["kw"] = kw
            made["calls"] = []

        def sleep(self, level):
            made["calls"].append(("sleep", level))

    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: types.SimpleNamespace(LLM=LLM, SamplingParams=dict))
    from trainer.config.packaged import packaged_config
    from trainer.config.workers import actor_worker_config

    r = "actor_rollout_ref.rollout"
    config = actor_worker_config(packaged_config([
        "rollout=vllm", f"{r}.tensor_model_parallel_size=2", f"{r}.gpu_memory_utilization=0.4",
        "data.max_prompt_length=64", "data.max_response_length=32", f"{r}.sleep_level=2", "trainer.seed=5"], 1))
    worker = types.SimpleNamespace(
        rollout_cfg=config.rollout, tokenizer=types.SimpleNamespace(pad_token_id=None, eos_token_id=7),
        actor=types.SimpleNamespace(model_path="/models/m", hf_config=None), config=config, rank=1, lora=False,
        device_type="cuda", device=torch.device("cpu"), param_dtype=lambda: torch.bfloat16)
    ActorRolloutRefWorker._build_rollout(worker)
    kw = made["kw"]
    assert kw["model"] == "/models/m" and kw["enable_sleep_mode"] is True
    assert kw["tensor_parallel_size"] == 2 and kw["gpu_memory_utilization"] == 0.4
    assert kw["dtype"] == "bfloat16" and kw["max_model_len"] == 96 and kw["seed"] == 6
    assert worker.pad_token_id == 7                                  # pad falls back to EOS
    assert made["calls"] == [("sleep", 1), ("sleep", 2)]              # asleep at once, then the configured level
    assert isinstance(worker.engine, vllm_engine.VLLMRolloutEngine)
