"""The failures of a worker call (:class:`trainer.placement.WorkerGroup`, :class:`trainer.local_workers.
LocalWorkerGroup`)."""
from __future__ import annotations

__all__ = ["WorkerFailure", "WorkerDied"]


class WorkerFailure(RuntimeError):
    """A worker process died or raised; the message names the role and rank."""


class WorkerDied(WorkerFailure):
    """A worker process died (killed, out of memory, its node lost): the failure ``trainer.max_restarts`` recovers
    from (:mod:`trainer.recovery`)."""
