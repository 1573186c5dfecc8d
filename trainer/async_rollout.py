"""The controller's side of ``trainer.rollout_placement=separate``: weight pushes and the pipelined rollout of
``trainer.async.staleness`` (see :mod:`trainer.rollout_placement` for the keys).

Versions. Version ``v`` is the actor's weights after ``v`` training steps. The batch trained at step ``k`` is
generated with version ``v(k) = max(floor, k - 1 - s)`` (``s`` = staleness; ``floor`` = 0, or the step a run resumed
at when the rollout's checkpoint lacks the versions its batches in flight need), so its ``async/staleness`` is
``k - 1 - v(k)`` <= s. Each step ``k``:

1. push the actor's weights (version ``k - 1``; the batch of step ``k + s`` is made with them), then start the
   generations of batches ``k .. k + s`` not started yet (:meth:`OffPolicyPipeline.next_batch`);
2. the step waits for batch ``k`` (:meth:`OffPolicyPipeline.collect`), scores it, recomputes the old log-probs
   with the actor (the policy the update starts from), weights the policy gradient by truncated importance
   sampling between the rollout's log-probs and the old ones (``algorithm.rollout_correction.rollout_is=auto``:
   on when s >= 1), and updates, while the rollout workers generate batch ``k + 1 .. k + s``;
3. :meth:`OffPolicyPipeline.step_done` releases the versions no batch after step ``k`` needs (the rollout keeps
   those of steps ``k + 1 .. k + s``: up to ``s`` copies of the weights in its CPU memory, and one in the engine).

Checkpoints: the data loader's position is saved as it was before the first batch not yet trained was drawn
(:meth:`OffPolicyPipeline.loader_state`) and the rollout role saves the versions of the batches in flight, so a
resumed run drops those batches and generates them again with the same weights and seeds: nothing is trained
twice and the steps are those of the uninterrupted run. With s = 0 a batch is started and awaited in the same
step: on-policy, with generation on its own workers.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import ray

from trainer.hooks.base import timed
from trainer.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["WeightPush", "OffPolicyPipeline", "wait_calls"]


def wait_calls(calls: list, timeout_s: float | None) -> list:
    """Wait for several :class:`trainer.placement.PendingCall` of different groups together; returns their results
    in order. A group whose rank died is reported first (:class:`trainer.placement.WorkerDied` naming its role),
    before a peer whose collective failed because of it."""
    futures = [f for c in calls for f in c.futures]
    ray.wait(futures, num_returns=len(futures), timeout=timeout_s)

    def died(call) -> bool:
        ready, _ = ray.wait(list(call.futures), num_returns=len(call.futures), timeout=0)
        for f in ready:
            try:
                ray.get(f)
            except ray.exceptions.RayActorError:
                return True
            except Exception:  # noqa: BLE001 (a raise, not a death: reported by result() below)
                pass
        return False

    for call in [c for c in calls if died(c)]:
        call.result()  # raises WorkerDied naming the role and rank
    return [c.result() for c in calls]


class WeightPush:
    """The weight group between the actor's rank 0 and the rollout workers (:mod:`trainer.workers.weight_sync`),
    made when constructed, and the pushes over it.

    Args:
        actor: the actor's :class:`trainer.roles.ActorGroup`.
        rollout: the :class:`trainer.roles.RolloutGroup`.
        backend: ``nccl`` (rollout engines on GPUs of their own) or ``gloo`` (CPU, or an engine sharing the actor's
            GPU, which NCCL cannot join twice).
        timeout_s: bound of the group's rendezvous and broadcasts, and of the controller's waits.

    Attributes:
        newest: the newest version the rollout workers hold (-1: none).
    """

    def __init__(self, actor, rollout, backend: str, timeout_s: float | None):
        self.actor, self.rollout, self.timeout_s = actor, rollout, timeout_s
        addr, port = actor.weight_sync_address()
        layout = actor.weights_layout()
        world = 1 + rollout.wg.world_size
        t = float(timeout_s or 1800.0)
        wait_calls([actor.start_weight_sync(addr, port, world, backend, t),
                    rollout.start_weight_sync(addr, port, world, backend, t, layout)], timeout_s)
        self.newest = -1
        logger.info("weight group: actor rank 0 + %d rollout workers over %s at %s:%s (%d buckets)",
                    world - 1, backend, addr, port, len(layout))

    def push(self, version: int, keep_from: int) -> dict[str, float]:
        """Send the actor's current weights as ``version``; the rollout workers then drop versions older than
        ``keep_from``. Returns the actor's ``{"seconds", "bytes"}`` of the broadcast."""
        sent, _ = wait_calls([self.actor.start_push(), self.rollout.start_receive(version, keep_from)],
                             self.timeout_s)
        self.newest = int(version)
        return sent[0]


