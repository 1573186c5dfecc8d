"""Benchmark rollout generation (plain ``generate`` with the dynamic cache vs :class:`HFRolloutEngine`) and the
trainer -> engine weight sync.

Usage (GPU machine):
    python tools/bench/rollout.py --model /path/to/SmolLM2-135M-Instruct --out bench_rollout.json
    python tools/bench/rollout.py --random smollm2 --prompts 256 --n 4 --new-tokens 256 --out r.json
    python tools/bench/rollout.py --engine hf,vllm --random qwen2-1.5b --prompts 512 --n 1 --new-tokens 512 \
        --skip-plain --skip-sync --out r.json
``--decode-loop generate,graph`` times the transformers engine's two decode loops (``rollout.decode_loop``) on one
engine, same weights and prompts, with ms per decode step (seconds / the longest response of each chunk).
``--engine hf,vllm`` times both engines in one process on the same weights and prompts (the transformers engine
first; its memory is returned before vLLM starts). A random-weight model is saved as an HF folder first, so that
vLLM loads the same weights; each row then ends only at EOS or ``--new-tokens``.
Prompts are random token ids (lengths uniform in [--min-prompt, --max-prompt]); tokens/s counts the generated
tokens inside ``response_mask`` (EOS ends a row early). The engine is called twice: the first call includes
``torch.compile`` (reported as compile seconds), the second is the timed one. The sync timing builds a
random-weight Qwen2-1.5B (hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960, vocab 151936) in bf16
and streams its parameters into an engine in buckets (``rollout.context.sync_weights``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import torch  # noqa: E402
from transformers import LlamaConfig, Qwen2Config  # noqa: E402

from rollout.base import SamplingConfig, finalize_responses  # noqa: E402
from rollout.context import iter_actor_params, sync_weights  # noqa: E402
from rollout.compile_stats import compile_counts  # noqa: E402
from rollout.hf_engine import HFRolloutEngine  # noqa: E402

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
QWEN2_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


RANDOM = {"smollm2": ("llama", SMOLLM2), "qwen2-1.5b": ("qwen2", QWEN2_1_5B)}


def random_config(name: str):
    """The HF config of a ``--random`` shape (``smollm2`` or ``qwen2-1.5b``)."""
    kind, kw = RANDOM[name]
    return (LlamaConfig if kind == "llama" else Qwen2Config)(**kw)


def save_random_model(name: str, folder: str, dtype=torch.bfloat16, seed: int = 0) -> str:
    """Write a random-weight model of shape ``name`` with the project's embedded tokenizer (token ids are
    random, so any tokenizer serves; vLLM needs one in the folder) to ``folder``; returns ``folder``."""
    from transformers import AutoModelForCausalLM

    from trainer.embedded import build_tokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(random_config(name), dtype=dtype)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder


def load_model(args, device, dtype):
    """Return (config, model with weights, eos id)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.model:
        cfg = AutoConfig.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device)
    else:
        cfg = random_config(args.random)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else cfg.eos_token_id[0]
    return cfg, model.eval(), eos


