"""Curves, the table, the targets and the plot of ``tools/bench/learn_vs_trl.py``.

A run (one side, one seed) gives checkpoints at wall-clock marks (seconds since its process started); the evaluator
scores each on the held-out set (``svamp``) and the base model once (time 0, shared by every run). The value of a
run at mark ``t`` is its checkpoint with the largest mark <= ``t`` (a checkpoint is saved at the first step end at or
after its mark, so its real time, ``elapsed_s``, can be later); a run with none yet is at the base model. A run
with its own ``budget_s`` (runs of files of different budgets, :mod:`tools.bench.learn_merge`) has no value after it.

Per mark and side: the mean over seeds and the spread (half the range over seeds; 0 with one seed).
Targets (:func:`targets`):

- **at every mark** ours' mean strict accuracy >= TRL's mean - the larger of the two spreads;
- **half the time**: the first mark where ours' mean reaches TRL's best mean (over the marks) is at most half the
  first mark where TRL reaches it; not measured (None) when ours' last mark with a value is before half that time
  and ours has not reached it.

Beside them, the one-answer baseline (the accuracy of giving every held-out question its most common true answer,
``eval.sets``) as a line in the table's notes and the plot, and, where the evaluator recorded them, each side's most
common answer and its share per mark (:func:`answer_rows`): an accuracy at or below the baseline with one answer
given to nearly every question is a policy that learned that answer, not how to solve the problems.
"""
from __future__ import annotations

import math

from tools.bench.learn_signal import signal_lines

__all__ = ["SIDES", "ckpt_id", "run_budget", "within_budget", "run_values", "mark_table", "targets",
           "constant_baseline_of", "answer_rows", "gsm8k_rows", "markdown", "plot"]

SET = "svamp"
SIDES = ("trl", "ours")  # the two sides, in the order they run and are reported


def ckpt_id(side: str, seed: int, mark_s: float) -> str:
    """The evaluator's name of a checkpoint: ``<side>_s<seed>_t<mark, 6 digits>``."""
    return f"{side}_s{seed}_t{int(round(mark_s)):06d}"


def run_values(run: dict, results: dict, marks: list[float], name: str = SET) -> dict[float, dict | None]:
    """``{mark: evaluator result of the run's state at that mark}`` (module docstring); a mark whose checkpoint
    was not scored, or after the run's own ``budget_s`` (set by :mod:`tools.bench.learn_merge` for runs of files
    of different budgets), gives None. ``results``: the evaluator's ``results`` ({checkpoint id: {set: result}})."""
    out = {}
    exports = sorted(run.get("exports") or [], key=lambda e: e["mark_s"])
    for t in marks:
        if t > run.get("budget_s", math.inf) + 1e-9:
            out[t] = None
            continue
        upto = [e for e in exports if e["mark_s"] <= t]
        key = ckpt_id(run["side"], run["seed"], upto[-1]["mark_s"]) if upto else "base"
        out[t] = (results.get(key) or {}).get(name)
    return out


def run_budget(run: dict, doc: dict) -> float:
    """The run's own budget (seconds): its ``budget_s`` (runs of files of different budgets), else the job's."""
    return float(run.get("budget_s", (doc.get("job") or {}).get("budget_s", math.inf)))


def within_budget(doc: dict) -> dict:
    """``doc`` with each run's saves and training signal cut at its own budget (:func:`run_budget`): a save after
    it (a run that saved once more before it was stopped) counts in no table, target, plot or GSM8K row."""
    runs = []
    for r in doc.get("runs", []):
        end = run_budget(r, doc) + 1e-9
        cut = {k: [e for e in r[k] if e["mark_s"] <= end] for k in ("exports", "signal") if r.get(k) is not None}
        runs.append(dict(r, **cut))
    return dict(doc, runs=runs)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _stats(values: list[float]) -> dict:
    if not values:
        return dict(mean=None, spread=None, values=[])
    return dict(mean=sum(values) / len(values), spread=(max(values) - min(values)) / 2, values=values)