@dataclass
class _InFlight:
    prompts: DataProto
    epoch: int
    version: int
    call: Any


class OffPolicyPipeline:
    """Generation on the rollout role, ``trainer.async.staleness`` batches ahead of the update (module docstring).

    Args:
        trainer: the :class:`trainer.ppo_trainer.RayPPOTrainer`, its workers started (its loader, roles,
            ``tag_prompts`` and ``last_step`` are used).
        placement: the run's :class:`trainer.rollout_placement.RolloutPlacement` (``separate``).
        weights: the :class:`WeightPush` to use (default: one made between the trainer's actor and rollout roles).
    """

    def __init__(self, trainer, placement, weights: WeightPush | None = None):
        self.tr, self.s = trainer, int(placement.staleness)
        self.rollout = trainer.roles.rollout
        if weights is None:
            timeout = float(trainer.cfg["trainer"].get("ray_timeout_s") or 0) or None
            backend = "nccl" if trainer.device == "cuda" and placement.rollout_bundles else "gloo"
            weights = WeightPush(trainer.roles.actor, self.rollout, backend, timeout)
        self.weights = weights
        self.rollout.version_for = self._version_for_call
        self.trace = ChromeTrace(placement.trace_file) if placement.trace_file else None
        self.reset()

    def reset(self) -> None:
        """Forget the batches in flight (after a checkpoint was loaded: they are generated again)."""
        self.pending: dict[int, _InFlight] = {}
        self.loader_states: dict[int, dict] = {}
        self.floor: int | None = None  # set at the first step after a (re)start
        self.step_version: int | None = None
        self.received = 0.0  # when the batch of the step in progress arrived (wall clock, s)
        self.last_train: tuple[float, float] | None = None  # the previous step's training on its batch

    # ---- versions -----------------------------------------------------------------------------------------------
    def version_for(self, step: int) -> int:
        """The weights version that generates the batch of ``step`` (see the module docstring)."""
        return max(int(self.floor or 0), step - 1 - self.s)

    def _start(self, trained: int) -> None:
        """At the first step after ``trained`` steps: use the rollout's saved versions when they cover the next
        ``s`` batches, else generate those with the current weights (``floor = trained``)."""
        held = set(self.rollout.held_versions())
        self.floor = 0
        needed = {self.version_for(j) for j in range(trained + 1, trained + self.s + 1)}
        if needed and not needed <= held:
            self.floor = trained
        self.weights.newest = max(held) if held else -1
        if self.floor:
            logger.warning("the rollout holds weight versions %s, not %s: the batches in flight are generated "
                           "again with the weights of step %d", sorted(held), sorted(needed), trained)

    def _push(self, version: int, timing: dict | None) -> None:
        """Push the actor's weights after ``version`` steps; the rollout keeps the versions of the batches not
        trained yet (those of steps ``version + 1 ..``)."""
        t0 = time.time()
        with timed("sync_weights", timing if timing is not None else {}):
            self.weights.push(version, self.version_for(version + 1))
        if self.trace is not None:
            self.trace.event("sync_weights", "actor", t0, time.time(), {"weights_version": version})

    def current_weights(self) -> int:
        """Push the actor's weights now (version = steps trained) unless the rollout holds them; returns the version
        (validation generates with it)."""
        version = int(self.tr.global_step)
        if self.weights.newest < version:
            self._push(version, None)
        return version

    def _version_for_call(self, prompts: DataProto) -> int:
        if prompts.meta.get("validate") or self.step_version is None:
            return self.current_weights()
        return self.step_version  # e.g. ReMax's greedy baselines: the weights that made the step's batch

    # ---- the step -----------------------------------------------------------------------------------------------
    def next_batch(self, step: int, timing: dict) -> tuple[DataProto, int]:
        """Push the actor's weights (version ``step - 1``: the batch of step ``step + s`` needs them, and so does a
        checkpoint of this step, even when that batch lies past the run's end), then start the generations of
        batches ``step .. step + s`` not started yet; returns batch ``step``'s prompts and epoch."""
        if self.floor is None:
            self._start(step - 1)
        if self.weights.newest < step - 1:
            self._push(step - 1, timing)
        last = min(step + self.s, self.tr.last_step())
        for j in range(max([step - 1, *self.pending]) + 1, last + 1):
            version = self.version_for(j)
            if version > self.weights.newest:  # only the actor's current weights can be sent
                raise RuntimeError(f"step {step}: the batch of step {j} needs weights version {version}, which the "
                                   f"rollout does not hold (newest: {self.weights.newest})")
            self.loader_states[j] = dict(self.tr.loader.state_dict())
            prompts, epoch = self.tr.loader.next_batch()
            self.tr.tag_prompts(prompts, j, 1)
            prompts.meta["weights_version"] = version
            self.pending[j] = _InFlight(prompts, epoch, version, self.rollout.submit(prompts))
        batch = self.pending[step]
        return batch.prompts, batch.epoch

    def collect(self, step) -> DataProto:
        """Wait for the batch of ``step`` (a :class:`trainer.hooks.base.StepContext`); its metrics go into
        ``step.metrics``: ``async/staleness`` (updates between its weights and the policy it trains),
        ``async/weights_version``, ``async/wait_gen_s`` (seconds the step waited for it), ``async/gen_s`` (its
        generation, from the first rollout worker's start to the last one's end) and ``async/gen_overlap_s``
        (seconds of that generation that ran while the previous step trained: from its batch's arrival to the end of
        its actor update)."""
        k = step.global_step
        batch = self.pending.pop(k)
        t0 = time.perf_counter()
        rows = batch.call.result()
        start, end = rows.meta.pop("rollout_gen_window", (0.0, 0.0))
        overlap = 0.0
        if self.last_train is not None:
            overlap = max(0.0, min(end, self.last_train[1]) - max(start, self.last_train[0]))
        step.metrics.update({"async/staleness": float(k - 1 - batch.version),
                             "async/weights_version": float(batch.version),
                             "async/wait_gen_s": time.perf_counter() - t0, "async/gen_s": end - start,
                             "async/gen_overlap_s": overlap})
        self.received = time.time()
        if self.trace is not None:
            self.trace.event("generate", "rollout", start, end, {"step": k, "weights_version": batch.version})
        self.step_version = batch.version
        return rows

    def step_done(self, step: int, update_window: tuple[float, float]) -> None:
        """After the update of ``step`` (wall-clock start and end, s): release what no batch needs any more."""
        self.last_train = (self.received, update_window[1])
        if self.trace is not None:
            self.trace.event("train_step", "actor", *self.last_train, {"step": step})
            self.trace.event("update_actor", "actor", *update_window, {"step": step})
        self.step_version = None
        for j in [j for j in self.loader_states if j <= step]:
            del self.loader_states[j]
        self.rollout.release_below(self.version_for(step + 1))

    def loader_state(self) -> dict:
        """The data loader's position after the last trained batch (before the first batch in flight was drawn)."""
        return dict(self.loader_states[min(self.pending)]) if self.pending else self.tr.loader.state_dict()


class ChromeTrace:
    """Complete events (``"ph": "X"``) appended to a Chrome trace file in the JSON array format (its closing
    bracket is optional), readable by ``chrome://tracing`` and Perfetto: one row per role (``pid``)."""

    def __init__(self, path: str):
        self.path = path  # the file is opened at the first event: a fresh run sets an earlier run's trace aside
        # after its workers started (trainer.launch.run), so nothing of this run may be written here before

    def event(self, name: str, role: str, start: float, end: float, args: dict) -> None:
        """One event from ``start`` to ``end`` (seconds since the epoch); the file starts with ``[`` when new."""
        ev = {"name": name, "cat": role, "ph": "X", "pid": role, "tid": 0, "ts": start * 1e6,
              "dur": max(0.0, end - start) * 1e6, "args": args}
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        if new:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(("[\n" if new else "") + json.dumps(ev) + ",\n")


def read_trace(path: str) -> list[dict]:
    """The events of a :class:`ChromeTrace` file."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip().rstrip(",")
    return json.loads(text + "]" if not text.endswith("]") else text)
