"""PRIME's implicit PRM worker's sections (``configs/algorithm/prime.yaml``): ``reward_model`` (its batching) and
``reward_model.model`` (the PRM and its frozen reference), and what the worker receives."""
from __future__ import annotations

from dataclasses import dataclass

from trainer.config.actor import OptimConfig
from trainer.config.model import ModelConfig
from trainer.config.section import Section
from trainer.config.runtime import WorkerRuntime, runtime_kwargs
from trainer.config_checks import ConfigError
from trainer.run_roles import optimizer_steps_per_training_step

__all__ = ["PRMConfig", "PRMModelConfig", "PRMWorkerConfig", "prm_worker_config"]


@dataclass(frozen=True)
class PRMConfig(Section):
    """``reward_model``: the PRM update's mini-batches (prompts; x rollout.n rows) and micro-batches (rows of one
    worker, or a token budget per worker with use_dynamic_bsz)."""

    mini_batch_size: int
    micro_batch_size_per_gpu: int
    use_dynamic_bsz: bool
    max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int


@dataclass(frozen=True)
class PRMModelConfig(Section):
    """``reward_model.model``: the trained PRM's folder (None: the actor's), its frozen reference (None: the same
    folder), the implicit reward's beta (> 0) and its optimizer (``optim.grad_clip``: the PRM's gradient clip)."""

    path: str | None
    ref_path: str | None
    beta_train: float
    optim: OptimConfig

    def check(self, key: str) -> None:
        if not self.beta_train > 0:
            raise ConfigError(f"{key}.beta_train={self.given('beta_train')}; expected > 0")


@dataclass(frozen=True)
class PRMWorkerConfig(WorkerRuntime):
    """The PRM worker's config (:class:`trainer.workers.prm.PRMWorker`).

    Attributes:
        model: ``reward_model.model`` over ``actor_rollout_ref.model`` (its path the PRM's).
        ref_path: the frozen reference's folder.
        grad_clip: ``reward_model.model.optim.grad_clip``.
        rollout_n: ``actor_rollout_ref.rollout.n``; total_steps: optimizer steps of the run (the LR schedule).
    """

    model: ModelConfig
    prm: PRMConfig
    prm_model: PRMModelConfig
    ref_path: str
    grad_clip: float
    rollout_n: int
    total_steps: int


def prm_worker_config(cfg: dict) -> PRMWorkerConfig:
    """The :class:`PRMWorkerConfig` of the run config ``cfg`` (algorithm=prime). Raises ConfigError naming a bad key.

    The PRM's optimizer steps: ``optim.total_training_steps`` (else ``trainer.total_training_steps``) training
    steps x ``data.train_batch_size / reward_model.mini_batch_size`` mini-batches each."""
    rm = cfg["reward_model"]
    prm = PRMConfig.from_dict(rm, "reward_model")
    pm = PRMModelConfig.from_dict(rm["model"], "reward_model.model")
    model = ModelConfig.from_dict(cfg["actor_rollout_ref"]["model"], "actor_rollout_ref.model").for_role(
        rm["model"], "reward_model.model", own_lora=False)
    steps = pm.optim.total_training_steps
    steps = int(cfg["trainer"]["total_training_steps"]) if steps is None or steps < 0 else steps
    per_step = optimizer_steps_per_training_step(cfg["data"]["train_batch_size"], prm.mini_batch_size)
    clip = rm["model"]["optim"]["grad_clip"]
    return PRMWorkerConfig(**runtime_kwargs(cfg), model=model, prm=prm, prm_model=pm,
                           ref_path=pm.ref_path or model.path, grad_clip=float(clip),
                           rollout_n=int(cfg["actor_rollout_ref"]["rollout"]["n"]), total_steps=max(1, steps * per_step))
