"""``deepspeed``: ZeRO stage, precision, offload and the optimizer of the trained roles (the deepspeed group,
``configs/deepspeed/zero*.yaml``, holds the defaults)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.config.section import Section
from trainer.config_checks import ConfigError

__all__ = ["DeepSpeedConfig", "OPTIMIZERS", "effective_zero_stage", "check_ds_config_values"]

OPTIMIZERS = ("torch_adamw", "deepspeed_adamw")


def effective_zero_stage(ds) -> int:
    """The ZeRO stage a run's ``deepspeed`` section (a mapping) trains with: ``ds_config.zero_optimization.stage``
    when set (the workers merge ``deepspeed.ds_config`` into DeepSpeed's config last), else ``zero_stage``."""
    zero = (ds.get("ds_config") or {}).get("zero_optimization") or {}
    return int(zero.get("stage", ds["zero_stage"]))


@dataclass(frozen=True)
class DeepSpeedConfig(Section):
    """``deepspeed``.

    Attributes:
        zero_stage: 0-3 of the actor and critic (a frozen reference uses 3 when training does, else 0).
        bf16: auto (on for cuda, off for cpu) | true | false.
        offload_optimizer, offload_param: ZeRO-Offload of optimizer states / (stage 3) parameters to CPU.
        optimizer: torch_adamw | deepspeed_adamw.
        ds_config: a raw DeepSpeed config merged over the generated one, or None.
    """

    zero_stage: int
    bf16: Any
    offload_optimizer: bool
    offload_param: bool
    optimizer: str
    ds_config: dict | None

    def check(self, key: str) -> None:
        """A ZeRO stage of 0-3, a known optimizer (``deepspeed_adamw`` with ``offload_optimizer``: DeepSpeed's
        ZeRO-Offload refuses a client optimizer other than its CPU Adam), and a ``ds_config`` that keeps DeepSpeed's
        gradient norm check (:func:`trainer.workers.step_guard.check_ds_config_keeps_norm_check`)."""
        from trainer.workers.step_guard import check_ds_config_keeps_norm_check

        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"{key}.zero_stage={self.given('zero_stage')}; expected 0, 1, 2 or 3")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"{key}.optimizer={self.given('optimizer')!r}; expected torch_adamw or deepspeed_adamw")
        if self.offload_optimizer and self.optimizer == "torch_adamw":  # DeepSpeed refuses it in every worker
            raise ConfigError(f"{key}.offload_optimizer=true with {key}.optimizer=torch_adamw: ZeRO-Offload steps the "
                              f"optimizer on the CPU with DeepSpeed's CPU Adam; expected {key}.optimizer="
                              "deepspeed_adamw with the offload")
        try:
            check_ds_config_keeps_norm_check(self.ds_config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if self.ds_config:
            check_ds_config_values(self.ds_config, self.zero_stage, f"{key}.ds_config")

    @property
    def effective_zero_stage(self) -> int:
        """:func:`effective_zero_stage` of this section."""
        return effective_zero_stage({"ds_config": self.ds_config, "zero_stage": self.zero_stage})

    def bf16_on(self, device_type: str) -> bool:
        """Whether the trained roles compute in bf16 on ``device_type`` (``cpu`` | ``cuda``)."""
        return (device_type == "cuda") if self.bf16 == "auto" else bool(self.bf16)


# the workers set these per role and rank count; checked there, not here (one process here)
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def check_ds_config_values(ds_config: dict, zero_stage: int, key: str) -> None:
    """Build DeepSpeed's own config object (``deepspeed.runtime.config.DeepSpeedConfig``, its pydantic models) from
    ``ds_config`` over a minimal base, so that a value DeepSpeed refuses (``zero_optimization.stage=9``, a string
    where a number belongs) stops the run here instead of inside every worker. The batch keys are left out (the
    workers set them for their own rank count).

    Raises:
        ConfigError: one line naming ``key``, the offending entry and DeepSpeed's reason.
    """
    from deepspeed.runtime.config import DeepSpeedConfig as DSConfig

    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": zero_stage}}
    for k, v in ds_config.items():
        if k in _BATCH_KEYS:
            continue
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    try:
        DSConfig(cfg)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, DeepSpeed's asserts and ValueErrors
        errors = getattr(exc, "errors", None)
        if callable(errors):  # pydantic: the first field it refused, in the section's model (title)
            e = errors()[0]
            where = ".".join(str(x) for x in e.get("loc", ()))
            raise ConfigError(f"{key}: {where}={e.get('input')!r} in DeepSpeed's {getattr(exc, 'title', 'config')}: "
                              f"{e.get('msg')}") from None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{key}: DeepSpeed refuses it: {reason}") from None
