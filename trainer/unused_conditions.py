"""The conditions under which the settings of :data:`trainer.unused_settings.SWITCHED_OFF`'s families are read:
the estimator's own keys, validation, rollout importance sampling, LoRA, the rollout placement, the training
strategy and the built-in policy losses' keys (:data:`LOSS_MODE_READERS`). Each takes the run's plain config.
"""
from __future__ import annotations

from trainer.verl_compat import _get

__all__ = ["BUILTIN_LOSS_MODES", "LOSS_MODE_READERS", "has_val_data", "lora_off", "loss_mode", "no_validation_why",
           "norm_std_readers", "reads_norm_std", "rollout_is_off", "strategy", "validates"]

_A = "actor_rollout_ref.actor"
_CLIPPED = ("vanilla", "gspo", "cispo", "geo_mean", "clip_cov", "dppo_tv", "dppo_kl")
#: the built-in policy losses' own keys -> the loss modes that read them (trainer/algos/losses.py, policy_losses.py;
#: tests/test_verl_keys.py checks every built-in loss mode against it); a loss mode registered
#: elsewhere (external_lib) may read any key, so with one none is warned about
LOSS_MODE_READERS = {
    (f"{_A}.clip_ratio", f"{_A}.clip_ratio_low", f"{_A}.clip_ratio_high"): _CLIPPED,
    (f"{_A}.clip_ratio_c",): ("vanilla", "dppo_tv", "dppo_kl"),
    (f"{_A}.tau_pos", f"{_A}.tau_neg"): ("sapo",),
    tuple(f"{_A}.policy_loss.{k}" for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")): ("clip_cov",),
    (f"{_A}.policy_loss.kl_cov_ratio", f"{_A}.policy_loss.ppo_kl_coef"): ("kl_cov",),
}
BUILTIN_LOSS_MODES = ("vanilla", "gspo", "gpg", "cispo", "geo_mean", "clip_cov", "kl_cov", "sapo", "dppo_tv", "dppo_kl")


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def reads_norm_std(run: dict) -> bool:
    """Whether the run's estimator reads ``algorithm.norm_adv_by_std_in_grpo`` (its registry entry's
    ``config_kwargs``); True for a name that is no estimator (refused elsewhere)."""
    from trainer.core_algos import ADV_ESTIMATOR_SPECS

    spec = ADV_ESTIMATOR_SPECS.get(str(_get(run, "algorithm.adv_estimator")))
    return spec is None or "norm_adv_by_std_in_grpo" in spec.config_kwargs


def norm_std_readers() -> str:
    """The registered estimators that read ``algorithm.norm_adv_by_std_in_grpo``, comma-separated."""
    from trainer.core_algos import ADV_ESTIMATOR_SPECS

    return ", ".join(n for n, s in ADV_ESTIMATOR_SPECS.items() if "norm_adv_by_std_in_grpo" in s.config_kwargs)


def has_val_data(run: dict) -> bool:
    """Held-out data: ``data.val_files``, or the embedded task's (generated when ``data.train_files`` is null)."""
    return bool(_get(run, "data.val_files")) or _get(run, "data.train_files") is None


def validates(run: dict) -> bool:
    """Whether a validation pass runs: held-out data (:func:`has_val_data`) and ``trainer.val_only``,
    ``val_before_train`` or ``test_freq > 0``."""
    t = run.get("trainer") or {}
    return has_val_data(run) and bool(t.get("val_only") or t.get("val_before_train") or _int(t.get("test_freq")) > 0)


def no_validation_why(run: dict) -> str:
    """Why no validation pass runs (for a warning line)."""
    if not has_val_data(run):
        return "no validation runs without held-out data (data.val_files unset)"
    return (f"no validation runs (trainer.test_freq={_get(run, 'trainer.test_freq')}, val_before_train=false, "
            "val_only=false)")


def rollout_is_off(run: dict) -> bool:
    """``algorithm.rollout_correction.rollout_is`` off: null, or ``auto`` with ``trainer.async.staleness`` 0."""
    level = _get(run, "algorithm.rollout_correction.rollout_is")
    if level == "auto":
        return _int(_get(run, "trainer.async.staleness")) <= 0
    return level in (None, "", "none", "null")


def lora_off(run: dict, model: str) -> bool:
    """Whether the model section ``model`` trains every weight (``lora_rank`` 0 or null)."""
    return not _int(_get(run, f"{model}.lora_rank"))


def strategy(run: dict) -> str:
    """``trainer.strategy`` (deepspeed when unset)."""
    return str(_get(run, "trainer.strategy") or "deepspeed")


def loss_mode(run: dict) -> str:
    """``actor.policy_loss.loss_mode``."""
    return str(_get(run, f"{_A}.policy_loss.loss_mode"))
