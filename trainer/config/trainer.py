"""``trainer``: what the driver (:class:`trainer.ppo_trainer.RayPPOTrainer`, :mod:`trainer.launch`) reads of the
run's length, logging, checkpoints, validation and recovery (``configs/ppo_trainer.yaml`` holds the defaults; the
data group sets ``total_epochs``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.config.section import Section, built_by
from trainer.config_checks import ConfigError
from trainer.tracking import BACKENDS, unknown_backends

__all__ = ["TrainerConfig", "DEVICES", "STRATEGIES", "run_strategy"]

DEVICES = ("cpu", "cuda")
STRATEGIES = ("deepspeed", "megatron")


def run_strategy(cfg: Mapping) -> str:
    """``trainer.strategy`` of the run config ``cfg`` (a mapping with a ``trainer`` section): the training path,
    ``deepspeed`` or ``megatron``. The one reader of the key (``configs/ppo_trainer.yaml`` holds its default): the
    config checks, the roles and the worker configs ask it.

    Raises:
        ConfigError: another value, ``trainer.strategy=<value>; expected deepspeed or megatron``.
    """
    strategy = cfg["trainer"]["strategy"]
    if strategy not in STRATEGIES:
        raise ConfigError(f"trainer.strategy={strategy!r}; expected deepspeed or megatron")
    return strategy


def at_least(key: str, value: int, minimum: int) -> None:
    """A ConfigError ``<key>=<value>; expected an integer >= <minimum>`` when ``value < minimum``."""
    if value < minimum:
        raise ConfigError(f"{key}={value}; expected an integer >= {minimum}")


def plain_logger(logger: Any) -> Any:
    """``trainer.logger`` as the user wrote it: a name, or a plain list of names (an OmegaConf list too)."""
    return logger if isinstance(logger, str) else list(logger or [])


@dataclass(frozen=True)
class TrainerConfig(Section):
    """``trainer`` as the driver reads it, resolved (:func:`trainer.launch.resolve_config`: ``device=auto`` is cuda
    or cpu, ``resume_mode=resume_path`` is the path of ``resume_from_path``).

    Attributes:
        device: cpu | cuda. nnodes, n_gpus_per_node: workers per role = their product (>= 1).
        cpus_per_worker: CPUs of a placement bundle (one worker).
        total_epochs: passes over the training data (>= 1).
        total_training_steps: the run's steps (>= 1); None before :func:`trainer.launch.plan_run_length` fills it
            (the driver's copy is replaced then, see :func:`trainer.config.section.replaced`).
        project_name, experiment_name, logger, output_dir: tracking (:class:`trainer.tracking.Tracking`).
        default_local_dir: the folder of the ``global_step_<N>`` checkpoints.
        save_freq, test_freq: checkpoint / validate every this many steps (<= 0: never; the last step too).
        val_before_train, val_only, val_also_greedy, log_val_generations: validation (:mod:`trainer.validation`).
        resume_mode: auto | disable | the path of a ``global_step_<N>`` folder.
        max_actor_ckpt_to_keep: checkpoints kept (None: all).
        export_hf_on_end: write ``<output_dir>/hf_actor`` at the end.
        seed: the run's seed (prompt sampling seeds, the tiny model's initialisation).
        balance_batch: reorder rows so data-parallel ranks get similar token counts.
        critic_warmup: steps that train only the critic before the actor.
        max_consecutive_skipped_steps: stop after this many non-finite steps in a row (>= 1).
        max_restarts: re-create dead workers this many times (>= 0).
        single_process: the actor's one worker runs in the driver's process, without Ray
            (:mod:`trainer.local_workers`).
    """

    device: str
    nnodes: int
    n_gpus_per_node: int
    cpus_per_worker: int
    total_epochs: int
    total_training_steps: int | None
    project_name: str
    experiment_name: str
    logger: Any  # a list of backends (or one name); checked by trainer.tracking.Tracking
    output_dir: str
    default_local_dir: str
    save_freq: int
    test_freq: int
    val_before_train: bool
    val_only: bool
    val_also_greedy: bool
    log_val_generations: int
    resume_mode: str = field(metadata=built_by(lambda value, key: _resume_mode(value, key)))
    max_actor_ckpt_to_keep: int | None
    export_hf_on_end: bool
    seed: int
    balance_batch: bool
    critic_warmup: int
    max_consecutive_skipped_steps: int
    max_restarts: int
    single_process: bool

    def check(self, key: str) -> None:
        """A known device, at least one worker, and the counts' lower bounds (see the attributes)."""
        if self.device not in DEVICES:
            raise ConfigError(f"{key}.device={self.device!r}; expected auto, cpu or cuda")
        for name in ("nnodes", "n_gpus_per_node"):  # each >= 1: at least one worker (two negatives make no world)
            at_least(f"{key}.{name}", getattr(self, name), 1)
        if self.max_consecutive_skipped_steps < 1:
            raise ConfigError(f"{key}.max_consecutive_skipped_steps={self.max_consecutive_skipped_steps}; "
                              "expected >= 1")
        at_least(f"{key}.max_restarts", self.max_restarts, 0)
        at_least(f"{key}.total_epochs", self.total_epochs, 1)
        if self.total_training_steps is not None:
            at_least(f"{key}.total_training_steps", self.total_training_steps, 1)
        if self.max_actor_ckpt_to_keep is not None:
            at_least(f"{key}.max_actor_ckpt_to_keep", self.max_actor_ckpt_to_keep, 0)
        at_least(f"{key}.log_val_generations", self.log_val_generations, 0)
        unknown = unknown_backends(self.logger)
        if unknown:
            raise ConfigError(f"{key}.logger={plain_logger(self.logger)!r}: unknown backend(s) {unknown}; "
                              f"expected a list of {list(BACKENDS)}")


def _resume_mode(value, key: str) -> str:
    """``trainer.resume_mode`` when allowed (:func:`trainer.checkpoint.resume.check_resume_mode`, which raises the
    one-line ConfigError otherwise)."""
    from trainer.checkpoint.resume import check_resume_mode

    return check_resume_mode(value, key)
