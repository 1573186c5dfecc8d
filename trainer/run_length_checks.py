"""Config checks of settings that train nothing, or train a group of identical samples: a critic warm-up with no
critic or as long as the run, and greedy sampling under an estimator that compares the samples of one prompt; and
the warning of a learning-rate warm-up longer than its schedule.

:func:`check_training_happens` runs in :func:`trainer.config_validate.validate` (the run's length when
``trainer.total_training_steps`` is set) and again once :func:`trainer.launch.plan_run_length` has filled in the
length from the data, before any worker starts; :func:`lr_warmup_warnings` are logged then.
"""
from __future__ import annotations

from trainer.config_checks import ConfigError, ErrorCollector
from trainer.run_roles import critic_on

__all__ = ["check_training_happens", "check_critic_warmup", "lr_warmup_warnings", "check_greedy_groups"]


def check_critic_warmup(cfg: dict) -> None:
    """``trainer.critic_warmup``: the actor is not updated during its steps, so it needs a critic to warm up and
    must be shorter than the run (``trainer.total_training_steps``, when known).

    Raises:
        ConfigError: a warm-up without a critic, or one of at least the run's steps (the actor would never train).
    """
    warmup = int(cfg["trainer"]["critic_warmup"])
    if warmup <= 0:
        return
    if not critic_on(cfg):
        enable = str(cfg["critic"].get("enable")).lower()
        raise ConfigError(f"trainer.critic_warmup={warmup} with no critic (algorithm.adv_estimator="
                          f"{cfg['algorithm']['adv_estimator']}, critic.enable={enable}): the "
                          "actor is not updated during the warm-up and there is no critic to warm up; expected "
                          "trainer.critic_warmup=0")
    total = cfg["trainer"].get("total_training_steps")
    if total is not None and warmup >= int(total):
        raise ConfigError(f"trainer.critic_warmup={warmup} with trainer.total_training_steps={int(total)}: the actor "
                          "is not updated during the warm-up, so it would never train; expected critic_warmup < "
                          "the run's steps")


def _optims(cfg: dict) -> list[tuple[str, dict]]:
    """``(dotted key, optim section)`` of each role that trains (the critic's with a critic, PRIME's reward
    model's when it has one)."""
    out = [("actor_rollout_ref.actor.optim", cfg["actor_rollout_ref"]["actor"]["optim"])]
    if critic_on(cfg):
        out.append(("critic.optim", cfg["critic"]["optim"]))
    rm = (cfg.get("reward_model") or {}).get("model") or {}
    if isinstance(rm.get("optim"), dict):
        out.append(("reward_model.model.optim", rm["optim"]))
    return out


def lr_warmup_warnings(cfg: dict) -> list[str]:
    """One warning per trained role whose ``optim.lr_warmup_steps`` (when >= 0 it overrides
    ``lr_warmup_steps_ratio``, verl's rule) exceeds the schedule's steps: ``optim.total_training_steps``, or (-1)
    ``trainer.total_training_steps`` when known. The learning rate then never reaches ``optim.lr`` (a warning, not
    an error: verl's example scripts keep their warm-up when a short run cuts their length)."""
    out = []
    for key, optim in _optims(cfg):
        steps = optim.get("lr_warmup_steps")
        if steps is None or int(steps) < 0:
            continue
        total = optim.get("total_training_steps")
        where = f"{key}.total_training_steps"
        if total is None or int(total) < 0:
            total, where = cfg["trainer"].get("total_training_steps"), "trainer.total_training_steps"
        if total is not None and int(steps) > int(total):
            out.append(f"{key}.lr_warmup_steps={int(steps)} with {where}={int(total)}: the learning rate never "
                       f"reaches {key}.lr in this run (it rises to {int(total)}/{int(steps)} of it); set "
                       "lr_warmup_steps <= the schedule's steps")
    return out


def check_greedy_groups(cfg: dict) -> None:
    """Greedy training rollouts (``rollout.temperature=0`` or ``rollout.do_sample=false``) under an estimator that
    compares the samples of one prompt (its registry entry is group-based, as where ``rollout.n=1`` is refused):
    every sample of a group is the same, so every advantage would be 0.

    Raises:
        ConfigError: naming the estimator and the sampling key.
    """
    from trainer import core_algos

    est = cfg["algorithm"]["adv_estimator"]
    spec = core_algos.ADV_ESTIMATOR_SPECS.get(est)
    rollout = cfg["actor_rollout_ref"]["rollout"]
    if spec is None or not spec.group_based:
        return
    for name, greedy in (("do_sample", rollout.get("do_sample") is False),
                         ("temperature", _number(rollout.get("temperature")) == 0)):
        if greedy:
            value = str(rollout[name]).lower()
            raise ConfigError(f"algorithm.adv_estimator={est} compares the samples of one prompt, but "
                              f"actor_rollout_ref.rollout.{name}={value} samples greedily: every sample of a "
                              "group is the same and every advantage would be 0; expected do_sample=true and "
                              "temperature > 0")


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None  # a value of the wrong type is the rollout section's error


def check_training_happens(cfg: dict) -> None:
    """:func:`check_critic_warmup` and :func:`check_greedy_groups`; their errors together.

    Raises:
        ConfigError: one line per failed check (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    errors = ErrorCollector()
    for check in (check_critic_warmup, check_greedy_groups):
        errors.run(check, cfg)
    errors.raise_if_any()
