"""A resume with another learning-rate schedule than its checkpoint's: warned before start-up
(:func:`resume_schedule_warnings`). The workers restore the scheduler's position and then set the optimizer's rate to
the new schedule's at that position (:func:`trainer.checkpoint.base.rate_at_restored_step`), so the first resumed
step already trains at the new schedule's rate."""
from __future__ import annotations

from trainer.resume_checks import SCHEDULE_KEYS, _optim_diffs, _same, _saved_config
from trainer.run_roles import role_section, trained_optims, trained_roles, updates_per_step

__all__ = ["resume_schedule_warnings"]

_NEW_RATE = ("the new schedule's rate applies from the first resumed step, at the scheduler's restored position; "
             "the rate may jump")


def resume_schedule_warnings(cfg: dict, step_dir: str) -> list[str]:
    """Warning lines for a resume that changes the learning-rate schedule: one when a key of :data:`SCHEDULE_KEYS`
    differs from the checkpoint's, one when the run's length (``trainer.total_training_steps``, or
    ``trainer.total_epochs`` when the length comes from the data, or an ``optim.total_training_steps`` set) differs
    while a trained role's schedule decays (not ``constant``): the schedule is stretched or shrunk over the new
    length (the run's length only for a role whose ``optim.total_training_steps`` is unset: a set one is the
    schedule's length whatever the run's); one per trained role whose optimizer steps per training step changed (``ppo_epochs``,
    ``ppo_mini_batch_size``, PRIME's ``reward_model.mini_batch_size``) while its schedule moves (decays or warms up):
    the schedule counts optimizer steps, so the restored count falls at another point of the run
    (:func:`_per_step_diffs`).
    The run is allowed (a schedule changed on purpose is a use), but not silently."""
    out = []
    diffs = _optim_diffs(cfg, step_dir, SCHEDULE_KEYS)
    if diffs:
        out.append(f"trainer.resume_mode: {', '.join(diffs)}: the learning-rate schedule changes at the resumed step "
                   f"({_NEW_RATE})")
    saved = _saved_config(step_dir)
    if saved is not None:
        out += _per_step_diffs(cfg, saved)
    moving = [o for o in _trained(cfg) if o.get("lr_scheduler_type") != "constant"]
    decaying = sorted({o.get("lr_scheduler_type") for o in moving})
    if saved is None or not decaying:
        return out
    # the run's length sets a schedule's length only where its own optim.total_training_steps is unset (-1/null)
    follows_run = any(o.get("total_training_steps") in (None, -1) for o in moving)
    length = (_length_diffs(cfg, saved) if follows_run else []) + _optim_diffs(cfg, step_dir, ("total_training_steps",))
    if length:
        out.append(f"trainer.resume_mode: {', '.join(length)}: the decaying learning-rate schedule "
                   f"(lr_scheduler_type={', '.join(map(str, decaying))}) spans the run's new length ({_NEW_RATE})")
    return out


def _trained(cfg: dict) -> list[dict]:
    """The ``optim`` sections of the roles this run trains (actor; critic when on; PRIME's PRM)."""
    return [optim for _, optim in trained_optims(cfg)]


def _length_diffs(cfg: dict, saved: dict) -> list[str]:
    """``trainer.total_training_steps=<now> (checkpoint: <saved>)`` when set and different; with it unset (the data
    gives the length), ``trainer.total_epochs`` when it differs."""
    now, then = cfg.get("trainer") or {}, saved.get("trainer") or {}
    key = "total_training_steps" if now.get("total_training_steps") is not None else "total_epochs"
    if then.get(key) is None or _same(now.get(key), then.get(key)):
        return []
    return [f"trainer.{key}={now.get(key)!r} (checkpoint: {then.get(key)!r})"]


def _per_step_diffs(cfg: dict, saved: dict) -> list[str]:
    """Warnings for the trained roles whose optimizer steps per training step differ from the checkpoint's while their
    schedule moves (not ``constant`` without warm-up)."""
    out = []
    for key, path in trained_roles(cfg):
        optim = role_section(cfg, path).get("optim") or {}
        moves = (optim.get("lr_scheduler_type") != "constant" or (optim.get("lr_warmup_steps") or 0) > 0
                 or (optim.get("lr_warmup_steps_ratio") or 0) > 0)
        now, then = updates_per_step(cfg, key), updates_per_step(saved, key)
        if not moves or now is None or then is None or now[0] == then[0]:
            continue
        changed = [f"{k}={v!r} (checkpoint: {then[1].get(k)!r})" for k, v in now[1].items()
                   if not _same(v, then[1].get(k))]
        out.append(f"trainer.resume_mode: {', '.join(changed) or key}: {key} makes {now[0]} optimizer steps per "
                   f"training step (checkpoint: {then[0]}), and its learning-rate schedule (lr_scheduler_type="
                   f"{optim.get('lr_scheduler_type')}, warm-up included) counts optimizer steps, so the restored count "
                   f"falls at another point of the run: the rate may go back into warm-up or rise ({_NEW_RATE})")
    return out
