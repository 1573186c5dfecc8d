"""What a run asks of the machine or Ray cluster, checked against what exists before any worker starts.

A run asks for ``trainer.nnodes`` nodes, each hosting ``trainer.n_gpus_per_node`` workers; every worker takes one
bundle of ``trainer.cpus_per_worker`` CPUs (+ 1 GPU with ``trainer.device=cuda``). The roles of a worker slot
(actor+rollout+ref, critic, PRIME's PRM) split its bundle (``1/roles`` of its CPUs and GPU each), so a run needs
exactly ``nnodes * n_gpus_per_node`` bundles, plus the bundles of rollout workers placed on their own
(``trainer.rollout_placement=separate`` with an integer ``actor_rollout_ref.rollout.n_gpus``;
:mod:`trainer.rollout_placement`). :func:`check_request` compares that with:

* this machine, before a local Ray starts (its CPUs from the process's CPU affinity, its GPUs from CUDA; one node);
* the Ray cluster, once joined (``RAY_ADDRESS``) or started: the CPUs and GPUs not in use, and each alive node's
  CPUs and GPUs (``ray.nodes()``), since a node must hold all ``n_gpus_per_node`` workers it is given.

Every refusal is one :class:`PlacementError` line naming the request (workers x CPUs per worker, nodes) and what
was found.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass


class PlacementError(RuntimeError):
    """The machine or Ray cluster cannot place the requested workers (or a ``RAY_ADDRESS`` does not answer)."""


@dataclass(frozen=True)
class ResourceRequest:
    """The resources of a run (from the ``trainer`` config section).

    Attributes:
        device: ``cpu`` or ``cuda``.
        nnodes: nodes (``trainer.nnodes``).
        workers_per_node: workers per node (``trainer.n_gpus_per_node``).
        cpus_per_worker: logical Ray CPUs per worker bundle (``trainer.cpus_per_worker``).
        rollout_bundles: bundles of rollout workers of their own (``trainer.rollout_placement=separate``), one
            worker each, beside the ``nnodes * workers_per_node`` bundles of the other roles.
    """

    device: str
    nnodes: int
    workers_per_node: int
    cpus_per_worker: int
    rollout_bundles: int = 0

    @classmethod
    def from_config(cls, trainer_cfg: dict, rollout_bundles: int = 0) -> "ResourceRequest":
        """Raises PlacementError for non-integer or non-positive counts. ``rollout_bundles``: see the class."""
        vals = {}
        for key in ("nnodes", "n_gpus_per_node", "cpus_per_worker"):
            v = trainer_cfg[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlacementError(f"trainer.{key}={v!r}; expected an integer >= 1")
            vals[key] = v
        return cls(trainer_cfg["device"], vals["nnodes"], vals["n_gpus_per_node"], vals["cpus_per_worker"],
                   int(rollout_bundles))

    @property
    def world(self) -> int:
        return self.nnodes * self.workers_per_node

    @property
    def bundles(self) -> int:
        """Every bundle of the run: the roles' ``world`` and the rollout workers' own."""
        return self.world + self.rollout_bundles

    def bundle(self) -> dict[str, float]:
        """One worker's Ray bundle."""
        return {"GPU": 1, "CPU": self.cpus_per_worker} if self.device == "cuda" else {"CPU": self.cpus_per_worker}

    def describe(self) -> str:
        gpu = " + 1 GPU" if self.device == "cuda" else ""
        rollout = (f" + {self.rollout_bundles} rollout workers (trainer.rollout_placement=separate, "
                   f"actor_rollout_ref.rollout.n_gpus={self.rollout_bundles})") if self.rollout_bundles else ""
        return (f"{self.bundles} workers x {self.cpus_per_worker} CPUs{gpu} (trainer.nnodes={self.nnodes} x "
                f"trainer.n_gpus_per_node={self.workers_per_node}{rollout}, "
                f"trainer.cpus_per_worker={self.cpus_per_worker})")


def machine_resources(device: str) -> list[dict[str, float]]:
    """This machine as one node: ``[{"CPU": usable CPUs, "GPU": visible CUDA devices (0 for device=cpu)}]``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    gpus = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    return [{"CPU": float(cpus), "GPU": float(gpus)}]


def ray_node_resources() -> list[dict[str, float]]:
    """Each alive node of the connected Ray cluster: ``{"CPU", "GPU", "ip"}`` (totals of the node)."""
    import ray

    return [{"CPU": float(n["Resources"].get("CPU", 0)), "GPU": float(n["Resources"].get("GPU", 0)),
             "ip": n.get("NodeManagerAddress", "?")} for n in ray.nodes() if n.get("Alive")]


def check_request(req: ResourceRequest, nodes: list[dict[str, float]], where: str,
                  free: dict[str, float] | None = None) -> None:
    """Refuse a request that ``nodes`` (and the ``free`` totals, when given) cannot place.

    Args:
        req: the run's request.
        nodes: per node ``{"CPU": n, "GPU": n}`` (totals).
        where: how the message names them ("this machine", "the Ray cluster at RAY_ADDRESS=...").
        free: the cluster's resources not in use (``ray.available_resources()``); None: all of ``nodes``.

    Raises:
        PlacementError: one line naming the request and the CPUs, GPUs or nodes found.
    """
    have = free if free is not None else {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    state = "free " if free is not None else ""
    need_cpu = req.bundles * req.cpus_per_worker
    if have.get("CPU", 0.0) < need_cpu:
        raise PlacementError(f"{req.describe()} = {need_cpu} CPUs requested, but {where} has "
                             f"{_num(have.get('CPU', 0.0))} {state}CPUs; lower trainer.n_gpus_per_node or "
                             "trainer.cpus_per_worker, or add nodes")
    if req.device == "cuda" and have.get("GPU", 0.0) < req.bundles:
        raise PlacementError(f"{req.bundles} GPUs requested ({req.describe()}), but {where} has "
                             f"{_num(have.get('GPU', 0.0))} {state}GPU(s); lower trainer.n_gpus_per_node or add "
                             "nodes (ray start --address ...)")
    per_node = {"CPU": req.workers_per_node * req.cpus_per_worker}
    if req.device == "cuda":
        per_node["GPU"] = req.workers_per_node
    fit = [n for n in nodes if all(n.get(k, 0.0) >= v for k, v in per_node.items())]
    if len(fit) < req.nnodes:
        found = "; ".join(f"{n.get('ip', 'node')}: {_num(n.get('CPU', 0))} CPUs, {_num(n.get('GPU', 0))} GPUs"
                          for n in nodes)
        size = ", ".join(f"{_num(v)} {k}s" for k, v in per_node.items())
        raise PlacementError(f"trainer.nnodes={req.nnodes} nodes of {req.workers_per_node} workers ({size} each) "
                             f"requested, but {where} has {len(nodes)} node(s), {len(fit)} of them big enough "
                             f"({found})")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def probe_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when ``address`` (``host:port`` or ``ray://host:port``) does not accept a TCP connection.

    ``auto`` and addresses without a port are left to ``ray.init``. Raises PlacementError naming the address.
    """
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise PlacementError(f"RAY_ADDRESS={address!r} does not answer ({exc.strerror or exc}); start the Ray head "
                             "there (ray start --head --port ...) or unset RAY_ADDRESS for a local Ray") from None