def mark_table(doc: dict, name: str = SET) -> list[dict]:
    """One row per mark (0 = the base model, then every mark of the job): per side ``acc`` and ``format`` stats
    over the seeds whose value exists, none at a mark after the budget of one of that side's runs (runs of
    different budgets: no mean over a changing set of seeds), and ``ok`` (ours' mean >= TRL's - the larger spread;
    None when a side has no value)."""
    results = (doc.get("eval") or {}).get("results") or {}
    marks = [float(m) for m in doc["job"]["marks_s"]]
    runs = [r for r in doc.get("runs", []) if not r.get("error") or r.get("exports")]
    vals = {id(r): run_values(r, results, marks, name) for r in runs}
    base = (results.get("base") or {}).get(name)
    rows = []
    for t in [0.0] + marks:
        row = dict(mark_s=t)
        for side in SIDES:
            mine = [r for r in runs if r["side"] == side]
            short = any(t > run_budget(r, doc) + 1e-9 for r in mine)  # a mean over fewer seeds is no mean
            got = [base] * (base is not None) if t == 0 else [] if short else \
                [vals[id(r)][t] for r in mine if vals[id(r)][t] is not None]
            row[side] = {k: _stats([g[k] for g in got if _finite(g.get(k))]) for k in ("acc", "format")}
        a, b = row["ours"]["acc"], row["trl"]["acc"]
        row["ok"] = None if a["mean"] is None or b["mean"] is None else \
            a["mean"] >= b["mean"] - max(a["spread"], b["spread"]) - 1e-12
        rows.append(row)
    return rows


def targets(rows: list[dict]) -> dict:
    """The two targets of the module docstring from :func:`mark_table` rows (marks > 0 only)."""
    later = [r for r in rows if r["mark_s"] > 0]
    checked = [r for r in later if r["ok"] is not None]
    out = dict(every_mark=bool(checked) and all(r["ok"] for r in checked), marks_checked=len(checked),
               marks_failed=[r["mark_s"] for r in checked if not r["ok"]])
    trl = [(r["mark_s"], r["trl"]["acc"]["mean"]) for r in later if r["trl"]["acc"]["mean"] is not None]
    ours = [(r["mark_s"], r["ours"]["acc"]["mean"]) for r in later if r["ours"]["acc"]["mean"] is not None]
    if not trl or not ours:
        return dict(out, half_time=None)
    best = max(a for _, a in trl)
    t_trl = min(t for t, a in trl if a == best)
    reach = [t for t, a in ours if a >= best - 1e-12]
    t_ours = min(reach) if reach else None
    best_ours = max(a for _, a in ours)
    unmeasured = t_ours is None and max(t for t, _ in ours) < t_trl / 2  # ours' runs stopped before half the time
    return dict(out, trl_best_acc=best, trl_best_mark_s=t_trl, ours_reaches_trl_best_at_s=t_ours,
                ours_best_acc=best_ours, ours_best_mark_s=min(t for t, a in ours if a == best_ours),
                half_time=None if unmeasured else t_ours is not None and t_ours <= t_trl / 2)


def constant_baseline_of(doc: dict, name: str = SET) -> dict | None:
    """The evaluator's one-answer baseline of set ``name`` (``{"n", "answer", "acc"}``), or None."""
    return (((doc.get("eval") or {}).get("sets") or {}).get(name)) or None


def answer_rows(doc: dict, name: str = SET) -> list[dict]:
    """Per mark (> 0): ``{"mark_s", "trl": [...], "ours": [...]}``, each list one ``(seed, top_answer,
    top_answer_share, acc_beyond_top)`` per run of that side, all but the seed None where the run's state at the
    mark has no such result (a file of an older evaluator, a checkpoint not scored); [] when no result holds them."""
    results = (doc.get("eval") or {}).get("results") or {}
    if not any("top_answer_share" in (r.get(name) or {}) for r in results.values()):
        return []
    marks = [float(m) for m in doc["job"]["marks_s"]]
    runs = [r for r in doc.get("runs", []) if r.get("exports")]
    vals = [(r, run_values(r, results, marks, name)) for r in runs]
    pick = (lambda v: (v.get("top_answer"), v["top_answer_share"], v.get("acc_beyond_top"))
            if v and "top_answer_share" in v else (None, None, None))
    return [{"mark_s": t, **{side: [(r["seed"], *pick(v[t])) for r, v in vals if r["side"] == side]
                             for side in SIDES}} for t in marks]


def gsm8k_rows(doc: dict) -> list[dict]:
    """GSM8K (strict) of the base model and of each run's last checkpoint: ``{"model", "acc", "format", "n"}``."""
    results = (doc.get("eval") or {}).get("results") or {}
    out = []
    if (results.get("base") or {}).get("gsm8k"):
        out.append(dict(model="base", **_pick(results["base"]["gsm8k"])))
    for r in doc.get("runs", []):
        if r.get("exports"):
            last = max(r["exports"], key=lambda e: e["mark_s"])
            res = (results.get(ckpt_id(r["side"], r["seed"], last["mark_s"])) or {}).get("gsm8k")
            if res:
                out.append(dict(model=f"{r['side']} seed {r['seed']}, {_min(last['mark_s'])} min "
                                      f"(step {last['global_step']})", **_pick(res)))
    return out