def bench_generation(args, device, dtype) -> list[dict]:
    cfg, model, eos = load_model(args, device, dtype)
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(args.min_prompt, args.max_prompt + 1, (args.prompts,), generator=g).tolist()
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in lens]
    sampling = SamplingConfig(n=args.n, temperature=args.temperature, max_new_tokens=args.new_tokens, seed=0)
    rows = []
    if not args.skip_plain:
        rows.append(plain_generate(model, prompts, sampling, eos, device))
        print(rows[-1], flush=True)
    weights = dict(model.state_dict())
    del model
    engines = args.engine.split(",")
    if "hf" not in engines:
        del weights
        return rows + [bench_vllm(args, cfg, eos, prompts, sampling)]
    loops = args.decode_loop.split(",")
    for i, attn in enumerate(args.attn.split(",")):  # one engine per attention backend, one after the other
        if i:  # free the previous engine; PyTorch's caching allocator reuses its blocks for the next one
            del engine
            gc.collect()
        engine = HFRolloutEngine(cfg, eos_token_id=eos, device=device, dtype=dtype, max_batch_size=args.max_batch,
                                 attn_implementation=attn, decode_loop="graph" if "graph" in loops else "generate",
                                 compile_regions=args.compile_regions)
        engine.load_weights(weights.items())
        for loop in loops:  # the same engine and weights in each decode loop, --engine-calls calls each
            engine.decode_loop = loop
            rows.append(engine_row(engine, prompts, sampling, args.engine_calls, attn, loop))
            print(rows[-1], flush=True)
        engine.decode_loop = loops[0]
    del weights
    if args.decode_ab:  # the same engine (one compilation) in each decode-loop setting, --engine-calls calls each
        rows.append(decode_ab(engine, prompts, sampling, args.engine_calls))
    if args.profile:  # one more call under torch.profiler: where a decoding step's time goes
        rows[-1]["profile"] = profile_generate(engine, prompts, sampling, args.profile_rows)
    if args.sleep_wake:  # does a sleep/wake cycle (new addresses) cost a recompile or a graph recording?
        rows.append(sleep_wake_row(engine, prompts, sampling, args.engine_calls, args.sleep_level))
        print(rows[-1], flush=True)
    if "vllm" in engines:
        engine = out = None  # the HF engine and its last output go before vLLM starts
        gc.collect()
        from rollout import memory

        memory.empty_cache()  # the HF engine's cached blocks go back before vLLM sizes its KV cache
        rows.append(bench_vllm(args, cfg, eos, prompts, sampling))
    return rows


def decode_steps(response_mask: torch.Tensor, rows_per_call: int) -> int:
    """Decode steps of one ``generate`` call of the engine: the longest response of each chunk of ``rows_per_call``
    rows, summed over the chunks (every loop runs a chunk until its longest row ends)."""
    lengths = response_mask.sum(1)
    return int(sum(int(lengths[i:i + rows_per_call].max()) for i in range(0, len(lengths), rows_per_call)))


def engine_row(engine, prompts, sampling, calls: int, attn: str, loop: str) -> dict:
    """``calls`` timed calls of one engine in decode loop ``loop``: the last call's seconds, tokens/s and ms per
    decode step (:func:`decode_steps`), the first call's (compile and CUDA-graph recording included), the
    recordings per call."""
    times, records, out = timed_calls(engine, prompts, sampling, calls)
    tokens = int(out.response_mask.sum())
    steps = decode_steps(out.response_mask, engine._rows_per_call())
    kind = "static cache + compile" if engine.use_static_cache else "dynamic"
    return dict(name=f"HFRolloutEngine ({kind}, {attn}, decode_loop={loop})", attn_implementation=attn,
                decode_loop=loop, seconds=times[-1], tokens=tokens, tok_per_s=tokens / times[-1],
                decode_steps=steps, ms_per_decode_step=1e3 * times[-1] / max(steps, 1), first_call_s=times[0],
                compile_s=max(0.0, times[0] - times[-1]), all_calls_s=times, cudagraph_records_per_call=records)


