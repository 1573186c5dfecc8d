"""Plot one or more runs from their ``metrics.jsonl`` files (matplotlib, PNG).

    python tools/plot_run.py RUN_DIR [RUN_DIR ...] [--out docs/plots] [--name gsm8k]

A RUN_DIR is a run's ``trainer.output_dir`` (or a ``metrics.jsonl`` file itself). Several runs overlay in the
same axes for comparison. Writes ``<name>_reward.png`` (training score, strict accuracy, format rate and
held-out accuracy per step), ``<name>_length.png`` (response length and its clip ratio), ``<name>_kl_entropy.png``
and ``<name>_timing.png`` (step time by stage, stacked, for the first run). When a run trained a PRIME PRM, also writes ``<name>_prm.png``
(PRM accuracy on the verified label, PRM cross-entropy, share of groups inside the accuracy band). When a run had
multi-turn tool rollouts, also writes ``<name>_tools.png`` (tool calls per sample, tool-error rate, turns per sample
of the runs with tools; held-out accuracy of every run, so a run without tools sits beside). Returns the written paths.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterable

STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "testing",
          "save_checkpoint")


def load_metrics(path: str) -> list[dict]:
    """Rows of a run's metrics.jsonl (``path`` is the run folder or the file); a last line cut short (a run stopped
    while writing it) is left out. Raises FileNotFoundError, or ValueError naming a line that is not JSON."""
    f = path if path.endswith(".jsonl") else os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(f):
        raise FileNotFoundError(f"no metrics.jsonl at {f!r}")
    with open(f, encoding="utf-8") as fh:
        lines = [(n, line) for n, line in enumerate(fh, 1) if line.strip()]
    rows = []
    for i, (n, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:  # the last line of a run stopped while writing it
                print(f"warning: {f}, line {n}: cut short, left out", file=sys.stderr)
                continue
            raise ValueError(f"{f}, line {n}: not valid JSON ({exc.msg})") from exc
    return rows


def series(rows: Iterable[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` over the rows that have a numeric value for it."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def _label(path: str) -> str:
    if path.endswith(".jsonl"):
        return os.path.basename(path)[: -len(".jsonl")]
    return os.path.basename(os.path.normpath(path))


def ratio_series(rows: Iterable[dict], num: str, den: str) -> tuple[list[int], list[float]]:
    """(steps, ``num / den``) over the rows where both are numbers and ``den > 0`` (e.g. the tool-error rate
    ``multi_turn/tool_errors / multi_turn/tool_calls_total``)."""
    rows = list(rows)
    top, bottom = dict(zip(*series(rows, num))), dict(zip(*series(rows, den)))
    steps = [s for s in top if bottom.get(s, 0) > 0]
    return steps, [top[s] / bottom[s] for s in steps]


def _val_acc_keys(rows: list[dict]) -> list[str]:
    return sorted({k for r in rows for k in r if k.startswith("val/") and k.endswith("/acc")})


def _tools_figure(plt, runs: list[tuple[str, list[dict]]]):
    """The multi-turn figure: tool calls, tool-error rate and turns per sample (runs with ``multi_turn/*``), and
    held-out accuracy (every run, greedy dashed). None when no run has multi-turn metrics."""
    tool_runs = {label for label, rows in runs if any("multi_turn/tool_calls/mean" in r for r in rows)}
    if not tool_runs:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    for i, (label, rows) in enumerate(runs):
        if label in tool_runs:
            axes[0].plot(*series(rows, "multi_turn/tool_calls/mean"), color=f"C{i % 10}", label=label)
            axes[1].plot(*ratio_series(rows, "multi_turn/tool_errors", "multi_turn/tool_calls_total"),
                         color=f"C{i % 10}", label=label)
            axes[2].plot(*series(rows, "multi_turn/num_turns/mean"), color=f"C{i % 10}", label=label)
        for key in _val_acc_keys(rows):
            parts = key.split("/")
            axes[3].plot(*series(rows, key), "o--" if "greedy" in parts else "o-", color=f"C{i % 10}",
                         label=f"{label} {'/'.join(parts[1:-1])}")
    return fig, axes


def plot(run_dirs: list[str], out_dir: str, name: str = "run") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(_label(p), load_metrics(p)) for p in run_dirs]
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def save(fig, suffix, axes=(), titles=()):
        """Title, grid and legend (when something is labelled) on each axis, then write the PNG."""
        for ax, title in zip(axes, titles):
            ax.set(title=title, xlabel="step")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        path = os.path.join(out_dir, f"{name}_{suffix}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    # held-out accuracy and format rate on separate axes (format climbs to 1, accuracy stays small); a greedy
    # pass (trainer.val_also_greedy: val/<source>/greedy/<metric>) is dashed beside the sampled one
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for i, (label, rows) in enumerate(runs):
        # the score over every generated row (reward/score/mean); critic/score/mean is over the trained batch,
        # which dynamic sampling (algorithm.filter_groups) filters, so it is only the fallback for older runs
        score = "reward/score/mean" if series(rows, "reward/score/mean")[0] else "critic/score/mean"
        for key, style in ((score, "-"), ("reward/acc/mean", "--"), ("reward/format/mean", ":")):
            x, y = series(rows, key)
            if x:
                axes[0].plot(x, y, style, label=f"{label} {'score' if key == score else key.split('/')[1]}")
        val_keys = sorted({k for r in rows for k in r if k.startswith("val/") and k.split("/")[-1] in ("acc", "format")})
        for key in val_keys:
            x, y = series(rows, key)
            parts = key.split("/")
            ax = axes[1] if parts[-1] == "acc" else axes[2]
            ax.plot(x, y, "o--" if "greedy" in parts else "o-", color=f"C{i % 10}",
                    label=f"{label} {'/'.join(parts[1:-1])}")
    save(fig, "reward", axes, ("training reward (score), strict accuracy, format", "held-out strict accuracy",
                               "held-out format rate"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in runs:
        axes[0].plot(*series(rows, "response_length/mean"), label=label)
        axes[1].plot(*series(rows, "response_length/clip_ratio"), label=label)
    save(fig, "length", axes, ("response length (tokens)", "response clip ratio (hit max length)"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in runs:
        for key in ("actor/kl_loss", "actor/reward_kl_penalty"):
            x, y = series(rows, key)
            if x:
                axes[0].plot(x, y, label=f"{label} {key}")
        axes[1].plot(*series(rows, "actor/entropy"), label=label)
    save(fig, "kl_entropy", axes, ("KL to the reference", "entropy of the policy (nats/token)"))

    prm_runs = [(label, rows) for label, rows in runs if any("reward_model/ce_loss" in r for r in rows)]
    if prm_runs:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for label, rows in prm_runs:
            for ax, key in zip(axes, ("reward_model/dpo_acc_abs", "reward_model/ce_loss", "prime/pass_ratio")):
                ax.plot(*series(rows, key), label=label)
        save(fig, "prm", axes, ("PRM accuracy on the verified label", "PRM cross-entropy (nats)",
                                "groups inside the accuracy band"))

    tools = _tools_figure(plt, runs)
    if tools:
        save(tools[0], "tools", tools[1], ("tool calls per sample", "tool-error rate (errors / calls)",
                      "turns per sample (model + tool + 1)", "held-out strict accuracy"))

    label, rows = runs[0]
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [int(r["step"]) for r in rows if "timing_s/step" in r]
    bottom = [0.0] * len(steps)
    for stage in STAGES:
        vals = [float(r.get(f"timing_s/{stage}", 0.0)) for r in rows if "timing_s/step" in r]
        if any(vals):
            ax.bar(steps, vals, bottom=bottom, label=stage)
            bottom = [b + v for b, v in zip(bottom, vals)]
    save(fig, "timing", [ax], [f"step time by stage (s): {label}"])
    return written


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", default="plots")
    p.add_argument("--name", default="run")
    a = p.parse_args(argv)
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        p.error(f"--out {a.out!r} is a file; expected a folder (new or existing)")
    try:
        paths = plot(a.runs, a.out, a.name)
    except (FileNotFoundError, ValueError) as exc:  # a run folder without metrics.jsonl, or unreadable metrics
        p.error(str(exc))
    for path in paths:
        print(path)


if __name__ == "__main__":
    sys.exit(main())
