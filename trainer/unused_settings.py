"""Settings that a run's other choices leave without effect: each gets one warning line before start-up (verl
accepts and ignores them without a word). A setting counts as set when it differs from the value the root config
(``configs/ppo_trainer.yaml``) gives it in this run, its interpolations resolved against the run's own values.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

from trainer.verl_compat import R, _fmt, _get, leaves, same_value

__all__ = ["ENGINE_KEYS", "switched_off_warnings", "unused_setting_warnings"]

ROOT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "ppo_trainer.yaml")
KL_LOSS = "actor_rollout_ref.actor.use_kl_loss"
_INTERP = re.compile(r"^\$\{(\.?[\w.]+)\}$")
_MISSING = object()


# rollout keys of one engine, with their group defaults: another engine leaves them unused
ENGINE_KEYS = {"vllm": {"tensor_model_parallel_size": 1, "gpu_memory_utilization": 0.5},
               "hf": {"static_cache": "auto", "max_batch_size": 256, "prompt_length_bucket": 64}}


def unused_setting_warnings(cfg: dict) -> list[str]:
    """Warnings for settings that this run's other choices leave without effect: rollout keys of the other engine
    (set away from their defaults), ``free_cache_engine=false`` (the engine always frees its KV cache: it sleeps
    while DeepSpeed trains), ``deepspeed.offload_param`` below ZeRO-3, a custom reward function's name without
    its path, ``use_kl_in_reward`` with PRIME (whose advantages never read the penalised rewards),
    ``rollout.multi_turn`` settings while multi-turn rollouts are off, ``critic.*`` settings of a run without a
    critic and ``actor.kl_loss_*`` without ``actor.use_kl_loss`` (:func:`switched_off_warnings`)."""
    from trainer.config.deepspeed import effective_zero_stage

    rc = _get(cfg, R) or {}
    out = []
    ds = cfg.get("deepspeed") or {}
    if ds.get("offload_param") and effective_zero_stage(ds) < 3:
        out.append(f"deepspeed.offload_param=true: no effect: DeepSpeed offloads parameters with ZeRO-3 only, this run "
                   f"has ZeRO-{effective_zero_stage(ds)} (add deepspeed=zero3)")
    custom = _get(cfg, "reward_model.custom_reward_function") or {}
    if not custom.get("path") and custom.get("name") not in (None, "compute_score"):
        out.append(f"reward_model.custom_reward_function.name={custom['name']}: ignored without "
                   "custom_reward_function.path (the file that defines it)")
    from trainer.hooks.prime import prime_enabled

    if (cfg.get("algorithm") or {}).get("use_kl_in_reward") and prime_enabled(cfg):
        out.append("algorithm.use_kl_in_reward=true: no effect with algorithm=prime: PRIME's advantages are built from "
                   "the verified and the implicit process rewards, not from token_level_rewards where that penalty "
                   "goes (use actor_rollout_ref.actor.use_kl_loss=true for a KL term)")
    if "free_cache_engine" in rc and rc["free_cache_engine"] is not True:  # the rollout groups set true
        out.append(f"{R}.free_cache_engine={_fmt(rc['free_cache_engine'])}: ignored: the engine always frees its KV "
                   "cache after generation (it sleeps while DeepSpeed trains)")
    name = rc.get("name")
    if name != "vllm" and rc.get("prompt_length") != _get(cfg, "data.max_prompt_length"):
        out.append(f"{R}.prompt_length={_fmt(rc.get('prompt_length'))}: ignored: rollout.name={name} takes each "
                   "batch's prompts as they are (data.max_prompt_length limits them); only vLLM sizes its context by it")
    for engine, keys in ENGINE_KEYS.items():
        if engine == name:
            continue
        for key, default in keys.items():
            if key in rc and not same_value(rc[key], default):
                out.append(f"{R}.{key}={_fmt(rc[key])}: ignored: a setting of rollout.name={engine}, and this run "
                           f"generates with rollout.name={name}")
    from trainer.multi_turn import unused_multi_turn_warnings

    return out + unused_multi_turn_warnings(rc) + switched_off_warnings(cfg)


@lru_cache(maxsize=1)
def _root_sections() -> dict:
    """The root config's ``critic`` section and the actor's KL-loss keys, unresolved (interpolations kept)."""
    from omegaconf import OmegaConf

    root = OmegaConf.load(ROOT_CONFIG)
    actor = root.actor_rollout_ref.actor
    return {"critic": OmegaConf.to_container(root.critic, resolve=False),
            "kl_loss": {k: actor[k] for k in ("kl_loss_coef", "kl_loss_type")}}


def _resolve(plain_cfg: dict, key: str, default):
    """``default`` of the leaf ``key``; an interpolation of one key (``${a.b}``, or ``${.b}`` beside the leaf)
    is read from ``plain_cfg`` (the run's values); anything else is returned as it is."""
    m = _INTERP.match(default) if isinstance(default, str) else None
    if m is None:
        return default
    ref = m.group(1)
    return _get(plain_cfg, f"{key.rpartition('.')[0]}{ref}" if ref.startswith(".") else ref, _MISSING)


def _set_leaves(cfg: dict, section: str, defaults: dict) -> list[str]:
    """``key=value`` (the run's value) of the leaves of ``cfg``'s ``section`` that differ from ``defaults`` (a
    root-config section placed at ``section``): an interpolation such as ``${.ppo_micro_batch_size_per_gpu}`` is
    resolved in the run's own config at the leaf's place, so a value that follows its source is not counted.
    The walk reads no key of a recording config (:func:`trainer.config_reads.plain`)."""
    from trainer.config_reads import plain

    run = plain(cfg)
    now = dict(leaves(_get(run, section) or {}, section))
    out = []
    for key, default in leaves(defaults, section):
        default = _resolve(run, key, default)
        if key in now and default is not _MISSING and not same_value(now[key], default):
            out.append(f"{key}={_fmt(now[key])}")
    return out


def switched_off_warnings(cfg: dict) -> list[str]:
    """``critic.*`` set (away from the root config's values) while the run trains no critic (``critic.enable``
    false, or null with an estimator that needs none, e.g. GRPO), and ``actor.kl_loss_coef`` / ``kl_loss_type``
    set while ``actor.use_kl_loss`` is false: one warning line each naming the keys and the switch."""
    out = []
    enable = (cfg.get("critic") or {}).get("enable")
    if enable is None:
        from trainer.core_algos import ADV_ESTIMATOR_SPECS

        spec = ADV_ESTIMATOR_SPECS.get((cfg.get("algorithm") or {}).get("adv_estimator"))
        enable = bool(spec is not None and spec.needs_critic)
    if not enable and isinstance(cfg.get("critic"), dict):
        node = dict(_root_sections()["critic"])
        node.pop("enable", None)
        changed = _set_leaves(cfg, "critic", node)
        if changed:
            est = (cfg.get("algorithm") or {}).get("adv_estimator")
            out.append(f"{', '.join(changed)}: ignored: this run trains no critic (algorithm.adv_estimator={est}, "
                       "critic.enable unset or false); algorithm=gae or critic.enable=true trains one")
    if not _get(cfg, KL_LOSS):
        actor = "actor_rollout_ref.actor"
        changed = _set_leaves(cfg, actor, _root_sections()["kl_loss"])
        if changed:
            out.append(f"{', '.join(changed)}: ignored: {KL_LOSS}=false (set it true for the KL loss term)")
    return out
