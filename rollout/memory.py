"""The one place in the project that returns PyTorch's cached GPU memory to the driver.

Rule (verl's, from its issues #556 and #575): an inference engine that allocates outside
PyTorch's caching allocator (vLLM's CuMemAllocator in sleep mode) cannot reuse blocks that PyTorch keeps cached,
so the cache is emptied right before the engine wakes up and right after it sleeps - and nowhere else, so that the
caching allocator stays fast during training. ``tests/test_rollout_empty_cache_grep.py`` checks that no other file
calls it; tests fake this function by monkeypatching ``rollout.memory.empty_cache``.

Beside it, the parameter storage of an engine that discards its own weight copy while asleep (sleep level 2):
:class:`DiscardedWeights`.
"""
from __future__ import annotations

import gc

import torch


def empty_cache() -> None:
    """Release PyTorch's cached CUDA blocks to the driver; a no-op without CUDA.

    A young-generation ``gc.collect(1)`` runs first so that freshly made tensors kept alive only by reference
    cycles are freed before the cache is returned (verl's ``aggressive_empty_cache`` does a full collection).
    A full collection cost 0.18 s per call in a trainer process (measured on the 2-core CPU box: 88% of a tiny
    rollout), and the temporaries of a weight sync are freed by reference counting anyway.
    """
    if not torch.cuda.is_available():
        return
    gc.collect(1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def device_used_gib() -> float | None:
    """GPU memory in use on the current device, in GiB, counting every allocator of every process
    (``total - free`` from ``torch.cuda.mem_get_info``, i.e. ``cudaMemGetInfo``); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def record_device_used(log: dict, stage: str) -> None:
    """``log[stage] = device_used_gib()`` when CUDA is present (no entry otherwise)."""
    used = device_used_gib()
    if used is not None:
        log[stage] = used


class DiscardedWeights:
    """A module's parameters while a sleep that discards the weights (vLLM's level 2) has freed them: each
    ``param.data`` is an empty tensor (buffers are kept) until :meth:`reallocate` gives it uninitialised storage on
    the device, and the weights count as back once :meth:`loaded` has seen every parameter."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.shapes = [p.shape for p in module.parameters()]  # module.parameters() order (tied ones once)
        for p in module.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.pending: set[int] = {id(p) for p in module.parameters()}

    def reallocate(self, module: torch.nn.Module, device: torch.device) -> None:
        """Uninitialised storage of each parameter's shape on ``device`` (garbage until loaded)."""
        for p, shape in zip(module.parameters(), self.shapes):
            p.data = torch.empty(shape, dtype=p.dtype, device=device)

    def loaded(self, param: torch.Tensor) -> None:
        """Record that ``param`` (one of the module's parameters) holds loaded values again."""
        self.pending.discard(id(param))

    @property
    def missing(self) -> int:
        """Parameters not loaded since the discard."""
        return len(self.pending)
