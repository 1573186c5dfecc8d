"""Combining JSON files of ``tools/bench/learn_vs_trl.py`` into one document.

Two uses, one merge (:func:`merge_docs`):

- ``--eval-from``: files of calls that trained without evaluating (e.g. one seed and side per call, one session:
  the checkpoints are still on the machine's disk); the merged document has no ``eval`` and is scored next. The
  jobs must agree in every key but seeds and sides, paths included (the evaluator reads the first file's model and
  held-out set).
- ``--report-from`` with several files: *evaluated* files of separate sessions (e.g. seed 1 trained and scored in
  one, seed 2 in another; checkpoints do not outlive a session). The jobs must agree in every key but seeds, sides
  and the folders of ``model``, ``train``, ``test`` and ``gsm8k``: those compare by their last path component, as
  each session may keep the same model and data under another directory. The evaluation results (and errors) are
  the union of every file's, per checkpoint and set, the first file's taken where two files have one; so the base
  model (time 0 of every run) is the first file's. Each session scores the base model again, and another machine may
  score it slightly differently: a base accuracy that differs between files is kept in ``eval.base_spread`` and
  printed. Provenance: every run gets ``file`` (the file it came from), the document ``meta_by_file`` (each file's
  ``meta``: date, device, command, versions) and ``eval.by_file`` (each file's evaluator engine, wall time, return
  code and GSM8K rows).

A (side, seed) run in two files is refused in both uses: its checkpoints would share the evaluator's names.
"""
from __future__ import annotations

import json
import os

from tools.bench.learn_report import SIDES

__all__ = ["PATH_KEYS", "job_differences", "load_doc", "merge_docs"]

PATH_KEYS = ("model", "train", "test", "gsm8k")  # compared by their last path component across sessions
FREE_KEYS = ("seeds", "sides")  # each file has its own
JOB_DEFAULTS = {"strict_format": False}  # the value of a key that files written before it existed lack


def job_differences(job: dict, other: dict, by_basename: bool = False) -> list[str]:
    """The keys (sorted) whose values differ between two jobs, over the keys of both, seeds and sides left out.

    ``by_basename``: the :data:`PATH_KEYS` compare by their last path component (``/tmp/a/smol_hf`` equals
    ``/data/smol_hf``; None only equals None). A key of :data:`JOB_DEFAULTS` that a job lacks has its default."""
    def norm(key, value):
        if value is None:
            value = JOB_DEFAULTS.get(key)
        if by_basename and key in PATH_KEYS and isinstance(value, str):
            return os.path.basename(os.path.normpath(value))
        return value
    keys = (set(job) | set(other)) - set(FREE_KEYS)
    return sorted(k for k in keys if norm(k, job.get(k)) != norm(k, other.get(k)))


def load_doc(path: str, flag: str) -> dict:
    """The JSON document at ``path``. Raises: SystemExit with one line naming ``flag`` and the file when it cannot
    be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {flag} {path}: {type(err).__name__}: {err}")


def merge_docs(paths: list[str], evaluated: bool = False, flag: str = "--eval-from") -> dict:
    """One document from several of this tool's JSON files: the first file's meta, job and split, every file's runs
    in file order, the job's ``seeds`` and ``sides`` those of the runs. Without ``evaluated``: no ``eval`` (the
    runs are to be scored next). With ``evaluated``: every file must hold an evaluation, and the document gets their
    union, ``eval.base_spread`` (when the base scores differ), ``eval.by_file``, ``meta_by_file`` and each run's
    ``file`` (module docstring).

    ``flag`` names the option in the messages. Raises: SystemExit with a one-line message when a file cannot be
    read, a file's job differs from the first's (naming the file and the keys; paths by their last component with
    ``evaluated``), a (side, seed) run is in two files, or (``evaluated``) a file has no evaluation results."""
    docs = [load_doc(p, flag) for p in paths]
    for p, d in zip(paths[1:], docs[1:]):
        bad = job_differences(docs[0]["job"], d["job"], by_basename=evaluated)
        if bad:
            raise SystemExit(f"error: {flag} {p}: its job differs from {paths[0]}'s in {', '.join(bad)}")
    seen = {}
    for p, d in zip(paths, docs):
        for r in d.get("runs", []):
            key = (r["side"], r["seed"])
            if key in seen:
                raise SystemExit(f"error: {flag} {p}: {r['side']} seed {r['seed']} is also in {seen[key]}; "
                                 "each (side, seed) run may come from one file only")
            seen[key] = p
    runs = [dict(r, file=p) if evaluated else r for p, d in zip(paths, docs) for r in d.get("runs", [])]
    doc = dict(docs[0], runs=runs)
    doc.pop("eval", None)
    doc["job"] = dict(doc["job"], seeds=sorted({r["seed"] for r in runs}),
                      sides=[s for s in SIDES if any(r["side"] == s for r in runs)])
    if evaluated:
        doc["eval"] = _merged_eval(paths, docs, flag)
        doc["meta_by_file"] = {p: d.get("meta") for p, d in zip(paths, docs)}
    return doc


def _merged_eval(paths: list[str], docs: list[dict], flag: str) -> dict:
    """The union of the files' evaluations (the first file's result, or one-answer baseline ``sets``, where two have
    one), ``base_spread`` and ``by_file``; prints one line when the base model's accuracy differs between files."""
    for p, d in zip(paths, docs):
        if not (d.get("eval") or {}).get("results"):
            raise SystemExit(f"error: {flag} {p}: no evaluation results (score its checkpoints with --eval-from "
                             "in the session that has them)")
    ev = dict(docs[0]["eval"], results={}, errors={}, sets={})
    for d in docs:
        for name, baseline in (d["eval"].get("sets") or {}).items():
            ev["sets"].setdefault(name, baseline)
        for ckpt, by_set in d["eval"]["results"].items():
            for name, res in by_set.items():
                ev["results"].setdefault(ckpt, {}).setdefault(name, res)
        for key, err in (d["eval"].get("errors") or {}).items():
            ev["errors"].setdefault(key, err)
    spread = {}
    for name in ev["results"].get("base", {}):
        seen = [(p, d["eval"]["results"]["base"][name]["acc"]) for p, d in zip(paths, docs)
                if name in (d["eval"]["results"].get("base") or {})]
        if len({acc for _, acc in seen}) > 1:
            spread[name] = dict(acc=[acc for _, acc in seen], files=[p for p, _ in seen])
    if spread:
        ev["base_spread"] = spread
        print("note: the base model's accuracy differs between files ("
              + "; ".join(f"{name}: " + ", ".join(f"{100 * a:.2f}% in {p}" for a, p in zip(s["acc"], s["files"]))
                          for name, s in spread.items()) + f"); the report uses {paths[0]}'s", flush=True)
    ev["by_file"] = {p: {k: d["eval"].get(k) for k in ("engine", "wall_s", "rc", "gsm8k_rows")}
                     for p, d in zip(paths, docs)}
    return ev
