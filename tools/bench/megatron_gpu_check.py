"""Megatron actor vs Hugging Face on GPU: log-probs at TP=1 and TP=2 (bf16 and fp32), one update through megatron's
DDP + DistributedOptimizer, the rollout weight sync and a checkpoint round trip. Prints a table, writes JSON.

    torchrun --nproc_per_node 2 tools/bench/megatron_gpu_check.py --model /tmp/smol_hf --out $OUT/megatron.json

Cases (each run through ``MegatronActorRefWorker`` exactly as ``trainer.strategy=megatron`` builds it):

* ``hf_model`` (``--model``, e.g. SmolLM2-135M: a Llama with tied embeddings), in bf16 on CUDA: TP=1, and TP=2
  only when 2 divides its head counts. SmolLM2 has 9 heads and 3 KV heads, so its TP=2 case is skipped (TP=3
  would divide them; it needs 3 GPUs), said so in the output.
* ``qwen2_rand``: a random-weight Qwen2 config (8 heads, 2 KV heads, q/k/v bias, untied head) with the same
  tokenizer, at TP=1 and TP=2 (TP=2 needs 2 processes), in bf16 and fp32.

Per case: log-probs of the worker (``compute_log_prob``) against HF fp32 and HF in the case dtype on the same
GPU (padded forward, SDPA). Tolerances (mean/max over valid response tokens):

* fp32 (TF32 off): max |megatron - HF fp32| <= 1e-3.
* bf16: mean |megatron - HF fp32| <= 2 * mean |HF bf16 - HF fp32| + 1e-3 (Megatron's bf16 error no larger than
  twice HF's own bf16 error). mean |megatron - HF bf16| and the max differences are reported, not judged: two bf16
  implementations each err by about mean |HF bf16 - HF fp32| in their own way, so their distance to each other
  grows with depth like that error (SmolLM2's 30 layers, 2026-11-30: 0.064 against HF bf16's own 0.056). An earlier
  version also required mean |megatron - HF bf16| <= 3e-2, which SmolLM2 failed for that reason.

Then ``update_actor`` once (finite grad norm, weights change), ``generate_sequences`` (the engine holds exactly
the TP-gathered actor weights) and save -> update -> load -> update: both updates' pg_loss (checks the weights),
and the weights after each of the two updates (checks the optimizer state too: max abs difference <= 1e-6 in
fp32; in bf16 <= 1e-2, which only catches gross errors because bf16 weights move in ulps). Exit code 0 when every
judged check passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != os.path.dirname(os.path.abspath(__file__))]
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

B, P, R, N = 8, 48, 32, 4
# weights after save->update vs load->update: the same computation on the same GPU, so equal up to reduction
# order; bf16 weights move in steps of one bf16 ulp (2^-8 relative) when an fp32 main weight crosses a rounding edge
RESUME_WEIGHT_ATOL = {"fp32": 1e-6, "bf16": 1e-2}


def _config(model_dir: str, out_dir: str, tp: int, dtype: str, world: int, device: str) -> dict:
    """The resolved run config of the check (the worker gets its :func:`trainer.config.workers.actor_worker_config`)."""
    from hydra import compose, initialize_config_dir

    from trainer.launch import resolve_config

    dp = world // tp
    mini = 2 * B * dp // N  # every rank holds the whole batch of 2*B rows = one mini-batch
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        c = compose("ppo_trainer", overrides=[
            "trainer.strategy=megatron", f"trainer.device={device}", f"trainer.n_gpus_per_node={world}",
            f"trainer.output_dir={out_dir}", f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
            f"actor_rollout_ref.actor.megatron.bf16={'true' if dtype == 'bf16' else 'false'}",
            "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            f"data.train_batch_size={mini}", "actor_rollout_ref.actor.optim.lr=1e-5",
            "actor_rollout_ref.rollout.static_cache=false", f"data.max_prompt_length={P}",
            f"data.max_response_length={R}", "trainer.total_training_steps=4"])
    return resolve_config(c)


def _batch(vocab: int, rows: int, seed: int):
    from trainer.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, P + R), generator=g)
    mask = torch.ones(rows, P + R, dtype=torch.long)
    for i in range(rows):
        mask[i, :(i * 5) % 17] = 0               # left padding of the prompt
        mask[i, P + R - (i * 3) % 11:] = 0       # right padding of the response
    pos = torch.clamp(mask.cumsum(1) - 1, min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos,
                                "responses": ids[:, P:], "response_mask": mask[:, P:].float()})


def _hf_log_probs(model_dir: str, d, dtype: torch.dtype, device) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from trainer.forward import forward_log_probs

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    with torch.no_grad():
        lp, _ = forward_log_probs(hf, d["input_ids"].to(device), d["attention_mask"].to(device),
                                  d["position_ids"].to(device), R, use_remove_padding=False)
    del hf
    return lp.float().cpu()


def _diff(a: torch.Tensor, b: torch.Tensor, m: torch.Tensor) -> tuple[float, float]:
    x = (a[m] - b[m]).abs()
    return float(x.max()), float(x.mean())


def make_random_qwen2(out_dir: str, tokenizer_dir: str | None) -> str:
    """A random-weight Qwen2 folder (8 heads, 2 KV heads: TP=2 divides them) with ``tokenizer_dir``'s tokenizer
    (or the project's embedded tokenizer). Written by rank 0; fp32 safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    if tokenizer_dir:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        from trainer.embedded import build_tokenizer

        tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    tmp = out_dir + f".tmp{os.getpid()}"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir)  # other ranks wait for the folder; it appears complete
    return out_dir


