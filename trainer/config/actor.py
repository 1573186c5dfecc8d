"""The trained roles' sections: ``actor_rollout_ref.actor`` (with ``optim``, ``policy_loss``, ``megatron``),
``actor_rollout_ref.ref`` and ``critic`` (verl's keys; ``configs/ppo_trainer.yaml`` holds their defaults)."""
from __future__ import annotations

import math

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.config.section import AUTO_BOOL, Section, bounded, built_by, finite
from trainer.config_checks import ConfigError, as_int

__all__ = ["OptimConfig", "PolicyLossConfig", "MegatronConfig", "ActorConfig", "RefConfig", "CriticConfig",
           "ULYSSES_SECTIONS", "ulysses_sizes", "check_ulysses_world", "check_ulysses_heads", "check_kl_type",
           "check_grad_clip"]

#: the sections with a ``ulysses_sequence_parallel_size``: the actor, its reference and the critic
ULYSSES_SECTIONS = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")


def _scale_factor(value: Any, path: str) -> float | None:
    """``loss_scale_factor``: null (the rollout's response_length) or a positive finite number (an infinite one
    scales every loss, and so every gradient, to 0)."""
    if value is None:
        return None
    try:
        ok = not isinstance(value, bool) and math.isfinite(float(value)) and float(value) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{path}={value!r}; expected null (rollout.response_length) or a positive finite number")
    return float(value)


def _check_betas(key: str, betas: tuple) -> None:
    """AdamW's ``betas``: two numbers in [0, 1) (torch's rule, checked here before any worker builds the optimizer)."""
    ok = len(betas) == 2 and all(not isinstance(b, bool) and isinstance(b, (int, float)) and 0.0 <= b < 1.0
                                 for b in betas)
    if not ok:
        raise ConfigError(f"{key}={list(betas)!r}; expected two numbers in [0, 1), e.g. [0.9, 0.999]")


def _check_scheduler(key: str, name: str) -> None:
    """A schedule ``transformers.get_scheduler`` knows (``constant`` and ``cosine`` are verl's names, with warmup)."""
    from transformers import SchedulerType

    known = sorted({"constant", "cosine", *(t.value for t in SchedulerType)})
    if name not in known:
        raise ConfigError(f"{key}={name!r}; expected one of {known}")


def _token_budget(key: str, dynamic: bool, value) -> None:
    """With dynamic micro-batches (``use_dynamic_bsz``) the token budget of one micro-batch is >= 1."""
    if dynamic:
        as_int(value, key, minimum=1)


