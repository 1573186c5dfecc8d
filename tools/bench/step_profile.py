"""Where does a GRPO/PPO step spend its time? Stage split from a run's metrics.jsonl, plus an optional
torch.profiler trace of the actor update's micro-batch loop.

Part 1 (``--metrics``): reads ``<output_dir>/metrics.jsonl`` written by ``trainer/main.py`` (one JSON object per
step) and reports, per stage (``timing_s/{gen, reward, old_log_prob, ref, values, adv, update_critic,
update_actor}``), the mean seconds per step, the share of ``timing_s/step``, the remainder ("other": data
loading, balancing, metrics, checkpoint), tokens/s per GPU (``perf/throughput``) and any logged peak-memory key
(a key containing ``memory``, e.g. ``perf/max_memory_allocated_gb``; the trainer may not log one).
The first ``--skip-first`` steps (default 1: start-up and compilation) are left out of the means.

Part 2 (``--profile``): builds a random-weight model (``--model``), runs ``--micro-batches`` micro-batches of the
actor update (packed ``forward_log_probs``, PPO clip loss, backward) and one AdamW step under
``torch.profiler``, after one un-profiled warm-up loop; exports a chrome trace (``--trace``, open it in
chrome://tracing or https://ui.perfetto.dev) and prints the top-15 ops by self device time (CPU time on CPU).

Usage:
    python tools/bench/step_profile.py --metrics outputs/run/metrics.jsonl --out step.json
    python tools/bench/step_profile.py --profile --model qwen2-1.5b --tokens 4096 --trace actor.json --out p.json
    python tools/bench/step_profile.py --tiny --out /tmp/step.json      # CPU smoke test (both parts)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import torch  # noqa: E402

from tools.bench.common import (actor_micro_step, apply_tiny, build_model, kernel_options,  # noqa: E402
                                packed_batch, pick_device, print_table, run_meta, update_setup, write_json)

STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def read_metrics(path: str) -> list[dict]:
    """Rows of a metrics.jsonl file (blank lines skipped).

    Raises:
        FileNotFoundError: no file at ``path``. ValueError: a line that is not a JSON object (line number given).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i} is not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i} is a {type(row).__name__}, expected a JSON object")
            rows.append(row)
    return rows


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize_steps(rows: list[dict], skip_first: int = 1) -> dict:
    """Per-stage timing summary of training-step rows (rows without ``timing_s/step`` are ignored).

    Returns:
        ``{"steps_used": [...], "stages": [{"stage", "mean_s", "share", "per_token_ms"}...] (incl. "other" and
        "step"), "tokens_per_s_per_gpu", "tokens_per_step", "memory": {key: {"mean", "max"}}}``. ``share`` is
        the stage's mean seconds over the mean step seconds. If ``skip_first`` would leave no step, none is skipped.

    Raises:
        ValueError: no row has ``timing_s/step``.
    """
    steps = [r for r in rows if _num(r.get("timing_s/step")) is not None]
    if not steps:
        raise ValueError("no row with 'timing_s/step' in the metrics: is this a trainer/main.py metrics.jsonl?")
    used = steps[skip_first:] if len(steps) > skip_first else steps
    step_s = _mean([_num(r["timing_s/step"]) for r in used])
    out_stages, covered = [], 0.0
    for name in STAGES:
        vals = [_num(r.get(f"timing_s/{name}")) for r in used]
        if all(v is None for v in vals):
            continue
        m = _mean([v if v is not None else 0.0 for v in vals])
        covered += m
        out_stages.append(dict(stage=name, mean_s=m, share=m / step_s if step_s else None,
                               per_token_ms=_mean([_num(r.get(f"timing_per_token_ms/{name}")) for r in used])))
    other = step_s - covered
    out_stages.append(dict(stage="other", mean_s=other, share=other / step_s if step_s else None, per_token_ms=None))
    out_stages.append(dict(stage="step", mean_s=step_s, share=1.0, per_token_ms=None))
    mem = {}
    for k in sorted({k for r in used for k in r if "memory" in k.lower()}):
        vals = [_num(r.get(k)) for r in used]
        vals = [v for v in vals if v is not None]
        if vals:
            mem[k] = dict(mean=sum(vals) / len(vals), max=max(vals))
    return dict(steps_used=[r.get("step") for r in used], num_steps_in_file=len(steps), stages=out_stages,
                tokens_per_s_per_gpu=_mean([_num(r.get("perf/throughput")) for r in used]),
                tokens_per_step=_mean([_num(r.get("perf/total_num_tokens")) for r in used]), memory=mem)


