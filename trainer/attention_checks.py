"""The settings that choose an attention implementation, checked before any worker starts:
``actor_rollout_ref.rollout.attn_implementation`` (the hf engine's inference copy) and ``attn_implementation`` in
``actor_rollout_ref.model.override_config`` and ``critic.model.override_config`` (the trained, reference and
critic models; a sub-config's entry such as ``text_config.attn_implementation`` too).

transformers only finds out that an implementation cannot run when a worker loads the model: FlashAttention
(``flash_attention_2/3/4``) needs CUDA and its package (on CUDA without it, transformers can load the same kernel
from the Hub through the ``kernels`` library instead), and FlexAttention has no backward pass on the CPU, so a
trained model cannot use it there (the rollout's inference copy can).
"""
from __future__ import annotations

import importlib.util

from trainer.config_checks import ConfigError
from trainer.override_checks import attention_entries, override_sources

__all__ = ["FLASH_PACKAGES", "check_implementation", "check_attention", "packed_attention_warnings"]

#: transformers' FlashAttention implementations: the module each imports and its package (how it is installed)
FLASH_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn (pip install flash-attn)"),
                  "flash_attention_3": ("flash_attn_interface", "flash-attn-3 (FlashAttention's hopper build)"),
                  "flash_attention_4": ("flash_attn", "flash-attn-4")}
ROLLOUT_KEY = "actor_rollout_ref.rollout.attn_implementation"


def _known_names() -> list[str]:
    from transformers import AttentionInterface

    return sorted({"eager", "sdpa", *AttentionInterface().valid_keys()})  # transformers' registered functions


def check_implementation(key: str, value, device: str, trained: bool) -> None:
    """One attention setting ``key=value`` on ``device`` (``trained``: a model whose backward runs).

    Raises:
        ConfigError: an unknown name (a model's key; the rollout's names are its section's check), FlashAttention
            without CUDA or without its package, or FlexAttention for a trained model on the CPU.
    """
    if isinstance(value, dict):  # transformers' per-sub-config form: {"": ..., "text_config": ...}
        for sub, v in value.items():
            check_implementation(f"{key}.{sub}" if sub else key, v, device, trained)
        return
    if value is None:
        return
    name = str(value).removeprefix("paged|")  # transformers drops the paged prefix (continuous batching only)
    if "/" not in name and name not in _known_names():  # org/name: a Hub kernel
        if not trained:
            return  # the rollout's names are refused by its section (trainer.config.rollout)
        raise ConfigError(f"{key}={value!r}; expected eager, sdpa or one of transformers' {_known_names()}")
    if name in FLASH_PACKAGES:
        module, package = FLASH_PACKAGES[name]
        missing = importlib.util.find_spec(module) is None
        if device != "cuda":
            raise ConfigError(f"{key}={value!r} needs trainer.device=cuda (FlashAttention runs on NVIDIA GPUs), got "
                              f"{device!r}" + (f", and the package {package}" if missing else "")
                              + "; use sdpa or eager on this machine")
        if missing and importlib.util.find_spec("kernels") is None:
            raise ConfigError(f"{key}={value!r} needs the package {package}, not installed (or the kernels "
                              "package, to load the kernel from the Hub: pip install kernels); or use sdpa")
    if name == "flex_attention" and trained and device != "cuda":
        raise ConfigError(f"{key}={value!r}: FlexAttention has no backward pass on the CPU, so the model cannot be "
                          f"trained with it on trainer.device={device}; use sdpa or eager")


def check_attention(cfg: dict) -> None:
    """Every attention setting of the run (see the module): the rollout's (hf engine), the actor's
    ``override_config`` and the critic's own, on ``trainer.device``.

    Raises:
        ConfigError: naming the first setting that cannot run and what it needs.
    """
    device = cfg["trainer"]["device"]
    rollout = cfg["actor_rollout_ref"]["rollout"]
    if rollout.get("name") == "hf" and (rollout.get("attn_implementation") or "auto") != "auto":
        check_implementation(ROLLOUT_KEY, rollout["attn_implementation"], device, trained=False)
    for key, override, _ in override_sources(cfg):
        for name, value in attention_entries(override, key):
            check_implementation(name, value, device, trained=True)


def packed_attention_warnings(cfg: dict, softcapped: bool | None = None) -> list[str]:
    """One warning line per attention entry of an ``override_config`` whose role runs packed forwards
    (``use_remove_padding``, or Ulysses SP above 1): the decoder's attention is then the packed (varlen) one
    (:func:`patches.ulysses.apply_ulysses_patch`; a padded batch there runs transformers' SDPA), and the entry
    reaches other sub-models (a vision tower) only. None for a role whose model has attention logit soft-capping
    (its forwards run padded, through the attention the entry chooses,
    :func:`trainer.workers.model_utils.packs_sequences`) unless its SP is above 1, for a null entry (transformers'
    default) and for an entry refused by :func:`check_attention`. ``softcapped``: whether the model is soft-capped,
    for every role; None: read for each role from its own model (:func:`trainer.role_models.role_config`)."""
    arr = cfg["actor_rollout_ref"]
    critic = cfg.get("critic") or {}
    packed = {"actor_rollout_ref": (arr["model"].get("use_remove_padding"),
                                    (arr.get("actor") or {}).get("ulysses_sequence_parallel_size")),
              "critic": ((critic.get("model") or {}).get("use_remove_padding", arr["model"].get("use_remove_padding")),
                         critic.get("ulysses_sequence_parallel_size"))}
    out = []
    for key, override, _ in override_sources(cfg):
        role = key.split(".")[0]
        rmpad, sp = packed[role]
        if int(sp or 1) <= 1 and not (bool(rmpad) and not _softcapped(cfg, role, softcapped)):
            continue
        where = f"{key.rsplit('.', 1)[0]}.use_remove_padding"
        out += [f"{name}={value!r}: not used by the decoder, whose attention is the packed (varlen) kernel while "
                f"{where} is on (or Ulysses SP > 1); set {where}=false to use it"
                for name, value in attention_entries(override, key) if value is not None and _runs(name, value, cfg)]
    return out


def _softcapped(cfg: dict, role: str, softcapped: bool | None) -> bool:
    """``softcapped`` when given, else whether the model the ``role`` (``actor_rollout_ref`` or ``critic``) loads
    has attention logit soft-capping (:func:`trainer.config.actor.attention_softcap`; a folder that cannot be read
    counts as none: the folder checks report it)."""
    if softcapped is not None:
        return softcapped
    from trainer.config.actor import attention_softcap
    from trainer.role_models import role_config, section_models

    model = section_models(cfg)["critic" if role == "critic" else "actor_rollout_ref.actor"][0]
    try:
        return attention_softcap(role_config(cfg, model)) is not None
    except (ConfigError, OSError):
        return False


def _runs(key: str, value, cfg: dict) -> bool:
    """Whether :func:`check_implementation` accepts ``key=value`` (a trained model's) on the run's device."""
    try:
        check_implementation(key, value, cfg["trainer"]["device"], trained=True)
    except ConfigError:
        return False
    return True
