"""The one place in the project that returns PyTorch's cached GPU memory to the driver.

Rule (verl #556 -> #575, see reference/verl-features.md section 4): an inference engine that allocates outside
PyTorch's caching allocator (vLLM's CuMemAllocator in sleep mode) cannot reuse blocks that PyTorch keeps cached,
so the cache is emptied right before the engine wakes up and right after it sleeps - and nowhere else, so that the
caching allocator stays fast during training. ``tests/test_rollout_empty_cache_grep.py`` checks that no other file
calls it; tests fake this function by monkeypatching ``rollout.memory.empty_cache``.
"""
from __future__ import annotations

import gc

import torch


def empty_cache() -> None:
    """Collect Python garbage, then release PyTorch's cached CUDA blocks (no-op without CUDA).

    ``gc.collect()`` first, so that tensors kept alive only by reference cycles are freed before the cache is
    returned (verl's ``aggressive_empty_cache`` does the same).
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
