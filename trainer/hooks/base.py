"""The algorithm's seams in the training step: the hook interface, the step context hooks see, and the default.

One step of :class:`trainer.ppo_trainer.RayPPOTrainer` asks the run's :class:`AlgorithmHooks` at five places:

1. ``generate``: prompts -> scored rows (one batch; DAPO's dynamic sampling draws more);
2. ``filter_batch``: rows -> the rows to train on (PRIME's accuracy band);
3. ``add_inputs``: columns the advantage reads that no built-in stage makes (critic values, ReMax's baselines);
4. ``compute_advantage``: ``advantages`` and ``returns`` (the estimator registry, or PRIME's RLOO per source);
5. ``update``: roles trained before the actor (the critic).

A :class:`StepHook` implements any of them (the others do nothing) and may add roles (:class:`trainer.roles.Role`)
and wrap the prompt loader. :class:`EstimatorAdvantage` is the PPO/GRPO default: the registry's estimator
(``algorithm.adv_estimator``) with its declared inputs (:mod:`trainer.adv_inputs`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from trainer.protocol import DataProto

__all__ = ["StepContext", "StepHook", "AlgorithmHooks", "EstimatorAdvantage", "timed"]


@contextmanager
def timed(name: str, timing: dict):
    """Add the block's wall time (seconds) to ``timing[name]``."""
    t0 = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - t0


@dataclass
class StepContext:
    """What the stages and hooks of one training step share.

    Attributes:
        global_step: the step being trained (1-based).
        world: workers per role (data-parallel x sequence-parallel).
        roles: the run's :class:`trainer.roles.Roles`.
        reward_fn: the training :class:`rewards.manager.RewardManager`.
        generate_and_score: ``(prompts, k) -> (rows, reward_output)`` for the step's ``k``-th prompt batch
            (1-based): ``rollout.n`` responses per prompt with ``uid`` and ``token_level_scores`` (B*n, R) f32.
        next_prompts: the loader's next prompt batch.
        timing: ``{stage: seconds}`` of the step (``timing_s/<stage>`` metrics).
        metrics: the step's metrics so far.
    """

    global_step: int
    world: int
    roles: Any
    reward_fn: Callable
    generate_and_score: Callable[[DataProto, int], tuple] | None = None
    next_prompts: Callable[[], DataProto] | None = None
    timing: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    def timer(self, name: str):
        """``with step.timer("stage"):`` adds the block's seconds to ``timing["stage"]``."""
        return timed(name, self.timing)

    def generate(self, prompts: DataProto) -> DataProto:
        """Responses of the rollout group (``roles.rollout``) for ``prompts`` (a row count divisible by the world)."""
        return self.roles.rollout.generate_sequences(prompts)


class StepHook:
    """One plug-in of the training step (see the module docstring); every method's default does nothing."""

    #: each step takes exactly one loader batch (dynamic sampling draws a varying number)
    one_batch_per_step = True

    def roles(self) -> list:
        """The :class:`trainer.roles.Role` entries this hook needs besides the actor."""
        return []

    def wrap_loader(self, loader):
        """The prompt loader of the run (e.g. one that draws more prompts per step)."""
        return loader

    def workers_ready(self, roles, infos: dict[str, list[dict]]) -> None:
        """Called once the roles' workers exist (again after a restart); ``infos``: each role's init info."""

    def generate(self, step: StepContext, prompts: DataProto) -> tuple[DataProto, list] | None:
        """Scored rows of the step and every generation batch's reward output, or None (not this hook's)."""
        return None

    def filter_batch(self, step: StepContext, batch: DataProto, rewards: Sequence) -> DataProto:
        """The rows to train on."""
        return batch

    def add_inputs(self, step: StepContext, batch: DataProto) -> None:
        """Put columns the advantage reads into ``batch`` (in place)."""

    def compute_advantage(self, step: StepContext, batch: DataProto) -> bool:
        """Set ``advantages`` and ``returns`` (B, R) f32 in ``batch``; False when this hook does not own them."""
        return False

    def update(self, step: StepContext, batch: DataProto) -> None:
        """Train a role other than the actor on ``batch`` (metrics into ``step.metrics``)."""


class AlgorithmHooks:
    """The run's hooks, asked in order at every seam of the step.

    ``generate`` and ``compute_advantage`` have one owner: the first hook that answers (a step must have an
    advantage owner: :class:`EstimatorAdvantage` or PRIME's); the other seams ask every hook in turn.
    """

    def __init__(self, hooks: Sequence[StepHook]):
        self.hooks = list(hooks)

    @property
    def one_batch_per_step(self) -> bool:
        return all(h.one_batch_per_step for h in self.hooks)

    def roles(self) -> list:
        return [r for h in self.hooks for r in h.roles()]

    def wrap_loader(self, loader):
        for h in self.hooks:
            loader = h.wrap_loader(loader)
        return loader

    def workers_ready(self, roles, infos: dict[str, list[dict]]) -> None:
        for h in self.hooks:
            h.workers_ready(roles, infos)

    def generate(self, step: StepContext, prompts: DataProto) -> tuple[DataProto, list]:
        """The hooks' generation, else one batch: ``generate_and_score(prompts, 1)``."""
        for h in self.hooks:
            out = h.generate(step, prompts)
            if out is not None:
                return out
        rows, reward = step.generate_and_score(prompts, 1)
        return rows, [reward]

    def filter_batch(self, step: StepContext, batch: DataProto, rewards: Sequence) -> DataProto:
        for h in self.hooks:
            batch = h.filter_batch(step, batch, rewards)
        return batch

    def add_inputs(self, step: StepContext, batch: DataProto) -> None:
        for h in self.hooks:
            h.add_inputs(step, batch)

    def compute_advantage(self, step: StepContext, batch: DataProto) -> None:
        """Raises RuntimeError when no hook owns the advantage."""
        for h in self.hooks:
            if h.compute_advantage(step, batch):
                return
        raise RuntimeError(f"no hook of {[type(h).__name__ for h in self.hooks]} computes the advantage")

    def update(self, step: StepContext, batch: DataProto) -> None:
        for h in self.hooks:
            h.update(step, batch)


class EstimatorAdvantage(StepHook):
    """The PPO/GRPO default: the registered estimator ``algorithm.adv_estimator``.

    Its declared inputs that no stage made are produced before the advantage (:func:`trainer.adv_inputs.
    produce_inputs`; ReMax's greedy baselines), and its ``config_kwargs`` are read from the ``algorithm`` section.

    Args:
        algorithm: the ``algorithm`` config section (``adv_estimator``, ``gamma``, ``lam``, the estimator's keys).

    Raises:
        ValueError: an unknown estimator name (the registry lists the known ones).
    """

    def __init__(self, algorithm):
        from trainer import core_algos

        self.spec = core_algos.get_adv_estimator_spec(algorithm["adv_estimator"])
        self.gamma, self.lam = float(algorithm["gamma"]), float(algorithm["lam"])
        from trainer.adv_inputs import estimator_kwargs

        self.kwargs = estimator_kwargs(self.spec, algorithm)

    def add_inputs(self, step: StepContext, batch: DataProto) -> None:
        from trainer.adv_inputs import produce_inputs

        produce_inputs(step, batch, self.spec, step.timing)

    def compute_advantage(self, step: StepContext, batch: DataProto) -> bool:
        from trainer import core_algos

        core_algos.compute_advantage(batch, self.spec.name, gamma=self.gamma, lam=self.lam, **self.kwargs)
        return True
