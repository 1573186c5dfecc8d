"""Metric logging: console (with a tqdm progress bar), a JSON-lines file per run, and wandb.

Every run writes ``<output_dir>/metrics.jsonl`` (one JSON object per step: ``{"step": N, "<metric>": value}``),
which ``tools/plot_run.py`` reads. wandb is used when ``trainer.logger`` includes it; without an API key it
runs in offline mode (``WANDB_MODE=offline``), so no network is needed.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from typing import Any, Mapping, Sequence

logger = logging.getLogger(__name__)

CONSOLE_KEYS = ("critic/score/mean", "reward/acc/mean", "critic/frac_reward_zero_std", "response_length/mean",
                "actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm", "timing_s/step", "perf/throughput")
BACKENDS = ("console", "wandb")
# what a run writes into trainer.output_dir besides checkpoints (set aside by a fresh run with them when they are
# inside it: set_aside_earlier_run)
RUN_OUTPUTS = ("metrics.jsonl", "val_generations.jsonl", "final_metrics.json", "val_only_metrics.json", "hf_actor",
               "hf_exports", "async_trace.json")
EARLIER_RUNS = "earlier_runs"


def unknown_backends(backends) -> list[str]:
    """The names in ``backends`` (``trainer.logger``: one name or a list of names) that are not in
    :data:`BACKENDS`, sorted; ``[]`` when every name is known."""
    backends = [backends] if isinstance(backends, str) else list(backends or [])
    return sorted({str(b) for b in backends} - set(BACKENDS))


class Tracking:
    """Fan metrics out to the configured backends.

    Args:
        project, experiment: names (wandb project / run name).
        backends: subset of {"console", "wandb"}; the JSON-lines file is always written.
        output_dir: where ``metrics.jsonl`` goes (a fresh run's start-up has moved an earlier run's outputs aside:
            :func:`set_aside_earlier_run`); a resumed run keeps the rows up to ``start_step`` (every row with
            ``keep_rows``: a ``trainer.val_only`` run appends its validation row).
        total_steps: length of the progress bar.

    Raises:
        ValueError: an unknown backend name.
    """

    def __init__(self, project: str, experiment: str, backends, output_dir: str, config: dict | None = None,
                 total_steps: int | None = None, start_step: int = 0, keep_rows: bool = False):
        unknown = unknown_backends(backends)
        if unknown:
            raise ValueError(f"trainer.logger has unknown backend(s) {unknown}; expected console and/or wandb")
        backends = [backends] if isinstance(backends, str) else list(backends or [])
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "metrics.jsonl")
        if not keep_rows:
            _keep_rows_up_to(self.path, start_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self.console = "console" in backends
        self._bar = None
        if self.console:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        self._wandb = None
        if "wandb" in backends:
            import wandb

            if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
                os.environ["WANDB_MODE"] = "offline"
            self._wandb = wandb.init(project=project, name=experiment, config=config, dir=output_dir)

    def log(self, data: dict[str, Any], step: int) -> None:
        advance = not data.get("_no_advance")  # keys starting with "_" steer logging and are not written
        clean = {k: _plain(v) for k, v in data.items() if not k.startswith("_")}
        self._file.write(json.dumps({"step": step, **clean}, allow_nan=True) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self.console:
            shown = {k.split("/")[-2] + "/" + k.split("/")[-1] if k.count("/") > 1 else k: clean[k]
                     for k in CONSOLE_KEYS if k in clean}
            shown.update({k: v for k, v in clean.items() if k.startswith("val/") and k.endswith("/acc")})
            line = " ".join(f"{k}={_fmt(v)}" for k, v in shown.items())
            if self._bar is not None:
                self._bar.write(f"step {step}: {line}")
                if advance:
                    self._bar.update(1)

    def log_generations(self, samples: list[dict], step: int) -> None:
        """Validation samples (``{"input", "output", "score"}``, :func:`generation_samples`): appended to
        ``<output_dir>/val_generations.jsonl`` with the step, printed on the console, a wandb table with wandb."""
        with open(os.path.join(os.path.dirname(self.path), "val_generations.jsonl"), "a", encoding="utf-8") as f:
            for row in samples:
                f.write(json.dumps({"step": step, **row}) + "\n")
        if self.console and self._bar is not None:
            for row in samples:
                self._bar.write(f"val sample (step {step}, score {_fmt(row['score'])}): {row['input']!r} -> "
                                f"{row['output']!r}")
        if self._wandb is not None:
            import wandb

            table = wandb.Table(columns=["step", "input", "output", "score"],
                                data=[[step, r["input"], r["output"], r["score"]] for r in samples])
            self._wandb.log({"val/generations": table}, step=step)

    def rewind_to(self, step: int) -> None:
        """Drop the rows of steps after ``step`` (a run that went back to a checkpoint logs them again) and set
        the progress bar to ``step``."""
        self._file.close()
        _keep_rows_up_to(self.path, step, fresh_at_0=False)
        self._file = open(self.path, "a", encoding="utf-8")
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def set_aside_earlier_run(output_dir: str, checkpoint_dir: str | None = None, more: Sequence[str] = (),
                          logs: Mapping[str, int] | None = None) -> str | None:
    """Move what an earlier run left in ``output_dir`` into ``<output_dir>/earlier_runs/<YYYYmmdd-HHMMSS>/``, so
    that a fresh run into the same folder replaces nothing and mixes with nothing; returns that folder, or None when
    there was nothing to move. Moved: the :data:`RUN_OUTPUTS` that exist and are not empty, the files ``more`` names
    (paths relative to ``output_dir``, e.g. the embedded task's ``data/train.jsonl`` when this run writes other
    rows), and, when ``checkpoint_dir`` (``trainer.default_local_dir``) lies inside ``output_dir``, its checkpoints
    (every ``global_step_<N>`` folder, complete or not, and the tracker file) into the same relative folder there:
    left in place, a later ``resume_mode=auto`` would resume the earlier run's checkpoint into this run's metrics. A
    checkpoint folder outside ``output_dir`` is not touched (a fresh run with checkpoints there is refused before
    start-up, :func:`trainer.config_preflight.preflight`). ``logs``: log files that this process appends to, each
    with the size it had when this run started; those inside ``output_dir`` (Hydra's ``main.log``) keep this run's
    lines and the earlier lines go to the same relative path there. One warning line names what was moved and
    where."""
    found = [n for n in RUN_OUTPUTS if _non_empty(os.path.join(output_dir, n))]
    found += [n for n in more if _non_empty(os.path.join(output_dir, n))]
    split = {p: n for p, n in (logs or {}).items() if n > 0 and _inside(p, output_dir) and os.path.isfile(p)}
    ckpts, ckpt_rel = _earlier_checkpoints(output_dir, checkpoint_dir)
    if not found and not ckpts and not split:
        return None
    dest = earlier_runs_folder(output_dir)
    for name in found:
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        os.replace(os.path.join(output_dir, name), os.path.join(dest, name))
    what = list(found)
    for path, size in split.items():
        rel = os.path.relpath(path, output_dir)
        _split_log(path, size, os.path.join(dest, rel))
        what.append(f"{rel} (the lines before this run's)")
    if ckpts:
        import shutil

        into = os.path.normpath(os.path.join(dest, ckpt_rel))
        os.makedirs(into, exist_ok=True)
        for name in ckpts:  # a rename within output_dir (shutil.move copies only across file systems)
            shutil.move(os.path.join(checkpoint_dir, name), os.path.join(into, name))
        steps = sorted(int(m.group(1)) for m in map(re.compile(r"global_step_(\d+)").match, ckpts) if m)
        where = os.path.relpath(into, output_dir)
        what.append(f"checkpoints ({f'steps {steps[0]}..{steps[-1]}' if steps else 'tracker'} of "
                    f"{checkpoint_dir}, now in {where})")
    logger.warning("%s held an earlier run's %s: moved to %s (this run starts from scratch; to go on with the "
                   "earlier run, give that folder as trainer.output_dir with trainer.resume_mode=auto)", output_dir,
                   ", ".join(what), dest)
    return dest


def earlier_runs_folder(output_dir: str) -> str:
    """A new folder ``<output_dir>/earlier_runs/<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``, ... added when it exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, k = os.path.join(output_dir, EARLIER_RUNS, stamp), 1
    while os.path.exists(dest):
        k += 1
        dest = os.path.join(output_dir, EARLIER_RUNS, f"{stamp}-{k}")
    os.makedirs(dest)
    return dest


def _inside(path: str, folder: str) -> bool:
    """``path`` lies inside ``folder``, not in its :data:`EARLIER_RUNS`."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(folder))
    return not rel.startswith(os.pardir) and rel.split(os.sep)[0] != EARLIER_RUNS


def _split_log(path: str, size: int, dest: str) -> None:
    """Move the first ``size`` bytes of the log ``path`` (an earlier run's lines) to ``dest``; ``path`` keeps the rest
    (this run's lines). The handlers that write ``path`` are held meanwhile; they append (Hydra's ``FileHandler``
    opens in mode ``a``), so their next lines follow this run's."""
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.FileHandler) and os.path.abspath(h.baseFilename) == os.path.abspath(path)]
    for h in handlers:
        h.acquire()
        h.flush()
    try:
        with open(path, "r+b") as f:
            head, rest = f.read(size), f.read()
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as out:
                out.write(head)
            f.seek(0)
            f.write(rest)
            f.truncate()
    finally:
        for h in handlers:
            h.release()


