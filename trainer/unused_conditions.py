"""The conditions under which the settings of :data:`trainer.unused_settings.SWITCHED_OFF`'s families are read:
the estimator's own keys, validation, rollout importance sampling, LoRA, the rollout placement, the training
strategy, the built-in policy losses' keys (:data:`LOSS_MODE_READERS`), the adaptive KL controller's keys, greedy
validation's sampling keys, row-count micro-batches beside token-budget ones and the old-log-prob pass's batching
when the pass never runs (:data:`trainer.on_policy.pass_never_runs`) (:data:`MORE_ROWS`). Each takes
the run's plain config.
"""
from __future__ import annotations

from trainer.on_policy import pass_never_runs
from trainer.verl_compat import _get

__all__ = ["BUILTIN_LOSS_MODES", "LOSS_MODE_READERS", "MORE_ROWS", "micro_batch_unread", "has_val_data", "lora_off",
           "loss_mode", "no_validation_why", "norm_std_readers", "reads_norm_std", "rollout_is_off", "strategy",
           "validates"]

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


_ARR = "actor_rollout_ref"
_VK = f"{_ARR}.rollout.val_kwargs"
#: each row-count micro-batch key -> (the switch of token-budget micro-batches of its role, that switch's budget)
_MICRO = {f"{_A}.ppo_micro_batch_size_per_gpu": (f"{_A}.use_dynamic_bsz", f"{_A}.ppo_max_token_len_per_gpu"),
          **{f"{_ARR}.{r}.log_prob_micro_batch_size_per_gpu": (f"{_ARR}.{r}.log_prob_use_dynamic_bsz",
                                                               f"{_ARR}.{r}.log_prob_max_token_len_per_gpu")
             for r in ("rollout", "ref")},
          **{f"critic.{k}_micro_batch_size_per_gpu": ("critic.use_dynamic_bsz", f"critic.{k}_max_token_len_per_gpu")
             for k in ("ppo", "forward")},
          "reward_model.micro_batch_size_per_gpu": ("reward_model.use_dynamic_bsz",
                                                    "reward_model.max_token_len_per_gpu")}


def _role_runs(run: dict, key: str) -> bool:
    """Whether the role that reads ``key`` runs (:func:`trainer.run_roles.section_runs`); the rollout section's
    log-prob keys are read by the old-log-prob pass, which may never run."""
    from trainer.run_roles import section_runs

    section = key.rsplit(".", 1)[0]
    return not pass_never_runs(run) if section == f"{_ARR}.rollout" else section_runs(run, section)


def micro_batch_unread(run: dict, key: str) -> bool:
    """Whether the row-count micro-batch size ``key`` (one of ``_MICRO``) is read by no role: its own role runs with
    token-budget micro-batches (``use_dynamic_bsz``), and every role that runs with row-count micro-batches has a
    micro-batch size of another value (the shipped sizes copy the actor's, so its value reaches them too). A role
    that does not run is not asked (its section's keys are warned about on their own)."""
    value = _get(run, key)
    if not _role_runs(run, key) or _get(run, _MICRO[key][0]) is not True:
        return False
    return not any(_role_runs(run, k) and _get(run, switch) is not True and _get(run, k) == value
                   for k, (switch, _) in _MICRO.items() if k != key)


def _micro_row(key: str) -> tuple:
    switch, budget = _MICRO[key]
    return (lambda r: micro_batch_unread(r, key), (key,),
            lambda r: f"{switch}=true forms micro-batches by their tokens ({budget}), not by a row count")


def _adaptive_kl_off(run: dict) -> bool:
    return bool(_get(run, "algorithm.use_kl_in_reward")) and _get(run, "algorithm.kl_ctrl.type") == "fixed"


def _greedy_validation(run: dict) -> bool:
    return validates(run) and _get(run, f"{_VK}.do_sample") is False


def _open_lower_clip(run: dict) -> bool:
    return loss_mode(run) in ("vanilla", "gspo", "clip_cov") and float(_get(run, f"{_A}.clip_ratio_low")) >= 1


def _zero_temperature_sampling(run: dict) -> bool:
    return validates(run) and _get(run, f"{_VK}.do_sample") is True and float(_get(run, f"{_VK}.temperature")) == 0


#: more (unused, keys, why) rows of :data:`trainer.unused_settings.SWITCHED_OFF`
MORE_ROWS = (
    (pass_never_runs, tuple(f"{_ARR}.rollout.log_prob_{k}" for k in ("micro_batch_size_per_gpu", "use_dynamic_bsz",
                                                                      "max_token_len_per_gpu")),
     lambda r: f"no old-log-prob pass runs: each step is one optimizer step of the actor ({_A}.ppo_mini_batch_size="
               f"data.train_batch_size, ppo_epochs=1), whose forward gives the old log-probs"),
    (_adaptive_kl_off, ("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"),
     lambda r: "algorithm.kl_ctrl.type=fixed keeps kl_coef (only kl_ctrl.type=adaptive reads them)"),
    (_greedy_validation, tuple(f"{_VK}.{k}" for k in ("temperature", "top_p", "top_k")),
     lambda r: f"{_VK}.do_sample=false decodes greedily (do_sample=true samples with them)"),
    (_open_lower_clip, (f"{_A}.clip_ratio", f"{_A}.clip_ratio_low"),
     lambda r: f"{_A}.policy_loss.loss_mode={loss_mode(r)} clips the ratio below at 1 - clip_ratio_low, at or under 0 "
               "for clip_ratio_low >= 1, where no ratio is: the ratio has no lower clip (clip_ratio_low follows "
               "clip_ratio unless set)"),
    (_zero_temperature_sampling, tuple(f"{_VK}.{k}" for k in ("do_sample", "top_p", "top_k")),
     lambda r: f"{_VK}.temperature=0 decodes greedily, also with do_sample=true (set a temperature > 0 to sample "
               "the validation responses)"),
) + tuple(_micro_row(k) for k in _MICRO)
