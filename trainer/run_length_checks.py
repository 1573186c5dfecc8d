"""Config checks of settings that train nothing, or train a group of identical samples: a critic warm-up with no
critic or as long as the run, greedy sampling under an estimator that compares the samples of one prompt and
greedy validation asked for several answers per question; and the warning of a learning-rate warm-up longer than
its schedule.

:func:`check_training_happens` runs in :func:`trainer.config_validate.validate` (the run's length when
``trainer.total_training_steps`` is set) and again once :func:`trainer.launch.plan_run_length` has filled in the
length from the data, before any worker starts; :func:`lr_warmup_warnings` are logged then.
"""
from __future__ import annotations

from trainer.config_checks import ConfigError, ErrorCollector
from trainer.run_roles import critic_on, trained_optims

__all__ = ["check_training_happens", "check_critic_warmup", "lr_warmup_warnings", "check_greedy_groups",
           "check_validation_sampling", "schedule_length_warnings", "validation_sampling_warnings"]


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


def schedule_length_warnings(cfg: dict, total: int) -> list[str]:
    """One warning per trained role whose ``optim.total_training_steps`` is set (>= 0) to another number than the
    run's length ``total``: its learning-rate schedule spans that many steps, not the run. Kept (a run stopped early
    keeps the full run's schedule, so that its resume is exact), but said, because verl's trainer replaces the value
    with the run's length. Call before the -1 entries are filled in."""
    out = []
    for key, optim in trained_optims(cfg):
        given = optim.get("total_training_steps")
        if given is not None and int(given) >= 0 and int(given) != total:
            out.append(f"{key}.total_training_steps={int(given)}: the learning-rate schedule spans {int(given)} "
                       f"steps while the run trains {total} (verl's trainer would replace it with the run's length; "
                       "leave it at -1 for that)")
    return out


def _warmup_steps(optim: dict, total: int) -> tuple[int, str] | None:
    """The warm-up's training steps and how it was set (``lr_warmup_steps=N``, or the ratio it came from), or None
    without a warm-up. ``lr_warmup_steps`` >= 0 overrides ``lr_warmup_steps_ratio`` (verl's rule); the run's
    length planning fills it in from the ratio."""
    steps, ratio = optim.get("lr_warmup_steps"), float(optim.get("lr_warmup_steps_ratio") or 0.0)
    if steps is None or int(steps) < 0:
        steps = int(ratio * total)
        return (steps, f"lr_warmup_steps_ratio={ratio:g}") if steps > 0 else None
    if ratio > 0 and int(steps) == int(ratio * total):
        return int(steps), f"lr_warmup_steps={int(steps)} (lr_warmup_steps_ratio={ratio:g})"
    return int(steps), f"lr_warmup_steps={int(steps)}"


def lr_warmup_warnings(cfg: dict) -> list[str]:
    """One warning per trained role whose LR warm-up (``optim.lr_warmup_steps``, or ``lr_warmup_steps_ratio`` x
    the schedule's steps) lasts at least the schedule's steps: ``optim.total_training_steps``, or (-1)
    ``trainer.total_training_steps`` when known. The learning rate then never reaches ``optim.lr``: the linear
    warm-up gives the last step ``(total - 1) / steps`` of it (a warning, not an error: verl's example scripts keep
    their warm-up when a short run cuts their length)."""
    out = []
    for key, optim in trained_optims(cfg):
        total = optim.get("total_training_steps")
        where = f"{key}.total_training_steps"
        if total is None or int(total) < 0:
            total, where = cfg["trainer"].get("total_training_steps"), "trainer.total_training_steps"
        if total is None:
            continue
        warmup = _warmup_steps(optim, int(total))
        if warmup is not None and warmup[0] >= int(total):
            steps, total = warmup[0], int(total)
            out.append(f"{key}.{warmup[1]} with {where}={total}: the learning rate never reaches {key}.lr in "
                       f"this run (its last step starts at {total - 1}/{steps} of it); set a warm-up shorter than "
                       "the schedule's steps")
    return out


