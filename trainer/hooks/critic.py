"""The critic as a hook: its role, the values before the advantage and its update before the actor's.

On when ``critic.enable`` is (``trainer.launch.resolve_config`` turns it on for an estimator whose registry entry
needs a critic, e.g. GAE). Stages: ``values`` (``timing_s/values``) puts ``values`` (B, R) f32 into the batch;
``update_critic`` trains on ``returns`` and logs ``critic/*`` (means over ranks and mini-batches).
"""
from __future__ import annotations

from trainer.hooks.base import StepContext, StepHook
from trainer.metric_utils import reduce_rank_metrics
from trainer.protocol import DataProto
from trainer.roles import CriticGroup, Role

__all__ = ["CriticHook", "critic_role"]


def _critic_worker() -> type:
    from trainer.workers.critic import CriticWorker

    return CriticWorker


def critic_role(critic_cfg) -> Role:
    """The critic's :class:`trainer.roles.Role` (checkpoint folder ``critic/``)."""
    from trainer.config.workers import critic_worker_config

    return Role("critic", _critic_worker, CriticGroup, sp_size=int(critic_cfg["ulysses_sequence_parallel_size"]),
                ckpt_dir="critic", worker_config=critic_worker_config)


class CriticHook(StepHook):
    """Values from the critic for the advantage, and the critic's update (see the module docstring).

    Args:
        critic_cfg: the ``critic`` config section.
    """

    def __init__(self, critic_cfg):
        self.role = critic_role(critic_cfg)

    def roles(self) -> list[Role]:
        return [self.role]

    def add_inputs(self, step: StepContext, batch: DataProto) -> None:
        with step.timer("values"):
            batch.union(step.roles.get("critic").compute_values(batch))

    def update(self, step: StepContext, batch: DataProto) -> None:
        with step.timer("update_critic"):
            step.metrics.update(reduce_rank_metrics(step.roles.get("critic").update_critic(batch)))
