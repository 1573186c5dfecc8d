"""``torch.profiler`` around the actor worker's calls of chosen training steps, to see where a step's time goes.

``DSRL_PROFILE_STEPS=3,4`` (read by the driver, :func:`profile_meta`) marks those steps' prompts with
``meta["profile_dir"]`` = ``<trainer.output_dir>/profile/step_<N>``; the mark travels with the step's batches, and
each worker call decorated with :func:`profiled` (generation, old/ref log-probs, update) that receives a marked batch
runs under ``torch.profiler`` (CPU, and CUDA on a GPU) and writes, per call and rank:

* ``<stage>_rank<R>.txt``: the profiler's table of the 30 ops with the most self time (device time on a GPU);
* ``<stage>_rank<R>.json.gz``: the Chrome trace (chrome://tracing, Perfetto).

and returns with its result the call's ``perf/profile/<stage>_wall_s`` (seconds of the call, CUDA synchronised)
and ``perf/profile/<stage>_device_s`` (kernel time summed over the call's ops: ``device_s / wall_s`` well under 1
means the GPU waited for the host). A profiled step is slower than the others; its metrics carry
``perf/profiled = 1`` so that step summaries can leave it out (``tools/bench/vs_trl_report.py`` does).
"""
from __future__ import annotations

import functools
import os
import time

import torch

__all__ = ["PROFILE_KEY", "ENV", "profile_steps", "profile_meta", "profiled"]

PROFILE_KEY = "profile_dir"
ENV = "DSRL_PROFILE_STEPS"


def profile_steps(value: str | None = None) -> set[int]:
    """The steps of ``DSRL_PROFILE_STEPS`` (or ``value``): comma-separated step numbers; empty: none.

    Raises:
        ValueError: an entry that is not a positive integer (naming the variable).
    """
    text = os.environ.get(ENV, "") if value is None else value
    out = set()
    for part in (p.strip() for p in text.split(",")):
        if part:
            if not part.isdigit() or int(part) < 1:
                raise ValueError(f"{ENV}={text!r}: expected comma-separated step numbers >= 1")
            out.add(int(part))
    return out


def profile_meta(step: int, output_dir: str) -> dict:
    """``{"profile_dir": <output_dir>/profile/step_<step>, "perf/profiled": 1.0}`` for a step of
    ``DSRL_PROFILE_STEPS``, else ``{}`` (the prompts' ``meta`` of the step; ``perf/`` keys reach its metrics)."""
    if step not in profile_steps():
        return {}
    return {PROFILE_KEY: os.path.join(os.path.abspath(output_dir), "profile", f"step_{step}"), "perf/profiled": 1.0}


def _write(prof, out_dir: str, name: str, cuda: bool) -> float:
    """The table and the trace of ``prof`` under ``out_dir``; returns the summed self device time (s)."""
    os.makedirs(out_dir, exist_ok=True)
    events = prof.key_averages()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    with open(os.path.join(out_dir, f"{name}.txt"), "w", encoding="utf-8") as f:
        f.write(events.table(sort_by=sort, row_limit=30))
    prof.export_chrome_trace(os.path.join(out_dir, f"{name}.json.gz"))
    return sum(e.self_device_time_total for e in events) / 1e6 if cuda else 0.0


def profiled(stage: str):
    """Decorator of a worker method ``fn(self, data, ...)`` (``data`` a :class:`trainer.protocol.DataProto`):
    when ``data.meta`` holds ``profile_dir``, the call runs under ``torch.profiler`` (module docstring) and its
    summary goes into the result: into ``result.meta`` for a DataProto, as one-element lists into a metrics dict.
    ``self`` must have ``rank`` and ``device``."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(self, data, *args, **kwargs):
            out_dir = data.meta.get(PROFILE_KEY)
            if not out_dir:
                return fn(self, data, *args, **kwargs)
            from torch.profiler import ProfilerActivity, profile

            cuda = self.device.type == "cuda"
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            t0 = time.perf_counter()
            with profile(activities=acts) as prof:
                result = fn(self, data, *args, **kwargs)
                if cuda:
                    torch.cuda.synchronize(self.device)
            wall = time.perf_counter() - t0
            device_s = _write(prof, out_dir, f"{stage}_rank{self.rank}", cuda)
            summary = {f"perf/profile/{stage}_wall_s": wall, f"perf/profile/{stage}_device_s": device_s}
            if isinstance(result, dict):
                result.update({k: [v] for k, v in summary.items()})
            else:
                result.meta.update(summary)
            return result
        return wrapper
    return decorator
