"""Which roles a run has, read from its resolved config by every check that needs to know (one rule, not a copy
per check)."""
from __future__ import annotations

__all__ = ["critic_on"]


def critic_on(run: dict) -> bool:
    """Whether the run (a resolved config mapping) has a critic: ``critic.enable``, or for null, whether
    ``algorithm.adv_estimator``'s registry entry needs one (GAE)."""
    enable = (run.get("critic") or {}).get("enable")
    if enable is None:
        from trainer.core_algos import ADV_ESTIMATOR_SPECS  # the registry, filled by the estimators' modules

        spec = ADV_ESTIMATOR_SPECS.get((run.get("algorithm") or {}).get("adv_estimator"))
        enable = bool(spec is not None and spec.needs_critic)
    return bool(enable)
