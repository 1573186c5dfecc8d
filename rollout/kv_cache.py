"""Static KV caches that outlive one ``generate`` call (``rollout.free_cache_engine=false`` with the transformers
engine).

transformers builds a new ``StaticCache`` in every ``generate`` call that asks for ``cache_implementation="static"``.
The compiled decoding step (``torch.compile`` ``mode="reduce-overhead"``) marks the cache tensors as static inputs of
its CUDA graphs, so a cache at new addresses makes CUDA-graph trees record the graph again: once per call, i.e.
once per training step (the engine's ``perf/rollout/cudagraph_records`` counter shows it). Passing the same cache
object to every call of the same shape (``generate(past_key_values=cache)``, transformers' documented way to give
``generate`` a cache, reset before each call) keeps the addresses, and the recorded graph is replayed. The price is
the cache's memory, held while the trainer updates the weights: ``rows * cache_len * layers * 2 * kv_heads *
head_dim * bytes`` per kept shape (SmolLM2-135M, 128 rows x 512 positions, bf16: 1.5 GB).
"""
from __future__ import annotations

import inspect

__all__ = ["KeptStaticCaches"]


class KeptStaticCaches:
    """One ``transformers.StaticCache`` per (rows, cache length) shape, kept until :meth:`clear`.

    Args:
        model: the engine's ``PreTrainedModel`` (its text config sizes the caches; its ``forward`` signature says
            whether ``generate`` takes the cache as ``cache`` (transformers >= 5.2x) or ``past_key_values``).
    """

    def __init__(self, model) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.kwarg = "cache" if "cache" in params else "past_key_values"
        self._caches: dict[tuple[int, int], object] = {}

    def generate_kwargs(self, rows: int, cache_len: int) -> dict:
        """``{kwarg: cache}`` for a ``generate`` call of ``rows`` rows and a static cache of ``cache_len`` positions:
        the kept cache of that shape, reset (zeroed in place, same tensors), or a new one on the first call."""
        from transformers import StaticCache

        key = (int(rows), int(cache_len))
        cache = self._caches.get(key)
        if cache is None:
            cache = StaticCache(config=self.model.config.get_text_config(decoder=True), max_cache_len=int(cache_len))
            self._caches[key] = cache
        else:
            cache.reset()
        return {self.kwarg: cache}

    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, cache_len) shapes kept now."""
        return sorted(self._caches)

    def clear(self) -> None:
        """Drop every kept cache (its memory returns to PyTorch's allocator once no graph holds it)."""
        self._caches.clear()
