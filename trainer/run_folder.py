"""What a run writes into ``trainer.output_dir`` before its checks have passed: the embedded task's generated data
(``<output_dir>/data/train.jsonl`` and ``val.jsonl``, from ``data.synthetic_task`` and ``data.seed``), the embedded
tiny model (``<output_dir>/init_model``, from ``trainer.seed``, ``actor_rollout_ref.model.tiny.*``,
``data.warm_start_steps`` and ``data.synthetic_task``) and the log of the entry point (Hydra's
``<output_dir>/main.log``). A fresh run sets an earlier run's outputs aside only once every check has passed
(:func:`trainer.tracking.set_aside_earlier_run`), so these must not replace or mix with the earlier run's before then:

- the data: when ``data/`` holds the same bytes (the same task and seed) they are kept as they are; when it holds
  other rows (an earlier run's), this run's rows wait in a temporary folder inside ``output_dir`` and move into
  ``data/`` once the earlier ones are set aside (:func:`settle_run_folder`); a resume over other rows (files edited
  since the run wrote them) is refused, the files kept (:func:`write_embedded_data`);
- the tiny model: ``init_model/build_settings.json`` records the settings it was built from; the folder is used as
  it is when they are this run's. Otherwise a fresh run builds its own model in a temporary folder inside
  ``output_dir``, which becomes ``init_model`` once the earlier one is set aside; a resume is refused, naming the
  changed keys (:func:`place_init_model`);
- the log: the lines it held when this run started (:func:`log_sizes`) are the earlier run's, set aside with its
  other outputs; this run's lines stay in ``main.log``. A resume goes on appending to its run's log.

The temporary folders are named ``.data-<pid>-*`` and ``.init_model-<pid>-*`` after the driver's process id and are
removed at its exit; those of a driver that was killed outright (``SIGKILL``: no exit code runs) are removed by the
next run's start in the same ``output_dir`` (:func:`remove_stale_staging`).
"""
from __future__ import annotations

import filecmp
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from typing import Callable, Iterable

logger = logging.getLogger(__name__)

DATA_DIR = "data"
#: the files the embedded tasks write into ``<output_dir>/data`` (``write_task`` of :mod:`trainer.embedded_tool`)
DATA_FILES = ("train.jsonl", "val.jsonl")
_staged: dict[str, tempfile.TemporaryDirectory] = {}  # output_dir -> this run's rows, waiting (removed at exit)
INIT_MODEL = "init_model"
#: the file in ``init_model`` that records the settings the tiny model was built from (:func:`place_init_model`)
BUILD_RECORD = "build_settings.json"
_staged_models: dict[str, tempfile.TemporaryDirectory] = {}  # output_dir -> this run's tiny model, waiting
_moved_models: list[tempfile.TemporaryDirectory] = []  # their former paths, links to init_model until exit
_STAGING = re.compile(r"^\.(?:data|init_model)-(\d+)-")  # a staging folder's name: its driver's pid


def _staging(output_dir: str, kind: str) -> tempfile.TemporaryDirectory:
    """A new staging folder ``<output_dir>/.<kind>-<pid>-*`` of this driver (after removing dead drivers' ones)."""
    remove_stale_staging(output_dir)
    return tempfile.TemporaryDirectory(prefix=f".{kind}-{os.getpid()}-", dir=output_dir)


def remove_stale_staging(output_dir: str) -> list[str]:
    """Remove the staging folders in ``output_dir`` whose driver process is gone (one killed by ``SIGKILL`` before
    its exit code could remove them); a live driver's are kept. Returns the removed paths."""
    import psutil

    removed = []
    try:
        names = os.listdir(output_dir)
    except OSError:
        return removed
    for name in names:
        m = _STAGING.match(name)
        path = os.path.join(output_dir, name)
        if m and int(m.group(1)) != os.getpid() and not psutil.pid_exists(int(m.group(1))) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("trainer.output_dir: removed %d temporary folder(s) of an earlier start that was killed: %s",
                    len(removed), ", ".join(os.path.basename(p) for p in removed))
    return removed


def log_sizes() -> dict[str, int]:
    """The files the root logger's file handlers append to (Hydra's ``main.log``), each with its size now: called
    when a run starts, so that the lines before are known to be an earlier run's."""
    out = {}
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            path = os.path.abspath(h.baseFilename)
            out[path] = os.path.getsize(path) if os.path.isfile(path) else 0
    return out


