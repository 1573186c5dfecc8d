"""A DeepSpeed resume loads the checkpoint's optimizer state into the optimizer this run builds, so the settings that
decide that state's layout must be the checkpoint's: the optimizer (``deepspeed.optimizer``: torch's ``AdamW`` saves
param groups without the ``bias_correction`` key that DeepSpeed's ``FusedAdam`` / ``DeepSpeedCPUAdam`` step reads,
so a resume with the other one died at its first step with ``KeyError: 'bias_correction'``) and the precision
(``deepspeed.bf16``, ``deepspeed.ds_config.fp16``: DeepSpeed names the ZeRO files of a bf16 run
``bf16_zero_pp_rank_*``, and an fp16 run keeps its loss scaler with the optimizer state; an fp32 checkpoint resumed
with bf16 died in the workers with ``FileNotFoundError``). :func:`check_engine_layout` refuses a change of either
before any worker starts. Changes that load the same state stay allowed: ``deepspeed.offload_optimizer`` with
``deepspeed_adamw`` (``FusedAdam`` and ``DeepSpeedCPUAdam`` save the same param groups and state), and
``torch_adamw`` on a ``deepspeed_adamw`` checkpoint (torch's AdamW reads DeepSpeed's Adam groups and state).

What a role folder was saved with is read from its client state (``optimizer``, ``precision``:
:func:`trainer.checkpoint.deepspeed_manager.optimizer_layout`); for a checkpoint saved before they were recorded, the
precision from DeepSpeed's ``ds_config`` in its model-states file (else from the ZeRO file names) and the optimizer
from the run config its ``data.pt`` keeps; what cannot be told is left unjudged."""
from __future__ import annotations

import os

from trainer.config_checks import ConfigError

__all__ = ["OPTIMIZER_CLASSES", "check_engine_layout", "run_layout", "saved_layout"]

#: the ``deepspeed.optimizer`` value that builds each optimizer class (``trainer.workers.base`` ``build_optimizer``)
OPTIMIZER_CLASSES = {"AdamW": "torch_adamw", "FusedAdam": "deepspeed_adamw", "DeepSpeedCPUAdam": "deepspeed_adamw"}
_PRECISION_KEYS = {"bf16": "deepspeed.bf16=true", "fp16": "deepspeed.ds_config.fp16.enabled=true",
                   "fp32": "deepspeed.bf16=false"}


def _enabled(section) -> bool | None:
    return bool(section.get("enabled", False)) if isinstance(section, dict) else None


def _precision(ds_config: dict, bf16: bool) -> str:
    """``fp16`` | ``bf16`` | ``fp32`` of a DeepSpeed config (``bf16``: its value when the config has no ``bf16``)."""
    if _enabled(ds_config.get("fp16")):
        return "fp16"
    on = _enabled(ds_config.get("bf16"))
    return "bf16" if (bf16 if on is None else on) else "fp32"


def run_layout(cfg: dict) -> dict:
    """``{"optimizer": torch_adamw | deepspeed_adamw, "precision": bf16 | fp16 | fp32}`` that the trained roles of
    ``cfg`` build (the workers merge ``deepspeed.ds_config`` over the generated config, so its ``fp16`` / ``bf16``
    decide; ``deepspeed.bf16=auto`` is bf16 on cuda)."""
    from trainer.config_validate import detect_device

    ds = cfg["deepspeed"]
    device = (cfg.get("trainer") or {}).get("device") or "auto"
    device = detect_device() if device == "auto" else device
    bf16 = (device == "cuda") if ds.get("bf16", "auto") == "auto" else bool(ds.get("bf16"))
    return {"optimizer": ds.get("optimizer"), "precision": _precision(ds.get("ds_config") or {}, bf16)}


