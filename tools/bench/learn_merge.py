"""Combining JSON files of ``tools/bench/learn_vs_trl.py`` into one document.

Two uses, one merge (:func:`merge_docs`):

- ``--eval-from``: files of calls that trained without evaluating (e.g. one seed and side per call, one session:
  the checkpoints are still on the machine's disk); the merged document has no ``eval`` and is scored next. The
  jobs must agree in every key but seeds and sides, paths included (the evaluator reads the first file's model and
  held-out set).
- ``--report-from`` with several files: *evaluated* files of separate sessions (e.g. seed 1 trained and scored in
  one, seed 2 in another; checkpoints do not outlive a session). The jobs must agree in every key but seeds, sides
  and the folders of ``model``, ``train``, ``test`` and ``gsm8k``: those compare by their last path component, as
  each session may keep the same model and data under another directory, and ``budget_s`` and ``marks_s``: runs
  of different budgets with the same ``every_s`` are set side by side (e.g. a 5-minute run of a new setting of ours
  beside TRL's 9-minute runs); each run gets ``budget_s``, its file's budget, and has no value at a mark after it
  (:func:`tools.bench.learn_report.run_values`), and the merged job has the longest budget and every file's marks.
  The evaluation results (and errors) are
  the union of every file's, per checkpoint and set, the first file's taken where two files have one; so the base
  model (time 0 of every run) is the first file's. Each session scores the base model again, and another machine may
  score it slightly differently: a base accuracy that differs between files is kept in ``eval.base_spread`` and
  printed. Provenance: every run gets ``file`` (the file it came from) and, from the merge before an evaluation,
  ``invocation`` (the command of the tool call that trained it), the document ``meta_by_file`` (each file's
  ``meta``: date, device, command, versions) and ``eval.by_file`` (each file's evaluator engine, wall time, return
  code and GSM8K rows).

A (side, seed) run in two files is refused in both uses: its checkpoints would share the evaluator's names.

A file may be named with one side, ``PATH:SIDE`` (:func:`parse_sources`): only that side's runs are taken from it,
e.g. ``old.json:trl,new.json:ours`` sets a new configuration of ours beside TRL's recorded runs. The job keys that
concern one side alone (:data:`SIDE_KEYS`) are compared only between files that hold runs of that side, and the
merged job takes them from the first file that does.
"""
from __future__ import annotations

import json
import os

from tools.bench.learn_report import SIDES

__all__ = ["PATH_KEYS", "SIDE_KEYS", "BUDGET_KEYS", "parse_sources", "job_differences", "load_doc", "merge_docs"]

PATH_KEYS = ("model", "train", "test", "gsm8k")  # compared by their last path component across sessions
FREE_KEYS = ("seeds", "sides")  # each file has its own
BUDGET_KEYS = ("budget_s", "marks_s")  # each evaluated file may have its own (module docstring)
JOB_DEFAULTS = {"strict_format": False}  # the value of a key that files written before it existed lack
SIDE_KEYS = {"ours": ("ours_engine", "ours_vllm_gpu_util", "ours_overrides"),  # keys that shape one side's runs alone
             "trl": ("trl_vllm_gpu_util", "trl_vllm_sleep", "trl_cache_implementation")}


