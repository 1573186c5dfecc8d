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
* a worker's exception is raised as :class:`trainer.worker_errors.WorkerFailure` naming the role, rank 0 and the
  method, with the worker's exception as its cause;
* the workers' environment: ``TOKENIZERS_PARALLELISM=false``, no "Loading weights" bars
  (``HF_HUB_DISABLE_PROGRESS_BARS``), DeepSpeed's deprecated-collective warning filtered (a user's own settings of
  these are kept); ``DS_ACCELERATOR=cpu`` and ``cpus_per_worker`` threads on the CPU (the worker's constructor).

What it cannot do (refused before start-up, :func:`trainer.single_process_checks.single_process_problems`): more
than one worker (nnodes x n_gpus_per_node > 1), roles other than the actor (a critic, PRIME's PRM, separate rollout
workers: each is a process group of its own), worker restarts (``trainer.max_restarts > 0`` re-creates dead worker
processes), the Megatron strategy. A crash of the worker's native code (a CUDA error, out of host memory) ends the
driver too. At the run's end (:meth:`LocalWorkerGroup.shutdown`, called by ``trainer.launch.run``) the worker's
DeepSpeed engines are destroyed and what it set in this process is given back (:class:`ProcessState`).
"""
from __future__ import annotations

import atexit
import builtins
import gc
import logging
import os
import pickle
import re
import warnings
from typing import Any

__all__ = ["LocalWorkerGroup", "LocalCall", "ProcessState", "worker_environment", "WORKER_ENV_KEYS",
           "WORKER_WARNING_FILTER"]

#: what every worker filters (-W syntax, action:message:category; the message matches the start of the warning's
#: text): DeepSpeed's use of a torch collective that torch has deprecated, once per call. Ray workers get it in
#: PYTHONWARNINGS (:func:`trainer.placement.init_ray`), the worker in this process from :func:`worker_environment`.
WORKER_WARNING_FILTER = "ignore:`torch.distributed.all_gather_into_tensor` is deprecated:FutureWarning"


#: the environment keys the worker sets in this process (:func:`worker_environment`, the worker's constructor)
WORKER_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR",
                   "TOKENIZERS_PARALLELISM", "HF_HUB_DISABLE_PROGRESS_BARS")


def worker_environment(device: str) -> None:
    """The environment the Ray workers get from :func:`trainer.placement.init_ray`, set in this process (a value
    the user set is kept; no tokenizer threads: the worker's constructor, as in a Ray worker): no download or
    "Loading weights" bars (huggingface_hub and transformers read the variable only at import, so their bars are
    switched off by call too), no DeepSpeed deprecation warning per collective (:data:`WORKER_WARNING_FILTER`), no compiler command lines of DeepSpeed's op probes in the driver's log; on
    the CPU, DeepSpeed's CPU accelerator, also where the driver's import of DeepSpeed chose CUDA (a GPU host running
    ``trainer.device=cpu``). :class:`ProcessState` takes what this changes back."""
    if "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        _set_progress_bars(False, False)
    logging.getLogger("compilers").setLevel(logging.WARNING)  # setuptools' compiler (DeepSpeed's op probes)
    if device == "cpu":  # before any import of DeepSpeed, and over one that came before
        os.environ["DS_ACCELERATOR"] = "cpu"
        _cpu_accelerator()
    action, message, category = WORKER_WARNING_FILTER.split(":")
    warnings.filterwarnings(action, message=re.escape(message), category=getattr(builtins, category))


def _progress_bars() -> tuple[bool, bool]:
    """Whether huggingface_hub's and transformers' progress bars are on in this process."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    return not are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled()


def _set_progress_bars(hub: bool, hf: bool) -> None:
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    (hf_logging.enable_progress_bar if hf else hf_logging.disable_progress_bar)()  # also sets the hub's: first
    (enable_progress_bars if hub else disable_progress_bars)()


def _cpu_accelerator() -> None:
    """DeepSpeed's CPU accelerator, where an earlier import of DeepSpeed in this process picked another one."""
    import sys

    if "deepspeed.accelerator" not in sys.modules:
        return  # picked at its import, from DS_ACCELERATOR
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if get_accelerator().device_name() != "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        set_accelerator(CPU_Accelerator())


class ProcessState:
    """What the worker changes in this process, taken when built and given back by :meth:`restore`: the
    :data:`WORKER_ENV_KEYS` variables, torch's thread count, the warning filters, both libraries' progress bars, the
    ``compilers`` logger's level, the global random generators' states (the worker seeds them from ``trainer.seed``;
    CUDA's when CUDA was initialised before). The torch process group is not among them: DeepSpeed keeps the group
    it first used, so a later run in this process uses the same one; one that this process had no group before is
    destroyed at exit (NCCL warns of a group left then)."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        self.env = {k: os.environ.get(k) for k in WORKER_ENV_KEYS}
        self.threads, self.filters, self.bars = torch.get_num_threads(), list(warnings.filters), _progress_bars()
        self.compilers_level = logging.getLogger("compilers").level
        from trainer.checkpoint.base import capture_rng_state

        self.rng = capture_rng_state()
        if dist.is_available() and not dist.is_initialized():
            atexit.unregister(_destroy_process_group)  # once, however many runs this process makes
            atexit.register(_destroy_process_group)

    def restore(self) -> None:
        import torch

        for key, value in self.env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.set_num_threads(self.threads)
        warnings.filters[:] = self.filters
        _set_progress_bars(*self.bars)
        logging.getLogger("compilers").setLevel(self.compilers_level)
        from trainer.checkpoint.base import restore_rng_state

        restore_rng_state(self.rng)


def _destroy_process_group() -> None:
    """At exit: the process group the worker made (a Ray worker's ends with its process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _destroy_engines(worker) -> None:
    """``destroy`` the DeepSpeed engines ``worker`` holds (actor, reference): their hooks and optimizer state, kept
    alive otherwise by reference cycles through autograd hooks."""
    for role in (getattr(worker, "actor", None), getattr(worker, "ref", None)):
        engine = getattr(role, "engine", None)
        if hasattr(engine, "destroy"):
            engine.destroy()


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
        self.worker, self.workers, self._saved = None, [], ProcessState()  # given back at shutdown
        worker_environment(device)
        try:
            self.worker = self._call(lambda: cls(worker_config, 0, 1, None, None, device, role), "__init__")
        except BaseException:
            self.shutdown()  # nothing attached this group yet: no one else would give the state back
            raise
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
        """Release the worker (its DeepSpeed engines destroyed, its models' memory freed) and give this
        process what the worker changed back (:class:`ProcessState`); a second call does nothing."""
        if self._saved is None:
            return
        self.workers = []
        try:
            _destroy_engines(self.worker)
        except Exception as exc:  # noqa: BLE001 - a run's own error (raised on the way out) is the one to report
            logging.getLogger(__name__).warning("releasing the %s worker: %s: %s", self.role, type(exc).__name__, exc)
        self.worker = None
        gc.collect()  # the engines' cycles: their tensors go back to torch's cache (kept for a later run)
        self._saved.restore()
        self._saved = None
