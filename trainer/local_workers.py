"""The actor's one worker inside the driver process (``trainer.single_process=true``): no Ray, no worker process.

On one GPU (or one CPU worker) the Ray path pays for a local Ray (GCS, raylet: seconds), a worker process that
imports torch, DeepSpeed and transformers again (seconds more) and a serialised copy of every batch through Ray's
object store; TRL's single-process trainer pays none of these. :class:`LocalWorkerGroup` builds the role's worker
class (the same :class:`trainer.workers.actor.ActorRolloutRefWorker`) in this process and answers the dispatch
calls of :class:`trainer.placement.WorkerGroup` by calling it directly, so the training step is the same code.

What stays as with Ray:

* every call's arguments and results are copies (a pickle round trip, as Ray's serialisation makes them): a worker
  that keeps a buffer it returned (a fixed-address rollout buffer on the CPU) or edits a batch it was given never
  changes the driver's rows;
* a worker's exception is raised as :class:`trainer.placement.WorkerFailure` naming the role, rank 0 and the
  method, with the worker's exception as its cause;
* the workers' environment: ``TOKENIZERS_PARALLELISM=false``, no "Loading weights" bars
  (``HF_HUB_DISABLE_PROGRESS_BARS``), DeepSpeed's deprecated-collective warning filtered (a user's own settings of
  these are kept); ``DS_ACCELERATOR=cpu`` and ``cpus_per_worker`` threads on the CPU (the worker's constructor).

What it cannot do (refused before start-up, :func:`single_process_problem`): more than one worker (nnodes x
n_gpus_per_node > 1), roles other than the actor (a critic, PRIME's PRM, separate rollout workers: each is a
process group of its own), worker restarts (``trainer.max_restarts > 0`` re-creates dead worker processes), the
Megatron strategy. A crash of the worker's native code (a CUDA error, out of host memory) ends the driver too.
"""
from __future__ import annotations

import atexit
import os
import pickle
import warnings
from typing import Any

__all__ = ["LocalWorkerGroup", "LocalCall", "single_process_problem", "check_single_process", "worker_environment"]

#: the warning the Ray workers filter (trainer.placement.WORKER_WARNING_FILTER): DeepSpeed's use of a collective torch
#: has deprecated, once per call
_DEPRECATED_COLLECTIVE = r"`torch.distributed.all_gather_into_tensor` is deprecated"


def single_process_problem(cfg: dict) -> str | None:
    """Why ``trainer.single_process=true`` cannot run the resolved config ``cfg`` (one line naming the setting and
    what to change), or None when it can (or the key is false)."""
    t = cfg["trainer"]
    if not t.get("single_process"):
        return None
    key = "trainer.single_process=true"
    workers = int(t["nnodes"]) * int(t["n_gpus_per_node"])
    if workers != 1:
        return (f"{key} runs one worker in this process; trainer.nnodes={t['nnodes']} x "
                f"trainer.n_gpus_per_node={t['n_gpus_per_node']} asks for {workers}: set both to 1, or "
                "trainer.single_process=false")
    if t.get("strategy", "deepspeed") != "deepspeed":
        return f"{key} runs the DeepSpeed worker; trainer.strategy={t['strategy']}: set trainer.single_process=false"
    if t.get("rollout_placement", "colocated") != "colocated":
        return (f"{key} runs the actor's worker alone; trainer.rollout_placement={t['rollout_placement']} needs "
                "rollout workers of their own: set trainer.single_process=false")
    from trainer.run_roles import trained_roles

    others = {"critic": "a critic (critic.enable, or algorithm.adv_estimator=gae)",
              "reward_model.model": "PRIME's reward model (algorithm.use_prime=true)"}
    for role, _ in trained_roles(cfg):
        if role in others:
            return f"{key} runs the actor's worker alone; this run also trains {others[role]}: " \
                   "set trainer.single_process=false"
    if int(t.get("max_restarts") or 0) > 0:
        return (f"{key} has no worker process to re-create; trainer.max_restarts={t['max_restarts']}: set it to 0, "
                "or trainer.single_process=false")
    return None


