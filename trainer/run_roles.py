"""Which roles a run has, read from its resolved config by every check that needs to know (one rule, not a copy
per check)."""
from __future__ import annotations

__all__ = ["critic_on", "prime_enabled", "section_runs", "trained_roles", "trained_optims", "role_section",
           "updates_per_step", "optimizer_steps_per_training_step", "ROLES"]

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


def section_runs(cfg, section: str) -> bool:
    """Whether the role of the config section ``section`` runs: ``actor_rollout_ref.ref`` when a KL term needs
    reference log-probs (:func:`trainer.config.runtime.needs_reference`), ``critic`` with a critic
    (:func:`critic_on`), ``reward_model`` with PRIME (:func:`prime_enabled`); any other section always. True when
    ``cfg`` lacks the keys that tell."""
    from trainer.config.runtime import needs_reference

    runs = {"actor_rollout_ref.ref": needs_reference, "critic": critic_on, "reward_model": prime_enabled}
    try:
        return bool(runs.get(section, lambda c: True)(cfg))
    except (KeyError, TypeError, AttributeError):
        return True


def trained_roles(cfg: dict) -> list[tuple[str, tuple[str, ...]]]:
    """The ``(key, path)`` entries of :data:`ROLES` that this run trains: the actor; the critic when the run has one
    (:func:`critic_on`); PRIME's PRM with ``algorithm.use_prime`` (:func:`prime_enabled`)."""
    on = {"critic": critic_on(cfg), "reward_model.model": prime_enabled(cfg)}
    return [(key, path) for key, path in ROLES if on.get(key, True)]


def role_section(cfg: dict, path: tuple[str, ...]) -> dict:
    """The mapping at ``path`` (e.g. ``("critic",)``) of the config mapping ``cfg``; ``{}`` when a part is missing
    or not a mapping."""
    for part in path:
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg if isinstance(cfg, dict) else {}


def trained_optims(cfg: dict) -> list[tuple[str, dict]]:
    """``(dotted key of the optim section, the section)`` of each role this run trains (:func:`trained_roles`) that
    has an ``optim`` mapping."""
    sections = ((key, role_section(cfg, path).get("optim")) for key, path in trained_roles(cfg))
    return [(f"{key}.optim", optim) for key, optim in sections if isinstance(optim, dict)]


def optimizer_steps_per_training_step(train_batch_size: int, mini_batch_size: int, epochs: int = 1) -> int:
    """Optimizer steps one training step makes for a trained role: ``epochs x train_batch_size // mini_batch_size``
    mini-batches (prompts), at least 1. The learning-rate schedule counts these (DeepSpeed steps the scheduler once
    per optimizer step); the one rule for the actor's and critic's schedule
    (:func:`trainer.config.workers.scheduler_total_steps`), the PRM's (:func:`trainer.config.prm.prm_worker_config`)
    and the resume check that compares them (:func:`updates_per_step`)."""
    return max(1, int(epochs) * max(1, int(train_batch_size) // max(1, int(mini_batch_size))))


def updates_per_step(cfg: dict, key: str) -> tuple[int, dict[str, object]] | None:
    """``(optimizer steps per training step, the keys they come from)`` of the trained role ``key`` (a key of
    :data:`ROLES`) in the config mapping ``cfg`` (:func:`optimizer_steps_per_training_step` of ``ppo_epochs`` and
    ``ppo_mini_batch_size``; the PRM: one epoch of ``reward_model.mini_batch_size``); None for values that are not
    numbers."""
    try:
        batch = role_section(cfg, ("data",)).get("train_batch_size")
        if key == "reward_model.model":
            keys = {"reward_model.mini_batch_size": role_section(cfg, ("reward_model",)).get("mini_batch_size")}
            return optimizer_steps_per_training_step(batch, keys["reward_model.mini_batch_size"]), keys
        node = role_section(cfg, dict(ROLES)[key])
        keys = {f"{key}.ppo_epochs": node.get("ppo_epochs"),
                f"{key}.ppo_mini_batch_size": node.get("ppo_mini_batch_size")}
        return optimizer_steps_per_training_step(batch, node.get("ppo_mini_batch_size"), node.get("ppo_epochs")), keys
    except (TypeError, ValueError):
        return None