def write_embedded_data(write: Callable[[str, int], tuple[str, str]], output_dir: str, seed: int,
                        resuming: bool = False) -> tuple[str, str]:
    """Write the embedded task's training and held-out files for ``seed`` (``write(folder, seed) -> (train, val)``)
    and return the paths this run reads: in ``<output_dir>/data`` when it holds none of them or the same bytes (kept
    as they are); else, an earlier run's rows being there, in a temporary folder inside ``output_dir`` that
    :func:`settle_run_folder` moves into ``data/`` (a start that stops before leaves ``data/`` as it was).

    A resume (``resuming``) whose ``data/`` holds other bytes than these rows (a file edited since the run wrote it;
    the rows of another ``data.seed`` are refused with the other data keys) is refused, as a tiny model built from
    other settings is (:func:`place_init_model`): the resume would write the generated rows over the file.

    Raises:
        ConfigError: (a resume) one line naming each differing file and the two ways on.
    """
    folder = os.path.join(output_dir, DATA_DIR)
    os.makedirs(output_dir, exist_ok=True)
    old = _staged.pop(os.path.realpath(output_dir), None)
    if old is not None:
        old.cleanup()
    staged = _staging(output_dir, "data")
    paths = write(staged.name, seed)
    names = [os.path.basename(p) for p in paths]
    there = [os.path.join(folder, n) for n in names]
    differ = [t for p, t in zip(paths, there) if os.path.exists(t) and not filecmp.cmp(p, t, shallow=False)]
    if differ and resuming:
        staged.cleanup()
        from trainer.config_checks import ConfigError

        raise ConfigError(_edited_data_line(differ, there, seed))
    if differ:
        _staged[os.path.realpath(output_dir)] = staged  # an earlier run's rows: they stay until it is set aside
        return paths[0], paths[1]
    os.makedirs(folder, exist_ok=True)
    for p, t in zip(paths, there):
        if not os.path.exists(t):
            os.replace(p, t)
    staged.cleanup()
    return there[0], there[1]


def _edited_data_line(differ: list[str], there: list[str], seed: int) -> str:
    """The refusal of a resume whose generated data files ``differ`` from the rows of ``data.seed`` ``seed``
    (``there``: the run's ``data/train.jsonl`` and ``val.jsonl``)."""
    it = "it" if len(differ) == 1 else "them"
    return (f"trainer.resume_mode: {', '.join(differ)} differ{'s' * (len(differ) == 1)} from the rows the embedded "
            f"task writes for data.seed={seed} (edited since the run wrote {it}?), and the resume would write those "
            f"rows over {it}; to resume on the files as they are (the resume's row checks compare them with the "
            f"checkpoint's), set data.train_files={there[0]} data.val_files={there[1]}; to have the generated rows "
            f"again, move the edited files out of {os.path.dirname(there[0])}")


def read_build_record(init_dir: str) -> dict | None:
    """The settings recorded in ``<init_dir>/build_settings.json`` (``{"trainer.seed": 0, ...}``); None when the
    folder has no record or one that cannot be read."""
    try:
        with open(os.path.join(init_dir, BUILD_RECORD), encoding="utf-8") as f:
            settings = json.load(f).get("settings")
    except (OSError, ValueError, AttributeError):
        return None
    return settings if isinstance(settings, dict) else None


def setting_diffs(settings: dict, recorded: dict) -> list[str]:
    """``<key>=<this run's> (init_model: <recorded>)`` for each setting that differs (None: not set)."""
    now = json.loads(json.dumps(settings))  # as the record reads back (tuples as lists)
    keys = list(now) + [k for k in recorded if k not in now]
    return [f"{k}={now.get(k)!r} (init_model: {recorded.get(k)!r})" for k in keys if now.get(k) != recorded.get(k)]


