"""Model FLOPs utilisation (MFU) of the actor update on packed micro-batches, random-weight models.

Per model config (``--models``, default Qwen2-1.5B and SmolLM2-135M architectures): build the model, patch it with
``patches.ulysses.apply_ulysses_patch`` (packed varlen attention, SP=1), then time ``--iters`` micro-batches
(after ``--warmup``) of the actor update path: ``trainer.forward.forward_log_probs`` on one packed row of
``--tokens`` tokens (``tokens / seq_len`` sequences), the PPO clip loss, backward, and an optimizer step every
``--accum`` micro-batches (0: never; forward+backward only). CUDA is synchronised around the timed loop.

    MFU = (6 N T + 12 L H d sum_i s_i^2) / (seconds * peak)        (trainer.metric_utils.compute_mfu; PaLM app. B)

with ``N`` the matmul parameters, ``T`` the tokens processed, ``s_i`` the sequence lengths, ``peak`` the GPU's
dense bf16 FLOP/s (``--peak-flops``, default 989e12 = H100/H200 SXM dense bf16). The chunked log-softmax
recomputation and the optimizer step are overheads that MFU does not count as useful FLOPs.

``--liger`` / ``--compile``: the trainer's optional fused kernels (``trainer.workers.kernels``: Liger's RoPE, RMSNorm
and SwiGLU; ``torch.compile`` of the decoder layers and the log-prob math), applied before DeepSpeed wraps the model.
Liger patches transformers' modules process-wide, so compare variants in separate processes.

Default path: the model in bf16 (fp32 on CPU) with ``torch.optim.AdamW``. ``--deepspeed``: the model in fp32
wrapped by DeepSpeed ZeRO-2 with bf16 on CUDA, using the trainer's own config and optimizer builder
(``trainer.workers.base.DistributedWorker``), single process (MASTER_ADDR/PORT set here), ``engine.backward``
and ``engine.step`` as in ``trainer/workers/update.py``; this is the real update path.

Usage:
    python tools/bench/mfu.py --out mfu.json                     # both models, 4096-token micro-batches
    python tools/bench/mfu.py --deepspeed --models qwen2-1.5b --out mfu_ds.json
    python tools/bench/mfu.py --deepspeed --compile --models qwen2-1.5b --out mfu_ds_compile.json
    python tools/bench/mfu.py --tiny --out /tmp/mfu.json         # CPU smoke test (tiny model, MFU vs --peak-flops)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import torch  # noqa: E402

from tools.bench.common import (Timer, actor_micro_step, apply_tiny, build_model, kernel_options,  # noqa: E402
                                packed_batch, peak_memory_gib, pick_device, print_table, reset_peak_memory, run_meta,
                                update_setup, write_json)

H200_BF16_DENSE = 989e12


def bench_model(name: str, device: torch.device, tokens: int, seq_len: int, response_len: int, iters: int,
                warmup: int, accum: int, peak_flops: float, use_deepspeed: bool = False, zero_stage: int = 2,
                gradient_checkpointing: bool = False, kernels: dict | None = None,
                ds_config: dict | None = None) -> dict:
    """Time the actor update on one model config and compute its MFU.

    Returns:
        dict with ``model, path, tokens_per_microbatch, seconds (timed loop), tokens_per_s, flops_per_token,
        tflops_per_s, mfu, peak_mem_gib (None on CPU)``.

    Raises:
        ValueError: bad sizes (see :func:`tools.bench.common.packed_batch`), ``iters < 1``.
    """
    if iters < 1 or warmup < 0 or accum < 0:
        raise ValueError(f"need iters >= 1, warmup >= 0, accum >= 0; got {iters}, {warmup}, {accum}")
    from trainer.metric_utils import compute_mfu, flops_per_token

    half = device.type == "cuda"
    dtype = torch.float32 if (use_deepspeed or not half) else torch.bfloat16
    # sp_group=1: no SP, fixed at patch time, as the trainer's workers patch (whole-layer graphs under --compile)
    model = build_model(name, device, dtype, sp_group=1, gradient_checkpointing=gradient_checkpointing)
    model.train()
    from trainer.workers.kernels import apply_kernel_options

    applied = apply_kernel_options(model, kernels or {})  # as trainer.workers.model_utils.ModelRole.build does
    cfg = model.config
    fwd, backward_fn, step, opt = update_setup(model, device, use_deepspeed, kernels, zero_stage, 1e-6, ds_config)
    batches = [packed_batch(tokens, seq_len, response_len, cfg.vocab_size, device, seed=i, host_inputs=True)
               for i in range(2)]

    def run(n: int):
        for i in range(n):
            actor_micro_step(fwd, batches[i % 2], backward_fn=backward_fn)
            if accum and (i + 1) % accum == 0:
                step()

    from torch._dynamo.utils import counters

    counters.clear()
    run(max(warmup, accum))  # warm-up includes one optimizer step when accum > 0 (lazy optimizer state)
    reset_peak_memory(device)
    with Timer(device) as t:
        run(iters)
    n_tok = tokens * iters
    seqlens = batches[0]["seqlens"] * iters
    mfu = compute_mfu(cfg, n_tok, seqlens, t.s, 1, peak_flops)
    opt_name = type(opt).__name__ + (" fused" if opt.defaults.get("fused") else "")
    row = dict(model=name, path="deepspeed-zero%d" % zero_stage if use_deepspeed else "torch", dtype=str(dtype)
               if not use_deepspeed else ("bf16 (fp32 master)" if half else "fp32"), device=str(device),
               tokens_per_microbatch=tokens, seq_len=seq_len, iters=iters, accum=accum, seconds=t.s,
               tokens_per_s=n_tok / t.s, flops_per_token=flops_per_token(cfg, seq_len),
               tflops_per_s=mfu * peak_flops / 1e12, mfu=mfu, peak_flops=peak_flops,
               peak_mem_gib=peak_memory_gib(device), params=sum(p.numel() for p in model.parameters()),
               gradient_checkpointing=gradient_checkpointing, kernels=", ".join(applied) or "none",
               # torch.compile: graphs built and graph breaks (with their reasons) over warm-up and timed loop
               compiled_graphs=counters["stats"]["unique_graphs"], graph_breaks=sum(counters["graph_break"].values()),
               graph_break_reasons=dict(counters["graph_break"].most_common(5)),
               cudagraph_skips=counters["inductor"]["cudagraph_skips"], ds_config=ds_config or {},
               optimizer=opt_name)
    del model, fwd, batches, opt, step, backward_fn
    gc.collect()
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen2-1.5b,smollm2-135m", help="comma list of tools/bench/common.py configs")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per packed micro-batch")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence inside the micro-batch")
    ap.add_argument("--response-len", type=int, default=768)
    ap.add_argument("--iters", type=int, default=20, help="timed micro-batches")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step (0: no step)")
    ap.add_argument("--peak-flops", type=float, default=H200_BF16_DENSE, help="peak FLOP/s of one GPU")
    ap.add_argument("--deepspeed", action="store_true", help="wrap with DeepSpeed (trainer's config) instead")
    ap.add_argument("--zero-stage", type=int, default=2, choices=[0, 1, 2, 3])
    ap.add_argument("--ds-config", type=json.loads, default=None, help="JSON merged into DeepSpeed's config last "
                    "(as deepspeed.ds_config), e.g. '{\"zero_optimization\": {\"contiguous_gradients\": false}}'")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--liger", action="store_true", help="actor_rollout_ref.model.use_liger (CUDA, liger-kernel)")
    ap.add_argument("--compile", action="store_true", help="actor_rollout_ref.model.use_torch_compile")
    ap.add_argument("--compile-mode", default="default", help="actor_rollout_ref.model.torch_compile_mode "
                    "(default, reduce-overhead = CUDA graphs, max-autotune-no-cudagraphs); implies --compile if not "
                    "default")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 256-token micro-batches")
    ap.add_argument("--out", default="bench_mfu.json")
    args = ap.parse_args(argv)
    if args.tiny:
        apply_tiny(args, ap, models="tiny", tokens=256, seq_len=64, response_len=32, iters=4, warmup=1, accum=2,
                   device="cpu")
    device = pick_device(args.device)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        rows.append(bench_model(name, device, args.tokens, args.seq_len, args.response_len, args.iters, args.warmup,
                                args.accum, args.peak_flops, args.deepspeed, args.zero_stage,
                                args.gradient_checkpointing,
                                kernel_options(args), args.ds_config))
        print(rows[-1], flush=True)
    print_table(rows, ["model", "path", "kernels", "dtype", "tokens_per_microbatch", "tokens_per_s", "tflops_per_s",
                       "mfu", "peak_mem_gib"], title=f"actor update MFU (peak {args.peak_flops:.3g} FLOP/s, {device})")
    doc = dict(meta=run_meta(args), results=rows)
    write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