def run_case(name: str, model_dir: str, tp: int, dtype: str, world: int, rank: int, local_rank: int,
             addr: str, port: int, device: str, work: str) -> dict:
    from megatron.core import parallel_state as ps

    from trainer.protocol import DataProto
    from trainer.workers.megatron_actor import MegatronActorRefWorker

    from trainer.config.workers import actor_worker_config

    cfg = actor_worker_config(_config(model_dir, os.path.join(work, f"{name}_tp{tp}_{dtype}"), tp, dtype, world,
                                      device))
    w = MegatronActorRefWorker(cfg, rank, world, addr, port, device=device)
    os.environ["LOCAL_RANK"] = str(local_rank)  # the worker assumes one visible GPU (Ray); torchrun shows all
    t0 = time.perf_counter()
    w.init_model()
    vocab = w.shape.vocab_size
    d = _batch(vocab, 2 * B, seed=0)
    lp = w.compute_log_prob(d)["old_log_probs"]
    m = d["response_mask"].bool()
    dev = w.device
    ref32 = _hf_log_probs(model_dir, d, torch.float32, dev)
    res = {"case": name, "tp": tp, "dtype": dtype, "world": world}
    res["max_vs_fp32"], res["mean_vs_fp32"] = _diff(lp, ref32, m)
    if dtype == "bf16":
        ref16 = _hf_log_probs(model_dir, d, torch.bfloat16, dev)
        res["max_vs_hf_bf16"], res["mean_vs_hf_bf16"] = _diff(lp, ref16, m)
        res["hf_bf16_mean_vs_fp32"] = _diff(ref16, ref32, m)[1]
        res["logprob_ok"] = res["mean_vs_fp32"] <= 2 * res["hf_bf16_mean_vs_fp32"] + 1e-3
    else:
        res["logprob_ok"] = res["max_vs_fp32"] <= 1e-3
    # one update through megatron DDP + DistributedOptimizer
    d.union(w.compute_log_prob(d).select(["old_log_probs"]))
    d.union(w.compute_ref_log_prob(d))
    d["advantages"] = torch.randn(len(d), R, generator=torch.Generator().manual_seed(1))
    before = w.hf_state_dict()
    met = w.update_actor(d)
    after = w.hf_state_dict()
    res["grad_norm"] = met["actor/grad_norm"][0]
    res["pg_loss"] = met["actor/pg_loss"][0]
    res["update_ok"] = bool(torch.isfinite(torch.tensor(met["actor/grad_norm"])).all()) and any(
        not torch.equal(before[k], after[k]) for k in after)
    # rollout weight sync
    pr = _batch(vocab, 2, seed=2)
    w.generate_sequences(DataProto.from_dict({"input_ids": pr["input_ids"][:, :P],
                                              "attention_mask": pr["attention_mask"][:, :P]}))
    eng = dict(w.engine.model.named_parameters())
    res["sync_ok"] = all(torch.equal(eng[k].detach().cpu().to(v.dtype), v) for k, v in after.items())
    # checkpoint round trip (DistributedOptimizer parameter state included)
    # (a failure here is recorded, not raised, so the numbers above survive: every rank fails alike)
    ck = os.path.join(work, f"ckpt_{name}_tp{tp}_{dtype}", "global_step_1", "actor")
    try:
        w.save_checkpoint(ck)
        a = w.update_actor(d)["actor/pg_loss"]
        w_a = w.hf_state_dict()
        w.load_checkpoint(ck)
        b = w.update_actor(d)["actor/pg_loss"]
        w_b = w.hf_state_dict()
        res["resume_pg_loss"] = [a, b]
        res["resume_max_abs_diff"] = max(abs(x - y) for x, y in zip(a, b))
        # the weights after the update that follows the load must equal those after the update that followed the
        # save: this also checks the optimizer state (moments and Adam's step count), not only the weights
        res["resume_weight_max_abs_diff"] = max((w_a[k].float() - w_b[k].float()).abs().max().item() for k in w_a)
    except Exception as e:  # noqa: BLE001 - reported in the JSON and the table
        res["resume_error"] = f"{type(e).__name__}: {e}"[:300]
    res["seconds"] = time.perf_counter() - t0
    res["ok"] = bool(res["logprob_ok"] and res["update_ok"] and res["sync_ok"] and "resume_error" not in res
                     and res.get("resume_weight_max_abs_diff", 1.0) <= RESUME_WEIGHT_ATOL[dtype])
    del w
    ps.destroy_model_parallel()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF folder of SmolLM2-135M (or any Llama/Qwen2); optional")
    ap.add_argument("--out", required=True, help="JSON result path")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"], help="cpu: a smoke run (fp32)")
    args = ap.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if "LOCAL_WORLD_SIZE" in os.environ:  # started by torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    else:  # one process on a free port
        from trainer.workers.base import free_port

        rank, world, local_rank, addr, port = 0, 1, 0, "127.0.0.1", free_port()
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    work = os.environ.get("MEGATRON_CHECK_DIR") or os.path.join(tempfile.gettempdir(), "megatron_gpu_check")
    os.makedirs(work, exist_ok=True)
    qwen = os.path.join(work, "qwen2_rand")
    if rank == 0 and not os.path.isfile(os.path.join(qwen, "config.json")):
        make_random_qwen2(qwen, args.model)
    dtypes = ["bf16", "fp32"] if device == "cuda" else ["fp32"]
    cases, skipped = [], []
    if args.model:
        with open(os.path.join(args.model, "config.json")) as f:
            hc = json.load(f)
        heads, kv = hc["num_attention_heads"], hc.get("num_key_value_heads") or hc["num_attention_heads"]
        cases.append(("hf_model", args.model, 1, dtypes[0]))
        if heads % 2 or kv % 2 or world % 2:
            skipped.append(f"hf_model tp=2: {heads} heads / {kv} KV heads / {world} processes do not divide by 2 "
                           "(SmolLM2-135M: 9/3, TP=3 would divide them; qwen2_rand covers TP=2)")
        else:
            cases.append(("hf_model", args.model, 2, dtypes[0]))
    for tp in (1, 2):
        if world % tp:
            skipped.append(f"qwen2_rand tp={tp}: needs a multiple of {tp} processes (got {world})")
            continue
        cases += [("qwen2_rand", qwen, tp, dt) for dt in dtypes]
    results = []
    _wait_for(os.path.join(qwen, "config.json"))
    for name, path, tp, dt in cases:
        results.append(run_case(name, path, tp, dt, world, rank, local_rank, addr, port, device, work))
        if rank == 0:  # each case as soon as it ends, so a later crash does not lose it
            print("case result:", json.dumps(results[-1], default=str), flush=True)
    ok = all(r["ok"] for r in results)
    if rank == 0:
        cols = ("case", "tp", "dtype", "max_vs_fp32", "mean_vs_fp32", "max_vs_hf_bf16", "mean_vs_hf_bf16",
                "hf_bf16_mean_vs_fp32", "grad_norm", "resume_max_abs_diff", "resume_weight_max_abs_diff", "sync_ok",
                "resume_error", "ok")
        print(" | ".join(f"{c:>12}" for c in cols))
        for r in results:
            print(" | ".join(f"{r.get(c, '-'):>12.3e}" if isinstance(r.get(c), float) else f"{str(r.get(c, '-')):>12}"
                             for c in cols))
        for s in skipped:
            print("skipped:", s)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"ok": ok, "device": device, "world": world,
                       "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                       "results": results, "skipped": skipped}, f, indent=1)
        print(f"{'PASS' if ok else 'FAIL'}; wrote {args.out}")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0 if ok else 1


def _wait_for(path: str, timeout_s: float = 300.0) -> None:
    t0 = time.time()
    while not os.path.isfile(path):
        if time.time() - t0 > timeout_s:
            raise TimeoutError(f"{path!r} did not appear within {timeout_s:.0f} s (rank 0 writes it)")
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
