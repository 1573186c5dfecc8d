"""A resume from a checkpoint older than the newest one: the steps after it belong to an earlier timeline, which the
resumed run would write over (its checkpoint folders, its ``metrics.jsonl`` rows, its end-of-run outputs). They are
set aside into ``<output_dir>/earlier_runs/<YYYYmmdd-HHMMSS>/``, where a fresh run puts an earlier run's outputs
(:func:`trainer.tracking.set_aside_earlier_run`), once every check has passed and the workers are placed
(:func:`set_aside_later_steps`); a checkpoint folder outside ``trainer.output_dir`` with later steps is refused
before start-up instead (:func:`later_steps_problem`)."""
from __future__ import annotations

import json
import logging
import os
import shutil

from trainer.checkpoint.base import TRACKER_FILE, list_checkpoints, parse_step, read_tracker, write_tracker
from trainer.checkpoint.resume import is_sound_checkpoint
from trainer.tracking import _inside, _non_empty, earlier_runs_folder

logger = logging.getLogger(__name__)

__all__ = ["later_steps_problem", "set_aside_later_steps"]

#: the outputs of a run's end (or its timed exports) that a later timeline left: set aside with its steps
END_OUTPUTS = ("final_metrics.json", "hf_actor", "hf_exports")
ROW_FILES = ("metrics.jsonl", "val_generations.jsonl")


def _later(checkpoint_dir: str | None, step: int, keep: str | None = None) -> list[tuple[int, str]]:
    """The ``global_step_<N>`` folders of ``checkpoint_dir`` with ``N > step``, except ``keep``."""
    if not checkpoint_dir:
        return []
    keep = os.path.realpath(keep) if keep else None
    return [(s, p) for s, p in list_checkpoints(checkpoint_dir) if s > step and os.path.realpath(p) != keep]


def later_steps_problem(output_dir: str, checkpoint_dir: str | None, step: int) -> str | None:
    """The refusal of a resume from step ``step`` while ``checkpoint_dir`` (``trainer.default_local_dir``), outside
    ``output_dir``, holds checkpoints of later steps (they cannot be set aside into ``output_dir``'s
    ``earlier_runs/``, and the resumed run would write over them); None when there are none or the folder lies
    inside ``output_dir``. A later step folder that is incomplete or damaged
    (:func:`trainer.checkpoint.verify.verify_step_folder`) is no timeline to keep: ``resume_mode=auto`` steps back
    past it, and the resumed run's save of that step writes over it."""
    if not checkpoint_dir or _inside(checkpoint_dir, output_dir):
        return None
    later = [(s, p) for s, p in _later(checkpoint_dir, step) if is_sound_checkpoint(p)]
    if not later:
        return None
    return (f"trainer.resume_mode: resuming from step {step}, but trainer.default_local_dir={checkpoint_dir!r} "
            f"holds checkpoints of later steps ({later[0][0]}..{later[-1][0]}) outside trainer.output_dir="
            f"{output_dir!r}, which the resumed run would write over; expected trainer.resume_mode=auto (go on from "
            "the newest), or move the later global_step_<N> folders away first")


def _read_rows(path: str, step: int) -> tuple[list[str], list[str], list[str]]:
    """The lines of the JSON-lines file ``path`` as ``(kept, later, damaged)``: rows of steps up to ``step`` (and
    blank lines and rows without a step), rows of later steps, and lines that are not a JSON object (a last line
    cut short by a crash or a copy): these are no step of any timeline."""
    kept, later, damaged = [], [], []
    if not os.path.isfile(path):
        return kept, later, damaged
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line if line.endswith("\n") else line + "\n"
            try:
                row_step = int(json.loads(line).get("step", -1)) if line.strip() else step
            except (ValueError, TypeError, AttributeError):
                damaged.append(line)
                continue
            (kept if row_step <= step else later).append(line)
    return kept, later, damaged