def _earlier_checkpoints(output_dir: str, checkpoint_dir: str | None) -> tuple[list[str], str]:
    """The checkpoint entries (``global_step_*`` folders, the tracker file) in ``checkpoint_dir`` when it lies inside
    ``output_dir`` (or is it), and its path relative to ``output_dir``; ``([], "")`` otherwise."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return [], ""
    out, ckpt = os.path.realpath(output_dir), os.path.realpath(checkpoint_dir)
    if ckpt != out and not ckpt.startswith(out + os.sep):
        return [], ""
    rel = os.path.relpath(ckpt, out)
    if rel.split(os.sep)[0] == EARLIER_RUNS:
        return [], ""
    from trainer.checkpoint.base import STEP_DIR_PREFIX, TRACKER_FILE

    names = sorted(n for n in os.listdir(checkpoint_dir)
                   if (n.startswith(STEP_DIR_PREFIX) and os.path.isdir(os.path.join(checkpoint_dir, n)))
                   or n == TRACKER_FILE)
    return names, rel


def _non_empty(path: str) -> bool:
    return os.path.getsize(path) > 0 if os.path.isfile(path) else os.path.isdir(path) and bool(os.listdir(path))


def _keep_rows_up_to(path: str, step: int, fresh_at_0: bool = True) -> None:
    """Make ``metrics.jsonl`` hold only rows of steps <= ``step`` (a resumed run continues after them; ``step`` 0
    with ``fresh_at_0`` empties it), so that resumes and rewinds never leave duplicate steps."""
    if not os.path.exists(path):
        return
    kept = []
    if step > 0 or not fresh_at_0:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    if int(json.loads(line).get("step", -1)) <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except (ValueError, TypeError, AttributeError):
                    continue
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def generation_samples(tokenizer, rows, scores: list[float], limit: int) -> list[dict]:
    """Up to ``limit`` samples ``{"input", "output", "score"}`` of a generated batch: the decoded prompt and
    response (padding dropped; ``prompts`` (B, P) and ``responses``/``response_mask`` (B, R) columns of ``rows``)
    and the summed token-level score."""
    out = []
    for i in range(min(max(limit, 0), len(rows))):
        prompt = rows["prompts"][i][rows["attention_mask"][i][: rows["prompts"].shape[1]].bool()]
        response = rows["responses"][i][rows["response_mask"][i].bool()]
        out.append({"input": tokenizer.decode(prompt.tolist(), skip_special_tokens=True),
                    "output": tokenizer.decode(response.tolist(), skip_special_tokens=True),
                    "score": float(scores[i])})
    return out
