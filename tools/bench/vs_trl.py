"""The same GRPO job run by TRL's ``GRPOTrainer`` and by this project (``trainer/main.py``): samples/s of both.

Job (both frameworks, one GPU or one CPU process, transformers generation, no vLLM, no reference model/KL):
``--batch`` prompts per step x ``--n`` samples per prompt (group size), responses up to ``--response-len`` tokens,
one optimizer step per training step (TRL: ``per_device_train_batch_size=--micro`` rows x
``gradient_accumulation_steps = batch*n/micro``; ours: ``ppo_mini_batch_size = batch``,
``ppo_micro_batch_size_per_gpu = --micro``), AdamW at ``--lr`` (constant), temperature 1.0, std-normalised group
advantages (TRL ``scale_rewards="group"``, ours ``algorithm=grpo``), token-mean loss (TRL ``loss_type="dapo"``,
ours ``loss_agg_mode=token-mean``), ``num_iterations = ppo_epochs = 1``, ``beta = 0``. The reward is this
project's rule scorer for the row's ``data_source`` (GSM8K strict, or the synthetic task's flexible scorer), called
by both. Each framework runs in its own subprocess, one after the other.

Differences that remain (printed in the JSON ``notes``): TRL generates with ``model.generate`` on the training
model (``disable_compile=True``; ``--trl-cache-implementation static`` to try a static cache), ours with its
rollout engine (static cache + ``torch.compile`` on CUDA); TRL trains with HF Trainer's bf16 autocast over fp32
weights, ours with DeepSpeed ZeRO-2 bf16 (fp32 master weights); ours filters prompts longer than
``data.max_prompt_length``, TRL does not truncate prompts.

samples/s = (batch * n) / mean step seconds over steps 2..S (step 1 holds compilation and warm-up), from
``timing_s/step`` (ours) and the time between TRL's ``on_step_end`` callbacks (TRL); the whole-process wall time
(model loading, Ray start, ...) is reported too.

Usage:
    python tools/bench/vs_trl.py --model .models/smollm2-135m-instruct --data data/gsm8k/train.parquet \\
        --batch 16 --n 8 --response-len 256 --steps 6 --out vs_trl.json
    python tools/bench/vs_trl.py --tiny --out /tmp/vs_trl.json     # CPU: embedded tiny model + synthetic task
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)


# ------------------------------------------------------------------------------------------------ TRL child
def _load_rows(path: str, max_rows: int | None):
    import datasets

    kind = "parquet" if path.endswith(".parquet") else "json"
    ds = datasets.load_dataset(kind, data_files=path, split="train")
    if max_rows:
        ds = ds.select(range(min(max_rows, len(ds))))
    keep = ["prompt", "ground_truth", "data_source"]
    ds = ds.map(lambda r: {"prompt": [{"role": m["role"], "content": m["content"]} for m in r["prompt"]],
                           "ground_truth": str(r["reward_model"]["ground_truth"]), "data_source": r["data_source"]})
    return ds.remove_columns([c for c in ds.column_names if c not in keep])


def project_reward(completions, ground_truth, data_source, **_):
    """TRL reward function that scores with this project's rule scorer for each row's ``data_source``.

    Args: completions: list of str or of chat messages ``[{"role": "assistant", "content": str}]``.
    Returns: list of float rewards (a dict result contributes its ``score``)."""
    from rewards.registry import get_scorer

    out = []
    for c, gt, ds in zip(completions, ground_truth, data_source):
        text = c if isinstance(c, str) else c[-1]["content"]
        s = get_scorer(ds)(text, gt)
        out.append(float(s["score"] if isinstance(s, dict) else s))
    return out


def run_trl(job: dict) -> dict:
    """Run TRL's GRPOTrainer for ``job['steps']`` optimizer steps; returns step times and TRL's version."""
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = job["device"] == "cuda"
    tok = AutoTokenizer.from_pretrained(job["model"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    rows = job["batch"] * job["n"]
    ga = rows // job["micro"]
    cfg = GRPOConfig(output_dir=job["out_dir"], max_steps=job["steps"], per_device_train_batch_size=job["micro"],
                     gradient_accumulation_steps=ga, num_generations=job["n"],
                     max_completion_length=job["response_len"],
                     learning_rate=job["lr"], lr_scheduler_type="constant", warmup_steps=0, temperature=1.0,
                     top_p=1.0, top_k=0, beta=0.0, num_iterations=1, loss_type="dapo", scale_rewards="group",
                     bf16=cuda, use_cpu=not cuda, report_to="none", save_strategy="no", logging_steps=1,
                     seed=job["seed"], cache_implementation=job.get("trl_cache_implementation"),
                     dataloader_num_workers=0, remove_unused_columns=False)
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            times.append(now - self.t)
            self.t = now

    trainer = GRPOTrainer(model=model, reward_funcs=project_reward, args=cfg,
                          train_dataset=_load_rows(job["data"], job.get("max_rows")), processing_class=tok,
                          callbacks=[StepClock()])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    return dict(framework="trl", trl_version=trl.__version__, step_seconds=times,
                reward_mean=[h.get("reward") for h in logs],
                completion_length=[h.get("completions/mean_length") for h in logs])


# ------------------------------------------------------------------------------------------------ parent
def tiny_assets(out_dir: str) -> tuple[str, str]:
    """The embedded tiny model folder (random Llama, the project's word-level tokenizer) and the synthetic task
    (verl layout jsonl), as ``trainer/main.py`` builds them with no overrides; returns (model dir, train file)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import embedded

    model_dir = os.path.join(out_dir, "tiny_model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        tok = embedded.build_tokenizer(model_dir)
        torch.manual_seed(1)
        AutoModelForCausalLM.from_config(embedded.tiny_model_config(len(tok))).save_pretrained(model_dir)
    train, _ = embedded.write_task(os.path.join(out_dir, "data"), train_rows=512, val_rows=8)
    return model_dir, train


def ours_command(job: dict) -> list[str]:
    """The ``trainer/main.py`` command line with overrides matching ``job``."""
    data_group = "synthetic" if job["data"].endswith(".jsonl") else "gsm8k"
    return [sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"data={data_group}", "model=smollm2",
            f"actor_rollout_ref.model.path={os.path.abspath(job['model'])}",
            f"data.train_files={os.path.abspath(job['data'])}", "data.val_files=null",
            f"data.train_batch_size={job['batch']}", f"data.max_prompt_length={job['max_prompt_len']}",
            f"data.max_response_length={job['response_len']}", f"data.max_rows={job.get('max_rows') or 'null'}",
            f"actor_rollout_ref.rollout.n={job['n']}", f"actor_rollout_ref.actor.ppo_mini_batch_size={job['batch']}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={job['micro']}",
            f"actor_rollout_ref.actor.optim.lr={job['lr']}", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
            "actor_rollout_ref.actor.use_kl_loss=false", "algorithm=grpo", "rollout=hf",
            f"trainer.device={job['device']}", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
            f"trainer.cpus_per_worker={job.get('cpus', 1)}",
            f"trainer.total_training_steps={job['steps']}", f"trainer.seed={job['seed']}",
            "trainer.export_hf_on_end=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
            f"trainer.output_dir={os.path.join(job['out_dir'], 'ours')}"]


def _run(cmd: list[str], log: str, timeout: int) -> float:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        with open(log, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{cmd[1]} exited {proc.returncode}; log {log}:\n{tail}")
    return wall


def summarize(name: str, step_seconds: list[float], samples_per_step: int, wall: float) -> dict:
    """samples/s from step times, leaving out step 1 (warm-up) when there is more than one step."""
    used = step_seconds[1:] if len(step_seconds) > 1 else step_seconds
    mean = sum(used) / len(used) if used else float("nan")
    return dict(framework=name, steps=len(step_seconds), mean_step_s=mean, samples_per_s=samples_per_step / mean,
                first_step_s=step_seconds[0] if step_seconds else None, process_wall_s=wall,
                step_seconds=step_seconds)


def main(argv=None) -> dict:
    from tools.bench.common import print_table, run_meta, write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".models/smollm2-135m-instruct", help="HF model folder")
    ap.add_argument("--data", default="data/gsm8k/train.parquet", help="verl-layout parquet/jsonl (prompt, "
                    "reward_model.ground_truth, data_source)")
    ap.add_argument("--max-rows", type=int, default=None, help="use only the first N rows")
    ap.add_argument("--batch", type=int, default=16, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    ap.add_argument("--micro", type=int, default=16, help="rows per forward/backward")
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--max-prompt-len", type=int, default=256, help="ours: data.max_prompt_length")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trl-cache-implementation", default=None, help="TRL GRPOConfig.cache_implementation")
    ap.add_argument("--only", choices=["trl", "ours"], help="run one framework only")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per framework run")
    ap.add_argument("--work-dir", default=None, help="logs and run outputs (default: next to --out)")
    ap.add_argument("--tiny", action="store_true", help="CPU: embedded tiny model + synthetic task, 3 steps")
    ap.add_argument("--out", default="bench_vs_trl.json")
    ap.add_argument("--trl-child", help=argparse.SUPPRESS)  # internal: run TRL from a job JSON file
    args = ap.parse_args(argv)
    if args.trl_child:
        with open(args.trl_child, encoding="utf-8") as f:
            job = json.load(f)
        res = run_trl(job)
        with open(job["trl_result"], "w", encoding="utf-8") as f:
            json.dump(res, f)
        return res
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    work = os.path.abspath(args.work_dir or os.path.splitext(os.path.abspath(args.out))[0] + "_work")
    os.makedirs(work, exist_ok=True)
    if args.tiny:
        from tools.bench.common import apply_tiny

        model, data = tiny_assets(work)
        apply_tiny(args, ap, model=model, data=data, batch=4, n=4, micro=8, response_len=4, max_prompt_len=16,
                   steps=3, lr=1e-3)
        device = args.device or "cpu"
    for name, p in (("--model", os.path.join(args.model, "config.json")), ("--data", args.data)):
        if not os.path.exists(p):
            raise SystemExit(f"error: {name}: {p} not found")
    if (args.batch * args.n) % args.micro:
        raise SystemExit(f"error: --micro ({args.micro}) must divide batch*n ({args.batch * args.n})")
    job = dict(model=args.model, data=args.data, max_rows=args.max_rows, batch=args.batch, n=args.n,
               micro=args.micro, response_len=args.response_len, max_prompt_len=args.max_prompt_len, lr=args.lr,
               steps=args.steps, seed=args.seed, device=device, out_dir=work, cpus=1 if device == "cpu" else 4,
               trl_cache_implementation=args.trl_cache_implementation,
               trl_result=os.path.join(work, "trl_result.json"))
    rows, spp = [], args.batch * args.n
    if args.only in (None, "trl"):
        job_path = os.path.join(work, "trl_job.json")
        with open(job_path, "w", encoding="utf-8") as f:
            json.dump(job, f)
        wall = _run([sys.executable, os.path.abspath(__file__), "--trl-child", job_path],
                    os.path.join(work, "trl.log"), args.timeout)
        with open(job["trl_result"], encoding="utf-8") as f:
            trl_res = json.load(f)
        rows.append(dict(summarize("trl", trl_res["step_seconds"], spp, wall), version=trl_res["trl_version"],
                         reward_mean=trl_res["reward_mean"]))
    if args.only in (None, "ours"):
        cmd = ours_command(job)
        wall = _run(cmd, os.path.join(work, "ours.log"), args.timeout)
        with open(os.path.join(work, "ours", "metrics.jsonl"), encoding="utf-8") as f:
            metrics = [json.loads(line) for line in f if line.strip()]
        steps = [m["timing_s/step"] for m in metrics if "timing_s/step" in m]
        rows.append(dict(summarize("ours", steps, spp, wall), command=" ".join(cmd),
                         reward_mean=[m.get("critic/score/mean") for m in metrics if "timing_s/step" in m]))
    ratio = None
    if len(rows) == 2:
        ratio = rows[1]["samples_per_s"] / rows[0]["samples_per_s"]
    print_table(rows, ["framework", "steps", "mean_step_s", "samples_per_s", "first_step_s", "process_wall_s"],
                title=f"GRPO samples/s, {spp} samples/step ({device})")
    if ratio is not None:
        print(f"ours / trl samples/s ratio: {ratio:.3f}")
    notes = ["TRL: model.generate (disable_compile=True) on the training model; ours: rollout engine "
             "(static cache + torch.compile on CUDA, dynamic cache on CPU)",
             "TRL: HF Trainer bf16 autocast (CUDA) over fp32 weights; ours: DeepSpeed ZeRO-2, bf16 with fp32 master",
             "step 1 is left out of samples/s (compilation, warm-up)"]
    doc = dict(meta=run_meta(args, machine=None), job=job, results=rows, ratio_ours_over_trl=ratio, notes=notes)
    write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
