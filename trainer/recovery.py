"""In-job recovery from a dead worker process: ``trainer.max_restarts=N`` (default 0: fail fast).

When a worker process dies (killed, out of memory, its node lost; :class:`trainer.placement.WorkerDied`) during a
training step, :meth:`Recovery.restart`, called from the driver loop:

1. stops the run with that failure when ``N`` restarts were used already (``N = 0``: at once, naming the role
   and rank, as without recovery);
2. tears the worker groups down (every role's Ray actors, ``RayPPOTrainer.roles``) and removes the placement
   group;
3. re-creates them (``RayPPOTrainer.init_workers``: the placement is checked again, so a lost node makes the
   restart fail unless the remaining nodes still fit the run);
4. loads the newest complete checkpoint (model, optimizer, scheduler, data loader position, KL coefficient), or,
   when none was written yet, the state the run started from;
5. rewinds ``metrics.jsonl`` and the progress bar to that step, so that every step is logged exactly once, and
   the loop continues from there: data trained before the checkpoint is not trained again; the steps after it
   are trained again from the checkpoint's weights.

A restart that fails (a worker dies during it, the placement no longer fits) stops the run with the original
failure and the restart's error in one message. Every restart is logged (``restart i of N after ...: resumed
from ... at step S, data loader at epoch E after B batches``) and counted in the ``trainer/restarts`` metric of every
step.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

logger = logging.getLogger(__name__)


class Recovery:
    """Restarts of one ``RayPPOTrainer.fit``.

    Args:
        trainer: the ``RayPPOTrainer`` (after its workers exist and its start checkpoint is loaded).
        tracker: the run's :class:`trainer.tracking.Tracking`.
        max_restarts: ``trainer.max_restarts`` (>= 0).
    """

    def __init__(self, trainer: Any, tracker: Any, max_restarts: int):
        self.trainer, self.tracker, self.max_restarts = trainer, tracker, int(max_restarts)
        self.count = 0
        kl = trainer.kl_ctrl.value if trainer.kl_ctrl is not None else None
        self._start = (trainer.global_step, dict(trainer.loader.state_dict()), kl)

    def metrics(self) -> dict[str, float]:
        """``{"trainer/restarts": restarts so far}``, logged with every step."""
        return {"trainer/restarts": float(self.count)}

    def restart(self, failure: Exception) -> None:
        """Recover from ``failure`` (a dead worker) or re-raise it; see the module docstring.

        Raises:
            the ``failure`` itself when no restart is left; :class:`trainer.placement.WorkerFailure` naming the
            failure and the restart's error when the restart fails.
        """
        from trainer.placement import WorkerFailure

        if self.count >= self.max_restarts:
            raise failure
        self.count += 1
        logger.warning("restart %d of %d after: %s", self.count, self.max_restarts, failure)
        try:
            self._teardown()
            self.trainer.init_workers()
            where = self._reload()
        except Exception as exc:
            raise WorkerFailure(f"{failure} (restart {self.count} of {self.max_restarts} failed: "
                                f"{type(exc).__name__}: {exc})") from exc
        state = self.trainer.loader.state_dict()
        logger.warning("restart %d of %d: resumed from %s at step %d, data loader at epoch %d after %d batches",
                       self.count, self.max_restarts, where, self.trainer.global_step, state["epoch"],
                       state["position"])

    def _teardown(self) -> None:
        """Kill every role's workers (the survivors may wait in a collective with the dead rank) and free the
        placement group's bundles for the new one."""
        from ray.util.placement_group import remove_placement_group

        tr = self.trainer
        tr.roles.shutdown()
        if getattr(tr, "pg", None) is not None:
            remove_placement_group(tr.pg)
            tr.pg = None
        self._wait_for_release()

    def _wait_for_release(self, timeout_s: float = 60.0) -> None:
        """Ray returns the killed actors' resources asynchronously: wait (up to ``timeout_s``) until the run's
        CPUs/GPUs are free again, so that the placement check sees them (a lost node's never come back)."""
        import ray

        from trainer.resources import ResourceRequest
        from trainer.rollout_placement import RolloutPlacement

        cfg = self.trainer.cfg
        req = ResourceRequest.from_config(cfg["trainer"], RolloutPlacement.from_config(cfg).rollout_bundles)
        need = {"CPU": req.bundles * req.cpus_per_worker, **({"GPU": req.bundles} if req.device == "cuda" else {})}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            free = ray.available_resources()
            if all(free.get(k, 0.0) >= v for k, v in need.items()):
                return
            time.sleep(0.5)

    def _reload(self) -> str:
        """Load the newest complete checkpoint, else the start state; rewind the metrics. Returns what was loaded."""
        from trainer.checkpoint.base import find_latest_checkpoint

        tr = self.trainer
        latest = find_latest_checkpoint(tr.cfg["trainer"]["default_local_dir"])
        if latest is not None:
            tr.global_step = tr.load_checkpoint(latest)
        else:
            step, loader_state, kl = self._start
            tr.global_step = step
            tr.loader.load_state_dict(dict(loader_state))
            if kl is not None:
                tr.kl_ctrl.value = kl
            latest = "the start of the run (no checkpoint yet)"
        self.tracker.rewind_to(tr.global_step)
        return os.fspath(latest)
