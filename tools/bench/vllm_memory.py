"""Does the empty_cache rule matter? vLLM colocated with a trainer in one process, three ways (GPU + vLLM).

The rule (``rollout/memory.py``): PyTorch's cached blocks go back to the driver right before the vLLM engine wakes
up and right after it sleeps, and nowhere else. vLLM allocates its weights and KV cache with its own CuMem
allocator, outside PyTorch's cache, so blocks that PyTorch keeps cached after training cannot be used by the
waking engine. Each mode runs in its own process:

* ``rule``: :func:`rollout.context.rollout_mode` as the trainer uses it;
* ``none``: the same with ``rollout.memory.empty_cache`` made a no-op: the training stage's cache stays reserved
  when vLLM wakes (expected: ``CUDA Error: out of memory`` from vLLM's cumem allocator at ``wake_up``);
* ``every_stage``: the rule plus an ``empty_cache`` after every training stage (old log-probs, update), the habit
  the rule forbids; its cost shows in the step time.

A step: rollout (wake -> bucketed weight sync -> wake KV -> generate -> sleep), an old-log-prob forward, one
update (forward, backward, AdamW) on the generated rows. The training stage's peak is raised to ``--fill-gib`` of
cached memory by one extra allocation freed at once (standing in for the activations of a bigger model), so that
the cache left behind is the same in every mode.

Usage: ``python tools/bench/vllm_memory.py --model /path/to/hf_model --out vllm_memory.json`` (all three modes).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

MODES = ("rule", "none", "every_stage")


def _train_stage(model, opt, rows, fill_gib: float, memory, every_stage: bool) -> dict:
    """Old log-prob forward + one update on ``rows`` (B, L) int64; returns the stage seconds."""
    import torch

    t = {}
    torch.cuda.synchronize(); t0 = time.perf_counter()
    with torch.no_grad():
        model(input_ids=rows).logits.float().log_softmax(-1)
    torch.cuda.synchronize(); t["old_log_prob_s"] = time.perf_counter() - t0
    if every_stage:
        memory.empty_cache()
    t0 = time.perf_counter()
    if fill_gib > 0:  # the activation peak of a bigger model: allocated and freed, left in PyTorch's cache
        filler = torch.empty(int(fill_gib * 2**30), dtype=torch.uint8, device="cuda")
        del filler
    logits = model(input_ids=rows[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del logits, loss
    torch.cuda.synchronize(); t["update_s"] = time.perf_counter() - t0
    if every_stage:
        memory.empty_cache()
    t["reserved_after_update_gib"] = torch.cuda.memory_reserved() / 2**30  # counts vLLM's pool too (asleep or not)
    t["allocated_after_update_gib"] = torch.cuda.memory_allocated() / 2**30
    return t


def run_mode(args) -> dict:
    """One mode in this process; returns its figures (or the error that stopped it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout import memory
    from rollout.base import SamplingConfig
    from rollout.context import iter_actor_params, rollout_mode
    from rollout.vllm_engine import VLLMRolloutEngine

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(29600 + MODES.index(args.mode)))
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    # One update before the filler is ever allocated: what an update keeps alive afterwards (AdamW's state, the
    # autograd thread's cuBLAS workspace) is then allocated outside the filler's segment. A live block inside that
    # segment would pin all of it in PyTorch's cache, beyond the reach of empty_cache, in every mode.
    warm = torch.randint(100, tok.vocab_size, (args.prompts, args.prompt_len + args.new_tokens), device="cuda")
    _train_stage(model, opt, warm, 0.0, memory, False)
    del warm
    memory.empty_cache()
    engine = VLLMRolloutEngine(args.model, eos_token_id=tok.eos_token_id, gpu_memory_utilization=args.gpu_util,
                               max_model_len=args.prompt_len + args.new_tokens + 8, enforce_eager=args.eager, seed=0)
    if args.mode == "none":
        memory.empty_cache = lambda: None  # what the engine sees when nobody returns PyTorch's cache
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, tok.vocab_size, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    sampling = SamplingConfig(n=1, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    bucket = 64 * 2**20
    steps, result, log = [], {"mode": args.mode}, {}
    try:
        for step in range(args.steps):
            torch.cuda.synchronize(); t0 = time.perf_counter()
            log: dict = {}
            with rollout_mode(engine, lambda: iter_actor_params(model, 0, bucket), bucket, memory_log=log):
                out = engine.generate(prompts, sampling)
            gen_s = time.perf_counter() - t0
            rows = torch.cat([torch.tensor(prompts), out.responses], dim=1).cuda()
            t = _train_stage(model, opt, rows, args.fill_gib, memory, args.mode == "every_stage")
            torch.cuda.synchronize()
            steps.append(dict(step=step, step_s=time.perf_counter() - t0, rollout_s=gen_s,
                              **t, **{f"used_gib/{k}": round(v, 2) for k, v in log.items()}))
            print(steps[-1], flush=True)
    except Exception as exc:  # the failure this bench looks for in mode none
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        result["error"] = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]
        result["error_at_step"] = len(steps)
        result["failed_step_used_gib"] = {k: round(v, 2) for k, v in log.items()}  # up to the failing stage
        result["torch_reserved_gib_at_failure"] = torch.cuda.memory_reserved() / 2**30
        print("stopped:", result["error"], flush=True)
    result["steps"] = steps
    timed = [s["step_s"] for s in steps[1:]]  # the first step includes warm-up
    if timed:
        result["median_step_s"] = statistics.median(timed)
    return result


