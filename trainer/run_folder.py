"""What a run writes into ``trainer.output_dir`` before its checks have passed: the embedded task's generated data
(``<output_dir>/data/train.jsonl`` and ``val.jsonl``, from ``data.synthetic_task`` and ``data.seed``) and the log of
the entry point (Hydra's ``<output_dir>/main.log``). A fresh run sets an earlier run's outputs aside only once every
check has passed (:func:`trainer.tracking.set_aside_earlier_run`), so these two must not replace or mix with the
earlier run's before then:

- the data: when ``data/`` holds the same bytes (the same task and seed) they are kept as they are; when it holds
  other rows (an earlier run's), this run's rows wait in a temporary folder inside ``output_dir`` and move into
  ``data/`` once the earlier ones are set aside (:func:`settle_run_folder`);
- the log: the lines it held when this run started (:func:`log_sizes`) are the earlier run's, set aside with its
  other outputs; this run's lines stay in ``main.log``. A resume goes on appending to its run's log.
"""
from __future__ import annotations

import filecmp
import json
import logging
import os
import sys
import tempfile
from typing import Callable, Iterable

logger = logging.getLogger(__name__)

DATA_DIR = "data"
#: the files the embedded tasks write into ``<output_dir>/data`` (``write_task`` of :mod:`trainer.embedded_tool`)
DATA_FILES = ("train.jsonl", "val.jsonl")
_staged: dict[str, tempfile.TemporaryDirectory] = {}  # output_dir -> this run's rows, waiting (removed at exit)


def log_sizes() -> dict[str, int]:
    """The files the root logger's file handlers append to (Hydra's ``main.log``), each with its size now: called
    when a run starts, so that the lines before are known to be an earlier run's."""
    out = {}
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            path = os.path.abspath(h.baseFilename)
            out[path] = os.path.getsize(path) if os.path.isfile(path) else 0
    return out


def write_embedded_data(write: Callable[[str, int], tuple[str, str]], output_dir: str, seed: int) -> tuple[str, str]:
    """Write the embedded task's training and held-out files for ``seed`` (``write(folder, seed) -> (train, val)``)
    and return the paths this run reads: in ``<output_dir>/data`` when it holds none of them or the same bytes (kept
    as they are); else, an earlier run's rows being there, in a temporary folder inside ``output_dir`` that
    :func:`settle_run_folder` moves into ``data/`` (a start that stops before leaves ``data/`` as it was)."""
    folder = os.path.join(output_dir, DATA_DIR)
    os.makedirs(output_dir, exist_ok=True)
    old = _staged.pop(os.path.realpath(output_dir), None)
    if old is not None:
        old.cleanup()
    staged = tempfile.TemporaryDirectory(prefix=".data-", dir=output_dir)
    paths = write(staged.name, seed)
    names = [os.path.basename(p) for p in paths]
    there = [os.path.join(folder, n) for n in names]
    if any(os.path.exists(t) and not filecmp.cmp(p, t, shallow=False) for p, t in zip(paths, there)):
        _staged[os.path.realpath(output_dir)] = staged  # an earlier run's rows: they stay until it is set aside
        return paths[0], paths[1]
    os.makedirs(folder, exist_ok=True)
    for p, t in zip(paths, there):
        if not os.path.exists(t):
            os.replace(p, t)
    staged.cleanup()
    return there[0], there[1]