def _pick(res: dict) -> dict:
    return {k: res.get(k) for k in ("acc", "format", "n")}


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.2f}"


def _min(seconds: float) -> str:
    return f"{seconds / 60:.2f}".rstrip("0").rstrip(".")


def _cell(stats: dict) -> str:
    if stats["mean"] is None:
        return "-"
    vals = "/".join(_pct(v) for v in stats["values"])
    return f"{_pct(stats['mean'])} ({vals})" if len(stats["values"]) > 1 else _pct(stats["mean"])


def markdown(doc: dict) -> str:
    """The held-out table per mark, the targets, the runs, their training signal between marks
    (:func:`tools.bench.learn_signal.signal_lines`) and the GSM8K before/after table."""
    rows, job = mark_table(doc), doc["job"]
    lines = [f"Held-out SVAMP ({job.get('test_rows', '?')} rows), greedy, strict accuracy and format compliance (%); "
             "mean over seeds (each seed's value):", "",
             "| minutes | TRL acc | ours acc | TRL format | ours format | ours >= TRL - spread |", "|---|---|---|---|---|---|"]
    for r in rows:
        ok = "-" if r["ok"] is None else ("yes" if r["ok"] else "**no**")
        lines.append(f"| {_min(r['mark_s'])} | {_cell(r['trl']['acc'])} | {_cell(r['ours']['acc'])} | "
                     f"{_cell(r['trl']['format'])} | {_cell(r['ours']['format'])} | {ok} |")
    tg = targets(rows)
    verdict = "not checked (no mark has both sides)" if not tg["marks_checked"] else \
        f"**{'met' if tg['every_mark'] else 'not met'}** ({tg['marks_checked']} marks checked; failed at " \
        f"{tg['marks_failed'] or 'none'} s)"
    lines += ["", f"- At every mark ours >= TRL - spread: {verdict}"]
    if tg.get("half_time") is None and tg.get("trl_best_acc") is not None:
        lines.append(f"- TRL's best mean accuracy {_pct(tg['trl_best_acc'])}% first at {_min(tg['trl_best_mark_s'])} "
                     "min; ours' runs stopped before half that time without reaching it: half-time target not measured")
    if tg.get("half_time") is not None:
        at = tg["ours_reaches_trl_best_at_s"]
        when = "never" if at is None else f"at {_min(at)} min"
        lines.append(f"- TRL's best mean accuracy {_pct(tg['trl_best_acc'])}% first at {_min(tg['trl_best_mark_s'])} "
                     f"min; ours reaches it {when}: half-time target "
                     f"**{'met' if tg['half_time'] else 'not met'}** (ours' best {_pct(tg['ours_best_acc'])}% at "
                     f"{_min(tg['ours_best_mark_s'])} min)")
    lines += _baseline_lines(doc, tg)
    lines += ["", "| run | steps | first save (s) | saves | stopped | process wall (s) |", "|---|---|---|---|---|---|"]
    for r in doc.get("runs", []):
        ex = sorted(r.get("exports") or [], key=lambda e: e["mark_s"])
        first = f"{ex[0]['elapsed_s']:.0f}" if ex else "-"
        lines.append(f"| {r['side']} seed {r['seed']} | {ex[-1]['global_step'] if ex else '-'} | {first} | "
                     f"{len(ex)} | {r.get('error') or r.get('stop', '-')} | {r.get('wall_s', 0):.0f} |")
    lines += signal_lines(doc)
    g = gsm8k_rows(doc)
    if g:
        lines += ["", "GSM8K test, greedy, strict (%):", "", "| model | acc | format | rows |", "|---|---|---|---|"]
        lines += [f"| {x['model']} | {_pct(x['acc'])} | {_pct(x['format'])} | {x['n']} |" for x in g]
    return "\n".join(lines + _sources(doc)) + "\n"


def _baseline_lines(doc: dict, tg: dict) -> list[str]:
    """The one-answer baseline's note and the most-common-answer table (module docstring); [] without either."""
    lines = []
    cb = constant_baseline_of(doc)
    if cb and cb.get("answer") is not None:
        lines.append(f"- One answer for every held-out question (\"{cb['answer']}\", the most common true answer) "
                     f"scores {_pct(cb['acc'])}%: a checkpoint at or below that may have learned only that answer.")
        best = [tg.get(k) for k in ("trl_best_acc", "ours_best_acc") if tg.get(k) is not None]
        if best and max(best) <= cb["acc"] + 1e-12:
            lines.append("- Neither side's best mean accuracy is above it: the comparison shows how fast each side "
                         "reaches the reward of that answer, not problem solving.")
    rows = answer_rows(doc)
    if rows:
        lines += ["", "Per seed: the most common held-out answer (its share of the answers, %; the accuracy on the "
                  "questions whose true answer is another, %):", "", "| minutes | TRL | ours |", "|---|---|---|"]
        cell = (lambda xs: " / ".join(f"s{seed}: " + ("-" if sh is None else f"{a or 'none'} ({_pct(sh)}; {_pct(b)})")
                                      for seed, a, sh, b in xs) or "-")
        lines += [f"| {_min(r['mark_s'])} | {cell(r['trl'])} | {cell(r['ours'])} |" for r in rows]
    return lines


