"""How many graphs ``torch.compile`` has made and how many CUDA graphs its ``reduce-overhead`` mode has recorded in
this process, so that a stage can report the compilations and recordings that happened during it.

A compiled engine that recompiles or re-records every step (a shape that changes from call to call, or parameters
that come back at other addresses after a sleep: CUDA-graph trees re-record a graph whose static inputs moved) pays
for it in every step's time without any error; the counts make that visible in the step's metrics.
"""
from __future__ import annotations

import sys

import torch

__all__ = ["compile_counts", "count_delta"]


def _counter_value(counter) -> int | None:
    """The next value of an ``itertools.count`` without advancing it (its repr is ``count(N)``), or None."""
    text = repr(counter)
    if text.startswith("count(") and text.endswith(")"):
        try:
            return int(text[6:-1])
        except ValueError:
            return None
    return None


def compile_counts() -> dict[str, int]:
    """``{"dynamo_graphs": N, "cudagraph_records": M}`` of this process so far.

    ``dynamo_graphs``: graphs ``torch.compile`` (dynamo) has compiled (``torch._dynamo.utils.counters["stats"]
    ["unique_graphs"]``, every compiled function of the process); ``cudagraph_records``: CUDA graphs the
    CUDA-graph trees of ``mode="reduce-overhead"`` have recorded on the current CUDA device (first recordings and
    re-recordings; the tree manager's graph id counter). Both are 0 when nothing was compiled or recorded; nothing
    is imported or initialised to read them (modules not yet loaded count 0).
    """
    out = {"dynamo_graphs": 0, "cudagraph_records": 0}
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        out["dynamo_graphs"] = int(utils.counters["stats"]["unique_graphs"])
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        manager = trees.get_container(torch.cuda.current_device()).tree_manager
        value = None if manager is None else _counter_value(manager.graph_counter)
        out["cudagraph_records"] = int(value or 0)
    return out


def count_delta(before: dict[str, int], prefix: str) -> dict[str, float]:
    """``{f"{prefix}/{name}": now - before}`` for every count of :func:`compile_counts` (floats, for metrics).

    Args:
        before: an earlier :func:`compile_counts` result.
        prefix: the metric prefix, e.g. ``"perf/rollout"``.
    """
    now = compile_counts()
    return {f"{prefix}/{k}": float(now[k] - before.get(k, 0)) for k in now}