def probe(args) -> dict:
    """Does ``empty_cache`` return a freed block to the driver, without and with a sleeping vLLM engine in this
    process? Allocates and frees ``--fill-gib``, then records the device memory in use and PyTorch's reserved
    memory (GiB) before and after :func:`rollout.memory.empty_cache`."""
    import torch

    from rollout import memory

    torch.cuda.set_device(0)
    out = {}

    def cycle(name):
        block = torch.empty(int(args.fill_gib * 2**30), dtype=torch.uint8, device="cuda")
        del block
        before = (memory.device_used_gib(), torch.cuda.memory_reserved() / 2**30)
        memory.empty_cache()
        after = (memory.device_used_gib(), torch.cuda.memory_reserved() / 2**30)
        out[name] = {"used_gib_before": round(before[0], 2), "reserved_gib_before": round(before[1], 2),
                     "used_gib_after": round(after[0], 2), "reserved_gib_after": round(after[1], 2)}
        print(name, out[name], flush=True)

    cycle("no_engine")
    from transformers import AutoTokenizer

    from rollout.base import SamplingConfig
    from rollout.vllm_engine import VLLMRolloutEngine

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29610")
    torch.distributed.init_process_group("nccl")
    tok = AutoTokenizer.from_pretrained(args.model)
    engine = VLLMRolloutEngine(args.model, eos_token_id=tok.eos_token_id, gpu_memory_utilization=args.gpu_util,
                               max_model_len=args.prompt_len + args.new_tokens + 8, enforce_eager=args.eager, seed=0)
    cycle("engine_asleep")
    engine.wake_up()
    engine.generate([[100, 200, 300]], SamplingConfig(n=1, max_new_tokens=8))
    engine.sleep(1)
    cycle("engine_after_wake_generate_sleep")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--mode", choices=MODES + ("all",), default="all")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--gpu-util", type=float, default=0.6, help="vLLM's gpu_memory_utilization")
    ap.add_argument("--fill-gib", type=float, default=70.0, help="cached GiB the training stage leaves behind")
    ap.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    ap.add_argument("--probe", action="store_true", help="only check whether empty_cache returns a freed block, "
                    "without and with a sleeping engine in the process")
    ap.add_argument("--out", default="vllm_memory.json")
    args = ap.parse_args(argv)
    if args.probe:
        with open(args.out, "w") as f:
            json.dump(probe(args), f, indent=1)
        return
    if args.mode != "all":
        res = run_mode(args)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        return
    results = {"args": vars(args), "modes": {}}
    for mode in MODES:  # one process per mode: a failed wake_up leaves vLLM unusable
        part = f"{args.out}.{mode}"
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--out", part]
        for key in ("model", "steps", "prompts", "prompt_len", "new_tokens", "gpu_util", "fill_gib"):
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        cmd += ["--eager"] if args.eager else []
        proc = subprocess.run(cmd, text=True, capture_output=True)
        print(proc.stdout[-3000:], proc.stderr[-1500:] if proc.returncode else "", flush=True)
        try:
            with open(part) as f:
                results["modes"][mode] = json.load(f)
        except (OSError, ValueError):  # the process died (vLLM's allocator may abort instead of raising)
            err = [ln for ln in proc.stderr.splitlines() if "rror" in ln]
            results["modes"][mode] = {"mode": mode, "error": f"exit {proc.returncode}: {(err or [''])[-1][:300]}",
                                      "stdout_tail": proc.stdout[-1500:], "stderr_tail": proc.stderr[-1500:]}
    print(f"\n{'mode':12s} {'median step s':>14s}  error")
    for mode, r in results["modes"].items():
        med = f"{r['median_step_s']:.3f}" if "median_step_s" in r else "-"
        print(f"{mode:12s} {med:>14s}  {r.get('error', '')[:90]}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
