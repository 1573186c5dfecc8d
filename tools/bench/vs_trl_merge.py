"""One report from several JSON files of ``tools/bench/vs_trl.py`` (``--report-from A.json,B.json``).

For sides run in separate calls, e.g. TRL's side of a 1.5B job in one call and ours in the next, on the same
machine. The files must describe the same job: every key of their ``job`` agrees but the ones a call may set for
itself (:data:`FREE_KEYS`: steps, overrides and profiling of our side, the work folder, vLLM memory shares) and the
paths ``model`` / ``data``, which compare by their last component (the random model's record compares without its
``reused`` flag and tokenizer folder). Their ``meta.device`` and ``meta.gpus`` must agree too: sides measured on
different cards do not compare (a second machine of the same kind can still differ; the report keeps every file's
``meta``, dates included, under ``parts``).

A side in more than one file (e.g. ours with and without the update's CUDA graphs) keeps its first row's name; later
rows become ``<side>@<file stem>``, so that every ratio keeps its own key. The merged document: the first file's
``meta`` and ``job``, every file's rows in file order (each with ``file``), ``sides`` in that order, the union of the
notes, and ``parts`` (per file: ``file``, ``meta``, ``job``, ``sides``).
"""
from __future__ import annotations

import json
import os

__all__ = ["FREE_KEYS", "merge_vs_docs"]

FREE_KEYS = ("steps", "out_dir", "ours_overrides", "ours_profile_steps", "trl_vllm_gpu_util", "ours_vllm_gpu_util")
_PATH_KEYS = ("model", "data")


def _norm_job(job: dict) -> dict:
    out = {k: v for k, v in job.items() if k not in FREE_KEYS}
    for k in _PATH_KEYS:
        if isinstance(out.get(k), str):
            out[k] = os.path.basename(os.path.normpath(out[k]))
    if isinstance(out.get("random_model"), dict):
        out["random_model"] = {k: v for k, v in out["random_model"].items() if k not in ("reused", "tokenizer")}
    return out


def _load(path: str, keys: tuple[str, ...]) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: --report-from {path}: {type(err).__name__}: {err}")
    if not isinstance(doc, dict) or not set(keys) <= set(doc):
        raise SystemExit(f"error: --report-from {path}: not a vs_trl.py report (expected keys {', '.join(keys)})")
    return doc


def merge_vs_docs(paths: list[str]) -> dict:
    """The merged document of ``paths`` (module docstring); one path: that file's document as it is.

    Raises:
        SystemExit: a file unreadable or not a report; jobs that differ (the keys named); another device or GPU count.
    """
    if len(paths) == 1:
        return _load(paths[0], ("results",))
    docs = [_load(p, ("job", "results", "meta")) for p in paths]
    first, base = docs[0], _norm_job(docs[0]["job"])
    for path, doc in zip(paths[1:], docs[1:]):
        job = _norm_job(doc["job"])
        diff = sorted(k for k in set(base) | set(job) if base.get(k) != job.get(k))
        if diff:
            raise SystemExit(f"error: --report-from: {path} ran another job than {paths[0]}: {', '.join(diff)} "
                             f"differ ({', '.join(f'{k}={job.get(k)!r} vs {base.get(k)!r}' for k in diff[:3])})")
        for key in ("device", "gpus"):
            if doc["meta"].get(key) != first["meta"].get(key):
                raise SystemExit(f"error: --report-from: {path} ran on {key} {doc['meta'].get(key)!r}, {paths[0]} on "
                                 f"{first['meta'].get(key)!r}: sides measured on different cards do not compare")
    rows, seen = [], set()
    for path, doc in zip(paths, docs):
        stem = os.path.splitext(os.path.basename(path))[0]
        for row in doc["results"]:
            name = row["side"] if row["side"] not in seen else f"{row['side']}@{stem}"
            seen.add(name)
            rows.append(dict(row, side=name, file=os.path.basename(path)))
    return dict(meta=first["meta"], job=first["job"], sides=[r["side"] for r in rows], results=rows,
                notes=list(dict.fromkeys(n for d in docs for n in d.get("notes", []))),
                parts=[dict(file=os.path.basename(p), meta=d["meta"], job=d["job"], sides=d.get("sides"))
                       for p, d in zip(paths, docs)])