def place_init_model(output_dir: str, settings: dict, build: Callable[[str], int], resuming: bool) -> str:
    """The folder of the embedded tiny model that this run reads: ``<output_dir>/init_model`` when it holds a model
    built from ``settings`` (the keys and values that decide it, recorded in its ``build_settings.json``), else
    built there by ``build(folder) -> vocabulary size`` (and recorded) when it is empty or absent.

    When it holds a model built from other settings, or one without a record (whether it matches is unknown):

    - a fresh run builds its own in a temporary folder inside ``output_dir`` (returned; an info line names the
      changed settings); once every check has passed, :func:`settle_run_folder` sets the earlier model aside with
      the earlier run's other outputs and moves this one into ``init_model``. A start that stops before leaves
      ``init_model`` as it was; the temporary folder is removed at exit;
    - a resume is refused for other settings (its checkpoint continues the model there, so they would be ignored);
      one without a record is used as it is, with an info line.

    Raises:
        ConfigError: a resume whose settings differ from the record: one line naming each key, this run's value and
            the recorded one.
    """
    init_dir = os.path.join(output_dir, INIT_MODEL)
    old = _staged_models.pop(os.path.realpath(output_dir), None)
    if old is not None:
        old.cleanup()
    if os.path.isfile(os.path.join(init_dir, "config.json")):
        recorded = read_build_record(init_dir)
        diffs = None if recorded is None else setting_diffs(settings, recorded)
        if diffs == []:
            return init_dir
        if resuming and diffs is None:
            logger.info("trainer.resume_mode: %s has no %s (the settings it was built from), so they are not compared "
                        "with this run's; the resume uses it as it is", init_dir, BUILD_RECORD)
            return init_dir
        if resuming:
            from trainer.config_checks import ConfigError

            raise ConfigError(f"trainer.resume_mode: {', '.join(diffs)}: the checkpoint continues the tiny model "
                              f"built into {init_dir} from the recorded values, so the new ones would be ignored; "
                              "resume with the recorded values, or trainer.resume_mode=disable for a new run (a fresh "
                              "run sets the earlier run's outputs aside)")
        why = (f"was built from other settings: {', '.join(diffs)}" if diffs else
               f"has no {BUILD_RECORD} (the settings it was built from), so whether it matches this run is unknown")
        logger.info("trainer.output_dir: %s %s; this fresh run builds its own tiny model, and the earlier one goes to "
                    "earlier_runs/ with the earlier run's outputs once every check has passed", init_dir, why)
    elif resuming or not (os.path.isdir(init_dir) and os.listdir(init_dir)):
        _build_with_record(init_dir, settings, build)  # nothing there to keep (a resume writes over a broken one)
        return init_dir
    os.makedirs(output_dir, exist_ok=True)
    staged = _staging(output_dir, INIT_MODEL)
    _staged_models[os.path.realpath(output_dir)] = staged
    folder = os.path.join(staged.name, INIT_MODEL)
    _build_with_record(folder, settings, build)
    return folder


def _build_with_record(folder: str, settings: dict, build: Callable[[str], int]) -> None:
    """``build(folder)``, then the record of ``settings`` (written last: a build cut short has none)."""
    vocab = build(folder)
    with open(os.path.join(folder, BUILD_RECORD), "w", encoding="utf-8") as f:
        json.dump({"settings": settings, "vocab_size": vocab}, f, indent=1)


def settle_run_folder(cfg: dict, fresh: bool, datasets: Iterable, logs: dict[str, int],
                      resumed: str | None = None) -> None:
    """Once every check has passed and the workers are placed: a fresh run sets the earlier run's outputs aside
    (:func:`trainer.tracking.set_aside_earlier_run`, with the embedded task's files in ``data/`` that this run does
    not read, ``init_model`` when this run built another (:func:`place_init_model`) and the earlier lines of the logs
    in ``logs``), a run resumed from the step folder ``resumed`` (not ``trainer.val_only``) the later steps of an
    earlier timeline (:func:`trainer.later_steps.set_aside_later_steps`); then this run's waiting tiny model moves into
    ``init_model`` and its waiting rows (:func:`write_embedded_data`) into ``data/``; ``cfg``'s model paths,
    ``data.train_files`` / ``val_files`` and the ``datasets``' ``files`` follow them."""
    from trainer.tracking import set_aside_earlier_run

    t, d = cfg["trainer"], cfg["data"]
    out = t["output_dir"]
    if resumed is not None and not t.get("val_only"):
        from trainer.later_steps import set_aside_later_steps

        set_aside_later_steps(out, t["default_local_dir"], resumed)
    model = _staged_models.pop(os.path.realpath(out), None) if fresh else None  # a resume stages none
    if fresh:
        reads = {os.path.realpath(f) for k in ("train_files", "val_files") for f in _as_list(d.get(k))}
        earlier = [os.path.join(DATA_DIR, n) for n in DATA_FILES
                   if os.path.realpath(os.path.join(out, DATA_DIR, n)) not in reads]
        set_aside_earlier_run(out, t["default_local_dir"], more=earlier + [INIT_MODEL] * (model is not None),
                              logs=logs)
    if model is not None:
        _settle_init_model(cfg, model)
    staged = _staged.pop(os.path.realpath(out), None)
    if staged is None:
        return
    folder = os.path.join(os.path.abspath(out), DATA_DIR)
    os.makedirs(folder, exist_ok=True)
    moved = {}  # the rows there were set aside (a fresh run; a resume over other rows is refused before)
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