def parse_sources(text: str, flag: str) -> list[tuple[str, str | None]]:
    """``[(path, side or None)]`` of a comma list of ``PATH`` or ``PATH:SIDE`` (SIDE one of trl, ours; a ``:``
    suffix that names no side is part of the path, e.g. ``learn_2026-12-06T16:55.json``).

    Raises: SystemExit with one line naming ``flag`` when the list holds no path."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        path, _, side = item.rpartition(":")
        if path and side in SIDES:
            out.append((path, side))
        elif item:
            out.append((item, None))
    if not out:
        raise SystemExit(f"error: {flag} {text!r}: expected a comma list of JSON files (PATH or PATH:SIDE)")
    return out


def job_differences(job: dict, other: dict, by_basename: bool = False, skip_sides=()) -> list[str]:
    """The keys (sorted) whose values differ between two jobs, over the keys of both, seeds and sides left out, and
    the :data:`SIDE_KEYS` of every side in ``skip_sides``.

    ``by_basename``: the :data:`PATH_KEYS` compare by their last path component (``/tmp/a/smol_hf`` equals
    ``/data/smol_hf``; None only equals None), and the :data:`BUDGET_KEYS` are left out (evaluated files of separate
    sessions). A key of :data:`JOB_DEFAULTS` that a job lacks has its default."""
    def norm(key, value):
        if value is None:
            value = JOB_DEFAULTS.get(key)
        if by_basename and key in PATH_KEYS and isinstance(value, str):
            return os.path.basename(os.path.normpath(value))
        return value
    keys = (set(job) | set(other)) - set(FREE_KEYS) - {k for s in skip_sides for k in SIDE_KEYS[s]} \
        - (set(BUDGET_KEYS) if by_basename else set())
    return sorted(k for k in keys if norm(k, job.get(k)) != norm(k, other.get(k)))


def load_doc(path: str, flag: str) -> dict:
    """The JSON document at ``path``. Raises: SystemExit with one line naming ``flag`` and the file when it cannot
    be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {flag} {path}: {type(err).__name__}: {err}")


def merge_docs(paths: list, evaluated: bool = False, flag: str = "--eval-from") -> dict:
    """One document from several of this tool's JSON files: the first file's meta, job and split, every file's runs
    in file order, the job's ``seeds`` and ``sides`` those of the runs. Without ``evaluated``: no ``eval`` (the
    runs are to be scored next). With ``evaluated``: every file must hold an evaluation, and the document gets their
    union, ``eval.base_spread`` (when the base scores differ), ``eval.by_file``, ``meta_by_file`` and each run's
    ``file`` (module docstring).

    ``paths``: file paths, or ``(path, side or None)`` pairs (:func:`parse_sources`): a side keeps only that side's
    runs of the file. ``flag`` names the option in the messages. Raises: SystemExit with a one-line message when a
    file cannot be read, a file's job differs from the first's (naming the file and the keys; paths by their last
    component with ``evaluated``; a side's :data:`SIDE_KEYS` against the first file holding that side), a (side,
    seed) run is in two files, a file holds no run of its side, or (``evaluated``) a file has no evaluation
    results."""
    sources = [(p, None) if isinstance(p, str) else tuple(p) for p in paths]
    paths = [p for p, _ in sources]
    docs = [_taken(load_doc(p, flag), p, side, flag) for p, side in sources]
    held = [{r["side"] for r in d.get("runs", [])} for d in docs]
    first = {s: next(j for j, h in enumerate(held) if s in h) for s in SIDE_KEYS if any(s in h for h in held)}
    for i in range(1, len(docs)):
        bad = {0: job_differences(docs[0]["job"], docs[i]["job"], by_basename=evaluated, skip_sides=tuple(SIDE_KEYS))}
        for side, keys in SIDE_KEYS.items():  # a side's settings against the first file that ran that side
            j = first.get(side, i)
            if side in held[i] and j < i:
                bad.setdefault(j, []).extend(k for k in job_differences(docs[j]["job"], docs[i]["job"]) if k in keys)
        parts = [f"from {paths[j]}'s in {', '.join(sorted(keys))}" for j, keys in sorted(bad.items()) if keys]
        if parts:
            raise SystemExit(f"error: {flag} {paths[i]}: its job differs {'; '.join(parts)}")
    seen = {}
    for p, d in zip(paths, docs):
        for r in d.get("runs", []):
            key = (r["side"], r["seed"])
            if key in seen:
                raise SystemExit(f"error: {flag} {p}: {r['side']} seed {r['seed']} is also in {seen[key]}; "
                                 "each (side, seed) run may come from one file only")
            seen[key] = p
    runs = [dict(r, file=r.get("file", p), budget_s=r.get("budget_s", d["job"]["budget_s"])) if evaluated
            else _with_invocation(r, d) for p, d in zip(paths, docs) for r in d.get("runs", [])]
    doc = dict(docs[0], runs=runs)
    doc.pop("eval", None)
    doc["job"] = dict(doc["job"], seeds=sorted({r["seed"] for r in runs}),
                      sides=[s for s in SIDES if any(r["side"] == s for r in runs)])
    if evaluated:  # runs of different budgets: the longest, and every file's marks
        doc["job"].update(budget_s=max(d["job"]["budget_s"] for d in docs),
                          marks_s=sorted({float(m) for d in docs for m in d["job"]["marks_s"]}))
    for side, j in first.items():  # a side's own settings from the first file that ran it
        doc["job"].update({k: docs[j]["job"][k] for k in SIDE_KEYS[side] if k in docs[j]["job"]})
    if evaluated:  # a merged file's runs keep the file, budget and meta they came from
        doc["eval"] = _merged_eval(paths, docs, flag)
        doc["meta_by_file"] = {}
        for p, d in zip(paths, docs):
            doc["meta_by_file"].update(d.get("meta_by_file") or {p: d.get("meta")})
        named = {r["file"] for r in runs}  # files whose runs a side selection dropped go; the first (the base) stays
        first = next(iter(doc["meta_by_file"]))
        doc["meta_by_file"] = {p: m for p, m in doc["meta_by_file"].items() if p in named or p == first}
    return doc