def _sources(doc: dict) -> list[str]:
    """Markdown lines on the files a combined document came from (``meta_by_file``, ``eval.by_file``, each run's
    ``file``; :mod:`tools.bench.learn_merge`) and on base scores that differ between them; none for one file. The
    command column holds each run's ``invocation`` (the tool call that trained it) where the file records one, else
    the file's own command (a file written before runs recorded it shows its first tool call's)."""
    files = doc.get("meta_by_file")
    if not files:
        return []
    ev = doc.get("eval") or {}
    first = next(iter(files))
    lines = ["", f"Combined from {len(files)} evaluated files (the base model at 0 min is {first}'s):", "",
             "| file | runs | date | device | evaluator | command |", "|---|---|---|---|---|---|"]
    for path, meta in files.items():
        meta, held = meta or {}, [r for r in doc.get("runs", []) if r.get("file") == path]
        runs = [f"{r['side']} seed {r['seed']}" for r in held]
        engine = ((ev.get("by_file") or {}).get(path) or {}).get("engine")
        commands = list(dict.fromkeys(r.get("invocation") or meta.get("command", "-") for r in held)) or ["-"]
        lines.append(f"| {path} | {', '.join(runs) or '-'} | {meta.get('date', '-')} | {meta.get('device', '-')} | "
                     f"{engine or '-'} | {'<br>'.join(f'`{c}`' for c in commands)} |")
    for name, sp in (ev.get("base_spread") or {}).items():
        seen = ", ".join(f"{_pct(a)} ({p})" for a, p in zip(sp["acc"], sp["files"]))
        lines += ["", f"- The base model's {name} accuracy differs between the files' sessions: {seen}; the table "
                      f"uses {sp['files'][0]}'s."]
    return lines


def plot(doc: dict, path: str) -> str | None:
    """PNG at ``path``: held-out strict accuracy (left) and format compliance (right) against wall-clock minutes
    (each checkpoint at its real time; the base model at 0), one line per run. Returns ``path``, or None when
    matplotlib is absent or nothing was scored."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    results = (doc.get("eval") or {}).get("results") or {}
    base = (results.get("base") or {}).get(SET)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    drawn = 0
    styles = {"trl": "tab:orange", "ours": "tab:blue"}
    dashes = ("-", "--", ":", "-.")
    for r in doc.get("runs", []):
        pts = [(0.0, base)] if base else []
        for e in sorted(r.get("exports") or [], key=lambda e: e["mark_s"]):
            res = (results.get(ckpt_id(r["side"], r["seed"], e["mark_s"])) or {}).get(SET)
            if res:
                pts.append((e["elapsed_s"] / 60, res))
        if not pts:
            continue
        drawn += 1
        for ax, key in zip(axes, ("acc", "format")):
            ax.plot([p[0] for p in pts], [100 * p[1][key] for p in pts], marker="o", color=styles.get(r["side"]),
                    linestyle=dashes[sorted(doc["job"]["seeds"]).index(r["seed"]) % len(dashes)]
                    if r["seed"] in doc["job"]["seeds"] else "-",
                    label=f"{'TRL' if r['side'] == 'trl' else 'ours'} seed {r['seed']}")
    if not drawn:
        plt.close(fig)
        return None
    for ax, title in zip(axes, ("held-out strict accuracy (%)", "format compliance (%)")):
        ax.set_xlabel("wall-clock minutes since process start")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    cb = constant_baseline_of(doc)
    if cb and cb.get("answer") is not None:
        axes[0].axhline(100 * cb["acc"], color="gray", linestyle=":",
                        label=f"one answer (\"{cb['answer']}\") for all")
    axes[0].legend(fontsize=8)
    job = doc["job"]
    budgets = sorted({run_budget(r, doc) for r in doc.get("runs", [])} or {job["budget_s"]})
    fig.suptitle(f"GRPO on SVAMP: {job['batch']} prompts x {job['n']}, lr {job['lr']:g}, {job['response_len']} tokens, "
                 f"budget {' / '.join(_min(b) for b in budgets)} min", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
