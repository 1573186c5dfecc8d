"""Ulysses sequence parallelism: tokens/s per GPU and peak memory vs sequence length, SP=1 vs SP=2, the longest
trainable sequence per SP size, and a log-prob equivalence check SP=2 vs SP=1.

No torchrun: for each SP size the script starts ``sp`` worker processes (``torch.multiprocessing``, spawn; nccl on
CUDA with one GPU per rank, gloo on CPU) that receive trials over queues. A trial is one actor-update step on ONE
packed sequence of ``T`` tokens (``--tokens-per-gpu``: ``sp`` such sequences, so each rank holds ``T``; response =
last ``T/2`` tokens of each): ``forward_log_probs`` with the Ulysses group
(each rank holds ``T * seqs / sp`` tokens), the PPO clip loss, backward, and a ``torch.optim.AdamW`` step after every
``--accum`` such micro-batches (1: every step; the trainer steps once per mini-batch of several micro-batches, so
``--accum 4`` is closer to its update; bf16 weights and
states on CUDA; the trainer's DeepSpeed path keeps fp32 master weights, so its memory is higher by about 12 bytes
per parameter). ``--warmup`` steps, then ``--iters`` timed steps; tokens/s per GPU = ``T * seqs * iters / seconds / sp``;
peak memory = ``torch.cuda.max_memory_allocated`` (max over ranks). Gradients are not all-reduced across
ranks in either SP size (the trainer all-reduces them over the dp x sp group, which SP=1 on the same GPUs at
data-parallel size 2 pays as well). A failure in any rank (e.g. CUDA OOM) kills
the whole pool (its peers may be blocked in a collective) and a new pool serves the next trial.

Search: from ``--search-start`` tokens, double ``T`` until a trial fails (OOM) or exceeds ``--search-max``, then
``--search-refine`` bisection steps between the last fit and the first OOM (``longest_sequence``); the longest ``T``
that fitted is reported. On CUDA each search trial gets a fresh pool (no allocator state carried over).

Equivalence: with SP=2, the log-probs of a packed batch of 4 sequences (``--equiv-tokens`` in all) computed with
the SP group and with SP=1 on the same rank and weights; max and mean absolute difference over response tokens
(bf16 on CUDA, fp32 on CPU).

Model configs (random weights): ``qwen2-1.5b`` (12 heads, 2 KV heads) and ``smollm2-135m`` (9 heads, 3 KV heads:
SP=2 does not divide 9 heads, so its SP=2 rows are reported as skipped; SP=3 works).

Usage:
    python tools/bench/ulysses.py --out ulysses.json                   # 2 GPUs: 8k/16k/32k, SP 1 and 2, search
    python tools/bench/ulysses.py --models qwen2-1.5b --no-search --out u.json
    python tools/bench/ulysses.py --tiny --out /tmp/u.json             # CPU smoke test (gloo, tiny model)
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from tools.bench.common import (actor_micro_step, apply_tiny, build_model, hf_config, packed_batch,  # noqa: E402
                                print_table, run_meta, update_setup, write_json)


# ----------------------------------------------------------------------------------------------- worker side
def _train_trial(task: dict, group, device, cache: dict) -> dict:
    import torch.distributed as dist

    key = (task["model"], task["gradient_checkpointing"], task.get("compile_mode"))
    if key not in cache:
        cache.clear()
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        # the group bound at patch time, as the trainer's workers do: the host-packed row's boundaries then go to
        # the attention as keyword arguments and its all-to-alls are traceable (no graph break under --compile)
        model = build_model(task["model"], device, dtype, sp_group=group if group.size > 1 else 1,
                            gradient_checkpointing=task["gradient_checkpointing"])
        model.train()
        kernels = {}
        if task.get("compile_mode"):  # the trainer's use_torch_compile (whole layers, all-to-alls included)
            from trainer.workers.kernels import apply_kernel_options

            kernels = {"use_torch_compile": True, "torch_compile_mode": task["compile_mode"]}
            apply_kernel_options(model, kernels)
        cache[key] = (model, update_setup(model, device, False, kernels)[2])  # AdamW step + zero_grad
    model, opt_step = cache[key]
    T, seqs = task["tokens"], int(task.get("seqs", 1))  # seqs sequences of T tokens packed in one micro-batch
    batch = packed_batch(T * seqs, T, T // 2, model.config.vocab_size, device, seed=task.get("seed", 0),
                         host_inputs=True)

    accum = max(1, int(task.get("accum", 1)))
    done = [0]

    def step():
        with group.activate():  # kept open across backward (recomputed layers look the group up)
            actor_micro_step(model, batch, sp=group)
        done[0] += 1
        if done[0] % accum == 0:
            opt_step()

    for _ in range(max(task["warmup"], accum)):  # warm-up includes one optimizer step (lazy AdamW state)
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(task["iters"]):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    secs = time.perf_counter() - t0
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else -1.0
    stats = torch.tensor([secs, mem], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    secs, mem = stats.tolist()
    from torch._dynamo.utils import counters  # this rank's torch.compile counters since the process started

    return dict(seconds=secs, peak_mem_gib=mem if mem >= 0 else None, micro_batch_tokens=batch["input_ids"].numel(),
                graph_breaks=sum(counters["graph_break"].values()),
                cudagraph_skips=counters["inductor"]["cudagraph_skips"])


@torch.no_grad()
def _equiv_trial(task: dict, group, device) -> dict:
    from patches.ulysses import UlyssesGroup
    from trainer.forward import forward_log_probs

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(task["model"], device, dtype).eval()
    T = task["tokens"]
    b = packed_batch(T, T // 4, T // 8, model.config.vocab_size, device, seed=1)
    args = (model, b["input_ids"], b["attention_mask"], b["position_ids"], b["response_length"])
    lp_sp, _ = forward_log_probs(*args, sp=group)
    lp_1, _ = forward_log_probs(*args, sp=UlyssesGroup())
    d = (lp_sp.float() - lp_1.float()).abs()
    return dict(max_abs_diff=d.max().item(), mean_abs_diff=d.mean().item(), dtype=str(dtype), tokens=T)


def _worker(rank: int, world: int, port: int, device_type: str, inq, outq) -> None:
    import torch.distributed as dist

    from patches.ulysses import UlyssesGroup

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    backend = "nccl" if device_type == "cuda" else "gloo"
    kw = {"device_id": device} if device_type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
    group = UlyssesGroup(dist.new_group(list(range(world))), world, rank) if world > 1 else UlyssesGroup()
    cache: dict = {}
    while True:
        task = inq.get()
        if task is None:
            break
        try:
            res = (_train_trial(task, group, device, cache) if task["kind"] == "train"
                   else _equiv_trial(task, group, device))
        except Exception as exc:  # reported to the parent, which tears the pool down
            msg = f"{type(exc).__name__}: {exc}"
            res = dict(error=msg[:1500], oom=isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in msg)
        res["rank"] = rank
        outq.put(res)
        if "error" in res:
            return
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------- parent side
class Pool:
    """``sp`` worker processes forming one SP group; :meth:`run` sends a trial to all and returns rank 0's
    result, or ``{"error", "oom"}`` after which the pool is closed (its processes killed)."""

    def __init__(self, sp: int, device_type: str, timeout_s: float):
        from trainer.workers.base import free_port

        if device_type == "cuda" and torch.cuda.device_count() < sp:
            raise ValueError(f"SP={sp} needs {sp} GPUs, found {torch.cuda.device_count()}")
        ctx = mp.get_context("spawn")
        self.sp, self.timeout_s, self.outq = sp, timeout_s, ctx.Queue()
        self.inqs = [ctx.Queue() for _ in range(sp)]
        port = free_port()
        self.procs = [ctx.Process(target=_worker, args=(r, sp, port, device_type, self.inqs[r], self.outq),
                                  daemon=True) for r in range(sp)]
        for p in self.procs:
            p.start()
        self.alive = True

    def run(self, task: dict) -> dict:
        if not self.alive:
            raise RuntimeError("pool is closed")
        for q in self.inqs:
            q.put(task)
        results, deadline = [], time.monotonic() + self.timeout_s
        while len(results) < self.sp:
            try:
                res = self.outq.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                res = dict(error=f"timeout after {self.timeout_s} s", oom=False)
            if "error" in res or time.monotonic() > deadline:
                self.close(kill=True)
                return res if "error" in res else dict(error="timeout", oom=False)
            results.append(res)
        return next(r for r in results if r["rank"] == 0)

    def close(self, kill: bool = False) -> None:
        if not self.alive:
            return
        self.alive = False
        if not kill:
            for q in self.inqs:
                q.put(None)
        for p in self.procs:
            p.join(timeout=None if not kill else 0.1)
            if p.is_alive():
                p.kill()  # our own child, by its process object
                p.join()


def _sp_ok(model: str, sp: int) -> str | None:
    from patches.ulysses import validate_ulysses_config

    cfg = hf_config(model)
    try:
        validate_ulysses_config(cfg.num_attention_heads, cfg.num_key_value_heads, sp)
    except ValueError as exc:
        return str(exc)
    return None


def longest_sequence(fits, start: int, cap: int, refine: int = 0, granule: int = 1024):
    """Longest sequence (tokens) that one training step fits, by doubling from ``start`` then bisecting.

    ``fits(T)`` runs one trial and returns its result dict (``"error"``/``"oom"`` keys on failure, else
    ``"peak_mem_gib"`` and ``"seconds"``). Doubling stops at the first failure or above ``cap``; then ``refine``
    bisection steps between the last fit and the first failure, midpoints rounded down to a multiple of
    ``granule`` tokens (stops early when the interval is one granule). Returns ``(last, stop, next_tried)``:
    ``last`` is ``{"tokens", "peak_mem_gib", "seconds_per_step"}`` of the longest fit (None if none fitted),
    ``stop`` is ``"cap"``, ``"OOM"`` or ``"error: ..."`` from the doubling, ``next_tried`` the first failing length.
    """
    T, last, stop = start, None, "cap"
    while T <= cap:
        r = fits(T)
        if "error" in r:
            stop = "OOM" if r.get("oom") else f"error: {r['error']}"
            break
        last = dict(tokens=T, peak_mem_gib=r["peak_mem_gib"], seconds_per_step=r["seconds"])
        T *= 2
    if last is None or stop != "OOM":
        return last, stop, T
    lo, hi = last["tokens"], T
    for _ in range(refine):
        mid = (lo + hi) // 2 // granule * granule
        if mid <= lo:
            break
        r = fits(mid)
        if "error" in r:
            hi = mid
        else:
            lo, last = mid, dict(tokens=mid, peak_mem_gib=r["peak_mem_gib"], seconds_per_step=r["seconds"])
    return last, stop, hi


def run_benchmark(models, sp_sizes, tokens_list, iters, warmup, device_type, search, search_start, search_max,
                  equiv_tokens, gradient_checkpointing=False, timeout_s=900.0, search_refine: int = 0,
                  accum: int = 1, compile_mode: str | None = None, tokens_per_gpu: bool = False) -> dict:
    """Run the throughput table (``compile_mode``: decoder layers and log-prob math under torch.compile in that
    mode, see ``trainer.workers.kernels``; None: eager),
    the longest-sequence search and the equivalence check.

    ``tokens_per_gpu``: a throughput trial at SP size ``sp`` packs ``sp`` sequences of ``T`` tokens into its
    micro-batch, so every GPU holds ``T`` tokens whatever the SP size: the trainer's dynamic batching rule (the
    micro-batch budget is ``ppo_max_token_len_per_gpu * sp``, as in verl). Without it a trial is ONE sequence of
    ``T`` tokens, so an SP rank holds ``T / sp``. The search always uses one sequence.

    Returns:
        ``{"throughput": [rows], "search": [rows], "equivalence": [rows]}``; a row's ``status`` is ``ok``, ``OOM``,
        ``skipped: <reason>`` or ``error: <message>``.
    """
    if accum < 1 or iters % accum:
        raise ValueError(f"accum must be >= 1 and divide iters (every timed window ends with an optimizer step); "
                         f"got accum={accum}, iters={iters}")
    base = dict(iters=iters, warmup=warmup, gradient_checkpointing=gradient_checkpointing, accum=accum,
                compile_mode=compile_mode)
    out: dict = dict(throughput=[], search=[], equivalence=[])
    for sp in sp_sizes:
        pool = None

        def trial(task, fresh=False):
            nonlocal pool
            if pool is None or not pool.alive or fresh:
                if pool is not None:
                    pool.close()
                pool = Pool(sp, device_type, timeout_s)
            return pool.run(task)

        for model in models:
            bad = _sp_ok(model, sp)
            if bad:
                out["throughput"].append(dict(model=model, sp=sp, status=f"skipped: {bad}"))
                continue
            for T in tokens_list:
                seqs = sp if tokens_per_gpu else 1
                r = trial(dict(kind="train", model=model, tokens=T, seqs=seqs, **base))
                row = dict(model=model, sp=sp, tokens=T, seqs=seqs, accum=accum, status="ok" if "error" not in r
                           else ("OOM" if r["oom"] else f"error: {r['error']}"))
                if "error" not in r:
                    row.update(seconds=r["seconds"], micro_batch_tokens=r["micro_batch_tokens"],
                               tokens_per_s_per_gpu=r["micro_batch_tokens"] * iters / r["seconds"] / sp,
                               peak_mem_gib=r["peak_mem_gib"], graph_breaks=r["graph_breaks"],
                               cudagraph_skips=r["cudagraph_skips"])
                out["throughput"].append(row)
                print(row, flush=True)
            if search:
                def fits(T, model=model):
                    return trial(dict(kind="train", model=model, tokens=T,
                                      **dict(base, iters=1, warmup=1, accum=1)),
                                 fresh=device_type == "cuda")

                last, stop, T = longest_sequence(fits, search_start, search_max, search_refine)
                row = dict(model=model, sp=sp, longest_tokens=last and last["tokens"],
                           peak_mem_gib=last and last["peak_mem_gib"], stopped_by=stop, next_tried=T)
                out["search"].append(row)
                print(row, flush=True)
            if sp > 1 and equiv_tokens:
                r = trial(dict(kind="equiv", model=model, tokens=equiv_tokens))
                row = dict(model=model, sp=sp, **({k: r[k] for k in ("max_abs_diff", "mean_abs_diff", "dtype",
                                                                      "tokens")} if "error" not in r
                                                  else dict(status=f"error: {r['error']}")))
                out["equivalence"].append(row)
                print(row, flush=True)
        if pool is not None:
            pool.close()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,qwen2-1.5b")
    ap.add_argument("--sp-sizes", default="1,2")
    ap.add_argument("--tokens", default="8192,16384,32768", help="comma list of sequence lengths")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-search", action="store_true", help="skip the longest-sequence search")
    ap.add_argument("--search-start", type=int, default=8192)
    ap.add_argument("--search-max", type=int, default=1 << 20)
    ap.add_argument("--search-refine", type=int, default=0,
                    help="bisection steps after doubling (between the last fit and the first OOM), 1,024-token grain")
    ap.add_argument("--equiv-tokens", type=int, default=8192, help="0: skip the SP=2 vs SP=1 log-prob check")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--compile", action="store_true", help="actor_rollout_ref.model.use_torch_compile in the "
                    "throughput trials")
    ap.add_argument("--compile-mode", default="default", help="torch_compile_mode of the throughput trials; implies "
                    "--compile if not default (reduce-overhead: each layer, all-to-alls included, as a CUDA graph)")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches (steps) per optimizer step in the throughput table (search trials use 1)")
    ap.add_argument("--tokens-per-gpu", action="store_true",
                    help="throughput trials pack SP-size sequences per micro-batch, so each GPU holds --tokens tokens "
                    "at every SP size (the trainer's rule: micro-batch budget = ppo_max_token_len_per_gpu x sp)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per trial before the pool is killed")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 256/512 tokens, gloo")
    ap.add_argument("--out", default="bench_ulysses.json")
    args = ap.parse_args(argv)
    if args.tiny:
        apply_tiny(args, ap, models="tiny", tokens="256,512", iters=2, warmup=1, search_start=512, search_max=1024,
                   equiv_tokens=256, device="cpu")
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    res = run_benchmark([m.strip() for m in args.models.split(",") if m.strip()],
                        [int(s) for s in args.sp_sizes.split(",")], [int(t) for t in args.tokens.split(",")],
                        args.iters, args.warmup, device_type, not args.no_search, args.search_start,
                        args.search_max, args.equiv_tokens, args.gradient_checkpointing, args.timeout,
                        args.search_refine, args.accum,
                        args.compile_mode if args.compile_mode != "default" else ("default" if args.compile else None),
                        args.tokens_per_gpu)
    print_table(res["throughput"], ["model", "sp", "tokens", "seqs", "accum", "status", "tokens_per_s_per_gpu", "peak_mem_gib", "graph_breaks"],
                title=f"Ulysses actor step ({device_type})")
    if res["search"]:
        print_table(res["search"], ["model", "sp", "longest_tokens", "peak_mem_gib", "stopped_by"],
                    title="longest trainable sequence (doubling)")
    if res["equivalence"]:
        print_table(res["equivalence"], ["model", "sp", "tokens", "dtype", "max_abs_diff", "mean_abs_diff"],
                    title="log-prob equivalence SP vs SP=1")
    doc = dict(meta=run_meta(args), **res)
    write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