def _with_invocation(run: dict, doc: dict) -> dict:
    """``run`` with ``invocation``: the command of the tool call that trained it (``doc``'s ``meta.command``), kept
    from an earlier merge when it has one. Files of one side each (the loan script's ``ours.json`` and ``trl.json``)
    are merged before their evaluation, and the merged document keeps only the first file's ``meta``."""
    command = (doc.get("meta") or {}).get("command")
    return run if "invocation" in run or command is None else dict(run, invocation=command)


def _taken(doc: dict, path: str, side: str | None, flag: str) -> dict:
    """``doc`` with only ``side``'s runs and their evaluation results and errors (all with None).

    Raises: SystemExit when the file holds none of them."""
    if side is None:
        return doc
    runs = [r for r in doc.get("runs", []) if r["side"] == side]
    if not runs:
        raise SystemExit(f"error: {flag} {path}:{side}: the file holds no {side} run (it holds "
                         f"{', '.join(sorted({r['side'] for r in doc.get('runs', [])})) or 'none'})")
    dropped = tuple(f"{s}_s" for s in SIDES if s != side)  # the evaluator's names of other sides' checkpoints
    ev = doc.get("eval")
    if ev:
        ev = dict(ev, **{k: {c: v for c, v in (ev.get(k) or {}).items() if not c.startswith(dropped)}
                         for k in ("results", "errors")})
    return dict(doc, runs=runs, eval=ev)


def _merged_eval(paths: list[str], docs: list[dict], flag: str) -> dict:
    """The union of the files' evaluations (the first file's result, or one-answer baseline ``sets``, where two have
    one), ``base_spread`` and ``by_file``; prints one line when the base model's accuracy differs between files."""
    for p, d in zip(paths, docs):
        if not (d.get("eval") or {}).get("results"):
            raise SystemExit(f"error: {flag} {p}: no evaluation results (score its checkpoints with --eval-from "
                             "in the session that has them)")
    ev = dict(docs[0]["eval"], results={}, errors={}, sets={})
    ev.pop("base_spread", None)  # an earlier merge's: this merge's is computed below
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
    ev["by_file"] = {}
    for p, d in zip(paths, docs):
        ev["by_file"].update(d["eval"].get("by_file") or
                             {p: {k: d["eval"].get(k) for k in ("engine", "wall_s", "rc", "gsm8k_rows")}})
    return ev
