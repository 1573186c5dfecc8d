"""The DeepSpeed path's speed defaults on CUDA (trainer/workers/base.py): fused AdamW with ZeRO <= 2 and no
offload, and ``overlap_comm`` for ZeRO-2 training; neither on the CPU, with ZeRO-3 or when offloading. Checked on
the config and constructor arguments (the kernels themselves need CUDA; measured in docs/benchmarks.md)."""
import os

import pytest
import torch

from trainer.config import DeepSpeedConfig, OptimConfig, WorkerRuntime
from trainer.config.packaged import packaged_section
from trainer.workers.base import DistributedWorker


def _worker(device, stage=2, **ds):
    env = dict(os.environ)
    section = packaged_section(DeepSpeedConfig, "deepspeed", [f"deepspeed.zero_stage={stage}"], **ds)
    cfg = WorkerRuntime(deepspeed=section, seed=1, cpus_per_worker=1)
    try:
        return DistributedWorker(cfg, rank=0, world_size=1, master_addr="127.0.0.1", master_port=29999, device=device)
    finally:  # the constructor exports MASTER_ADDR, RANK, DS_ACCELERATOR...; keep this process's environment
        os.environ.clear()
        os.environ.update(env)


@pytest.mark.parametrize("device,stage,ds,overlap", [
    ("cuda", 2, {}, True), ("cuda", 1, {}, None), ("cuda", 3, {}, None), ("cpu", 2, {}, None),
    ("cuda", 2, {"ds_config": {"zero_optimization": {"overlap_comm": False}}}, False)])
def test_overlap_comm_only_for_zero2_training_on_cuda(device, stage, ds, overlap):
    w = _worker(device, stage, **ds)
    assert w.ds_config(train=True)["zero_optimization"].get("overlap_comm") is overlap
    assert w.ds_config(train=False)["zero_optimization"].get("overlap_comm") is not True  # inference engines


@pytest.mark.parametrize("device,stage,ds,fused", [
    ("cuda", 2, {}, True), ("cuda", 1, {}, True), ("cuda", 0, {}, True), ("cuda", 3, {}, False),
    ("cpu", 2, {}, False), ("cuda", 2, {"ds_config": {"zero_optimization": {"stage": 3}}}, False)])
def test_torch_adamw_is_fused_on_cuda_with_zero_up_to_2(monkeypatch, device, stage, ds, fused):
    seen = {}

    class Recorder(torch.optim.AdamW):
        def __init__(self, params, **kw):
            seen.update(kw)
            kw.pop("fused", None)  # the fused kernel itself needs CUDA tensors
            super().__init__(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", Recorder)
    opt, _ = _worker(device, stage, **ds).build_optimizer(
        torch.nn.Linear(4, 4), packaged_section(OptimConfig, "actor_rollout_ref.actor.optim", lr=1e-3), total_steps=5)
    assert isinstance(opt, Recorder) and bool(seen.get("fused")) is fused
    assert seen["lr"] == 1e-3


def test_optimizer_offload_with_torch_adamw_is_refused_before_the_workers():
    """DeepSpeed's ZeRO-Offload refuses a client optimizer other than its CPU Adam in every worker (a traceback after
    start-up): the config check names both keys and the optimizer to use."""
    from trainer.config_checks import ConfigError

    with pytest.raises(ConfigError, match=r"^deepspeed.offload_optimizer=true with deepspeed.optimizer=torch_adamw: "
                                          r".*expected deepspeed.optimizer=deepspeed_adamw with the offload$"):
        packaged_section(DeepSpeedConfig, "deepspeed", [], offload_optimizer=True)
    ok = packaged_section(DeepSpeedConfig, "deepspeed", [], offload_optimizer=True, optimizer="deepspeed_adamw")
    assert ok.offload_optimizer and ok.optimizer == "deepspeed_adamw"
