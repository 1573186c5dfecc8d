"""The DeepSpeed path's speed defaults on CUDA (trainer/workers/base.py): fused AdamW with ZeRO <= 2 and no
offload, ``overlap_comm`` for ZeRO-2 training on more than one rank (neither on the CPU, with ZeRO-3 or when
offloading), and no reduce bucket for ZeRO-2 on one rank (one gradient copy per backward instead of two). Checked on
the config and constructor arguments (the kernels themselves need CUDA; measured in docs/benchmarks.md)."""
import os

import pytest
import torch

from trainer.workers.base import DistributedWorker

from tests.test_static_shapes import dist_group  # noqa: F401  (fixture: a one-process gloo group)


def _worker(device, stage=2, world_size=1, **ds):
    env = dict(os.environ)
    cfg = {"deepspeed": {"zero_stage": stage, "optimizer": "torch_adamw", **ds}, "trainer": {"cpus_per_worker": 1}}
    try:
        return DistributedWorker(cfg, rank=0, world_size=world_size, master_addr="127.0.0.1", master_port=29999,
                                 device=device)
    finally:  # the constructor exports MASTER_ADDR, RANK, DS_ACCELERATOR...; keep this process's environment
        os.environ.clear()
        os.environ.update(env)


@pytest.mark.parametrize("device,stage,world,ds,overlap,bucket", [
    ("cuda", 2, 2, {}, True, None), ("cuda", 2, 1, {}, None, 1), ("cpu", 2, 1, {}, None, 1),
    ("cuda", 1, 2, {}, None, None), ("cuda", 3, 2, {}, None, None), ("cpu", 2, 2, {}, None, None),
    ("cuda", 2, 2, {"ds_config": {"zero_optimization": {"overlap_comm": False}}}, False, None),
    ("cuda", 2, 1, {"ds_config": {"zero_optimization": {"reduce_bucket_size": 5e8, "overlap_comm": True}}}, True, 5e8)])
def test_overlap_comm_for_zero2_training_on_cuda_and_no_reduce_bucket_on_one_rank(device, stage, world, ds, overlap,
                                                                                   bucket):
    w = _worker(device, stage, world, **ds)
    zero = w.ds_config(train=True)["zero_optimization"]
    assert zero.get("overlap_comm") is overlap and zero.get("reduce_bucket_size") == bucket
    if not ds:  # (deepspeed.ds_config is merged into every engine's config, inference included)
        inference = w.ds_config(train=False)["zero_optimization"]
        assert inference.get("overlap_comm") is not True and "reduce_bucket_size" not in inference


@pytest.mark.parametrize("device,stage,ds,fused", [
    ("cuda", 2, {}, True), ("cuda", 1, {}, True), ("cuda", 0, {}, True), ("cuda", 3, {}, False),
    ("cpu", 2, {}, False), ("cuda", 2, {"offload_optimizer": True}, False),
    ("cuda", 2, {"ds_config": {"zero_optimization": {"stage": 3}}}, False)])
def test_torch_adamw_is_fused_on_cuda_with_zero_up_to_2(monkeypatch, device, stage, ds, fused):
    seen = {}

    class Recorder(torch.optim.AdamW):
        def __init__(self, params, **kw):
            seen.update(kw)
            kw.pop("fused", None)  # the fused kernel itself needs CUDA tensors
            super().__init__(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", Recorder)
    opt, _ = _worker(device, stage, **ds).build_optimizer(torch.nn.Linear(4, 4), {"lr": 1e-3}, total_steps=5)
    assert isinstance(opt, Recorder) and bool(seen.get("fused")) is fused
    assert seen["lr"] == 1e-3


class _CopyCounter:
    """Counts ``aten.copy_`` calls that move at least ``min_numel`` elements between different memory."""

    def __init__(self, min_numel):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if (func is torch.ops.aten.copy_.default and args[0].numel() >= min_numel
                        and args[0].data_ptr() != args[1].data_ptr()):
                    counter.copies += 1
                return func(*args, **(kwargs or {}))

        self.copies, self.mode = 0, Mode()


@pytest.mark.parametrize("bucket", [None, 5e8], ids=["trainer_default", "deepspeed_bucket"])
def test_one_rank_zero2_copies_each_gradient_once_per_backward_and_steps_like_plain_sgd(dist_group, bucket):
    """ZeRO-2 on one rank with the trainer's config: 3 accumulated backwards per step, 2 SGD steps (lr 0.1), equal to
    plain accumulation in fp32; each of the two 256 x 1024 weights' gradients is copied once per backward (the
    partition copy), against twice through DeepSpeed's 5e8-element bucket."""
    import copy

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256),
                               torch.nn.LayerNorm(256))
    ds = {} if bucket is None else {"ds_config": {"zero_optimization": {"reduce_bucket_size": bucket}}}
    cfg = _worker("cpu", 2, 1, **ds).ds_config(train=True)
    cfg["gradient_clipping"] = 0.0
    model, plain = copy.deepcopy(base), copy.deepcopy(base)
    engine, *_ = dist_group.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                       config=cfg)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    counter = _CopyCounter(256 * 1024)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        for _ in range(3):
            x, y = torch.randn(8, 256, generator=g), torch.randn(8, 256, generator=g)
            with counter.mode:
                engine.backward((engine(x) - y).pow(2).mean() / 3, scale_wrt_gas=False)
            ((plain(x) - y).pow(2).mean() / 3).backward()
        engine.step()
        opt.step()
        opt.zero_grad()
    for (n, p), q, b in zip(engine.module.named_parameters(), plain.parameters(), base.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=n)
        assert (p - b).abs().max() > 1e-4, n
    assert counter.copies == 6 * 2 * (1 if bucket is None else 2), counter.copies