def _check_epochs(key: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{key}.ppo_epochs={value}; expected an integer >= 1 (passes over each batch per step)")


def check_grad_clip(key: str, value: float, given=None) -> float:
    """``value`` of a role's gradient-norm clip when it is a finite number >= 0, else a ConfigError naming ``key``.
    0 turns clipping off (DeepSpeed's ``gradient_clipping`` and Megatron's ``clip_grad`` clip only when > 0); a
    negative value is refused rather than read as 0: torch's ``clip_grad_norm_`` (verl's FSDP path) would scale the
    gradients by a negative factor with it."""
    return bounded(key, value, given, ge=0, why="the largest gradient norm; 0: no clipping")


def check_kl_type(key: str, value: str) -> None:
    """A KL estimator name of :data:`trainer.algos.kl.KL_PENALTY_TYPES`, optionally with the ``+`` suffix (checked
    even while the KL term is off, so that a typo does not wait for it to be turned on)."""
    from trainer.algos.kl import KL_PENALTY_TYPES

    if not isinstance(value, str) or value.removesuffix("+") not in KL_PENALTY_TYPES:
        raise ConfigError(f"{key}={value!r}; expected one of {list(KL_PENALTY_TYPES)} (optionally with a '+' "
                          "suffix: the k2 gradient)")


def _check_clip_ratio_c(key: str, value: float, given, loss_mode: str) -> None:
    """``clip_ratio_c`` checked only where the policy loss reads it, as verl does (its loss asserts it): > 1 for
    vanilla's dual clip, > 0 for the DPPO losses' importance-weight truncation. The other built-in loss modes leave
    it unread (:mod:`trainer.unused_settings` warns about a value set for it); a loss mode registered through
    ``external_lib`` checks what it reads itself.

    Raises:
        ConfigError: ``<key>.clip_ratio_c=<given>; expected > 1 (...)`` or ``expected a number > 0 (...)``.
    """
    if loss_mode == "vanilla" and not value > 1.0:
        raise ConfigError(f"{key}.clip_ratio_c={given}; expected > 1 (the dual clip of "
                          f"{key}.policy_loss.loss_mode=vanilla)")
    if loss_mode in ("dppo_tv", "dppo_kl"):
        bounded(f"{key}.clip_ratio_c", value, given, gt=0,
                why=f"the importance-weight truncation of {key}.policy_loss.loss_mode={loss_mode}")


def _check_agg_mode(key: str, mode: str) -> None:
    from trainer.algos.losses import LOSS_AGG_MODES

    if mode not in LOSS_AGG_MODES:
        raise ConfigError(f"{key}.loss_agg_mode={mode!r}; expected one of {list(LOSS_AGG_MODES)}")


@dataclass(frozen=True)
class OptimConfig(Section):
    """A trained role's ``optim``: AdamW (lr, weight_decay, betas) and the LR schedule, whose step counts are
    TRAINING steps (``total_training_steps`` -1 and ``lr_warmup_steps`` < 0 are filled in by
    :func:`trainer.launch.plan_run_length` before the workers start; see :func:`trainer.workers.base._lr_scheduler`).
    """

    lr: float
    weight_decay: float
    betas: tuple
    lr_warmup_steps: int | None
    lr_warmup_steps_ratio: float | None
    lr_scheduler_type: str
    min_lr_ratio: float | None
    num_cycles: float
    total_training_steps: int | None

    def check(self, key: str) -> None:
        """lr finite and >= 0; min_lr_ratio and lr_warmup_steps_ratio fractions in [0, 1]; a min_lr_ratio or
        num_cycles other than the defaults only with the cosine schedule they shape."""
        if finite(f"{key}.lr", self.lr) < 0:
            raise ConfigError(f"{key}.lr={self.given('lr')}; expected >= 0")
        bounded(f"{key}.weight_decay", self.weight_decay, self.given("weight_decay"), ge=0)
        _check_betas(f"{key}.betas", self.betas)
        _check_scheduler(f"{key}.lr_scheduler_type", self.lr_scheduler_type)
        ratio = 0.0 if self.min_lr_ratio is None else self.min_lr_ratio
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"{key}.min_lr_ratio={ratio}; expected a fraction in [0, 1]")
        if self.lr_scheduler_type != "cosine" and (ratio != 0.0 or self.num_cycles != 0.5):
            raise ConfigError(f"{key}.min_lr_ratio={ratio} / num_cycles={self.given('num_cycles')} shape a cosine "
                              f"schedule, but {key}.lr_scheduler_type={self.lr_scheduler_type}; set "
                              "lr_scheduler_type=cosine")
        if not 0.0 <= (self.lr_warmup_steps_ratio or 0.0) <= 1.0:
            raise ConfigError(f"{key}.lr_warmup_steps_ratio={self.given('lr_warmup_steps_ratio')}; expected a "
                              "fraction in [0, 1]")


