"""``deepspeed.ds_config`` against the trainer's own keys and DeepSpeed's key list, before any worker starts.

The workers merge ``deepspeed.ds_config`` over the DeepSpeed config they build (``trainer.workers.base``), so an
entry there wins over the first-class key that owns the same setting, while other parts of the trainer still
follow the first-class key (a ZeRO stage of 3 there with ``deepspeed.zero_stage=2``: DeepSpeed partitions the
weights, the rollout's weight sharing expects whole ones). :func:`check_ds_config_entries` refuses such an entry
unless it equals the first-class value, and refuses a top-level key DeepSpeed does not read (DeepSpeed ignores
it silently). DeepSpeed's own value checks (its pydantic models, e.g. an unknown key inside
``zero_optimization``) are :func:`trainer.config.deepspeed.check_ds_config_values`.
"""
from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping

from trainer.config_checks import ConfigError, ErrorCollector, as_written
from trainer.run_roles import critic_on

__all__ = ["check_ds_config_entries", "deepspeed_top_level_keys"]

KEY = "deepspeed.ds_config"
# read from the config dict by ``deepspeed.initialize`` itself, outside its DeepSpeedConfig
_READ_BY_INITIALIZE = ("sequence_parallel_size", "data_parallel_size")


class _ReadRecorder(dict):
    """A config dict that records the keys read from it (``get``, ``[]``, ``in``, ``in keys()``); copies share the
    record (DeepSpeedConfig parses a copy)."""

    def __init__(self, data=(), read: set | None = None):
        super().__init__(data)
        self.read = set() if read is None else read

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def keys(self):
        return _KeysRecorder(self)

    def __copy__(self):
        return _ReadRecorder(self, self.read)


class _KeysRecorder:
    def __init__(self, owner: _ReadRecorder):
        self.owner = owner

    def __contains__(self, key):
        return key in self.owner

    def __iter__(self):
        return iter(dict.keys(self.owner))

    def __len__(self):
        return len(self.owner)


@functools.lru_cache(maxsize=1)
def deepspeed_top_level_keys() -> frozenset:
    """The top-level keys DeepSpeed reads: those that ``deepspeed.runtime.config.DeepSpeedConfig`` looks up while
    it parses a minimal config (recorded, so the list follows the installed DeepSpeed), and the few that
    ``deepspeed.initialize`` reads itself."""
    from deepspeed.runtime.config import DeepSpeedConfig as DSConfig

    cfg = _ReadRecorder({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                         "zero_optimization": {"stage": 0}})
    DSConfig(cfg)
    return frozenset(k for k in cfg.read if isinstance(k, str)) | frozenset(_READ_BY_INITIALIZE)


def check_ds_config_entries(cfg: Mapping) -> None:
    """Every top-level key of ``deepspeed.ds_config`` is one DeepSpeed reads, and no entry contradicts the
    first-class key that owns its setting: the ZeRO stage, offload, precision, gradient clipping (the actor's, the
    critic's when it is on, PRIME's reward model's), the optimizer and scheduler, and the batch keys.

    Raises:
        ConfigError: one line per bad entry (:class:`trainer.config_checks.ConfigErrors` for several), naming the
            ``ds_config`` entry, the first-class key and both values.
    """
    ds = cfg["deepspeed"]
    extra = ds.get("ds_config")
    if not isinstance(extra, Mapping) or not extra:
        return
    errors = ErrorCollector()
    try:
        known = deepspeed_top_level_keys()
    except ImportError:  # no DeepSpeed here: the strategy's own check reports that
        known = None
    for k in extra:
        if known is not None and k not in known:
            close = difflib.get_close_matches(str(k), sorted(known), n=1)
            errors.add(f"{KEY}.{k}: not a DeepSpeed config key (DeepSpeed would ignore it)"
                       + (f"; did you mean {close[0]}?" if close else "; remove it"))
    for check in (_check_zero, _check_precision, _check_clipping, _check_optimizer, _check_batch):
        errors.run(check, cfg, extra)
    errors.raise_if_any()


def _contradicts(entry: str, value, owner: str, owner_value, why: str = "") -> ConfigError:
    return ConfigError(f"{KEY}.{entry}={as_written(value)} contradicts {owner}={as_written(owner_value)}"
                       + (f" ({why})" if why else "") + f"; set {owner} instead, or leave {entry} out of ds_config")


def _check_zero(cfg: Mapping, extra: Mapping) -> None:
    """``zero_optimization.stage`` vs ``deepspeed.zero_stage``; ``offload_optimizer`` / ``offload_param``
    (``device`` cpu or nvme: on; none or null: off) vs ``deepspeed.offload_optimizer`` / ``offload_param``."""
    ds, zero = cfg["deepspeed"], extra.get("zero_optimization")
    if not isinstance(zero, Mapping):
        return  # DeepSpeed's model reports a zero_optimization that is no mapping
    errors = ErrorCollector()
    stage = zero.get("stage")
    # a stage DeepSpeed refuses (9, 'abc') is reported by its own model (check_ds_config_values), once
    if "stage" in zero and stage in (0, 1, 2, 3) and not isinstance(stage, bool) and stage != ds["zero_stage"]:
        errors.add(str(_contradicts("zero_optimization.stage", stage, "deepspeed.zero_stage", ds["zero_stage"])))
    for name in ("offload_optimizer", "offload_param"):
        if name not in zero:
            continue
        sub = zero[name]
        if isinstance(sub, Mapping) and "device" not in sub:
            continue  # tuning only (pin_memory, buffer sizes): merged over the trainer's own entry
        device = sub.get("device") if isinstance(sub, Mapping) else sub
        on = str(device).lower() in ("cpu", "nvme")
        if on != bool(ds.get(name)):
            errors.add(str(_contradicts(f"zero_optimization.{name}.device", device, f"deepspeed.{name}",
                                        bool(ds.get(name)))))
    errors.raise_if_any()


