"""Config checks of the algorithm: the advantage estimator, the policy loss and the loss aggregation.

Called by :func:`trainer.launch.validate` before any worker starts; every error is one :class:`ConfigError` line
naming the key, the bad value and what was expected.
"""
from __future__ import annotations

from trainer.config_checks import ConfigError

__all__ = ["check_estimator_and_loss", "check_reward_components", "PRIME_ESTIMATOR"]

#: the estimator PRIME's own advantages are (leave-one-out per reward source): the one value accepted with use_prime
PRIME_ESTIMATOR = "rloo"


def check_estimator_and_loss(cfg: dict) -> None:
    """The estimator and policy loss are registered (with PRIME, the estimator is :data:`PRIME_ESTIMATOR`, which
    its own advantages are), and the estimator's registry traits fit the config: a
    group-based one needs ``rollout.n >= 2``, one that needs a critic needs ``critic.enable``, and every declared
    input is made by a stage of this run or by a producer (:func:`trainer.adv_inputs.missing_inputs`).

    Raises:
        ConfigError: naming the key and value; unknown names list every registered name.
    """
    from trainer import core_algos
    from trainer.adv_inputs import missing_inputs

    est = cfg["algorithm"]["adv_estimator"]
    if est not in core_algos.ADV_ESTIMATOR_REGISTRY:
        raise ConfigError(f"algorithm.adv_estimator={est!r}; expected one of "
                          f"{sorted(core_algos.ADV_ESTIMATOR_REGISTRY)}")
    if cfg["algorithm"].get("use_prime") and est != PRIME_ESTIMATOR:
        raise ConfigError(f"algorithm.adv_estimator={est} with algorithm.use_prime=true: PRIME computes its own "
                          f"advantages (RLOO of each reward source, trainer/algos/prime.py), so {est} would never "
                          f"run; expected {PRIME_ESTIMATOR} (algorithm=prime sets it)")
    spec = core_algos.get_adv_estimator_spec(est)
    n = int(cfg["actor_rollout_ref"]["rollout"]["n"])
    if spec.group_based and n < 2:
        raise ConfigError(f"algorithm.adv_estimator={est} compares the samples of one prompt, but "
                          f"actor_rollout_ref.rollout.n={n}: every advantage would be 0; set rollout.n >= 2")
    if spec.needs_critic and cfg["critic"].get("enable") is False:  # null: on for such an estimator
        raise ConfigError(f"algorithm.adv_estimator={est} needs a critic (its values), but critic.enable=false; "
                          "set critic.enable=true (or leave it null)")
    check_reward_components(cfg, spec)
    missing = missing_inputs(spec, cfg)
    if missing:
        raise ConfigError(f"algorithm.adv_estimator={est} needs the batch column(s) {missing}, which no stage of "
                          "this run produces (an estimator's inputs are declared in its registry entry; a new one "
                          "comes with its producer)")


def check_reward_components(cfg: dict, spec) -> None:
    """``algorithm.gdpo_reward_keys`` / ``gdpo_reward_weights`` against the estimator ``spec``: an estimator that
    reads ``reward_components`` (GDPO) needs distinct keys and, if given, one finite weight per key, and takes no
    penalty that only the summed score would carry (``use_kl_in_reward``, ``reward_model.overlong_buffer``); any
    other estimator takes neither key.

    Raises:
        ConfigError: naming the key, the value and what was expected.
    """
    import math

    algo, est = cfg["algorithm"], cfg["algorithm"]["adv_estimator"]
    keys, weights = algo.get("gdpo_reward_keys"), algo.get("gdpo_reward_weights")
    if "reward_components" not in spec.inputs:
        for name, value in (("gdpo_reward_keys", keys), ("gdpo_reward_weights", weights)):
            if value is not None:
                raise ConfigError(f"algorithm.{name}={value!r} is set, but algorithm.adv_estimator={est} does not "
                                  "read reward components (gdpo does); remove it or set algorithm.adv_estimator=gdpo")
        return
    if not keys:
        raise ConfigError(f"algorithm.adv_estimator={est} normalises each reward component on its own: set "
                          "algorithm.gdpo_reward_keys=[...] to keys of the dict your scorer returns (besides 'score'), "
                          "e.g. [acc,format] with reward=format")
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) and k for k in keys) \
            or len(set(keys)) != len(keys):
        raise ConfigError(f"algorithm.gdpo_reward_keys={keys!r}; expected a list of distinct non-empty names")
    if weights is not None and (not isinstance(weights, (list, tuple)) or len(weights) != len(keys) or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights)):
        raise ConfigError(f"algorithm.gdpo_reward_weights={weights!r}; expected null or {len(keys)} finite numbers, "
                          f"one per algorithm.gdpo_reward_keys entry {list(keys)}")
    if algo.get("use_kl_in_reward"):
        raise ConfigError(f"algorithm.use_kl_in_reward=true with algorithm.adv_estimator={est}: the KL penalty goes "
                          "into the summed reward, which gdpo does not read; use actor_rollout_ref.actor.use_kl_loss")
    if ((cfg.get("reward_model") or {}).get("overlong_buffer") or {}).get("enable"):
        raise ConfigError(f"reward_model.overlong_buffer.enable=true with algorithm.adv_estimator={est}: the penalty "
                          "goes into the summed score, which gdpo does not read; return a length component from the "
                          "scorer and list it in algorithm.gdpo_reward_keys")