@dataclass(frozen=True)
class PolicyLossConfig(Section):
    """``actor.policy_loss``: the registered policy loss (``trainer.algos.registry``) and the options of
    clip_cov / kl_cov (Cui et al. 2025)."""

    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float

    def check(self, key: str) -> None:
        from trainer import core_algos

        if self.loss_mode not in core_algos.POLICY_LOSS_REGISTRY:
            raise ConfigError(f"{key}.loss_mode={self.given('loss_mode')!r}; expected one of "
                              f"{sorted(core_algos.POLICY_LOSS_REGISTRY)}")
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            bounded(f"{key}.{name}", getattr(self, name), self.given(name), ge=0, le=1, why="a share of the tokens")
        for name in ("clip_cov_lb", "clip_cov_ub", "ppo_kl_coef"):
            finite(f"{key}.{name}", getattr(self, name))


@dataclass(frozen=True)
class MegatronConfig(Section):
    """``actor.megatron`` of ``trainer.strategy=megatron`` (verl's keys; against the world size and the other
    sections by :func:`trainer.megatron_checks.check_megatron`)."""

    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    context_parallel_size: int
    use_distributed_optimizer: bool
    bf16: Any = field(metadata=AUTO_BOOL)  # auto | true | false
    ckpt_format: str

    def check(self, key: str) -> None:
        """Parallel sizes >= 1, tensor parallelism only (pipeline and context parallel sizes of 1: neither is
        wired), and a known ``ckpt_format`` (torch_dist | torch)."""
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            as_int(getattr(self, name), f"{key}.{name}", minimum=1)
        if self.pipeline_model_parallel_size != 1:
            raise ConfigError(f"{key}.pipeline_model_parallel_size={self.pipeline_model_parallel_size}: pipeline "
                              "parallelism is not supported yet on the Megatron path; use "
                              "pipeline_model_parallel_size=1 with tensor parallelism")
        if self.context_parallel_size != 1:
            raise ConfigError(f"{key}.context_parallel_size={self.context_parallel_size}: context parallelism is not "
                              "wired yet (it needs Transformer Engine's attention); use 1")
        if self.ckpt_format not in ("torch_dist", "torch"):
            raise ConfigError(f"{key}.ckpt_format={self.ckpt_format!r}; expected torch_dist or torch")


@dataclass(frozen=True)
class ActorConfig(Section):
    """``actor_rollout_ref.actor``: the PPO-family update of the policy (batch sizes in rows of one worker where
    the name says ``_per_gpu``, else in prompts; clip ratios and loss options of :mod:`trainer.algos.losses`)."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    policy_loss: PolicyLossConfig
    tau_pos: float
    tau_neg: float
    loss_agg_mode: str
    loss_scale_factor: float | None = field(metadata=built_by(_scale_factor))
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    grad_clip: float
    ulysses_sequence_parallel_size: int
    optim: OptimConfig

    def check(self, key: str) -> None:
        """grad_clip >= 0 (:func:`check_grad_clip`); entropy_coeff finite; kl_loss_coef >= 0; micro-batches of
        >= 1 row; ``clip_ratio_c`` as the policy loss reads it (:func:`_check_clip_ratio_c`); a known loss_agg_mode."""
        check_grad_clip(f"{key}.grad_clip", self.grad_clip, self.given("grad_clip"))
        finite(f"{key}.entropy_coeff", self.entropy_coeff)
        bounded(f"{key}.kl_loss_coef", self.kl_loss_coef, self.given("kl_loss_coef"), ge=0,
                why="the weight of the KL loss against the reference")
        if self.ppo_micro_batch_size_per_gpu <= 0:
            raise ConfigError(f"{key}.ppo_micro_batch_size_per_gpu={self.given('ppo_micro_batch_size_per_gpu')}; "
                              "expected >= 1")
        _check_clip_ratio_c(key, self.clip_ratio_c, self.given("clip_ratio_c"), self.policy_loss.loss_mode)
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            bounded(f"{key}.{name}", getattr(self, name), self.given(name), gt=0,
                    why="the PPO ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]")
        for name in ("tau_pos", "tau_neg"):
            bounded(f"{key}.{name}", getattr(self, name), self.given(name), gt=0, why="SAPO's gate temperature")
        _check_epochs(key, self.ppo_epochs)
        _token_budget(f"{key}.ppo_max_token_len_per_gpu", self.use_dynamic_bsz, self.ppo_max_token_len_per_gpu)
        check_kl_type(f"{key}.kl_loss_type", self.kl_loss_type)
        _check_agg_mode(key, self.loss_agg_mode)


@dataclass(frozen=True)
class RefConfig(Section):
    """``actor_rollout_ref.ref``: how the frozen reference model's log-probs are batched."""

    log_prob_micro_batch_size_per_gpu: int
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int

    def check(self, key: str) -> None:
        _token_budget(f"{key}.log_prob_max_token_len_per_gpu", self.log_prob_use_dynamic_bsz,
                      self.log_prob_max_token_len_per_gpu)