def _settle_init_model(cfg: dict, staged: tempfile.TemporaryDirectory) -> None:
    """Move the tiny model waiting in ``staged`` into ``<output_dir>/init_model`` (the earlier one was set aside) and
    point ``cfg``'s model paths there (a restart of the workers reads them); its former path links to it until the
    run ends, for the workers already started from it."""
    src = os.path.join(staged.name, INIT_MODEL)
    dest = os.path.join(os.path.abspath(cfg["trainer"]["output_dir"]), INIT_MODEL)
    os.replace(src, dest)
    os.symlink(dest, src)
    _moved_models.append(staged)
    for section in (cfg["actor_rollout_ref"]["model"], cfg["critic"]["model"]):
        for key in ("path", "tokenizer_path"):
            if section.get(key) == src:
                section[key] = dest


def _as_list(files) -> list[str]:
    return [] if files is None else [files] if isinstance(files, str) else list(files)


FINAL_METRICS = "final_metrics.json"
VAL_ONLY_METRICS = "val_only_metrics.json"  # a trainer.val_only run's metrics (final_metrics.json is kept)


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
    from trainer.interrupt import run_complete

    run_complete()  # nothing to do: an interrupt from here on only cuts the shut-down short (exit 0)
    return summary


def write_final_metrics(output_dir: str, summary: dict, trained: bool, val_only: bool = False) -> bool:
    """Write ``<output_dir>/final_metrics.json``, unless the run trained no step (a resume with nothing left: the data
    used up at the first draw, a SIGTERM before the first step) and an earlier one is there: its metrics are the
    run's last and are kept (a warning says so). A ``trainer.val_only`` run (``val_only``) writes its validation
    metrics to ``<output_dir>/val_only_metrics.json`` instead, so the training run's ``final_metrics.json`` is kept.
    Returns whether the file was written."""
    path = os.path.join(output_dir, VAL_ONLY_METRICS if val_only else FINAL_METRICS)
    if not trained and not val_only and os.path.isfile(path):
        logger.warning("no step was trained after the resume: %s keeps the metrics of the run's last trained step",
                       path)
        return False
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return True


def nothing_saved_warnings(trainer: dict) -> list[str]:
    """One warning when the run trains but writes no model: no checkpoint (``trainer.save_freq <= 0``), no HF export
    at the end (``trainer.export_hf_on_end=false``) nor at wall-clock marks (``trainer.export_hf_freq_s <= 0``);
    ``[]`` otherwise or for ``trainer.val_only`` (nothing is trained)."""
    def num(key: str) -> float:
        try:
            return float(trainer.get(key) or 0)
        except (TypeError, ValueError):
            return 0.0  # a mistyped value has its own error

    if trainer.get("val_only") or trainer.get("export_hf_on_end") is not False or num("save_freq") > 0 or \
            num("export_hf_freq_s") > 0:
        return []
    return [f"trainer.export_hf_on_end=false with trainer.save_freq={trainer.get('save_freq')} and "
            f"trainer.export_hf_freq_s={trainer.get('export_hf_freq_s')}: the trained model is written nowhere (no "
            "checkpoint, no Hugging Face export), only the metrics; set trainer.save_freq=<N> > 0, "
            "trainer.export_hf_on_end=true or trainer.export_hf_freq_s=<seconds>"]

