"""Reading ``generate``'s stop flag one step late on CUDA, so that the host never waits for the device per token.

transformers' sampling loop ends when every row has finished, which it learns by reading
``unfinished_sequences.max() == 0`` on the host after every token: a device-to-host copy that waits for all queued
work, so the host and the device take turns instead of overlapping. transformers ships ``DeferredStopCheck``
(``transformers.generation.utils``, 5.17 and later), which copies the flag asynchronously into pinned memory and
reads it at the next step, at the price of one extra decode step that ``generate`` undoes before it returns; it
enables it only on ``mps``. :func:`deferred_stop_check` enables it on CUDA too, for the calls made inside it, where
it is safe by transformers' own rule (no assisted generation; a cache that outlives the call must be croppable).
On the SmolLM2-135M GRPO job one decode step took 4.1 ms on the host against 1.8 ms on the device
(docs/benchmarks.md).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["deferred_stop_check"]


@contextlib.contextmanager
def deferred_stop_check(device_types: tuple[str, ...] = ("cuda",)) -> Iterator[bool]:
    """Within the block, ``generate`` on a device of ``device_types`` reads its stop flag one step late.

    Yields:
        True when transformers has ``DeferredStopCheck`` (and the patch is in place), False otherwise (the block
        runs with transformers' per-token check).
    """
    try:
        from transformers.generation.utils import DeferredStopCheck
    except ImportError:  # transformers before 5.17: nothing to enable
        yield False
        return
    original = DeferredStopCheck.__dict__["is_supported"]
    fallback = original.__func__ if isinstance(original, staticmethod) else original

    def is_supported(device, cache, cache_is_returned, is_assistant) -> bool:
        if device.type in device_types and not is_assistant:
            return cache is None or not cache_is_returned or bool(getattr(cache, "is_croppable", False))
        return fallback(device, cache, cache_is_returned, is_assistant)

    DeferredStopCheck.is_supported = staticmethod(is_supported)
    try:
        yield True
    finally:
        DeferredStopCheck.is_supported = original
