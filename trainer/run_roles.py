"""Which roles a run has, read from its resolved config by every check that needs to know (one rule, not a copy
per check)."""
from __future__ import annotations

__all__ = ["critic_on", "prime_enabled", "trained_roles", "trained_optims", "ROLES"]

#: ``(key, path)`` of each role that can train: the actor, the critic, PRIME's reward model
ROLES = (("actor_rollout_ref.actor", ("actor_rollout_ref", "actor")), ("critic", ("critic",)),
         ("reward_model.model", ("reward_model", "model")))


def critic_on(run: dict) -> bool:
    """Whether the run (a resolved config mapping) has a critic: ``critic.enable``, or for null, whether
    ``algorithm.adv_estimator``'s registry entry needs one (GAE)."""
    enable = (run.get("critic") or {}).get("enable")
    if enable is None:
        from trainer.core_algos import ADV_ESTIMATOR_SPECS  # the registry, filled by the estimators' modules

        spec = ADV_ESTIMATOR_SPECS.get((run.get("algorithm") or {}).get("adv_estimator"))
        enable = bool(spec is not None and spec.needs_critic)
    return bool(enable)


def prime_enabled(cfg) -> bool:
    """True when the config asks for PRIME (``algorithm.use_prime``)."""
    return bool((cfg.get("algorithm") or {}).get("use_prime", False))


def trained_roles(cfg: dict) -> list[tuple[str, tuple[str, ...]]]:
    """The ``(key, path)`` entries of :data:`ROLES` that this run trains: the actor; the critic when the run has one
    (:func:`critic_on`); PRIME's PRM with ``algorithm.use_prime`` (:func:`prime_enabled`)."""
    on = {"critic": critic_on(cfg), "reward_model.model": prime_enabled(cfg)}
    return [(key, path) for key, path in ROLES if on.get(key, True)]


def trained_optims(cfg: dict) -> list[tuple[str, dict]]:
    """``(dotted key of the optim section, the section)`` of each role this run trains (:func:`trained_roles`) that
    has an ``optim`` mapping."""
    out = []
    for key, path in trained_roles(cfg):
        node = cfg
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        optim = node.get("optim") if isinstance(node, dict) else None
        if isinstance(optim, dict):
            out.append((f"{key}.optim", optim))
    return out
