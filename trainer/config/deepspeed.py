"""``deepspeed``: ZeRO stage, precision, offload and the optimizer of the trained roles (the deepspeed group,
``configs/deepspeed/zero*.yaml``, holds the defaults)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.config.section import Section
from trainer.config_checks import ConfigError

__all__ = ["DeepSpeedConfig", "OPTIMIZERS", "effective_zero_stage"]

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
        """A ZeRO stage of 0-3, a known optimizer, and a ``ds_config`` that keeps DeepSpeed's gradient norm check
        (:func:`trainer.workers.step_guard.check_ds_config_keeps_norm_check`)."""
        from trainer.workers.step_guard import check_ds_config_keeps_norm_check

        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"{key}.zero_stage={self.given('zero_stage')}; expected 0, 1, 2 or 3")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"{key}.optimizer={self.given('optimizer')!r}; expected torch_adamw or deepspeed_adamw")
        try:
            check_ds_config_keeps_norm_check(self.ds_config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    @property
    def effective_zero_stage(self) -> int:
        """:func:`effective_zero_stage` of this section."""
        return effective_zero_stage({"ds_config": self.ds_config, "zero_stage": self.zero_stage})

    def bf16_on(self, device_type: str) -> bool:
        """Whether the trained roles compute in bf16 on ``device_type`` (``cpu`` | ``cuda``)."""
        return (device_type == "cuda") if self.bf16 == "auto" else bool(self.bf16)
