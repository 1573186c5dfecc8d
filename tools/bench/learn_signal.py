"""The training signal of each run of ``tools/bench/learn_vs_trl.py`` between its wall-clock marks.

Held-out accuracy says where a policy got; these say how it got there, step by step, read the same way on both
sides: the training reward, the share of prompt groups whose rewards are all equal (no policy-gradient signal in
them: ours' ``critic/frac_reward_zero_std``, TRL's ``frac_reward_zero_std``), the policy entropy (nats per token)
and the mean response length (tokens). :func:`signal_by_mark` averages them over the steps a run took between two
of its saves, so both sides are compared at the same wall-clock minutes even when their step rates differ.
"""
from __future__ import annotations

import math
import os

from tools.plot_run import load_metrics

__all__ = ["SIGNAL_KEYS", "step_rows", "signal_by_mark", "signal_lines"]

# report name: (ours' metrics.jsonl key, TRL's per-step key in learn_vs_trl_child's result)
SIGNAL_KEYS = {
    "reward": ("critic/score/mean", "reward"),
    "frac_reward_zero_std": ("critic/frac_reward_zero_std", "frac_reward_zero_std"),
    "entropy": ("actor/entropy", "entropy"),
    "response_length": ("response_length/mean", "completion_length"),
}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def step_rows(run: dict) -> list[dict]:
    """Per optimizer step of one run, in step order, ``{"step": int, <SIGNAL_KEYS name>: float, ...}`` (a value the
    run did not log, or logged as a boolean, is left out; a step logged twice, as after a resume, keeps its last
    entry): ours' from ``<run["out_dir"]>/metrics.jsonl`` (one JSON object per step), TRL's from
    ``run["trl"]["steps"]``. [] when neither is there."""
    if run["side"] == "trl":
        src, col = (run.get("trl") or {}).get("steps") or [], 1
    else:
        path = os.path.join(run["out_dir"], "metrics.jsonl") if run.get("out_dir") else ""
        if not os.path.isfile(path):
            return []
        src, col = load_metrics(path), 0  # a last line cut by a killed process is left out
    by_step = {}
    for s in src:
        if not _number(s.get("step")):
            continue
        row = {"step": int(s["step"])}
        row.update({name: float(s[keys[col]]) for name, keys in SIGNAL_KEYS.items() if _number(s.get(keys[col]))})
        by_step[row["step"]] = row
    return [by_step[k] for k in sorted(by_step)]


def signal_by_mark(steps: list[dict], exports: list[dict]) -> list[dict]:
    """Per save of the run (``exports``: the manifest's entries, ``mark_s`` and ``global_step``), in mark order:
    ``{"mark_s", "steps": the number of steps after the previous save up to this one, <name>: their mean}``; a
    name none of those steps logged (or only as NaN) is left out."""
    out, prev = [], 0
    for e in sorted(exports, key=lambda e: e["mark_s"]):
        upto = int(e.get("global_step") or 0)
        window = [s for s in steps if prev < s["step"] <= upto]
        row = {"mark_s": float(e["mark_s"]), "steps": len(window)}
        for name in SIGNAL_KEYS:
            vals = [s[name] for s in window if name in s and math.isfinite(s[name])]
            if vals:
                row[name] = sum(vals) / len(vals)
        out.append(row)
        prev = max(prev, upto)
    return out


def _cell(runs: list[dict], side: str, mark_s: float, name: str, fmt: str) -> str:
    """One value per seed of ``side``, in seed order, ``-`` where that seed has none at the mark; ``-`` alone when
    the side has no run."""
    by_seed = {run["seed"]: next((r for r in run["signal"] if r["mark_s"] == mark_s), {})
               for run in runs if run["side"] == side}
    return "/".join(format(by_seed[seed][name], fmt) if name in by_seed[seed] else "-"
                    for seed in sorted(by_seed)) or "-"


def signal_lines(doc: dict) -> list[str]:
    """Markdown: one row per mark, per side the steps taken since the previous mark, the share of reward-flat
    groups, the entropy and the training reward over those steps (one value per seed in seed order, ``/`` between
    seeds, ``-`` for a seed without it); [] when no run of ``doc["runs"]`` holds ``signal`` (:func:`signal_by_mark`)."""
    runs = [r for r in doc.get("runs") or [] if r.get("signal")]
    if not runs:
        return []
    marks = sorted({r["mark_s"] for run in runs for r in run["signal"]})
    lines = ["", "Training signal between marks (mean over the steps since the previous mark; one value per seed, in "
             "seed order):", "", "| minutes | TRL steps | ours steps | TRL flat groups | ours flat groups | TRL entropy "
             "| ours entropy | TRL reward | ours reward |", "|---|---|---|---|---|---|---|---|---|"]
    for t in marks:
        cells = [_cell(runs, side, t, name, fmt) for name, fmt in
                 (("steps", "d"), ("frac_reward_zero_std", ".2f"), ("entropy", ".2f"), ("reward", ".3f"))
                 for side in ("trl", "ours")]
        lines.append(f"| {t / 60:g} | " + " | ".join(cells) + " |")
    return lines