GEMM_KERNEL_MARKERS = ("gemm", "nvjet", "cutlass", "xmma", "matmul")


def kernel_summary(events, wall_s: float, top_gaps: int = 12, min_gap_us: float = 20.0) -> dict:
    """Device-kernel totals of a profile and where the GPU sat idle.

    Returns:
        ``kernels`` (launch count), ``kernel_ms`` (sum of kernel times, overlapping streams counted twice),
        ``gemm_ms`` (kernels whose name contains one of :data:`GEMM_KERNEL_MARKERS`), ``busy_fraction``
        (``kernel_ms / wall``), ``span_ms`` (first kernel start to last kernel end), ``idle_ms`` (time in that span
        with no kernel running on any stream: the GPU waits for the host), ``idle_fraction`` (``idle_ms /
        span_ms``), ``gaps_over_min`` (idle gaps longer than ``min_gap_us`` microseconds: count and total ms) and
        ``top_gaps``: the ``top_gaps`` longest idle gaps as ``{"us", "before", "after", "host"}`` (the kernels
        around the gap and the innermost host op running at the gap's middle).
    """
    from torch.autograd import DeviceType

    ks = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]
    total = sum(e.device_time for e in ks) / 1e3
    gemm = sum(e.device_time for e in ks if any(m in e.name.lower() for m in GEMM_KERNEL_MARKERS)) / 1e3
    out = dict(kernels=len(ks), kernel_ms=total, gemm_ms=gemm,
               busy_fraction=total / (wall_s * 1e3) if wall_s > 0 else None)
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in ks if e.time_range.end > e.time_range.start)
    if not spans:
        return out
    gaps, busy_end, last = [], spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > busy_end:
            gaps.append((start - busy_end, busy_end, last, name))
        if end > busy_end:
            busy_end, last = end, name
    span_us = busy_end - spans[0][0]
    idle_us = sum(g[0] for g in gaps)
    long = [g for g in gaps if g[0] > min_gap_us]
    host = [e for e in events if getattr(e, "device_type", None) == DeviceType.CPU]

    def innermost(t):
        inside = [e for e in host if e.time_range.start <= t <= e.time_range.end]
        return min(inside, key=lambda e: e.time_range.end - e.time_range.start).name if inside else None

    top = sorted(long, reverse=True)[:top_gaps]
    out.update(span_ms=span_us / 1e3, idle_ms=idle_us / 1e3, idle_fraction=idle_us / span_us if span_us else None,
               gaps_over_min=dict(min_us=min_gap_us, count=len(long), ms=sum(g[0] for g in long) / 1e3),
               top_gaps=[dict(us=g[0], before=g[2][:80], after=g[3][:80], host=innermost(g[1] + g[0] / 2))
                         for g in top])
    return out


