"""Hugging Face exports of the actor at wall-clock marks: ``trainer.export_hf_freq_s``.

With ``trainer.export_hf_freq_s = F > 0`` the trainer writes the actor as a Hugging Face folder (the same export as
``trainer.export_hf_on_end``) at the end of the first training step that ends at or after each mark ``F``, ``2F``,
``3F``, ... seconds of wall-clock since the trainer process started. The start is the operating system's start time
of the driver process (``psutil.Process().create_time()``), so the start-up (imports, Ray, model loading,
compilation) counts. A resumed run counts from its own start, and its marks continue after the last mark of the
exports already there (:func:`last_mark`: ``exports.jsonl`` and the ``t<mark>s`` folders): after an earlier process's
``t000240s``, a resumed run's first 120 s mark is ``t000360s``, so no export of an earlier process is written over.

Folders: ``<output_dir>/hf_exports/t<mark>s`` (``t000120s`` for the 120 s mark; ``t000001.500s`` for a mark that is not
a whole second). Each export appends one JSON line to
``<output_dir>/hf_exports/exports.jsonl``: ``mark_s`` (the mark, seconds), ``elapsed_s`` (seconds since the process
started when the export began), ``global_step`` (optimizer steps done), ``path`` and ``export_s`` (seconds the
export took). A step that passes several marks gives one export, named after the last mark it passed.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from typing import Callable

__all__ = ["WallClockMarks", "TimedHFExports", "process_start_time", "export_dir", "append_entry", "read_entries",
           "last_mark", "EXPORTS_SUBDIR", "MANIFEST"]

EXPORTS_SUBDIR = "hf_exports"
MANIFEST = "exports.jsonl"
_DIR_RE = re.compile(r"^t(\d+(?:\.\d+)?)s$")


def process_start_time() -> float:
    """This process's start time as the operating system records it (seconds since the epoch)."""
    import psutil  # shipped with Ray (ray/thirdparty_files)

    return float(psutil.Process().create_time())


class WallClockMarks:
    """Marks ``every_s``, ``2 * every_s``, ... seconds after ``start`` (epoch seconds; default: this process's
    start), taken at most once each.

    ``due()`` gives the last mark passed and not yet taken (seconds, a float), or None; ``take(mark)`` records it,
    so that the next mark due is the first one after it. ``clock``: a function returning epoch seconds (tests pass
    a fake).

    Raises: ValueError when ``every_s`` is not a finite number > 0."""

    def __init__(self, every_s: float, start: float | None = None, clock: Callable[[], float] = time.time):
        every_s = float(every_s)
        if not math.isfinite(every_s) or every_s <= 0:
            raise ValueError(f"every_s={every_s}; expected a number of seconds > 0")
        self.every_s, self.clock = every_s, clock
        self.start = process_start_time() if start is None else float(start)
        self.taken = 0.0  # the last mark taken (0: none)

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return self.clock() - self.start

    def due(self) -> float | None:
        mark = math.floor(self.elapsed() / self.every_s) * self.every_s
        return mark if mark > self.taken else None

    def take(self, mark: float) -> None:
        self.taken = max(self.taken, float(mark))


def export_dir(root: str, mark_s: float) -> str:
    """``<root>/t<mark, 6 digits>s`` (with 3 decimals for a mark that is not a whole second: ``t000001.500s``)."""
    mark_s = round(float(mark_s), 3)
    return os.path.join(root, f"t{int(mark_s):06d}s" if mark_s == int(mark_s) else f"t{mark_s:010.3f}s")


def last_mark(root: str) -> float:
    """The last mark of the exports in ``root``: the largest ``mark_s`` of ``exports.jsonl`` and of the ``t<mark>s``
    folders there (an export whose line was never written included); 0.0 when there are none."""
    marks = []
    for entry in read_entries(root):
        try:
            marks.append(float(entry["mark_s"]))
        except (TypeError, KeyError, ValueError):
            continue
    if os.path.isdir(root):
        marks += [float(m.group(1)) for m in map(_DIR_RE.match, os.listdir(root)) if m]
    return max([m for m in marks if math.isfinite(m)], default=0.0)


def append_entry(root: str, entry: dict) -> None:
    """Append ``entry`` as one JSON line to ``<root>/exports.jsonl`` (created with its folder)."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, MANIFEST), "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def read_entries(root: str) -> list[dict]:
    """The entries of ``<root>/exports.jsonl`` in the order written ([] when absent); a last line cut short by a
    killed process is skipped."""
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class TimedHFExports:
    """The exports of ``trainer.export_hf_freq_s`` (module docstring) into ``root``."""

    def __init__(self, marks: WallClockMarks, root: str):
        self.marks, self.root = marks, root
        self.after: float | None = None  # the last mark of an earlier process's exports (read at the first export)

    @classmethod
    def from_config(cls, trainer_cfg: dict) -> "TimedHFExports | None":
        """From the ``trainer`` section; None when ``export_hf_freq_s`` is absent, null or <= 0."""
        every = trainer_cfg.get("export_hf_freq_s")
        if every is None or float(every) <= 0:
            return None
        return cls(WallClockMarks(float(every)), os.path.join(trainer_cfg["output_dir"], EXPORTS_SUBDIR))

    def due(self) -> bool:
        return self.marks.due() is not None

    def export(self, export_fn: Callable[[str], object], global_step: int) -> dict | None:
        """Call ``export_fn(folder)`` for the mark due (nothing when none is) and record it; returns the entry. The
        mark is counted after :func:`last_mark` of the folder as the first export found it (a resumed run's marks
        continue after the earlier process's), so the folder is a new one."""
        mark = self.marks.due()
        if mark is None:
            return None
        if self.after is None:  # read here, not at start-up: a fresh run sets an earlier run's exports aside first
            self.after = last_mark(self.root)
        named = self.after + mark
        elapsed, path, t0 = self.marks.elapsed(), export_dir(self.root, named), time.perf_counter()
        export_fn(path)
        self.marks.take(mark)
        entry = dict(mark_s=named, elapsed_s=elapsed, global_step=int(global_step), path=os.path.abspath(path),
                     export_s=time.perf_counter() - t0)
        append_entry(self.root, entry)
        return entry
