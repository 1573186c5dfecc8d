"""Per-side summaries, ratios, the markdown table and the step-split plot of ``tools/bench/vs_trl.py``.

A side's run gives one record per optimizer step: ``step_s`` (wall seconds), ``gen_tokens`` (response tokens
generated, EOS included), ``prompt_tokens`` (prompt tokens of the same rows), ``rows`` and ``split_s`` (stage ->
seconds). :func:`summarize` averages the timed steps (step 1, which holds compilation and warm-up, is left out
when there is more than one step, and so are steps run under the profiler):

- samples/s = ``batch * n`` / mean step seconds;
- generated tokens/s = mean generated tokens per step / mean step seconds;
- trained tokens/s = mean (prompt + generated) tokens per step / mean step seconds (the tokens the actor's
  forward and backward run over, once per step here: one PPO epoch);
- ``split_s``: mean seconds per stage, and ``other`` = mean step seconds - the stages' sum; ``step_splits``: every
  step's own split (step 1 included);
- ``detail_s`` (ours): means of seconds that are not stages (the engine's generate call, each stage's time inside
  the worker); ``counters_per_step``: compilations / CUDA-graph recordings during each step's generation and
  whether a separate old-log-prob pass ran; ``device_used_gib``: GPU memory in use at each rollout state (max);
- ``update_mfu``: ``trainer.metric_utils.compute_mfu`` of the ``update`` stage over the step's trained tokens,
  each row taken at the mean row length (prompt + response), against ``peak_flops`` (989e12: H100/H200 dense
  bf16); the attention term uses the mean length, so it is approximate. ``trainer_mfu`` (ours): the mean of the
  trainer's own ``perf/mfu/actor`` over the timed steps (:mod:`trainer.workers.update_mfu`: the worker's update
  time, every row's own length), shown beside it in the table's "update MFU" cell.
"""
from __future__ import annotations

import math
import os
import re

__all__ = ["STAGES", "ours_steps", "summarize", "update_mfu", "ratios", "markdown", "plot_split"]

# stage order of the table and the plot (a side lacking one shows "-")
STAGES = ("gen", "weight_sync", "wake_up", "sleep", "old_log_prob", "ref", "reward", "adv", "update")
# trainer/ppo_trainer.py timer -> bench stage; other timers keep their names
_OURS_STAGE = {"update_actor": "update"}
_OURS_NOT_STAGES = {"step", "testing", "save_checkpoint", "export_hf"}
# the colocated engine's perf/rollout_s/<state> (rollout.context.rollout_mode: the seconds that ended in <state>),
# carved out of the trainer's "gen" timer
_ROLLOUT_STAGE = {"before_wake": "wake_up", "weights_awake": "wake_up", "kv_awake": "wake_up",
                  "weights_synced": "weight_sync", "asleep": "sleep"}
# per-step keys that are not stages (not stacked in the split): metric -> detail name
_OURS_DETAIL = {"perf/rollout_s/generated": "gen_engine", "perf/worker_s/gen": "worker_gen",
                "perf/worker_s/old_log_prob": "worker_old_log_prob", "perf/worker_s/ref": "worker_ref",
                "perf/worker_s/update_actor": "worker_update"}
_OURS_COUNTERS = ("perf/rollout/dynamo_graphs", "perf/rollout/cudagraph_records", "perf/old_log_prob_pass")
_DEVICE_USED = re.compile(r"^perf/(?:hf|vllm)_(.+)_gib$")


def _ours_split(m: dict) -> dict[str, float]:
    """Stage seconds of one metrics line: the ``timing_s/<timer>`` keys, with the engine's wake-up, weight sync
    and sleep (``perf/rollout_s/*``) taken out of ``gen`` (so ``gen`` is generation and the rows around it)."""
    split = {_OURS_STAGE.get(k[9:], k[9:]): float(v) for k, v in m.items()
             if k.startswith("timing_s/") and k[9:] not in _OURS_NOT_STAGES}
    carved: dict[str, float] = {}
    for k, stage in _ROLLOUT_STAGE.items():
        if f"perf/rollout_s/{k}" in m:
            carved[stage] = carved.get(stage, 0.0) + float(m[f"perf/rollout_s/{k}"])
    if carved and "gen" in split:
        split["gen"] -= sum(carved.values())
        split.update(carved)
    return split