def _greedy_setting(rollout: dict) -> str | None:
    """The first rollout sampling setting that makes decoding greedy, as ``name=value``, or None: ``do_sample=false``,
    ``temperature=0`` or ``top_k=1`` (only the most likely token is kept)."""
    checks = (("do_sample", rollout.get("do_sample") is False),
              ("temperature", _number(rollout.get("temperature")) == 0),
              ("top_k", _number(rollout.get("top_k")) == 1))
    for name, greedy in checks:
        if greedy:
            return f"{name}={str(rollout[name]).lower()}"
    return None


def check_greedy_groups(cfg: dict) -> None:
    """Greedy training rollouts (``rollout.temperature=0``, ``rollout.do_sample=false`` or ``rollout.top_k=1``)
    under an estimator that compares the samples of one prompt (its registry entry is group-based, as where
    ``rollout.n=1`` is refused): every sample of a group is the same, so every advantage would be 0. Validation's
    ``rollout.val_kwargs`` are not read (greedy validation is fine).

    Raises:
        ConfigError: naming the estimator and the sampling key.
    """
    from trainer import core_algos

    est = cfg["algorithm"]["adv_estimator"]
    spec = core_algos.ADV_ESTIMATOR_SPECS.get(est)
    if spec is None or not spec.group_based:
        return
    setting = _greedy_setting(cfg["actor_rollout_ref"]["rollout"])
    if setting is not None:
        raise ConfigError(f"algorithm.adv_estimator={est} compares the samples of one prompt, but "
                          f"actor_rollout_ref.rollout.{setting} samples greedily: every sample of a "
                          "group is the same and every advantage would be 0; expected do_sample=true, "
                          "temperature > 0 and top_k != 1")


def check_validation_sampling(cfg: dict) -> None:
    """Validation's sampling (``rollout.val_kwargs``) by the rule training's follows, when a validation pass runs
    (:func:`trainer.unused_conditions.validates`; without one the keys are warned about as ignored): ``n > 1`` with
    greedy decoding (``do_sample=false``, ``temperature=0`` or ``top_k=1``) gives n identical answers per question
    (best@n / worst@n of copies). ``do_sample=true`` with ``temperature=0`` and ``n=1`` is greedy validation, as in
    training: :func:`validation_sampling_warnings` says so.

    Raises:
        ConfigError: naming the val_kwargs keys and their values.
    """
    from trainer.unused_conditions import validates

    vk = cfg["actor_rollout_ref"]["rollout"].get("val_kwargs") or {}
    if not validates(cfg):
        return
    key = "actor_rollout_ref.rollout.val_kwargs"
    n, setting = _number(vk.get("n")), _greedy_setting(vk)
    if n is not None and n > 1 and setting is not None:
        raise ConfigError(f"{key}.n={vk['n']} with {key}.{setting} (greedy): every answer to a question is the "
                          "same, so best@n / worst@n compare copies; expected n=1, or do_sample=true, temperature "
                          "> 0 and top_k != 1")


def validation_sampling_warnings(cfg: dict) -> list[str]:
    """A warning when a validation pass runs with ``val_kwargs.do_sample=true`` and ``temperature=0``: the engine
    decodes greedily (a temperature of 0 is greedy, as vLLM takes it), so ``do_sample`` has no effect."""
    from trainer.unused_conditions import validates

    vk = cfg["actor_rollout_ref"]["rollout"].get("val_kwargs") or {}
    if not validates(cfg) or vk.get("do_sample") is not True or _number(vk.get("temperature")) != 0:
        return []
    key = "actor_rollout_ref.rollout.val_kwargs"
    return [f"{key}.do_sample=true with {key}.temperature={vk['temperature']}: validation decodes greedily (a "
            "temperature of 0 is greedy); set a temperature > 0 to sample"]


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
