"""Ray placement: one placement group for the run, worker groups pinned to its bundles, and dispatch.

One bundle per worker slot: ``{"GPU": 1, "CPU": k}`` on GPU machines, ``{"CPU": k}`` with
``trainer.device=cpu``. Roles that share the slots (actor+rollout+ref in one worker; the critic beside it)
take a fraction of each bundle. A group's ranks start side by side; rank 0 picks the rendezvous address, the
others receive it before their first call and join it.

Dispatch modes (how a method's batch is split over ranks and gathered back):

* ``run_all``: the same arguments to every rank (init, save, load); returns the list of results.
* ``dispatch_dp``: split rows into ``dp`` equal chunks; SP peers of a data-parallel rank (``rank // sp``)
  receive the same chunk; results are concatenated from the first SP rank of each data-parallel rank.
* ``dispatch_all``: split rows over every rank (generation is not sequence-parallel); ``submit_all`` does the same
  without waiting (a :class:`PendingCall`, e.g. the pipelined rollout of ``trainer.async.staleness``).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainer.local_workers import WORKER_WARNING_FILTER
from trainer.protocol import DataProto
from trainer.resources import (PlacementError, ResourceRequest, check_request, machine_resources, probe_ray_address,
                               ray_node_resources)
from trainer.worker_errors import WorkerDied, WorkerFailure  # noqa: F401  (raised here; imported from here too)

logger = logging.getLogger(__name__)
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def init_ray(device: str) -> None:
    """Join ``RAY_ADDRESS`` when set (PlacementError at once when it does not answer), else start a local Ray on
    this machine's own CPUs and GPUs (Ray's count; never raised to fit a request: see :func:`check_placement`).

    Without ``RAY_ADDRESS`` the local Ray is always a new one (``address="local"``): a bare ``ray.init()`` would join
    the last cluster that ``ray start`` left on this machine, or hang for minutes on one that has since stopped."""
    if ray.is_initialized():
        return
    env = {"TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": os.pathsep.join(
        p for p in (PROJECT_ROOT, os.environ.get("PYTHONPATH", "")) if p)}
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    # workers: no "Loading weights" bars (they print after the driver's own lines), and not DeepSpeed's use of a
    # torch collective that torch has deprecated, once per rank (a user's own settings of either are kept)
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS", ""), WORKER_WARNING_FILTER) if w)
    for key in ("TORCH_CUDA_ARCH_LIST", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE", "DSRL_CONFIG_READS"):
        if key in os.environ:
            env[key] = os.environ[key]
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "include_dashboard": False,
                              "logging_level": logging.WARNING, "log_to_driver": True}
    address = os.environ.get("RAY_ADDRESS")
    if address:
        probe_ray_address(address)
    from trainer.interrupt import ray_init_guard

    try:
        # the driver's Ctrl-C / SIGTERM handling stays in force during ray.init (Ray's own handlers are not
        # installed; a signal meanwhile is raised when it returns) and a local Ray runs in its own session
        with ray_init_guard():
            ray.init(address=address or "local", **kwargs)
    except ConnectionError as exc:
        raise PlacementError(f"RAY_ADDRESS={address!r}: could not join a Ray cluster there "
                             f"({str(exc).splitlines()[0]}); start one with ray start --head, or unset RAY_ADDRESS "
                             "for a local Ray; with Ray's token authentication set RAY_AUTH_MODE=token and the head's "
                             "token (~/.ray/auth_token)") from None


def start_workers(roles, cfg: dict, t, device: str, world: int, rollout_bundles: int = 0):
    """Start Ray, place the run's bundles and start every role's workers (:meth:`trainer.roles.Roles.start`); with
    ``trainer.single_process`` (``t``: the trainer section) the actor's one worker is built in this process instead
    (:class:`trainer.local_workers.LocalWorkerGroup`: no Ray, no placement group). Returns ``(placement group or None,
    {role: [per-rank init info]}, time.time() when the workers began to start)``."""
    if t.single_process:
        from trainer.local_workers import LocalWorkerGroup

        if len(roles.specs) != 1:  # single_process_problem refuses these runs before start-up
            raise ValueError(f"trainer.single_process=true runs the actor alone; roles {[r.name for r in roles.specs]}")
        r, t_workers, t0 = roles.specs[0], time.time(), time.perf_counter()
        roles.attach(r.name, LocalWorkerGroup(r.worker(), r.name, r.worker_config(cfg), device))
        infos, roles.startup_s = init_models([(r.name, roles.get(r.name))], t0, first="worker")
        return None, infos, t_workers
    init_ray(device)
    pg = create_placement_group(device, t.nnodes, t.n_gpus_per_node, t.cpus_per_worker, rollout_bundles=rollout_bundles)
    t_workers = time.time()
    return pg, roles.start(pg, world, cfg, device, t.cpus_per_worker), t_workers


def startup_split(t_ray: float, t_workers: float, now: float | None = None, parts: dict | None = None,
                  restart: bool = False, no_ray: bool = False) -> str:
    """The driver's start-up as one phrase for the log: seconds from the process start (the operating system's
    start time, :func:`trainer.hf_exports.process_start_time`; with ``restart``, from ``t_ray``) to ``now``
    (default: the current time), split at ``t_ray`` (:func:`init_ray` called) and ``t_workers`` (the placement
    group placed, the workers starting). All three are ``time.time()`` values in seconds. ``parts``: ``{name:
    seconds}`` of the workers' start-up (:func:`init_models`), listed after it in that order. ``no_ray``: the worker
    was built in this process (``trainer.single_process``)."""
    from trainer.hf_exports import process_start_time

    now = time.time() if now is None else now
    detail = ": " + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items()) if parts else ""
    workers = ("no Ray, the worker's start-up" if no_ray else
               f"Ray and the placement group {t_workers - t_ray:.1f} s, the workers' start-up") + \
        f" {now - t_workers:.1f} s"
    if restart:
        return f"{now - t_ray:.1f} s after the restart began ({workers}{detail})"
    start = process_start_time()
    before = "before the worker" if no_ray else "before Ray"
    return f"{now - start:.1f} s after the process started ({before} {t_ray - start:.1f} s, {workers}{detail})"


def init_models(clients: list[tuple[str, Any]], t0: float,
                first: str = "processes") -> tuple[dict[str, list[dict]], dict[str, float]]:
    """Each role's ``init_model`` in turn (``clients``: ``(role name, client)``, start-up order), once its workers'
    processes, created from ``t0`` (``time.perf_counter()`` seconds) on, have started. Returns ``({role: per-rank
    init info}, {part: seconds})``: ``processes`` (``t0`` to now), then each role's build, named by the role, or by
    the parts its rank 0 reports in ``startup_s`` (the actor's: imports, distributed, actor, reference, rollout
    engine). ``first``: the name of the first part (``worker`` for a worker built in this process)."""
    parts, infos = {first: time.perf_counter() - t0}, {}
    for name, client in clients:
        t = time.perf_counter()
        infos[name] = client.init_model()
        split = infos[name][0].get("startup_s") if infos[name] else None
        parts.update(split or {name: time.perf_counter() - t})
    return infos, parts


def _where() -> str:
    address = os.environ.get("RAY_ADDRESS")
    return f"the Ray cluster at RAY_ADDRESS={address}" if address else "the local Ray"


def check_placement(trainer_cfg: dict, rollout_bundles: int = 0) -> ResourceRequest:
    """Check the run's workers against what exists, before any worker starts (see :mod:`trainer.resources`).

    Without ``RAY_ADDRESS``: against this machine (one node) before Ray starts; with it: joins the cluster and
    checks its free CPUs/GPUs and its nodes. :func:`create_placement_group` checks the Ray cluster again.

    ``rollout_bundles``: bundles of rollout workers of their own (:attr:`trainer.rollout_placement.
    RolloutPlacement.rollout_bundles`).

    Raises:
        PlacementError: one line naming the request and what was found.
    """
    req = ResourceRequest.from_config(trainer_cfg, rollout_bundles)
    if not os.environ.get("RAY_ADDRESS") or trainer_cfg.get("single_process"):  # no Ray is joined then
        check_request(req, machine_resources(req.device), "this machine")
        return req
    init_ray(req.device)
    check_request(req, ray_node_resources(), _where(), free=ray.available_resources())
    return req


def create_placement_group(device: str, nnodes: int, n_gpus_per_node: int, cpus_per_worker: int,
                           timeout_s: float = 60.0, rollout_bundles: int = 0):
    """One placement group with ``nnodes * n_gpus_per_node`` bundles (:meth:`ResourceRequest.bundle`), then
    ``rollout_bundles`` more for rollout workers of their own: PACK on one node; SPREAD over the nodes when
    ``nnodes > 1`` (Ray places bundles on distinct nodes as evenly as it can).

    Raises:
        PlacementError: when the cluster lacks the CPUs, GPUs or nodes (naming what was asked and what exists), or
            the bundles are not placed within ``timeout_s``.
    """
    req = ResourceRequest(device, nnodes, n_gpus_per_node, cpus_per_worker, rollout_bundles)
    check_request(req, ray_node_resources(), _where(), free=ray.available_resources())
    bundle = req.bundle()
    pg = placement_group([dict(bundle) for _ in range(req.bundles)], strategy="SPREAD" if nnodes > 1 else "PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"could not place {req.bundles} bundles of {bundle} within {timeout_s:.0f} s "
                             f"(cluster: {ray.cluster_resources()})")
    return pg


class WorkerGroup:
    """``world_size`` Ray actors of ``cls`` (one per bundle) forming one DeepSpeed process group.

    Args:
        cls: a :class:`trainer.workers.base.DistributedWorker` subclass; its ``CONCURRENCY_GROUPS`` attribute
            (``{name: threads}``), when set, gives the Ray actor those concurrency groups (methods marked with
            ``ray.method(concurrency_group=name)`` run there, beside the default group's one call at a time).
        role: name used in errors and logs (actor, critic, ...).
        share: fraction of each bundle this role takes (roles colocated on a bundle share it).
        bundle_offset: rank ``r`` runs on bundle ``bundle_offset + r``.
        worker_config: what each worker's constructor receives (its role's typed config, picklable).
        timeout_s: the bound of every call of the group (``trainer.ray_timeout_s``); None: none.
    """

    #: seconds to wait, after one rank raised, for another rank's call to end in its process's death (reported instead)
    PEER_DEATH_GRACE_S = 10.0

    def __init__(self, cls, role: str, pg, world_size: int, worker_config: Any, device: str, cpus_per_worker: int,
                 share: float = 1.0, sp_size: int = 1, bundle_offset: int = 0, timeout_s: float | None = None,
                 wait: bool = True):
        self.role, self.world_size, self.sp_size = role, world_size, sp_size
        self.timeout_s = timeout_s
        if world_size % sp_size:
            raise ValueError(f"{role}: ulysses_sequence_parallel_size={sp_size} does not divide {world_size} workers")
        self.dp_size = world_size // sp_size
        opts: dict[str, Any] = {"num_cpus": cpus_per_worker * share}
        if device == "cuda":
            opts["num_gpus"] = share
        groups = getattr(cls, "CONCURRENCY_GROUPS", None)
        remote = ray.remote(concurrency_groups=dict(groups))(cls) if groups else ray.remote(cls)
        # every rank's process starts now, side by side (each imports torch, DeepSpeed and the model code, seconds
        # of CPU): rank 0 picks the rendezvous address in its constructor, the others receive it in
        # set_master_addr_port (see wait_started), before any other call
        self.workers = [remote.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle_offset + rank), name=None, **opts).remote(
            worker_config, rank, world_size, None, None, device, role) for rank in range(world_size)]
        self.pids: list[int] = []
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait until every rank's process runs its worker (created with ``wait=False``: several groups then start
        side by side), hand rank 0's rendezvous address to the other ranks and log where each rank runs."""
        if self.pids:
            return
        ranks = list(range(self.world_size))
        addr, port = self._get([self.workers[0].get_master_addr_port.remote()], "get_master_addr_port", [0])[0]
        self._get([w.set_master_addr_port.remote(addr, port) for w in self.workers[1:]], "set_master_addr_port",
                  ranks[1:])
        where = self._get([w.location.remote() for w in self.workers], "location", ranks)
        self.pids = [w["pid"] for w in where]
        self.node_ids = [w["node_id"] for w in where]
        self.master_addr = f"{addr}:{port}"
        logger.info("%s workers: %s", self.role, ", ".join(f"rank {r} pid {p}" for r, p in enumerate(self.pids)))
        logger.info("%s nodes: %s; rendezvous at %s", self.role,
                    ", ".join(f"rank {r} on node {w['node_id'][:12]} ({w['node_ip']})" for r, w in enumerate(where)),
                    self.master_addr)

    # ---- calls --------------------------------------------------------------------------------------------
    def _get(self, futures: list, method: str, ranks: list[int], timeout_s: float | None = None) -> list:
        """Wait for ``futures``; the first failure raises :class:`WorkerFailure` naming role, rank and method (a rank
        that died is named before a peer whose call raised because of it; see :meth:`_raise_if_a_peer_died`)."""
        pending = dict(zip(futures, ranks))
        results: dict[Any, Any] = {}
        timeout_s = getattr(self, "timeout_s", None) if timeout_s is None else timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not done:
                raise WorkerFailure(f"{self.role}.{method} did not finish within {timeout_s:.0f} s on ranks "
                                    f"{sorted(pending.values())}")
            ref = done[0]
            rank = pending.pop(ref)
            try:
                results[ref] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                raise WorkerDied(f"{self.role} rank {rank} died during {method}: {exc}") from exc
            except ray.exceptions.RayTaskError as exc:
                self._raise_if_a_peer_died(pending, method, f"rank {rank} raised: {str(exc)[:300]}", deadline)
                raise WorkerFailure(f"{self.role} rank {rank} raised in {method}: {exc}") from exc
        return [results[f] for f in futures]

    def _raise_if_a_peer_died(self, pending: dict, method: str, seen: str, deadline: float | None = None) -> None:
        """After one rank raised: if another rank's call ends within :attr:`PEER_DEATH_GRACE_S` (and before
        ``deadline``) because its process died, raise that death (the root cause; the raising rank's error is often
        its collective failing because of it, e.g. gloo's "Connection reset by peer"), else return, so that the
        caller reports the rank that raised; any other error of a peer (its own raise, a lost object) is ignored."""
        if not pending:
            return
        grace = self.PEER_DEATH_GRACE_S
        if deadline is not None:
            grace = max(0.0, min(grace, deadline - time.monotonic()))
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=grace)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                raise WorkerDied(f"{self.role} rank {pending[ref]} died during {method}: {exc} (then {seen})") \
                    from exc
            except Exception:  # noqa: BLE001 (not a death: the rank that raised first is the one reported)
                pass

    def run_all(self, method: str, *args, **kwargs) -> list:
        futures = [getattr(w, method).remote(*args, **kwargs) for w in self.workers]
        return self._get(futures, method, list(range(self.world_size)))

    def dispatch_dp(self, method: str, data: DataProto) -> DataProto:
        chunks = data.chunk(self.dp_size)
        futures = [getattr(w, method).remote(chunks[r // self.sp_size]) for r, w in enumerate(self.workers)]
        outs = self._get(futures, method, list(range(self.world_size)))
        return DataProto.concat_workers([outs[d * self.sp_size] for d in range(self.dp_size)])

    def dispatch_dp_metrics(self, method: str, data: DataProto) -> list[dict]:
        chunks = data.chunk(self.dp_size)
        futures = [getattr(w, method).remote(chunks[r // self.sp_size]) for r, w in enumerate(self.workers)]
        return self._get(futures, method, list(range(self.world_size)))

    def dispatch_all(self, method: str, data: DataProto) -> DataProto:
        return self.submit_all(method, data).result()

    def submit_all(self, method: str, data: DataProto) -> "PendingCall":
        """``dispatch_all`` without waiting: the rows are split over every rank and the call started."""
        chunks = data.chunk(self.world_size)
        return PendingCall(self, method, [getattr(w, method).remote(c) for w, c in zip(self.workers, chunks)])

    def start_all(self, method: str, *args, **kwargs) -> "PendingCall":
        """``run_all`` without waiting (the same arguments to every rank)."""
        return PendingCall(self, method, [getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def shutdown(self) -> None:
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # already dead
                pass


class PendingCall:
    """A call started on every rank of a :class:`WorkerGroup` and not waited for yet.

    ``result()`` waits with the group's rules (:meth:`WorkerGroup._get`: a dead rank raises :class:`WorkerDied`
    naming the role, rank and method) and returns the ranks' results joined (:meth:`DataProto.concat_workers`) when
    they are batches, else the list of results; ``done()`` is true once every rank returned.
    """

    def __init__(self, group: WorkerGroup, method: str, futures: list):
        self.group, self.method, self.futures = group, method, futures

    def done(self) -> bool:
        ready, _ = ray.wait(list(self.futures), num_returns=len(self.futures), timeout=0)
        return len(ready) == len(self.futures)

    def result(self):
        outs = self.group._get(self.futures, self.method, list(range(len(self.futures))))
        return DataProto.concat_workers(outs) if outs and all(isinstance(o, DataProto) for o in outs) else outs
