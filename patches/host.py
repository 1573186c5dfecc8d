"""Host-side helpers of the packed forward: copying a micro-batch to the GPU without a stream sync, and running the
host-side packing on one intra-op thread."""
from __future__ import annotations

import contextlib

import torch

__all__ = ["to_device", "host_op_threads"]


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """Copy ``x`` to ``device`` without waiting for the GPU's queue.

    A host tensor goes through pinned memory with ``non_blocking=True`` (torch's plain ``.to("cuda")`` from pageable
    memory synchronises the stream, which stalls the GPU at every micro-batch); anything else is ``x.to(device)``.
    ``device=None`` returns ``x``.
    """
    if device is None:
        return x
    device = torch.device(device)
    if x.device.type == "cpu" and device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


@contextlib.contextmanager
def host_op_threads(n: int = 1):
    """Run the block's CPU tensor ops on ``n`` intra-op threads, then restore the previous count.

    The host-side packing of a micro-batch (a few ops on ``(batch, seq_len)`` int64 tensors) gains nothing from
    intra-op parallelism, and with a large thread pool its ops wait for the pool: in a profiled actor update on one
    H200 machine (16 cores, CUDA graphs) the GPU's longest idle gaps were spent in such host ops (``aten::index``,
    ``repeat_interleave``, ``diff``); one thread raised the update's MFU from 38.0% to 42.2-42.8% there (16
    micro-batches of 4k tokens per step, same machine), and on a 2-core box the packing of a 4,096-token micro-batch
    took 24 ms on 2 threads and 0.2 ms on 1 (17.8 vs 0.65 ms with both cores busy with other processes, about
    0.2 ms either way on an idle box; docs/benchmarks.md). A process given one CPU (a Ray worker with
    ``num_cpus=1``) already runs one thread.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"host_op_threads needs n >= 1, got {n}")
    prev = torch.get_num_threads()
    if prev == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
