"""Typed config: frozen dataclass sections built from the resolved Hydra config (verl's key names), each with
its own checks beside it (:class:`trainer.config.section.Section`), what each worker receives
(:mod:`trainer.config.workers`) and what the driver reads (``trainer``, ``data``). The defaults live in
``configs/`` only."""
from trainer.config.actor import ActorConfig, CriticConfig, MegatronConfig, OptimConfig, PolicyLossConfig, RefConfig
from trainer.config.data import DataConfig
from trainer.config.deepspeed import DeepSpeedConfig
from trainer.config.model import ModelConfig
from trainer.config.rollout import RolloutConfig, SamplingKwargs
from trainer.config.section import Section
from trainer.config.trainer import TrainerConfig
from trainer.config.workers import (ActorWorkerConfig, CriticWorkerConfig, RolloutWorkerConfig, WorkerRuntime,
                                    actor_worker_config, check_sections, critic_worker_config, rollout_worker_config)

__all__ = ["Section", "ModelConfig", "OptimConfig", "PolicyLossConfig", "MegatronConfig", "ActorConfig", "RefConfig",
           "CriticConfig", "RolloutConfig", "SamplingKwargs", "DeepSpeedConfig", "TrainerConfig",
           "DataConfig", "WorkerRuntime", "ActorWorkerConfig", "CriticWorkerConfig", "RolloutWorkerConfig",
           "actor_worker_config", "critic_worker_config", "rollout_worker_config", "check_sections"]
