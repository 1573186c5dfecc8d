"""The compile worker pool started at the worker's start when it will compile on CUDA (trainer/workers/kernels.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainer.workers import kernels


@pytest.fixture
def calls(monkeypatch):
    import torch._inductor.async_compile as ac

    seen = []
    monkeypatch.setattr(ac, "maybe_warm_pool", lambda: seen.append(1))
    return seen


@pytest.mark.parametrize("compile_update, name, static, device, started", [
    (True, "vllm", None, "cuda", True),     # the update and reference compile
    (False, "hf", None, "cuda", True),      # the engine's static-cache decoding compiles (its default on CUDA)
    (False, "hf", "auto", "cuda", True),
    (False, "hf", False, "cuda", False),    # no static cache: nothing compiles
    (False, "vllm", None, "cuda", False),   # vLLM compiles in its own processes
    (True, "hf", None, "cpu", False),       # inductor's pool is for Triton (CUDA) kernels
])
def test_the_pool_starts_only_where_this_worker_compiles_on_cuda(calls, compile_update, name, static, device,
                                                                  started):
    rollout = SimpleNamespace(name=name, static_cache=static)
    assert kernels.warm_compile_pool(compile_update, rollout, device) is started
    assert calls == ([1] if started else [])