def sleep_wake_row(engine, prompts, sampling, calls: int, level: int) -> dict:
    """``calls`` calls of ``engine.generate``, each after a sleep (``level``) / wake cycle as a training step does
    (weights loaded again on wake): seconds and CUDA-graph recordings per call, beside the steady calls' row; with
    ``--temperature 0`` whether each call decoded the tokens of a call made awake (``same_tokens_as_awake``)."""
    weights = {k: v.detach().clone() for k, v in engine.model.state_dict().items()} if level >= 2 else None
    greedy = sampling.temperature == 0  # then every call must decode the awake call's tokens
    awake = engine.generate(prompts, sampling).responses if greedy else None
    times, records, out, same = [], [], None, []
    for _ in range(calls):
        engine.sleep(level)
        engine.wake_up()
        if weights is not None:  # level 2 drops the weights: the trainer syncs them after each wake
            engine.load_weights(weights.items())
        t, r, out = timed_calls(engine, prompts, sampling, 1)
        times, records = times + t, records + r
        if greedy:
            same.append(bool(torch.equal(out.responses, awake)))
    tokens = int(out.response_mask.sum())
    return dict(name=f"HFRolloutEngine after sleep(level={level})/wake each call", sleep_level=level,
                seconds=times[-1], tokens=tokens, tok_per_s=tokens / times[-1], all_calls_s=times,
                cudagraph_records_per_call=records, same_tokens_as_awake=same if greedy else None)


def timed_calls(engine, prompts, sampling, calls: int):
    """``calls`` calls of ``engine.generate``: (seconds per call, CUDA-graph recordings per call, the last output)."""
    times, records, out = [], [], None
    for _ in range(calls):
        before = compile_counts()
        _sync(); t0 = time.perf_counter()
        out = engine.generate(prompts, sampling)
        _sync(); times.append(time.perf_counter() - t0)
        records.append(compile_counts()["cudagraph_records"] - before["cudagraph_records"])
    return times, records, out


def decode_ab(engine, prompts, sampling, calls: int) -> dict:
    """Seconds per ``generate`` call and CUDA-graph recordings per call of one transformers engine (one compilation)
    with ``generate``'s all-rows-finished flag read after every token and one step late (``defer_stop_check``),
    ``calls`` calls each; the mean leaves the first call of each setting out."""
    out = {"name": "decode loop A/B", "deferred_available": _has_deferred_stop_check(), "settings": []}
    for defer in (False, True):
        engine.defer_stop_check = defer
        times, records, res = timed_calls(engine, prompts, sampling, calls)
        tokens = int(res.response_mask.sum())
        steady = times[1:] or times
        row = dict(defer_stop_check=defer, first_call_s=times[0], mean_s=sum(steady) / len(steady),
                   all_calls_s=times, cudagraph_records_per_call=records, tokens=tokens,
                   tok_per_s=tokens * len(steady) / sum(steady))
        print(row, flush=True)
        out["settings"].append(row)
    engine.defer_stop_check = True
    return out


def _has_deferred_stop_check() -> bool:
    try:
        from transformers.generation.utils import DeferredStopCheck  # noqa: F401
    except ImportError:
        return False
    return True


def bench_vllm(args, cfg, eos, prompts, sampling) -> dict:
    """Time :class:`rollout.vllm_engine.VLLMRolloutEngine` on the same prompts: created asleep, woken, called
    ``--engine-calls`` times (the first includes warm-up); also one sleep + wake cycle (seconds)."""
    from rollout.vllm_engine import VLLMRolloutEngine

    folder = args.model or save_random_model(args.random, tempfile.mkdtemp(prefix="bench_vllm_"))
    t0 = time.perf_counter()
    engine = VLLMRolloutEngine(folder, eos_token_id=eos, gpu_memory_utilization=args.vllm_gpu_util,
                               max_model_len=args.max_prompt + args.new_tokens + 16, load_format="auto", seed=0)
    build_s = time.perf_counter() - t0
    engine.wake_up()
    times = []
    for _ in range(args.engine_calls):
        _sync(); t0 = time.perf_counter()
        out = engine.generate(prompts, sampling)
        _sync(); times.append(time.perf_counter() - t0)
    _sync(); t0 = time.perf_counter()
    engine.sleep(1)
    engine.wake_up()
    _sync(); cycle = time.perf_counter() - t0
    tokens = int(out.response_mask.sum())
    row = dict(name="VLLMRolloutEngine (CUDA graphs)", seconds=times[-1], tokens=tokens, tok_per_s=tokens / times[-1],
               first_call_s=times[0], build_s=build_s, sleep_wake_s=cycle, all_calls_s=times,
               gpu_memory_utilization=args.vllm_gpu_util)
    print(row, flush=True)
    engine.sleep(1)
    return row


