"""What each worker receives: its role's sections plus the few values it needs from elsewhere in the config, as
frozen dataclasses built once on the driver from the resolved, planned config (after
:func:`trainer.launch.plan_run_length`); Ray pickles them to the workers. No worker sees the whole config.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.config.actor import ActorConfig, CriticConfig, MegatronConfig, RefConfig
from trainer.config.deepspeed import DeepSpeedConfig
from trainer.config.model import ModelConfig
from trainer.config.rollout import RolloutConfig
from trainer.config.runtime import ARR, WorkerRuntime, needs_reference, runtime_kwargs
from trainer.config.trainer import run_strategy
from trainer.run_roles import critic_on, optimizer_steps_per_training_step

__all__ = ["WorkerRuntime", "ActorWorkerConfig", "CriticWorkerConfig", "RolloutWorkerConfig", "actor_worker_config",
           "critic_worker_config", "rollout_worker_config", "runtime_kwargs", "scheduler_total_steps",
           "needs_reference", "check_sections"]


@dataclass(frozen=True)
class ActorWorkerConfig(WorkerRuntime):
    """The actor + rollout + reference worker's config (:class:`trainer.workers.actor.ActorRolloutRefWorker` and the
    Megatron worker).

    Attributes:
        megatron: ``actor.megatron`` with ``trainer.strategy=megatron``, else None.
        need_ref: a KL term needs reference log-probs (``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``).
        separate_rollout: ``trainer.rollout_placement=separate`` (the engine lives in rollout workers).
        sum_pi_squared: the estimator reads the ``sum_pi_squared`` column of the log-prob pass.
        chat_template_kwargs: ``data.apply_chat_template_kwargs`` (the multi-turn loop's template).
        total_steps: optimizer steps of the whole run (the LR schedule; :func:`scheduler_total_steps`).
    """

    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
    megatron: MegatronConfig | None
    need_ref: bool
    separate_rollout: bool
    sum_pi_squared: bool
    chat_template_kwargs: dict
    total_steps: int


@dataclass(frozen=True)
class CriticWorkerConfig(WorkerRuntime):
    """The critic worker's config: ``critic`` and its model (``critic.model`` over ``actor_rollout_ref.model``).

    Attributes:
        rollout_n: ``actor_rollout_ref.rollout.n`` (rows per prompt in a mini-batch).
        response_length: ``actor_rollout_ref.rollout.response_length`` (``loss_scale_factor``'s default).
        total_steps: optimizer steps of the whole run (:func:`scheduler_total_steps`).
    """

    model: ModelConfig
    critic: CriticConfig
    rollout_n: int
    response_length: int
    total_steps: int


@dataclass(frozen=True)
class RolloutWorkerConfig(WorkerRuntime):
    """A separate rollout worker's config (:class:`trainer.workers.rollout.RolloutWorker`).

    Attributes:
        ray_timeout_s: ``trainer.ray_timeout_s``; None: wait for a weights version without a bound.
        chat_template_kwargs: ``data.apply_chat_template_kwargs``.
    """

    model: ModelConfig
    rollout: RolloutConfig
    ray_timeout_s: float | None
    chat_template_kwargs: dict


def scheduler_total_steps(run_steps: int | None, train_batch_size: int, role: ActorConfig | CriticConfig) -> int:
    """Optimizer steps of a whole run for the LR schedule of one trained role (actor or critic).

    ``role.optim.total_training_steps`` (filled from ``trainer.total_training_steps`` when -1) counts TRAINING
    steps; DeepSpeed steps the scheduler once per optimizer step, and one training step makes
    ``ppo_epochs * train_batch_size / ppo_mini_batch_size`` of them. Setting the key explicitly lets a run stopped
    early (``trainer.total_training_steps`` smaller) keep the schedule of the full run, so that resuming is exact.

    Raises:
        ValueError: neither count is planned yet (call :func:`trainer.launch.plan_run_length` first).
    """
    steps = role.optim.total_training_steps
    if steps is None or steps < 0:
        if run_steps is None:
            raise ValueError("trainer.total_training_steps is not planned yet: call trainer.launch.plan_run_length "
                             "(or set trainer.total_training_steps) before building a trained role")
        steps = int(run_steps)
    return max(1, steps * optimizer_steps_per_training_step(train_batch_size, role.ppo_mini_batch_size,
                                                            role.ppo_epochs))


def actor_worker_config(cfg: dict) -> ActorWorkerConfig:
    """The :class:`ActorWorkerConfig` of the run config ``cfg``. Raises ConfigError naming a bad key."""
    from trainer.adv_inputs import log_prob_pass_columns

    arr, t = cfg[ARR], cfg["trainer"]
    actor = ActorConfig.from_dict(arr["actor"], f"{ARR}.actor")
    megatron = None
    if run_strategy(cfg) == "megatron":
        megatron = MegatronConfig.from_dict(arr["actor"]["megatron"], f"{ARR}.actor.megatron")
    return ActorWorkerConfig(
        **runtime_kwargs(cfg), model=ModelConfig.from_dict(arr["model"], f"{ARR}.model"), actor=actor,
        ref=RefConfig.from_dict(arr["ref"], f"{ARR}.ref"), rollout=RolloutConfig.from_dict(arr["rollout"],
                                                                                           f"{ARR}.rollout"),
        megatron=megatron, need_ref=needs_reference(cfg),
        separate_rollout=t["rollout_placement"] == "separate",
        sum_pi_squared="sum_pi_squared" in log_prob_pass_columns(cfg),
        chat_template_kwargs=dict(cfg["data"]["apply_chat_template_kwargs"] or {}),
        total_steps=scheduler_total_steps(t["total_training_steps"], cfg["data"]["train_batch_size"], actor))


def critic_worker_config(cfg: dict) -> CriticWorkerConfig:
    """The :class:`CriticWorkerConfig` of the run config ``cfg``. Raises ConfigError naming a bad key."""
    critic = CriticConfig.from_dict(cfg["critic"], "critic")
    model = ModelConfig.from_dict(cfg[ARR]["model"], f"{ARR}.model").for_role(cfg["critic"]["model"], "critic.model",
                                                                               own_lora=True)
    rollout = cfg[ARR]["rollout"]
    return CriticWorkerConfig(**runtime_kwargs(cfg), model=model, critic=critic, rollout_n=int(rollout["n"]),
                              response_length=int(rollout["response_length"]),
                              total_steps=scheduler_total_steps(cfg["trainer"]["total_training_steps"],
                                                                cfg["data"]["train_batch_size"], critic))


def rollout_worker_config(cfg: dict) -> RolloutWorkerConfig:
    """The :class:`RolloutWorkerConfig` of the run config ``cfg``. Raises ConfigError naming a bad key."""
    timeout = cfg["trainer"]["ray_timeout_s"]
    return RolloutWorkerConfig(
        **runtime_kwargs(cfg), model=ModelConfig.from_dict(cfg[ARR]["model"], f"{ARR}.model"),
        rollout=RolloutConfig.from_dict(cfg[ARR]["rollout"], f"{ARR}.rollout"),
        ray_timeout_s=float(timeout) if timeout else None,
        chat_template_kwargs=dict(cfg["data"]["apply_chat_template_kwargs"] or {}))


def check_sections(cfg: dict) -> None:
    """Build every section the run's workers and the driver receive (the critic's when ``critic.enable``; PRIME's
    reward model's when ``reward_model.model`` has an ``optim``), so that their checks run before anything starts;
    every error is raised together (:class:`trainer.config_checks.ConfigErrors`, one line each)."""
    from trainer.config.data import DataConfig
    from trainer.config.actor import check_grad_clip
    from trainer.config.prm import PRMConfig, PRMModelConfig
    from trainer.config.trainer import TrainerConfig
    from trainer.config_checks import ErrorCollector, as_int

    arr, errors = cfg[ARR], ErrorCollector()
    model = errors.run(ModelConfig.from_dict, arr["model"], f"{ARR}.model")
    for cls, name in ((ActorConfig, "actor"), (RefConfig, "ref"), (RolloutConfig, "rollout")):
        errors.run(cls.from_dict, arr[name], f"{ARR}.{name}")
    micro = arr["actor"]["ppo_micro_batch_size_per_gpu"]  # refused by the actor's section when < 1
    for name in ("rollout", "ref"):  # their old-log-prob micro-batch: the actor's unless set apart
        if not arr[name]["log_prob_use_dynamic_bsz"] and arr[name]["log_prob_micro_batch_size_per_gpu"] != micro:
            errors.run(as_int, arr[name]["log_prob_micro_batch_size_per_gpu"],
                       f"{ARR}.{name}.log_prob_micro_batch_size_per_gpu", 1)
    errors.run(DeepSpeedConfig.from_dict, cfg["deepspeed"], "deepspeed")
    errors.run(TrainerConfig.from_dict, cfg["trainer"], "trainer")  # the driver's (trainer.ppo_trainer)
    errors.run(DataConfig.from_dict, cfg["data"], "data")
    if critic_on(cfg):
        errors.run(CriticConfig.from_dict, cfg["critic"], "critic")
        if model is not None:
            errors.run(model.for_role, cfg["critic"]["model"], "critic.model", True)
    rm = cfg.get("reward_model") or {}
    if isinstance((rm.get("model") or {}).get("optim"), dict):
        errors.run(PRMConfig.from_dict, rm, "reward_model")
        errors.run(PRMModelConfig.from_dict, rm["model"], "reward_model.model")
        if rm["model"]["optim"].get("grad_clip") is not None:  # the PRM's own clip (PRIME), >= 0 as the actor's
            errors.run(check_grad_clip, "reward_model.model.optim.grad_clip", rm["model"]["optim"]["grad_clip"])
    errors.raise_if_any()
