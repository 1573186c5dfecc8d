"""A resume with another learning-rate schedule than its checkpoint's: warned before start-up
(:func:`resume_schedule_warnings`). The workers restore the scheduler's position and then set the optimizer's rate to
the new schedule's at that position (:func:`trainer.checkpoint.base.rate_at_restored_step`), so the first resumed
step already trains at the new schedule's rate."""
from __future__ import annotations

from trainer.resume_checks import SCHEDULE_KEYS, _optim_diffs, _same, _saved_config
from trainer.run_roles import trained_optims

__all__ = ["resume_schedule_warnings"]

_NEW_RATE = ("the new schedule's rate applies from the first resumed step, at the scheduler's restored position; "
             "the rate may jump")


def resume_schedule_warnings(cfg: dict, step_dir: str) -> list[str]:
    """Warning lines for a resume that changes the learning-rate schedule: one when a key of :data:`SCHEDULE_KEYS`
    differs from the checkpoint's, one when the run's length (``trainer.total_training_steps``, or
    ``trainer.total_epochs`` when the length comes from the data, or an ``optim.total_training_steps`` set) differs
    while a trained role's schedule decays (not ``constant``): the schedule is stretched or shrunk over the new
    length. The run is allowed (a schedule changed on purpose is a use), but not silently."""
    out = []
    diffs = _optim_diffs(cfg, step_dir, SCHEDULE_KEYS)
    if diffs:
        out.append(f"trainer.resume_mode: {', '.join(diffs)}: the learning-rate schedule changes at the resumed step "
                   f"({_NEW_RATE})")
    saved = _saved_config(step_dir)
    decaying = sorted({o.get("lr_scheduler_type") for o in _trained(cfg) if o.get("lr_scheduler_type") != "constant"})
    if saved is None or not decaying:
        return out
    length = _length_diffs(cfg, saved) + _optim_diffs(cfg, step_dir, ("total_training_steps",))
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