def saved_layout(role_dir: str, saved_cfg: dict | None = None) -> dict:
    """The ``optimizer`` (a ``deepspeed.optimizer`` value) and ``precision`` the DeepSpeed role folder ``role_dir``
    was saved with: its client state, else (older checkpoints) the precision from DeepSpeed's ``ds_config`` in the
    model-states file or the ZeRO file names (``bf16_zero_pp_rank_*``: bf16; ``zero_pp_rank_*``: not bf16), and the
    optimizer from ``saved_cfg`` (the run config the step's ``data.pt`` keeps). A key that cannot be told is absent.

    Raises:
        FileNotFoundError: no ``latest`` file or no model-states file (:func:`read_model_states`).
    """
    from trainer.checkpoint.deepspeed_manager import CLIENT_STATE_KEY, read_model_states

    folder, sd = read_model_states(role_dir)
    client = sd.get(CLIENT_STATE_KEY) or {}
    out = {}
    if client.get("optimizer") in OPTIMIZER_CLASSES:
        out["optimizer"] = OPTIMIZER_CLASSES[client["optimizer"]]
    elif isinstance(saved_cfg, dict) and (saved_cfg.get("deepspeed") or {}).get("optimizer"):
        out["optimizer"] = saved_cfg["deepspeed"]["optimizer"]
    if client.get("precision"):
        out["precision"] = client["precision"]
    elif isinstance(sd.get("ds_config"), dict):
        out["precision"] = _precision(sd["ds_config"], False)
    else:
        names = os.listdir(folder)
        if any(n.startswith("bf16_zero_pp_rank_") for n in names):
            out["precision"] = "bf16"
        elif any(n.startswith("zero_pp_rank_") and n.endswith("optim_states.pt") for n in names):
            out["precision"] = "fp16 or fp32"  # compared as "not bf16"
    return out


def _differs(key: str, saved: str, now: str) -> bool:
    """Whether ``now`` cannot resume a state saved with ``saved``. DeepSpeed's Adam (either class) loads into torch's
    AdamW: its groups gain AdamW's defaults (decoupled weight decay), the moments and step count are kept; the
    other way round the groups lack the ``bias_correction`` key that DeepSpeed's Adam reads."""
    if key == "optimizer":
        return saved == "torch_adamw" and now != saved
    if saved == "fp16 or fp32":
        return now == "bf16"
    return saved != now


def _message(path: str, role: str, key: str, saved: str, now: str) -> str:
    if key == "optimizer":
        was, has, use = (f"deepspeed.optimizer={v}" for v in (saved, now, saved))
        why = ("torch's AdamW saved its param groups without the bias_correction key that DeepSpeed's Adam reads, so "
               "the first step would fail")
    else:
        was, has = (f"{v} precision" + (f" ({_PRECISION_KEYS[v]})" if v in _PRECISION_KEYS else "")
                    for v in (saved, now))
        use = _PRECISION_KEYS.get(saved, "the checkpoint's precision")
        why = ("DeepSpeed saves each precision's optimizer state in other files or layouts (bf16_zero_pp_rank_* "
               "under bf16, the loss scaler under fp16), so it would not load, or load wrong")
    return (f"trainer.resume_mode: {path!r} ({role}) was saved with {was} but this run has {has}: {why}; resume with "
            f"{use}, or start a new run with trainer.resume_mode=disable (from its HF export, tools/export_hf.py, as "
            "actor_rollout_ref.model.path)")


def check_engine_layout(cfg: dict, path: str, roles: list[str], saved_cfg: dict | None = None) -> None:
    """Every DeepSpeed role folder of ``roles`` under the step folder ``path`` was saved with the optimizer and
    precision this run trains with (:func:`run_layout` against :func:`saved_layout`); a folder whose record cannot be
    read, or a key it does not tell, is left to the worker's load. ``saved_cfg``: the run config of the step's
    ``data.pt`` (older checkpoints' optimizer).

    Raises:
        ConfigError: one line naming the checkpoint, the role, the key, the checkpoint's value and this run's, and
            what to do.
    """
    if cfg.get("deepspeed") is None:
        return
    now = run_layout(cfg)
    for role in roles:
        try:
            saved = saved_layout(os.path.join(path, role), saved_cfg)
        except (OSError, RuntimeError, ValueError):
            continue
        for key in ("optimizer", "precision"):
            if key in saved and now.get(key) is not None and _differs(key, saved[key], now[key]):
                raise ConfigError(_message(path, role, key, saved[key], now[key]))
