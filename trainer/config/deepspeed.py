"""``deepspeed``: ZeRO stage, precision, offload and the optimizer of the trained roles (the deepspeed group,
``configs/deepspeed/zero*.yaml``, holds the defaults)."""
from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.config.section import AUTO_BOOL, Section
from trainer.config_checks import ConfigError

__all__ = ["DeepSpeedConfig", "OPTIMIZERS", "effective_zero_stage", "check_ds_config_values"]

OPTIMIZERS = ("torch_adamw", "deepspeed_adamw")


def effective_zero_stage(ds) -> int:
    """The ZeRO stage a run's ``deepspeed`` section (a mapping) trains with: ``ds_config.zero_optimization.stage``
    when set (the workers merge ``deepspeed.ds_config`` into DeepSpeed's config last), else ``zero_stage``."""
    raw = ds.get("ds_config")
    zero = (raw.get("zero_optimization") if isinstance(raw, Mapping) else None) or {}
    stage = zero.get("stage", ds["zero_stage"]) if isinstance(zero, Mapping) else ds["zero_stage"]
    return int(stage) if isinstance(stage, int) else int(ds["zero_stage"])  # another value: the section refuses it


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
    bf16: Any = field(metadata=AUTO_BOOL)  # auto | true | false
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
            if e.get("type") == "extra_forbidden":
                raise ConfigError(_unknown_key_line(ds_config, getattr(exc, "title", ""), e["loc"], key)) from None
            where = ".".join(str(x) for x in e.get("loc", ()))
            raise ConfigError(f"{key}: {where}={e.get('input')!r} in DeepSpeed's {getattr(exc, 'title', 'config')}: "
                              f"{e.get('msg')}") from None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{key}: DeepSpeed refuses it: {reason}") from None


def _unknown_key_line(ds_config: Mapping, title: str, loc: tuple, key: str) -> str:
    """The error line of a nested ``ds_config`` key that DeepSpeed's model ``title`` (e.g. ``DeepSpeedZeroConfig``)
    does not have, at ``loc`` inside that model: its dotted path in ``ds_config`` and, as for an unknown top-level
    key (:func:`trainer.ds_config_checks.check_ds_config_entries`), the nearest key DeepSpeed has there."""
    loc = tuple(str(x) for x in loc)
    top = next((k for k, v in ds_config.items() if _holds(v, loc)), None)
    parent = ".".join(([str(top)] if top is not None else []) + list(loc[:-1]))
    close = difflib.get_close_matches(loc[-1], sorted(_model_keys(title, loc[:-1])), n=1)
    hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else "; remove it"
    return (f"{key}.{parent + '.' if parent else ''}{loc[-1]}: not a key of DeepSpeed's {title or 'config'} "
            f"(DeepSpeed refuses it){hint}")


def _holds(node, loc: tuple) -> bool:
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _model_keys(title: str, path: tuple) -> set:
    """The keys (field names and aliases) of DeepSpeed's pydantic model named ``title``, or of the model at ``path``
    below it; empty when it is not found."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    todo, model = [DeepSpeedConfigModel], None
    while todo and model is None:
        cls = todo.pop()
        model = cls if cls.__name__ == title else None
        todo += cls.__subclasses__()
    for part in path:
        fields = getattr(model, "model_fields", {})
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        model = _sub_model(field.annotation) if field is not None else None
    fields = getattr(model, "model_fields", {})
    return set(fields) | {f.alias for f in fields.values() if f.alias}


def _sub_model(annotation):
    """The pydantic model inside a field's annotation (``Optional[X]``, ``X | None``), or None."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    return next((m for m in map(_sub_model, typing.get_args(annotation)) if m is not None), None)