@dataclass(frozen=True)
class CriticConfig(Section):
    """``critic`` (GAE's value model): its update (as the actor's) and value forwards; ``critic.model`` is merged
    over the actor's model (:meth:`trainer.config.model.ModelConfig.for_role`)."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int
    forward_micro_batch_size_per_gpu: int
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int | None
    forward_max_token_len_per_gpu: int | None
    shuffle: bool
    ppo_epochs: int
    cliprange_value: float
    loss_agg_mode: str
    loss_scale_factor: float | None = field(metadata=built_by(_scale_factor))
    grad_clip: float
    ulysses_sequence_parallel_size: int
    optim: OptimConfig

    def check(self, key: str) -> None:
        """grad_clip >= 0 (:func:`check_grad_clip`); update and value micro-batches of >= 1 row; with use_dynamic_bsz
        token budgets >= 1; a known loss_agg_mode."""
        check_grad_clip(f"{key}.grad_clip", self.grad_clip, self.given("grad_clip"))
        bounded(f"{key}.cliprange_value", self.cliprange_value, self.given("cliprange_value"), ge=0)
        _check_epochs(key, self.ppo_epochs)
        for name in ("ppo_micro_batch_size_per_gpu", "forward_micro_batch_size_per_gpu"):
            as_int(getattr(self, name), f"{key}.{name}", minimum=1)
        if self.use_dynamic_bsz:
            for name in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"):
                as_int(getattr(self, name), f"{key}.{name}", minimum=1)
        _check_agg_mode(key, self.loss_agg_mode)


# ---- the Ulysses size of the actor, reference and critic sections against the world and the model ----------------
def ulysses_sizes(cfg: Mapping) -> list[tuple[str, Any]]:
    """``(dotted key, value as written)`` of ``ulysses_sequence_parallel_size`` in each of :data:`ULYSSES_SECTIONS`
    of the run config ``cfg`` whose role runs: the actor's always, the reference's when a KL term needs reference
    log-probs (:func:`trainer.config.runtime.needs_reference`), the critic's when the run has a critic
    (:func:`trainer.run_roles.critic_on`), PRIME's reward model's with PRIME (:func:`trainer.run_roles.section_runs`);
    every section when ``cfg`` lacks the keys that tell. The size of a role
    that does not run is warned about as ignored (:mod:`trainer.unused_settings`), not checked against the workers
    or the model."""
    from trainer.run_roles import section_runs

    out = []
    for key in ULYSSES_SECTIONS:
        if not section_runs(cfg, key):
            continue
        node = cfg
        for part in key.split("."):
            node = node[part]
        if "ulysses_sequence_parallel_size" in node:  # a reward_model section without it: one rank per sequence
            out.append((f"{key}.ulysses_sequence_parallel_size", node["ulysses_sequence_parallel_size"]))
    return out


def check_ulysses_world(cfg: Mapping, world: int) -> None:
    """Each section's Ulysses size divides the run's ``world`` workers (its sequence-parallel groups are
    contiguous ranks; :func:`patches.sequence_parallel.dp_sp_rank_layout`).

    Raises:
        ConfigError: ``<key>=<sp> must divide the <world> workers (trainer.nnodes*trainer.n_gpus_per_node)``, or
        ``<key>=<sp>; expected an integer >= 1``.
    """
    from trainer.config_checks import as_int

    for key, sp in ulysses_sizes(cfg):
        if world % as_int(sp, key, minimum=1):
            raise ConfigError(f"{key}={sp} must divide the {world} workers (trainer.nnodes*trainer.n_gpus_per_node)")


def check_ulysses_heads(cfg: Mapping, heads: int | None, kv_heads: int | None, model: str | None = None,
                        sections: Collection[str] | None = None) -> None:
    """Each section's Ulysses size above 1 splits the attention heads of the model its role loads by the patch's own
    rule (:func:`patches.validate_ulysses_config`: ``heads % sp == 0`` and ``kv_heads % sp == 0 or sp % kv_heads ==
    0``). ``heads`` None (unknown) passes; ``kv_heads`` None means ``heads`` (no GQA). ``model`` names that model in
    the error (``the model critic.model.path='...'``; None: "the model's heads"); ``sections`` (of
    :data:`ULYSSES_SECTIONS`): the sections whose role loads it (None: all). Every such section is checked.

    Raises:
        ConfigError: naming the key, the size, the model, both head counts and the rule that fails, one line per
            section (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    from trainer.config_checks import ErrorCollector

    kv_heads = kv_heads or heads
    errors = ErrorCollector()
    for key, sp in ulysses_sizes(cfg):
        if int(sp) <= 1 or not heads or not _of_sections(key, sections):
            continue
        from patches import validate_ulysses_config

        try:
            validate_ulysses_config(int(heads), int(kv_heads), int(sp))
        except ValueError as exc:
            whose = "the model's heads" if model is None else f"the heads of {model}"
            errors.add(f"{key}={int(sp)} does not fit {whose} (num_attention_heads={heads}, "
                       f"num_key_value_heads={kv_heads}): {exc}")
    errors.raise_if_any()


def _of_sections(key: str, sections: Collection[str] | None) -> bool:
    """Whether the ``<section>.ulysses_sequence_parallel_size`` key ``key`` is of one of ``sections`` (None: all)."""
    return sections is None or key.rsplit(".", 1)[0] in sections


def attention_softcap(hf: Any) -> float | None:
    """The model's attention logit soft-capping (``attn_logit_softcapping``: Gemma 2), read from a model config (a
    dict or a transformers config; a multimodal model's text config, :func:`trainer.role_models.text_value`); None
    when it has none."""
    from trainer.role_models import text_value

    value = text_value(hf, "attn_logit_softcapping")
    return None if value is None else float(value)


def check_ulysses_softcap(cfg: Mapping, softcap: float | None, model: str | None = None,
                          sections: Collection[str] | None = None) -> None:
    """A Ulysses size above 1 needs the varlen kernels, which have no attention logit soft-capping: such a model
    (``softcap`` not None, :func:`attention_softcap`) trains without SP (its forwards are then padded batches
    through the model's own attention, :func:`trainer.workers.model_utils.packs_sequences`). ``model`` and
    ``sections`` as for :func:`check_ulysses_heads`.

    Raises:
        ConfigError: naming the key, the size and the model's soft-capping value, one line per section
            (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    from trainer.config_checks import ErrorCollector

    whose = "the model's attention" if model is None else f"the attention of {model}"
    errors = ErrorCollector()
    for key, sp in ulysses_sizes(cfg):
        if softcap is not None and int(sp) > 1 and _of_sections(key, sections):
            errors.add(f"{key}={int(sp)}: {whose} uses logit soft-capping "
                       f"(attn_logit_softcapping={softcap:g}, e.g. Gemma 2), which the Ulysses varlen kernels "
                       "do not support; expected 1 (no sequence parallelism) for this model")
    errors.raise_if_any()