def settle_run_folder(cfg: dict, fresh: bool, datasets: Iterable, logs: dict[str, int]) -> None:
    """Once every check has passed and the workers are placed: a fresh run sets the earlier run's outputs aside
    (:func:`trainer.tracking.set_aside_earlier_run`, with the embedded task's files in ``data/`` that this run does
    not read and the earlier lines of the logs in ``logs``), then this run's waiting rows
    (:func:`write_embedded_data`) move into ``data/``; ``cfg``'s ``data.train_files`` / ``val_files`` and the
    ``datasets``' ``files`` follow them."""
    from trainer.tracking import set_aside_earlier_run

    t, d = cfg["trainer"], cfg["data"]
    out = t["output_dir"]
    if fresh:
        reads = {os.path.realpath(f) for k in ("train_files", "val_files") for f in _as_list(d.get(k))}
        earlier = [os.path.join(DATA_DIR, n) for n in DATA_FILES
                   if os.path.realpath(os.path.join(out, DATA_DIR, n)) not in reads]
        set_aside_earlier_run(out, t["default_local_dir"], more=earlier, logs=logs)
    staged = _staged.pop(os.path.realpath(out), None)
    if staged is None:
        return
    folder = os.path.join(os.path.abspath(out), DATA_DIR)
    os.makedirs(folder, exist_ok=True)
    moved = {}  # the rows there were set aside (a fresh run) or are this run's own, written again (a resume)
    for name in os.listdir(staged.name):
        moved[os.path.join(staged.name, name)] = os.path.join(folder, name)
        os.replace(os.path.join(staged.name, name), os.path.join(folder, name))
    staged.cleanup()
    for key in ("train_files", "val_files"):
        if isinstance(d.get(key), str):
            d[key] = moved.get(d[key], d[key])
    for ds in datasets:
        if ds is not None:
            ds.files = [moved.get(f, f) for f in ds.files]


def _as_list(files) -> list[str]:
    return [] if files is None else [files] if isinstance(files, str) else list(files)


FINAL_METRICS = "final_metrics.json"


def already_complete(output_dir: str, step_dir: str, step: int, last_step: int, trainer_cfg=None) -> dict:
    """A resume whose checkpoint is at the run's last step: nothing to train, so no worker starts and nothing in
    ``output_dir`` is rewritten (``final_metrics.json`` keeps the finished run's metrics, which are returned; ``{}``
    when it has none). Says so in one line; the run exits 0.

    A checkpoint past the last step (``trainer.total_training_steps`` or ``trainer.total_epochs`` lowered below it;
    ``trainer_cfg``: the run's trainer section, its length planned) is refused instead: a resume cannot go back, and
    reporting the run as done would pass off the checkpoint's longer run as the one asked for.

    Raises:
        ConfigError: one line naming the run's length keys, the last step and the checkpoint's step.
    """
    if step > last_step:
        from trainer.config_checks import ConfigError

        keys = (f" (trainer.total_training_steps={trainer_cfg.total_training_steps}, trainer.total_epochs="
                f"{trainer_cfg.total_epochs})" if trainer_cfg is not None else "")
        raise ConfigError(f"trainer.resume_mode: the run ends at step {last_step}{keys}, before the checkpoint it "
                          f"resumes: {step_dir} is step {step}, and a resume cannot go back to an earlier step; "
                          f"expected a run of at least {step} steps ({step}: the run is complete, nothing is "
                          f"trained), or trainer.resume_mode=disable for a new run of {last_step} steps (a fresh run "
                          "sets the earlier run's outputs aside)")
    path = os.path.join(output_dir, FINAL_METRICS)
    summary = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
    print(f"done: the run is already complete: {step_dir} is step {step} of {last_step}, nothing left to train; "
          f"{output_dir} is kept as it was ({FINAL_METRICS} {'kept' if summary else 'absent'}; raise "
          "trainer.total_training_steps or trainer.total_epochs to train on)", file=sys.stderr)
    return summary


def write_final_metrics(output_dir: str, summary: dict, trained: bool) -> bool:
    """Write ``<output_dir>/final_metrics.json``, unless the run trained no step (a resume with nothing left: the data
    used up at the first draw, a SIGTERM before the first step) and an earlier one is there: its metrics are the
    run's last and are kept (a warning says so). Returns whether the file was written."""
    path = os.path.join(output_dir, FINAL_METRICS)
    if not trained and os.path.isfile(path):
        logger.warning("no step was trained after the resume: %s keeps the metrics of the run's last trained step",
                       path)
        return False
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return True