def profile_generate(engine, prompts, sampling, top: int = 15) -> dict:
    """Profile one ``engine.generate`` call; print and return the ``top`` ops by self device time (CPU time on
    CPU): ``{"wall_s", "ops": [{"name", "self_s", "calls"}]}``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        _sync(); t0 = time.perf_counter()
        engine.generate(prompts, sampling)
        _sync(); wall = time.perf_counter() - t0
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    avg = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    ops = [dict(name=e.key[:90], self_s=getattr(e, key) / 1e6, calls=e.count) for e in avg]
    print(f"profiled call: {wall:.2f} s wall; top ops by {key}:")
    for o in ops:
        print(f"  {o['self_s']:8.3f} s {o['calls']:7d}  {o['name']}")
    return dict(wall_s=wall, ops=ops)


@torch.no_grad()
def plain_generate(model, prompts, sampling, eos, device) -> dict:
    """``model.generate`` with the dynamic cache, one batch of all rows (prompt-major), left padding."""
    from transformers import GenerationConfig

    rows = [p for p in prompts for _ in range(sampling.n)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), eos, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gc = GenerationConfig(do_sample=True, temperature=sampling.temperature, top_k=0, max_new_tokens=sampling.max_new_tokens,
                          eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    _sync(); t0 = time.perf_counter()
    seq = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gc)
    _sync(); dt = time.perf_counter() - t0
    gen = seq[:, width:].cpu()
    out = finalize_responses(gen, torch.zeros(gen.shape), [eos], eos, sampling.max_new_tokens)
    tokens = int(out.response_mask.sum())
    return dict(name="plain generate (dynamic cache)", seconds=dt, tokens=tokens, tok_per_s=tokens / dt)


def _zero3_actor(cfg, device: str):
    """A random-weight model wrapped by DeepSpeed ZeRO-3 (bf16 on CUDA) with the trainer's own ds_config.

    World size and rank come from the environment (``torchrun --nproc_per_node K``); without it, one process.
    Returns the engine's ``.module`` (parameters are empty placeholders until gathered)."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    from trainer.workers.base import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    ds_cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": device == "cuda"},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True}
    torch.manual_seed(0)  # same weights on every rank; deepspeed.initialize partitions them
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_cfg)
    return engine.module