def profile_actor_update(model_name: str, tokens: int, seq_len: int, response_len: int, micro_batches: int,
                         device: torch.device, trace: str | None, row_limit: int = 15,
                         kernels: dict | None = None, use_deepspeed: bool = False, shapes: bool = False) -> dict:
    """Profile one actor-update loop (``micro_batches`` x forward+backward, then one AdamW step).

    Args:
        kernels: the trainer's fused-kernel options (``use_liger``, ``use_torch_compile``, ``torch_compile_mode``;
            see ``trainer.workers.kernels``), applied to the model before the loop.
        use_deepspeed: the trainer's DeepSpeed ZeRO-2 engine (fp32 master weights, bf16 on CUDA) instead of a bf16
            model with ``torch.optim.AdamW``.
        shapes: record input shapes and add ``copies_by_shape``: the ``aten::copy_`` calls grouped by input shapes
            (which tensors are copied, how often, their device time).

    Returns:
        ``{"seconds", "tokens", "top_ops": [{"name", "self_time_ms", "total_time_ms", "calls"}...], "top_cpu_ops"
        (the same sorted by self host time, ``self_time_ms`` = host ms), "copies_by_shape" (with ``shapes``),
        "kernel_summary": {...} (CUDA only, see :func:`kernel_summary`), "table": str, "trace": path|None}``;
        times are the profiler's (device time on CUDA, CPU time on CPU).
    """
    from trainer.workers.kernels import apply_kernel_options

    dtype = torch.bfloat16 if device.type == "cuda" and not use_deepspeed else torch.float32
    model = build_model(model_name, device, dtype, sp_group=1)  # no SP, fixed at patch time (as the workers)
    model.train()
    applied = apply_kernel_options(model, kernels or {})
    vocab = model.config.vocab_size
    fwd, backward_fn, step, _ = update_setup(model, device, use_deepspeed, kernels)
    batches = [packed_batch(tokens, seq_len, response_len, vocab, device, seed=i, host_inputs=True)
               for i in range(micro_batches)]

    def loop():
        for b in batches:
            actor_micro_step(fwd, b, backward_fn=backward_fn)
        step()

    loop()  # warm-up: allocator, kernels, lazy optimizer state
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    from tools.bench.common import Timer

    with profile(activities=acts, record_shapes=shapes) as prof, Timer(device) as t:
        loop()
    if trace:
        os.makedirs(os.path.dirname(os.path.abspath(trace)), exist_ok=True)
        prof.export_chrome_trace(trace)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=row_limit)
    ev = list(prof.key_averages())
    self_attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    tot_attr = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    ev.sort(key=lambda e: getattr(e, self_attr, 0.0), reverse=True)
    top = [dict(name=e.key, self_time_ms=getattr(e, self_attr, 0.0) / 1e3,
                total_time_ms=getattr(e, tot_attr, 0.0) / 1e3,
                calls=e.count) for e in ev[:row_limit]]
    by_cpu = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    top_cpu = [dict(name=e.key, self_time_ms=e.self_cpu_time_total / 1e3, calls=e.count) for e in by_cpu[:row_limit]]
    copies = None
    if shapes:
        grouped = [e for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::copy_"]
        grouped.sort(key=lambda e: getattr(e, self_attr, 0.0), reverse=True)
        copies = [dict(input_shapes=str(e.input_shapes), calls=e.count, self_time_ms=getattr(e, self_attr, 0.0) / 1e3,
                       host_ms=e.self_cpu_time_total / 1e3) for e in grouped[:25]]
    ksum = kernel_summary(prof.events(), t.s) if device.type == "cuda" else None
    return dict(model=model_name, device=str(device), dtype=str(dtype), path="deepspeed-zero2" if use_deepspeed else
                "torch", seconds=t.s, tokens=tokens * micro_batches,
                tokens_per_s=tokens * micro_batches / t.s, micro_batches=micro_batches, top_ops=top, table=table,
                top_cpu_ops=top_cpu, copies_by_shape=copies,
                kernels=", ".join(applied) or "none", kernel_summary=ksum,
                trace=os.path.abspath(trace) if trace else None)


def _tiny_metrics(path: str) -> str:
    """A 3-step metrics.jsonl in the trainer's format with made-up timings, for --tiny without --metrics."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for s in (1, 2, 3):
            t = {"gen": 2.0 / s, "reward": 0.1, "old_log_prob": 0.2, "ref": 0.2, "adv": 0.01, "update_actor": 0.5}
            row = {"step": s, **{f"timing_s/{k}": v for k, v in t.items()}, "timing_s/step": sum(t.values()) + 0.09,
                   "perf/total_num_tokens": 1000.0, "perf/throughput": 1000.0 / (sum(t.values()) + 0.09) / 2}
            f.write(json.dumps(row) + "\n")
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", help="a run's metrics.jsonl (trainer.output_dir/metrics.jsonl)")
    ap.add_argument("--skip-first", type=int, default=1, help="warm-up steps left out of the means (default 1)")
    ap.add_argument("--profile", action="store_true", help="also profile one actor-update micro-batch loop")
    ap.add_argument("--model", default="qwen2-1.5b", help="qwen2-1.5b | smollm2-135m | tiny (random weights)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per packed micro-batch")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (rows = tokens / seq-len)")
    ap.add_argument("--response-len", type=int, default=768)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--trace", help="chrome trace output (json); default next to --out")
    ap.add_argument("--deepspeed", action="store_true", help="the trainer's DeepSpeed ZeRO-2 engine (fp32 master)")
    ap.add_argument("--compile", action="store_true", help="actor_rollout_ref.model.use_torch_compile")
    ap.add_argument("--compile-mode", default="default", help="actor_rollout_ref.model.torch_compile_mode "
                    "(default, reduce-overhead = CUDA graphs, max-autotune-no-cudagraphs); implies --compile if not "
                    "default")
    ap.add_argument("--liger", action="store_true", help="actor_rollout_ref.model.use_liger (CUDA)")
    ap.add_argument("--shapes", action="store_true", help="record input shapes: the copies grouped by shape")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 256-token micro-batches")
    ap.add_argument("--out", default="bench_step_profile.json", help="JSON output path")
    args = ap.parse_args(argv)
    if args.tiny:
        apply_tiny(args, ap, model="tiny", tokens=256, seq_len=64, response_len=32, micro_batches=2, profile=True)
        if not args.metrics:
            args.metrics = _tiny_metrics(os.path.splitext(os.path.abspath(args.out))[0] + ".tiny_metrics.jsonl")
    if not args.metrics and not args.profile:
        ap.error("give --metrics PATH and/or --profile (or --tiny)")
    doc: dict = dict(meta=run_meta(args))
    if args.metrics:
        summary = summarize_steps(read_metrics(args.metrics), args.skip_first)
        doc["steps"] = dict(metrics=os.path.abspath(args.metrics), **summary)
        print_table(summary["stages"], ["stage", "mean_s", "share", "per_token_ms"],
                    title=f"stage split over {len(summary['steps_used'])} steps (from step {summary['steps_used'][0]}) "
                          f"of {args.metrics}")
        print(f"tokens/s per GPU: {summary['tokens_per_s_per_gpu']}; tokens per step: {summary['tokens_per_step']}")
        if summary["memory"]:
            print_table([dict(key=k, **v) for k, v in summary["memory"].items()], ["key", "mean", "max"],
                        title="logged memory")
        else:
            print("no memory keys in the metrics (the trainer did not log peak memory)")
    if args.profile:
        trace = args.trace or os.path.splitext(os.path.abspath(args.out))[0] + ".trace.json"
        prof = profile_actor_update(args.model, args.tokens, args.seq_len, args.response_len, args.micro_batches,
                                    pick_device(args.device), trace,
                                    kernels=kernel_options(args), use_deepspeed=args.deepspeed, shapes=args.shapes)
        print(prof["table"])
        print_table(prof["top_cpu_ops"], ["name", "self_time_ms", "calls"], title="top ops by self host time")
        if prof["copies_by_shape"]:
            print_table(prof["copies_by_shape"], ["input_shapes", "calls", "self_time_ms", "host_ms"],
                        title="aten::copy_ by input shapes")
        print(f"actor update loop ({prof['kernels']}): {prof['seconds']:.3f} s for {prof['tokens']} tokens "
              f"({prof['tokens_per_s']:.1f} tok/s, profiler on); trace: {prof['trace']}")
        if prof["kernel_summary"]:
            ks = prof["kernel_summary"]
            print("device kernels: " + ", ".join(f"{k}={v:.4g}" for k, v in ks.items() if isinstance(v, (int, float))))
            if ks.get("top_gaps"):
                long = ks["gaps_over_min"]
                print(f"GPU idle {ks['idle_ms']:.2f} ms of {ks['span_ms']:.2f} ms; gaps > {long['min_us']:g} us: "
                      f"{long['count']} = {long['ms']:.2f} ms; longest:")
                for g in ks["top_gaps"]:
                    print(f"  {g['us']:9.1f} us  host: {g['host']}  | before: {g['before'][:40]}  "
                          f"after: {g['after'][:40]}")
        doc["profile"] = prof
    write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
