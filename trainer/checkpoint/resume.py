"""Which checkpoint ``trainer.resume_mode`` resumes from (:func:`resolve_resume_path`): its allowed values
(:func:`resume_mode_problem`), ``auto``'s step back over an incomplete newest step (:func:`newest_complete_before`)
and the step folders of an earlier timeline that a resume from an older step sets aside
(:func:`later_checkpoints`)."""

from __future__ import annotations

import logging
import os

from trainer.checkpoint.base import (find_latest_checkpoint, is_complete_checkpoint, list_checkpoints, log_once,
                                     parse_step, step_dir)
from trainer.checkpoint.verify import IncompleteCheckpoint, verify_step_folder

logger = logging.getLogger(__name__)

#: the words ``trainer.resume_mode`` takes besides a checkpoint path (verl's, case-sensitive as in verl)
RESUME_WORDS = ("auto", "disable", "resume_path")


def resume_mode_problem(mode) -> str | None:
    """The one-line refusal of a ``trainer.resume_mode`` value, or None when it is allowed: ``auto``, ``disable``,
    ``resume_path`` (with ``trainer.resume_from_path``) or a path with a ``global_step_<N>`` component. Words are
    case-sensitive, as in verl (``Auto`` is refused with a hint)."""
    if isinstance(mode, str) and (mode in RESUME_WORDS or _has_step(mode)):
        return None
    hint = ""
    if isinstance(mode, str) and mode.strip().lower() in RESUME_WORDS:
        hint = f" (values are case-sensitive, as in verl: did you mean {mode.strip().lower()!r}?)"
    return (f"trainer.resume_mode={mode!r}; expected auto, disable, resume_path (with trainer.resume_from_path) or "
            f"the path of a checkpoint's global_step_<N> folder{hint}")


def _has_step(path: str) -> bool:
    try:
        parse_step(path)
    except ValueError:
        return False
    return True


def check_resume_mode(mode, key: str = "trainer.resume_mode"):
    """``mode`` when :func:`resume_mode_problem` allows it (``key``: the key for the config section's builder).

    Raises:
        ConfigError: one line naming the value and the allowed ones.
    """
    problem = resume_mode_problem(mode)
    if problem:
        from trainer.config_checks import ConfigError

        raise ConfigError(problem)
    return mode


def resolve_resume_path(resume_mode: str, root: str | None) -> tuple[str | None, int]:
    """Map ``trainer.resume_mode`` to ``(step folder or None, global step)``.

    - ``"disable"``: ``(None, 0)``: train from scratch.
    - ``"auto"``: the tracker's checkpoint under ``root`` (``trainer.default_local_dir``), or ``(None, 0)``. When
      that step folder is incomplete or damaged (a file missing or cut short, e.g. one rank's optimizer shard
      deleted, or a file whose bytes changed since the save: :func:`trainer.checkpoint.verify.verify_step_folder`),
      the newest complete earlier step is taken with a
      warning naming what is wrong with the newer one (auto resumes from the last usable checkpoint; the next save
      writes over the broken step). With none, the newest is returned and refused before start-up, naming the file.
      A tracker that is missing, empty or not an integer falls back to the newest complete step with a warning
      (:func:`trainer.checkpoint.base.find_latest_checkpoint`).
    - any other string: a path whose last ``global_step_<N>`` component gives the step; it is used as named (an
      incomplete one is refused before start-up, :func:`trainer.resume_checks.check_resume_checkpoint`).
    The trainer then runs from step ``N + 1``.

    Raises:
        ValueError: a value :func:`resume_mode_problem` refuses (the message names it and the allowed values).
        FileNotFoundError: an explicit path that does not exist.
    """
    problem = resume_mode_problem(resume_mode)
    if problem:
        raise ValueError(problem)
    if resume_mode == "disable":
        return None, 0
    if resume_mode == "resume_path":
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
    if resume_mode == "auto":
        path = find_latest_checkpoint(root)
        if path is None:
            log_once(logging.INFO, "resume_mode=auto: no checkpoint under %s, training from scratch", root, log=logger)
            return None, 0
        path = _newest_usable(root, path)
        return path, parse_step(path)
    step = parse_step(resume_mode)
    if not os.path.isdir(resume_mode):
        raise FileNotFoundError(f"trainer.resume_mode names {resume_mode!r}, which does not exist")
    return resume_mode, step


def _newest_usable(root: str, path: str) -> str:
    """``path`` when it is complete, else the newest complete step folder before it (warned once), else ``path``."""
    try:
        verify_step_folder(path, [])
        return path
    except IncompleteCheckpoint as exc:
        problem = exc.problem
    earlier = newest_complete_before(root, parse_step(path))
    if earlier is None:
        return path
    log_once(logging.WARNING, "trainer.resume_mode=auto: the newest checkpoint %s is incomplete or damaged (%s); "
             "resuming from the newest complete earlier one, %s", path, problem, earlier, log=logger)
    return earlier


def is_sound_checkpoint(step_dir: str) -> bool:
    """Whether the step folder is complete (``data.pt``) and its files pass
    :func:`trainer.checkpoint.verify.verify_step_folder` (nothing missing, cut short or damaged)."""
    if not is_complete_checkpoint(step_dir):
        return False
    try:
        verify_step_folder(step_dir, [])
    except IncompleteCheckpoint:
        return False
    return True


def newest_complete_before(root: str, step: int) -> str | None:
    """The newest step folder under ``root`` before ``step`` that is sound (:func:`is_sound_checkpoint`), or None."""
    return next((p for s, p in reversed(list_checkpoints(root)) if s < step and is_sound_checkpoint(p)), None)


def later_checkpoints(root: str | None, step: int) -> list[str]:
    """The names of the ``global_step_<N>`` folders under ``root`` with ``N > step`` (an earlier timeline's, when a
    run resumes from step ``step``), ordered by N; ``[]`` for no ``root``."""
    if not root:
        return []
    return [os.path.basename(p) for s, p in list_checkpoints(root) if s > step and p != step_dir(root, step)]