def _ours_detail(m: dict) -> dict[str, float]:
    """The seconds inside the stages of one metrics line (:data:`_OURS_DETAIL`), and ``gen_engine_per_decode_step``:
    the engine's generate call over the longest response's tokens (``response_length/max``: the decoding steps of
    a static-cache call, which decodes every row until the longest stops)."""
    out = {name: float(m[k]) for k, name in _OURS_DETAIL.items() if k in m}
    if "gen_engine" in out and m.get("response_length/max"):
        out["gen_engine_per_decode_step"] = out["gen_engine"] / float(m["response_length/max"])
    return out


def ours_steps(metrics: list[dict], rows: int) -> list[dict]:
    """Step records from this project's ``metrics.jsonl`` lines (those with ``timing_s/step``).

    ``gen_tokens`` = ``response_length/mean * rows``, ``prompt_tokens`` = ``prompt_length/mean * rows``;
    ``split_s`` from the ``timing_s/<timer>`` keys (``update_actor`` -> ``update``; ``step``, ``testing``,
    ``save_checkpoint`` and ``export_hf`` are not stages), with ``weight_sync``, ``wake_up`` (optimizer offload,
    cache release, waking weights and KV cache) and ``sleep`` taken out of ``gen`` from the colocated engine's
    ``perf/rollout_s/*`` keys when the run logs them. ``detail_s``: seconds that are not stages (not summed):
    ``gen_engine`` (the engine's generate call alone), ``gen_engine_per_decode_step`` (:func:`_ours_detail`) and
    ``worker_<stage>`` (the stage's time inside the worker, so that the trainer's timer minus it is the Ray call and
    the batch transfer). ``counters``: the step's
    ``perf/rollout/dynamo_graphs`` / ``cudagraph_records`` (compilations and CUDA-graph recordings during its
    generation) and ``perf/old_log_prob_pass`` (1: a separate old-log-prob pass ran). ``device_used_gib``: the
    engine's ``perf/<engine>_<state>_gib`` (GPU memory in use at each state of the rollout). ``profiled``: the step
    ran under ``torch.profiler`` (``DSRL_PROFILE_STEPS``, :mod:`trainer.workers.profiling`; slower, left out of the
    means by :func:`summarize`), ``profile_s`` its ``perf/profile/<stage>_{wall,device}_s``.
    ``peak_torch_allocated_gib`` / ``_reserved_gib``: the largest ``perf/max_memory_{allocated,reserved}_gb/<stage>``
    of the step (None when absent, e.g. on CPU)."""
    out = []
    for m in metrics:
        if "timing_s/step" not in m:
            continue
        mem = {kind: [v for k, v in m.items() if k.startswith(f"perf/max_memory_{kind}_gb/")]
               for kind in ("allocated", "reserved")}
        out.append(dict(step_s=float(m["timing_s/step"]), rows=rows,
                        gen_tokens=float(m.get("response_length/mean", float("nan"))) * rows,
                        prompt_tokens=float(m.get("prompt_length/mean", float("nan"))) * rows, split_s=_ours_split(m),
                        detail_s=_ours_detail(m),
                        counters={k.rpartition("/")[2]: float(m[k]) for k in _OURS_COUNTERS if k in m},
                        device_used_gib={_DEVICE_USED.match(k).group(1): float(v) for k, v in m.items()
                                         if _DEVICE_USED.match(k)},
                        reward=m.get("critic/score/mean"), profiled=bool(m.get("perf/profiled")),
                        trainer_mfu=m.get("perf/mfu/actor"),
                        profile_s={k[13:]: float(v) for k, v in m.items() if k.startswith("perf/profile/")},
                        peak_torch_allocated_gib=max(mem["allocated"], default=None),
                        peak_torch_reserved_gib=max(mem["reserved"], default=None)))
    return out


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(side: str, steps: list[dict], samples_per_step: int, wall: float) -> dict:
    """The side's row (see the module docstring). Raises ValueError when ``steps`` is empty."""
    if not steps:
        raise ValueError(f"{side}: no step records (did the run train any step?)")
    used = steps[1:] if len(steps) > 1 else steps
    used = [s for s in used if not s.get("profiled")] or used  # profiled steps are slower (the profiler's cost)
    mean = _mean(s["step_s"] for s in used)
    gen = _mean(s["gen_tokens"] for s in used)
    trained = gen + _mean(s["prompt_tokens"] for s in used)
    rows = _mean(s["rows"] for s in used)
    names = list(STAGES) + sorted({k for s in used for k in s["split_s"]} - set(STAGES))
    split = {k: _mean(s["split_s"].get(k, 0.0) for s in used) for k in names
             if any(k in s["split_s"] for s in used)}
    split["other"] = mean - sum(split.values())
    row = dict(side=side, steps=len(steps), timed_steps=len(used), mean_step_s=mean, rows_per_step=rows,
               samples_per_s=samples_per_step / mean, gen_tokens_per_step=gen, gen_tokens_per_s=gen / mean,
               trained_tokens_per_step=trained, trained_tokens_per_s=trained / mean,
               response_len_mean=gen / rows if rows else float("nan"), split_s=split,
               first_step_s=steps[0]["step_s"], process_wall_s=wall, step_seconds=[s["step_s"] for s in steps],
               step_splits=[s["split_s"] for s in steps])
    mfus = [s["trainer_mfu"] for s in used if s.get("trainer_mfu") is not None]
    if mfus:  # the trainer's own perf/mfu/actor (exact row lengths, the worker's update time)
        row["trainer_mfu"] = _mean(mfus)
    detail = sorted({k for s in used for k in s.get("detail_s", {})})
    if detail:  # means over the timed steps of the steps that logged them
        row["detail_s"] = {k: _mean(s["detail_s"][k] for s in used if k in s.get("detail_s", {})) for k in detail}
    if any(s.get("counters") for s in steps):
        row["counters_per_step"] = [s.get("counters", {}) for s in steps]
    profiles = {str(i + 1): s["profile_s"] for i, s in enumerate(steps) if s.get("profile_s")}
    if profiles:  # step number -> {stage_wall_s, stage_device_s}
        row["profile_s"] = profiles
    states = sorted({k for s in steps for k in s.get("device_used_gib", {})})
    if states:  # the largest over every step
        row["device_used_gib"] = {k: max(s["device_used_gib"][k] for s in steps if k in s.get("device_used_gib", {}))
                                  for k in states}
    return row