def _bf16_on(cfg: Mapping) -> bool:
    value = cfg["deepspeed"]["bf16"]
    if value == "auto":
        device = cfg["trainer"]["device"]
        if device == "auto":  # resolved by validate's first check; here for a caller that did not
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        return device == "cuda"
    return bool(value)


def _check_precision(cfg: Mapping, extra: Mapping) -> None:
    """``bf16`` (or DeepSpeed's alias ``bfloat16``) ``.enabled`` vs ``deepspeed.bf16`` as resolved for the device;
    ``fp16`` / ``amp`` enabled: the trainer computes in bf16 or fp32 only (``deepspeed.bf16``)."""
    errors, bf16 = ErrorCollector(), cfg["deepspeed"]["bf16"]
    for name in ("bf16", "bfloat16", "fp16", "amp"):
        sub = extra.get(name)
        if not isinstance(sub, Mapping) or "enabled" not in sub:
            continue
        on, want = bool(sub["enabled"]), (_bf16_on(cfg) if name in ("bf16", "bfloat16") else False)
        if on != want:
            why = f"{'on' if want else 'off'} on trainer.device={cfg['trainer']['device']}" if bf16 == "auto" and \
                name in ("bf16", "bfloat16") else "the trainer computes in bf16 or fp32" if name in ("fp16", "amp") else ""
            errors.add(str(_contradicts(f"{name}.enabled", sub["enabled"], "deepspeed.bf16", bf16, why)))
    errors.raise_if_any()


def _clip_owners(cfg: Mapping) -> list[tuple[str, object]]:
    """(key, value) of the gradient clip of every DeepSpeed-trained role of the run."""
    from trainer.hooks.prime import prime_enabled

    owners = [("actor_rollout_ref.actor.grad_clip", cfg["actor_rollout_ref"]["actor"]["grad_clip"])]
    if critic_on(cfg):
        owners.append(("critic.grad_clip", cfg["critic"]["grad_clip"]))
    optim = ((cfg.get("reward_model") or {}).get("model") or {}).get("optim")
    if prime_enabled(cfg) and isinstance(optim, Mapping) and "grad_clip" in optim:
        owners.append(("reward_model.model.optim.grad_clip", optim["grad_clip"]))
    return owners


def _check_clipping(cfg: Mapping, extra: Mapping) -> None:
    """``gradient_clipping`` equals the clip of every trained role (it would replace each of them)."""
    if "gradient_clipping" not in extra:
        return
    value = extra["gradient_clipping"]
    for owner, clip in _clip_owners(cfg):
        try:
            same = float(value) == float(clip)
        except (TypeError, ValueError):
            same = False
        if not same:
            raise _contradicts("gradient_clipping", value, owner, clip, "it would replace every trained role's clip")


def _check_optimizer(cfg: Mapping, extra: Mapping) -> None:
    """``optimizer`` / ``scheduler``: the trainer builds both (``deepspeed.optimizer``, the roles' ``optim.*``);
    ``zero_allow_untested_optimizer``: the trainer's optimizers need it true."""
    opt = cfg["deepspeed"]["optimizer"]
    for name in ("optimizer", "scheduler"):
        if name in extra:
            raise ConfigError(f"{KEY}.{name}={extra[name]!r}: the trainer builds the {name} itself "
                              f"(deepspeed.optimizer={opt} and the roles' optim.* keys: lr, betas, weight_decay, "
                              f"warmup, lr_scheduler_type); set those instead and leave {name} out of ds_config")
    if "zero_allow_untested_optimizer" in extra and extra["zero_allow_untested_optimizer"] is not True:
        raise _contradicts("zero_allow_untested_optimizer", extra["zero_allow_untested_optimizer"],
                           "deepspeed.optimizer", opt, "its optimizers are untested to DeepSpeed and need true")


# the values the workers set: one micro-batch per backward, accumulation done by the trainer
_BATCH = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "managed_gradient_accumulation": False}
_BATCH_OWNERS = "data.train_batch_size, actor_rollout_ref.actor.ppo_mini_batch_size / ppo_micro_batch_size_per_gpu"


def _check_batch(cfg: Mapping, extra: Mapping) -> None:
    """The batch keys: the trainer owns batch sizes and gradient accumulation (``_BATCH``: what the workers set)."""
    errors = ErrorCollector()
    for name in ("train_batch_size", *_BATCH):
        if name in extra and not (name in _BATCH and extra[name] == _BATCH[name]
                                  and isinstance(extra[name], bool) == isinstance(_BATCH[name], bool)):
            errors.add(f"{KEY}.{name}={as_written(extra[name])}: the trainer owns batch sizes and gradient "
                       "accumulation "
                       f"({_BATCH_OWNERS}; data.train_batch_size={cfg['data']['train_batch_size']})"
                       + (f" and sets {name}={as_written(_BATCH[name])}" if name in _BATCH else "")
                       + "; leave it out of ds_config")
    errors.raise_if_any()