def check_single_process(cfg: dict) -> None:
    """:func:`single_process_problem` as a check (:func:`trainer.config_validate.validate`).

    Raises:
        ConfigError: the one line naming the setting that single-process mode cannot run.
    """
    problem = single_process_problem(cfg)
    if problem:
        from trainer.config_checks import ConfigError

        raise ConfigError(problem)


def worker_environment(device: str) -> None:
    """The environment the Ray workers get from :func:`trainer.placement.init_ray`, set in this process (a value
    the user set is kept)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVE, category=FutureWarning)


def _destroy_process_group() -> None:
    """At exit: the worker's process group destroyed (a Ray worker's ends with its process; NCCL warns of a group
    left at the driver's exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _copied(value: Any) -> Any:
    """``value`` after a pickle round trip (what a Ray call's arguments and results go through)."""
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


class LocalCall:
    """A call already made (in-process calls return when done): :class:`trainer.placement.PendingCall`'s
    ``done`` / ``result``."""

    def __init__(self, outs: list):
        self.outs = outs

    def done(self) -> bool:
        return True

    def result(self):
        from trainer.protocol import DataProto

        outs = self.outs
        return DataProto.concat_workers(outs) if outs and all(isinstance(o, DataProto) for o in outs) else outs


class LocalWorkerGroup:
    """One rank of worker class ``cls`` built in this process, with :class:`trainer.placement.WorkerGroup`'s
    attributes and dispatch calls (``world_size = dp_size = sp_size = 1``).

    Args:
        cls: the role's worker class (a :class:`trainer.workers.base.DistributedWorker` subclass).
        role: the role's name in errors and logs.
        worker_config: what the worker's constructor receives (as with Ray).
        device: ``cpu`` or ``cuda`` (LOCAL_RANK 0: the first visible GPU).

    Raises:
        WorkerFailure: the constructor or a call raised (the worker's exception is the cause).
    """

    def __init__(self, cls, role: str, worker_config: Any, device: str):
        from trainer.workers.base import node_ip

        self.role, self.world_size, self.dp_size, self.sp_size, self.timeout_s = role, 1, 1, 1, None
        worker_environment(device)
        atexit.register(_destroy_process_group)
        self.worker = self._call(lambda: cls(worker_config, 0, 1, None, None, device, role), "__init__")
        self.workers = [self.worker]
        addr, port = self.worker.get_master_addr_port()
        self.pids, self.node_ids, self.master_addr = [os.getpid()], ["local"], f"{addr}:{port}"
        self.node_ip = node_ip()

    def wait_started(self) -> None:
        """Nothing to wait for (the worker was built in the constructor)."""

    def _call(self, fn, method: str):
        from trainer.worker_errors import WorkerFailure

        try:
            return fn()
        except Exception as exc:  # as a Ray worker's: named, with the worker's error as the cause
            raise WorkerFailure(f"{self.role} rank 0 raised in {method}: {type(exc).__name__}: {exc}") from exc

    def _run(self, method: str, *args, **kwargs):
        args, kwargs = _copied((args, kwargs))
        return _copied(self._call(lambda: getattr(self.worker, method)(*args, **kwargs), method))

    def run_all(self, method: str, *args, **kwargs) -> list:
        return [self._run(method, *args, **kwargs)]

    def dispatch_dp(self, method: str, data):
        return self._run(method, data)

    def dispatch_dp_metrics(self, method: str, data) -> list[dict]:
        return [self._run(method, data)]

    def dispatch_all(self, method: str, data):
        return self._run(method, data)

    def submit_all(self, method: str, data) -> LocalCall:
        return LocalCall([self._run(method, data)])

    def start_all(self, method: str, *args, **kwargs) -> LocalCall:
        return LocalCall([self._run(method, *args, **kwargs)])

    def shutdown(self) -> None:
        """Drop the worker (its models and engine are freed with it)."""
        self.worker = None
        self.workers = []