def update_mfu(hf_config, row: dict, peak_flops: float = 989e12) -> float | None:
    """MFU of the row's ``update`` stage (module docstring); None without an update time or tokens."""
    from trainer.metric_utils import compute_mfu

    t, tokens, n_rows = row["split_s"].get("update"), row.get("trained_tokens_per_step"), row.get("rows_per_step")
    if not t or t <= 0 or not tokens or not n_rows or not math.isfinite(tokens):
        return None
    length = tokens / n_rows
    return compute_mfu(hf_config, int(tokens), [length] * int(n_rows), t, 1, peak_flops)


def ratios(rows: list[dict]) -> dict[str, float]:
    """``"<ours side>/<trl side>"`` -> ratio of samples/s, for every pair of sides that ran."""
    ok = [r for r in rows if r.get("samples_per_s") is not None and not r.get("error")]
    return {f"{o['side']}/{t['side']}": o["samples_per_s"] / t["samples_per_s"]
            for o in ok if o["framework"] == "ours" for t in ok if t["framework"] == "trl"}


def _f(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _stage_columns(rows: list[dict]) -> list[str]:
    """Stages present in any row: :data:`STAGES` order, then other timers by name, then ``other``."""
    seen = {k for r in rows for k in r.get("split_s", {})}
    return [s for s in STAGES if s in seen] + sorted(seen - set(STAGES) - {"other"}) + ["other"] * ("other" in seen)


def markdown(doc: dict) -> str:
    """Two markdown tables (throughput and memory; mean step split in seconds) and the ratios of ``doc``."""
    rows = doc["results"]
    head = ("| side | engine | timed steps | step (s) | samples/s | generated tokens/step | generated tokens/s | "
            "trained tokens/s | peak GPU used (GiB) | peak torch allocated (GiB) | update MFU |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['side']} | {r.get('engine', '-')} | failed: {r['error'][:80]} |")
            continue
        mfu, inner = r.get("update_mfu"), r.get("trainer_mfu")
        mfu_cell = "-" if mfu is None else f"{100 * mfu:.1f}%"
        mfu_cell += "" if inner is None else f" (trainer {100 * inner:.1f}%)"
        lines.append("| " + " | ".join([r["side"], r["engine"], str(r["timed_steps"]), _f(r["mean_step_s"]),
                                         _f(r["samples_per_s"]), _f(r["gen_tokens_per_step"]),
                                         _f(r["gen_tokens_per_s"]), _f(r["trained_tokens_per_s"]),
                                         _f(r.get("peak_gpu_used_gib")), _f(r.get("peak_torch_allocated_gib")),
                                         mfu_cell]) + " |")
    cols = _stage_columns([r for r in rows if not r.get("error")])
    lines += ["", "| side | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for r in rows:
        if not r.get("error"):
            lines.append(f"| {r['side']} | " + " | ".join(_f(r["split_s"].get(c), 3) for c in cols) + " |")
    detail = [r for r in rows if not r.get("error") and r.get("detail_s")]
    if detail:  # seconds inside the stages (not part of the split's sum)
        keys = sorted({k for r in detail for k in r["detail_s"]})
        lines += ["", "| side (inside the stages, s) | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        lines += [f"| {r['side']} | " + " | ".join(_f(r["detail_s"].get(k), 3) for k in keys) + " |" for r in detail]
    for k, v in doc.get("ratios", {}).items():
        lines.append(f"\n{k} samples/s: **{v:.2f}x**")
    return "\n".join(lines) + "\n"


def plot_split(doc: dict, path: str) -> str | None:
    """A PNG at ``path``: one stacked horizontal bar per side, the mean step seconds split by stage. Returns
    ``path``, or None when matplotlib is absent or no side has a split."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in doc["results"] if not r.get("error") and r.get("split_s")]
    if not rows:
        return None
    names = _stage_columns(rows)
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.55 * len(rows)))
    cmap = plt.get_cmap("tab20")
    order = list(STAGES) + ["other"]
    for i, stage in enumerate(names):  # a stage keeps its colour from plot to plot
        left = [sum(max(r["split_s"].get(s, 0.0), 0.0) for s in names[:i]) for r in rows]
        color = cmap(order.index(stage) if stage in order else len(order) + i % (20 - len(order)))
        ax.barh([r["side"] for r in rows], [max(r["split_s"].get(stage, 0.0), 0.0) for r in rows], left=left,
                color=color, label=stage)
    for y, r in enumerate(rows):
        ax.text(r["mean_step_s"], y, f" {r['mean_step_s']:.2f} s, {r['samples_per_s']:.1f} samples/s", va="center",
                fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.3 * max(r["mean_step_s"] for r in rows))
    ax.set_xlabel("mean seconds per step (timed steps)")
    job = doc.get("job", {})
    ax.set_title(f"GRPO step split: {os.path.basename(str(job.get('model', '')))}, {job.get('batch')} prompts x "
                 f"{job.get('n')}, {job.get('response_len')} tokens", fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