def _split_rows(output_dir: str, step: int, rows: dict, dest: str) -> list[str]:
    """Move the later and damaged lines of each file of ``rows`` (name -> :func:`_read_rows`) to ``dest``, keeping
    the rest in place; returns what moved, one phrase per file."""
    what = []
    for name, (kept, later, damaged) in rows.items():
        if not later and not damaged:
            continue
        path = os.path.join(output_dir, name)
        with open(os.path.join(dest, name), "w", encoding="utf-8") as f:
            f.writelines(later + damaged)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
        parts = [f"{len(later)} rows after step {step}"] if later else []
        if damaged:
            parts.append(f"{len(damaged)} damaged line{'s' if len(damaged) > 1 else ''} (cut short or not a JSON "
                         "object, no later step)")
        what.append(f"{name} ({', '.join(parts)})")
    return what


def _move_later_checkpoints(output_dir: str, checkpoint_dir: str, step: int, later: list, dest: str) -> str:
    """Move the ``later`` step folders of ``checkpoint_dir`` to the same relative folder under ``dest``, with a copy
    of the tracker (set to ``step`` in place); returns the phrase naming them."""
    into = os.path.join(dest, os.path.relpath(os.path.realpath(checkpoint_dir), os.path.realpath(output_dir)))
    os.makedirs(into, exist_ok=True)
    for _, path in later:
        shutil.move(path, os.path.join(into, os.path.basename(path)))
    if os.path.isfile(os.path.join(checkpoint_dir, TRACKER_FILE)):
        shutil.copy2(os.path.join(checkpoint_dir, TRACKER_FILE), os.path.join(into, TRACKER_FILE))
    _tracker_at_most(checkpoint_dir, step)
    return (f"checkpoints (steps {later[0][0]}..{later[-1][0]} of {checkpoint_dir}, now in "
            f"{os.path.relpath(into, output_dir)})")


def set_aside_later_steps(output_dir: str, checkpoint_dir: str | None, resumed: str) -> str | None:
    """A run resumed from the step folder ``resumed`` (``.../global_step_<step>``, never moved itself): move what an
    earlier timeline left after that step into
    ``<output_dir>/earlier_runs/<YYYYmmdd-HHMMSS>/``: the ``global_step_<N>`` folders with ``N > step`` of
    ``checkpoint_dir`` when it lies inside ``output_dir`` (to the same relative folder there, with a copy of the
    tracker, which is set to ``step``), the rows of ``metrics.jsonl`` and ``val_generations.jsonl`` after ``step``
    (the earlier ones stay), and that timeline's ``final_metrics.json``, ``hf_actor`` and ``hf_exports``. Nothing is
    moved when neither a later checkpoint nor a later row exists (an ordinary resume). A damaged line of those files
    (cut short, not JSON) is no later step: it is set aside there too, named as damaged, and alone it moves nothing
    else. One warning line names what moved; returns the folder, or None."""
    step = parse_step(resumed)
    later = _later(checkpoint_dir, step, resumed) if checkpoint_dir and _inside(checkpoint_dir, output_dir) else []
    rows = {n: _read_rows(os.path.join(output_dir, n), step) for n in ROW_FILES}
    timeline = bool(later) or any(r[1] for r in rows.values())
    if not timeline and not any(r[2] for r in rows.values()):
        return None
    dest = earlier_runs_folder(output_dir)
    what = _split_rows(output_dir, step, rows, dest)
    if not timeline:
        logger.warning("trainer.resume_mode: this run resumes from step %d; %s holds no later step, but damaged "
                       "lines: moved %s to %s (the run's other outputs stay in place)", step, output_dir,
                       ", ".join(what), dest)
        return dest
    for name in END_OUTPUTS:
        if _non_empty(os.path.join(output_dir, name)):
            os.replace(os.path.join(output_dir, name), os.path.join(dest, name))
            what.append(name)
    if later:
        what.append(_move_later_checkpoints(output_dir, checkpoint_dir, step, later, dest))
    logger.warning("trainer.resume_mode: this run resumes from step %d, and %s held the later steps of an earlier "
                   "timeline: moved %s to %s (this run writes its own steps after %d)", step, output_dir,
                   ", ".join(what), dest, step)
    return dest


def _tracker_at_most(checkpoint_dir: str, step: int) -> None:
    """The tracker names ``step`` when it named a later one (moved aside) or holds no integer."""
    try:
        named = read_tracker(checkpoint_dir)
    except ValueError:
        named = step + 1
    if named is not None and named > step:
        write_tracker(checkpoint_dir, step)