def bench_sync(args, device) -> dict:
    """Stream a random-weight Qwen2-1.5B from the actor into a bf16 engine; seconds per full sync.

    ``--zero3``: the actor is a DeepSpeed ZeRO-3 engine (fp32 master partitions, bf16 compute copies), so every
    bucket is gathered with one ``GatheredParameters`` call over all ranks before ``load_weights``; otherwise a
    plain bf16 module on the same device (the ZeRO-0/1/2 path, no gather)."""
    from transformers import AutoModelForCausalLM

    cfg = Qwen2Config(**QWEN2_1_5B)
    stage = 3 if args.zero3 else 0
    if args.zero3:
        actor = _zero3_actor(cfg, device)
    else:
        with torch.device(device):
            actor = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    engine = HFRolloutEngine(cfg, device=device, dtype=torch.bfloat16)
    nbytes = sum(p.numel() for p in engine.model.parameters()) * 2  # bytes landed in the bf16 engine
    times, calls = [], 0
    for _ in range(args.sync_repeats):
        _sync(); t0 = time.perf_counter()
        calls = sync_weights(engine, iter_actor_params(actor, stage, args.bucket_mb * 2**20), args.bucket_mb * 2**20)
        _sync(); times.append(time.perf_counter() - t0)
    got = engine.model.state_dict()
    ok = True
    for bucket in iter_actor_params(actor, stage, args.bucket_mb * 2**20):
        ok = ok and all(torch.equal(t.to(torch.bfloat16), got[n]) for n, t in bucket)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    name = f"weight sync Qwen2-1.5B ZeRO-{stage}" + (f" ({world} ranks)" if args.zero3 else " bf16")
    return dict(name=name, seconds=min(times), all_s=times, load_weights_calls=calls, zero_stage=stage,
                world_size=world, gib=nbytes / 2**30, gib_per_s=nbytes / 2**30 / min(times),
                bucket_mb=args.bucket_mb, equal=ok)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="HF model folder (e.g. SmolLM2-135M-Instruct); default: --random")
    ap.add_argument("--random", default="smollm2", choices=sorted(RANDOM), help="random-weight shape without --model")
    ap.add_argument("--engine", default="hf", help="engines to time, comma-separated: hf, vllm")
    ap.add_argument("--vllm-gpu-util", type=float, default=0.5, help="vLLM's gpu_memory_utilization")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--attn", default="sdpa", help="engine attention backend(s), comma-separated, timed one after "
                    "the other in this process (e.g. sdpa,sdpa_gqa; rollout.attn_implementation)")
    ap.add_argument("--engine-calls", type=int, default=2)
    ap.add_argument("--decode-loop", default="generate",
                    help="the transformers engine's decode loop(s), comma-separated, timed one after the other on the "
                    "same engine: generate (transformers' generate), graph (one compiled function per decode step; "
                    "rollout.decode_loop)")
    ap.add_argument("--compile-regions", action="store_true", help="graph loop: one compiled decoder layer for all "
                    "(rollout.decode_compile_regions; run with an empty TORCHINDUCTOR_CACHE_DIR to time compiling)")
    ap.add_argument("--decode-ab", action="store_true", help="time the transformers engine with generate's stop "
                    "flag read after every token and one step late (--engine-calls calls each)")
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--skip-plain", action="store_true")
    ap.add_argument("--skip-gen", action="store_true")
    ap.add_argument("--skip-sync", action="store_true")
    ap.add_argument("--zero3", action="store_true",
                    help="sync from a DeepSpeed ZeRO-3 actor (run under torchrun for several ranks)")
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument("--sleep-wake", action="store_true", help="also time --engine-calls calls, each after a "
                    "sleep/wake cycle (the training loop's order)")
    ap.add_argument("--sleep-level", type=int, default=1, choices=(1, 2), help="--sleep-wake's level "
                    "(rollout.sleep_level: 2 frees the weights too, which are loaded again after each wake)")
    ap.add_argument("--profile", action="store_true", help="profile one more engine call; print the top ops")
    ap.add_argument("--profile-rows", type=int, default=15, help="ops listed by --profile")
    ap.add_argument("--out", default="bench_rollout.json")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    results = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", args=vars(args), rows=[])
    if not args.skip_gen:
        results["rows"] += bench_generation(args, device, dtype)
    if not args.skip_sync:
        results["rows"].append(bench_sync(args, device))
        print(results["rows"][-1], flush=True)
    print(f"\n{'what':68s} {'tok/s':>10s} {'seconds':>9s} {'compile s':>10s} {'ms/step':>8s}")
    for r in results["rows"]:
        for setting in r.get("settings", []):  # --decode-ab
            name = f"  stop flag read {'one step late' if setting['defer_stop_check'] else 'after every token'}"
            print(f"{name:68s} {setting['tok_per_s']:>10.0f} {setting['mean_s']:9.3f} "
                  f"{'records ' + str(setting['cudagraph_records_per_call']):>10s}")
        if "seconds" in r:
            tps = f"{r['tok_per_s']:.0f}" if "tok_per_s" in r else "-"
            step = f"{r['ms_per_decode_step']:.2f}" if "ms_per_decode_step" in r else "-"
            print(f"{r['name']:68s} {tps:>10s} {r['seconds']:9.3f} {r.get('compile_s', 0):10.1f} {step:>8s}")
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
