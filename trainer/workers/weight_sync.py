"""The actor's weights pushed to rollout workers placed on their own (``trainer.rollout_placement=separate``).

A process group of its own joins the actor's rank 0 (group rank 0) and the N rollout workers (ranks 1..N),
outside DeepSpeed's group: a ``torch.distributed.TCPStore`` served by the actor's rank 0 and a
``ProcessGroupGloo`` (CPU, or when an engine shares the actor's GPU) or ``ProcessGroupNCCL`` (engines on GPUs of
their own). The actor's parameters are walked in the buckets of the colocated weight sync
(:func:`rollout.context.iter_actor_params`, ``rollout.update_weights_bucket_megabytes``; ZeRO-3 gathers one bucket
at a time on every actor rank); each bucket goes out as one flat tensor per dtype in one ``broadcast`` from rank
0. The receivers know every bucket's names, shapes and dtypes in advance (:func:`weights_layout`, sent once over
Ray when the group is made), so nothing but tensor data crosses the group.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Iterable, Sequence

import torch
import torch.distributed as dist

__all__ = ["WeightGroup", "bucket_layout", "weights_layout", "broadcast_bucket", "receive_bucket", "WeightSender"]

NamedTensor = tuple[str, torch.Tensor]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bucket_layout(bucket: Sequence[NamedTensor]) -> list[dict]:
    """How one bucket travels: a part per dtype (in order of first appearance), each
    ``{"dtype": "float32", "tensors": [(name, shape), ...]}`` in the bucket's order."""
    parts: dict[str, list] = {}
    for name, t in bucket:
        parts.setdefault(_dtype_name(t.dtype), []).append((name, tuple(t.shape)))
    return [{"dtype": d, "tensors": ts} for d, ts in parts.items()]


def weights_layout(buckets: Iterable[Sequence[NamedTensor]]) -> list[list[dict]]:
    """:func:`bucket_layout` of every bucket, in order (the receivers' plan of one push)."""
    return [bucket_layout(b) for b in buckets]


class WeightGroup:
    """One rank of the weight group (see the module docstring).

    Args:
        addr, port: the TCPStore served by rank 0 (the actor's rank 0 picks them).
        rank, world: 0 for the actor's rank 0, 1..N for the rollout workers; N + 1.
        backend: ``gloo`` (tensors on the CPU) or ``nccl`` (tensors on this process's current CUDA device).
        timeout_s: how long a rendezvous or a broadcast may wait for the other ranks.

    Raises:
        ValueError: an unknown backend; RuntimeError: this torch build lacks NCCL.
    """

    def __init__(self, addr: str, port: int, rank: int, world: int, backend: str, timeout_s: float = 1800.0):
        timeout = timedelta(seconds=float(timeout_s))
        self.rank, self.world, self.backend = rank, world, backend
        self.store = dist.TCPStore(addr, int(port), world, rank == 0, timeout=timeout)
        prefix = dist.PrefixStore("dsrl_weights", self.store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefix, rank, world, timeout)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            nccl = getattr(dist, "ProcessGroupNCCL", None)
            if nccl is None:
                raise RuntimeError("the weight push over NCCL needs a CUDA build of torch")
            opts = nccl.Options()
            opts._timeout = timeout
            self.pg = nccl(prefix, rank, world, opts)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"weight group backend {backend!r}; expected gloo or nccl")

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's ``tensor`` (same shape and dtype, on :attr:`device`)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()


def broadcast_bucket(group: WeightGroup, bucket: Sequence[NamedTensor]) -> int:
    """Send one bucket from rank 0 (the parts of :func:`bucket_layout`, one ``broadcast`` each); returns bytes sent."""
    sent = 0
    for part in bucket_layout(bucket):
        names = {n for n, _ in part["tensors"]}
        flat = torch.cat([t.detach().reshape(-1) for n, t in bucket if n in names]).to(group.device)
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    return sent


def receive_bucket(group: WeightGroup, layout: list[dict]) -> list[NamedTensor]:
    """Receive one bucket sent by :func:`broadcast_bucket` with this ``layout``; returns ``(name, tensor)`` pairs,
    each tensor a CPU copy of its own (not a view of the flat buffer)."""
    out: list[NamedTensor] = []
    for part in layout:
        dtype = getattr(torch, part["dtype"])
        sizes = [int(torch.Size(shape).numel()) for _, shape in part["tensors"]]
        flat = torch.empty(sum(sizes), dtype=dtype, device=group.device)
        group.broadcast(flat)
        for (name, shape), piece in zip(part["tensors"], torch.split(flat, sizes)):
            out.append((name, piece.reshape(shape).to("cpu", copy=True)))
    return out


class WeightSender:
    """The actor worker's side of the push (mixed into :class:`trainer.workers.actor.ActorRolloutRefWorker`).

    Every actor rank runs :meth:`weights_layout` and :meth:`push_weights` (ZeRO-3 gathers each bucket on all of
    them); only rank 0 is in the weight group and sends.
    """

    _weight_group: WeightGroup | None = None

    def _weight_buckets(self):
        from rollout.context import iter_actor_params

        bucket = self.config.rollout.update_weights_bucket_megabytes * 2 ** 20
        return iter_actor_params(self.actor.engine.module, self.config.deepspeed.zero_stage, bucket)

    def weight_sync_address(self) -> tuple[str, int]:
        """A free ``(ip, port)`` on this node for the weight group's store (asked of rank 0, which holds the port
        until :meth:`init_weight_sync` binds it: :func:`trainer.workers.base.reserve_port`)."""
        from trainer.workers.base import node_ip, reserve_port

        return node_ip(), reserve_port()

    def weights_layout(self) -> list[list[dict]]:
        """:func:`weights_layout` of this rank's walk over the actor's parameters (every rank takes part)."""
        return weights_layout(self._weight_buckets())

    def init_weight_sync(self, addr: str, port: int, world: int, backend: str, timeout_s: float) -> None:
        """Join the weight group as its rank 0 (actor rank 0 only; the other ranks do nothing)."""
        if self.rank == 0:
            from trainer.workers.base import release_port

            release_port(port)
            self._weight_group = WeightGroup(addr, port, 0, world, backend, timeout_s)

    @torch.no_grad()
    def push_weights(self) -> dict[str, float]:
        """Broadcast the actor's current weights to the rollout workers; returns ``{"seconds", "bytes"}``."""
        t0, sent = time.perf_counter(), 0
        for bucket in self._weight_buckets():
            if self._weight_group is not None:
                sent += broadcast_bucket(self._weight_group, bucket)
        return {"seconds": time.perf_counter() - t0, "bytes": float(sent)}
