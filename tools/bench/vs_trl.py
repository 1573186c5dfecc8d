"""The same GRPO job run by TRL's ``GRPOTrainer`` and by this project (``trainer/main.py``), side by side.

Sides (``--sides``, run one after the other, each in its own subprocess, on one GPU or one CPU process):

- ``trl``: TRL ``GRPOTrainer``, generation with ``model.generate`` on the training model;
- ``trl_vllm``: TRL with its colocated vLLM (``use_vllm=True``, ``vllm_mode="colocate"``,
  ``vllm_enable_sleep_mode=True``, ``vllm_gpu_memory_utilization=--trl-vllm-gpu-util``);
- ``ours_hf`` / ``ours_vllm``: ``trainer/main.py`` with ``rollout=hf`` (transformers engine, static cache +
  ``torch.compile`` on CUDA) or ``rollout=vllm`` (``rollout.gpu_memory_utilization=--vllm-gpu-util``).

``--trl-vllm`` and ``--engine hf|vllm|hf,vllm`` pick the sides when ``--sides`` is not given.

The job (every side): ``--batch`` prompts per step x ``--n`` samples (group size), responses up to
``--response-len`` tokens, one optimizer step per training step (TRL: ``per_device_train_batch_size=--micro`` x
``gradient_accumulation_steps = batch*n/micro``; ours: ``ppo_mini_batch_size = batch``,
``ppo_micro_batch_size_per_gpu = --micro``), AdamW at ``--lr`` (constant), temperature 1.0, std-normalised group
advantages (TRL ``scale_rewards="group"``, ours ``algorithm=grpo``), token-mean loss (TRL ``loss_type="dapo"``,
ours ``loss_agg_mode=token-mean``), one PPO epoch, no reference model or KL (``beta=0``). Rewards: this project's
rule scorer for the row's ``data_source``, called by both. Both keep only prompts of at most
``--max-prompt-len`` tokens.

``--random-config qwen2-1.5b|smollm2``: the model is a random-weight one of that architecture, built here on the
CPU and saved as an HF folder (``tools/bench/random_model.py``) with ``--tokenizer``'s tokenizer (default: the
``--model`` folder's), the config's vocabulary set to the tokenizer's length. ``--ignore-eos`` (default on with
``--random-config``): every response exactly ``--response-len`` tokens: TRL through ``generation_kwargs``
(``min_tokens`` / ``min_new_tokens``), ours through ``actor_rollout_ref.rollout.ignore_eos`` when this checkout's
rollout config has that key (otherwise ours stops at EOS, which random weights almost never sample; the measured
tokens per step show any difference).

Reported per side (one JSON, ``--out``; a markdown table beside it, ``<out>.md``; a stacked bar chart of the step
split, ``<out>_split.png``): samples/s, generated and trained tokens/s, the mean step split (ours: its
``timing_s/*`` keys; TRL: timers around its methods, ``tools/bench/vs_trl_child.py`` says what each covers), peak
GPU memory (the whole device, sampled from this process every 0.1 s by NVML or ``nvidia-smi``; and the side's
PyTorch allocator peak), and the actor update's MFU. Step 1 (compilation, warm-up) is left out of every mean; the
whole-process wall time is reported too. The JSON is rewritten after each side, so a run cut short keeps the
sides that finished.

Usage:
    python tools/bench/vs_trl.py --model /tmp/smol_hf --data data/gsm8k/train.parquet --batch 16 --n 8 \\
        --micro 64 --response-len 256 --sides trl_vllm,ours_hf,ours_vllm --steps 6 --out vs_trl.json
    python tools/bench/vs_trl.py --model /tmp/smol_hf --random-config qwen2-1.5b --data data/gsm8k/train.parquet \\
        --batch 64 --n 8 --micro 8 --response-len 512 --sides trl_vllm,ours_vllm --steps 3 --out qwen.json
    python tools/bench/vs_trl.py --tiny --out /tmp/vs_trl.json     # CPU: embedded tiny model + synthetic task
    python tools/bench/vs_trl.py --report-from vs_trl.json --out vs_trl.json   # table + plot again
    python tools/bench/vs_trl.py --report-from trl.json,ours.json --out qwen.json   # sides of separate calls
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

# side -> (framework, generation engine)
SIDES = {"trl": ("trl", "transformers"), "trl_vllm": ("trl", "vllm"), "ours_hf": ("ours", "hf"),
         "ours_vllm": ("ours", "vllm")}
# set for the vLLM sides unless the environment has them: FlashInfer's sampler off (absent on some machines),
# vLLM's engine in the calling process (colocation: the trainer writes the weights into its model)
VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# TRL's colocated vLLM joins a torch.distributed group of one process
TRL_DIST_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29513"}


def resolve_sides(sides: str | None, trl_vllm: bool = False, engine: str | None = None) -> list[str]:
    """The sides to run, in order. ``sides``: comma list of :data:`SIDES` keys; otherwise TRL
    (``trl_vllm`` when ``trl_vllm``) then ours with each engine of ``engine`` (comma list, default ``hf``).

    Raises: ValueError for an unknown side or engine, a repeated side, or ``sides`` given with the others."""
    if sides:
        if trl_vllm or engine:
            raise ValueError("give either --sides or --trl-vllm/--engine, not both")
        out = [s.strip() for s in sides.split(",") if s.strip()]
    else:
        engines = [e.strip() for e in (engine or "hf").split(",") if e.strip()]
        bad = [e for e in engines if e not in ("hf", "vllm")]
        if bad:
            raise ValueError(f"--engine {bad[0]!r}: expected hf, vllm or hf,vllm")
        out = ["trl_vllm" if trl_vllm else "trl"] + [f"ours_{e}" for e in engines]
    unknown = [s for s in out if s not in SIDES]
    if unknown or not out or len(set(out)) != len(out):
        raise ValueError(f"--sides {sides!r}: expected distinct names from {sorted(SIDES)}")
    return out


def side_env(side: str, environ: dict | None = None, profile_steps: str | None = None) -> dict:
    """Environment variables the bench sets for ``side`` (values already in ``environ`` win): :data:`VLLM_ENV`
    for vLLM sides, :data:`TRL_DIST_ENV` for ``trl_vllm``, and for ours ``DSRL_PROFILE_STEPS=profile_steps`` when
    given (``--ours-profile-steps``: those steps' worker calls under ``torch.profiler``,
    :mod:`trainer.workers.profiling`)."""
    environ = os.environ if environ is None else environ
    want = dict(VLLM_ENV) if SIDES[side][1] == "vllm" else {}
    if side == "trl_vllm":
        want.update(TRL_DIST_ENV)
    if profile_steps and SIDES[side][0] == "ours":
        want["DSRL_PROFILE_STEPS"] = profile_steps
    return {k: environ.get(k, v) for k, v in want.items()}


def ours_ignore_eos_key(engine: str) -> bool:
    """Whether ``configs/rollout/<engine>.yaml`` of this checkout has an ``ignore_eos`` key."""
    from omegaconf import OmegaConf

    path = os.path.join(ROOT, "configs", "rollout", f"{engine}.yaml")
    return os.path.exists(path) and "ignore_eos" in OmegaConf.load(path)


def ours_command(job: dict, engine: str = "hf") -> list[str]:
    """The ``trainer/main.py`` command line with overrides matching ``job``, generating with ``engine``
    (``hf`` or ``vllm``; vLLM with ``rollout.gpu_memory_utilization = job["ours_vllm_gpu_util"]``), then
    ``job["ours_overrides"]`` (Hydra overrides given with ``--ours-override``; the last value of a key wins)."""
    data_group = "synthetic" if job["data"].endswith(".jsonl") else "gsm8k"
    cmd = [sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"data={data_group}", "model=smollm2",
           f"actor_rollout_ref.model.path={os.path.abspath(job['model'])}",
           f"data.train_files={os.path.abspath(job['data'])}", "data.val_files=null",
           f"data.train_batch_size={job['batch']}", f"data.max_prompt_length={job['max_prompt_len']}",
           f"data.max_response_length={job['response_len']}", f"data.max_rows={job.get('max_rows') or 'null'}",
           f"actor_rollout_ref.rollout.n={job['n']}", f"actor_rollout_ref.actor.ppo_mini_batch_size={job['batch']}",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={job['micro']}",
           f"actor_rollout_ref.actor.optim.lr={job['lr']}", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
           "actor_rollout_ref.actor.use_kl_loss=false", "algorithm=grpo", f"rollout={engine}",
           f"trainer.device={job['device']}", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
           f"trainer.cpus_per_worker={job.get('cpus', 1)}",
           f"trainer.total_training_steps={job['steps']}", f"trainer.seed={job['seed']}",
           "trainer.export_hf_on_end=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
           f"trainer.output_dir={os.path.join(job['out_dir'], f'ours_{engine}')}"]
    if engine == "vllm":
        cmd.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={job['ours_vllm_gpu_util']}")
    if job.get("ignore_eos") and ours_ignore_eos_key(engine):
        cmd.append("actor_rollout_ref.rollout.ignore_eos=true")
    return cmd + list(job.get("ours_overrides") or [])


class SideTimeout(RuntimeError):
    """A side's process ran past its time limit (it may have finished its steps and been stopped in shut-down)."""


#: seconds a side's session has after SIGINT at its timeout (the trainer shuts Ray down) before SIGKILL
SIGINT_GRACE_S = 15.0


def _run(cmd: list[str], log: str, timeout: int, env_extra: dict | None = None) -> float:
    """Run ``cmd`` in its own session with output to ``log``; returns wall seconds. On timeout the session gets
    SIGINT (the trainer shuts Ray down), then SIGKILL after :data:`SIGINT_GRACE_S`. Raises RuntimeError on a
    non-zero exit or a timeout (:class:`SideTimeout`; the message holds the log's tail)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           **(env_extra or {})}
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc, why = proc.wait(timeout=timeout), "exited"
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGINT, SIGINT_GRACE_S), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
            rc, why = proc.returncode, f"timed out after {timeout} s,"
    wall = time.perf_counter() - t0
    if rc != 0 or why != "exited":
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        kind = SideTimeout if why != "exited" else RuntimeError
        raise kind(f"{os.path.basename(cmd[1])} {why} {rc}; log {log}:\n{tail}")
    return wall


def _run_finished(cmd: list[str], log: str, timeout: int, env_extra: dict | None, done,
                  partial=None) -> tuple[float, str | None]:
    """:func:`_run`, except that a timeout after ``done()`` became true (every step written) is kept as a result,
    and so is one after ``partial()`` became true (some steps written: a side stopped at its budget keeps them):
    returns (wall seconds, a note saying where the process was stopped, or None)."""
    try:
        return _run(cmd, log, timeout, env_extra), None
    except SideTimeout:
        if done():
            return float(timeout), f"all steps written; stopped after {timeout} s while shutting down"
        if partial is not None and partial():
            return float(timeout), f"stopped at its time limit ({timeout} s) before its last step"
        raise


def _run_trl_side(side: str, job: dict, work: str, timeout: int) -> tuple[list[dict], dict, float]:
    sjob = dict(job, use_vllm=SIDES[side][1] == "vllm", out_dir=os.path.join(work, side),
                trl_result=os.path.join(work, f"{side}_result.json"))
    path = os.path.join(work, f"{side}_job.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(sjob, f)
    wall, note = _run_finished([sys.executable, os.path.abspath(__file__), "--trl-child", path],
                               os.path.join(work, f"{side}.log"), timeout, side_env(side),
                               lambda: os.path.exists(sjob["trl_result"]))
    with open(sjob["trl_result"], encoding="utf-8") as f:
        res = json.load(f)
    extra = dict(version=f"trl {res['trl_version']}", grpo_config=res["config"], reward_mean=res["reward_mean"],
                 peak_torch_allocated_gib=res["peak_torch_allocated_gib"],
                 peak_torch_reserved_gib=res["peak_torch_reserved_gib"], **({"note": note} if note else {}))
    return res["steps"], extra, wall


def _run_ours_side(side: str, job: dict, work: str, timeout: int) -> tuple[list[dict], dict, float]:
    from tools.bench.vs_trl_report import ours_steps

    engine = SIDES[side][1]
    cmd = ours_command(dict(job, out_dir=work), engine)
    metrics = os.path.join(work, f"ours_{engine}", "metrics.jsonl")

    def read() -> list[dict]:
        with open(metrics, encoding="utf-8") as f:
            return ours_steps([json.loads(line) for line in f if line.strip()], job["batch"] * job["n"])

    def written() -> int:
        try:
            return len(read())
        except (OSError, ValueError, KeyError):
            return 0

    wall, note = _run_finished(cmd, os.path.join(work, f"{side}.log"), timeout,
                               side_env(side, profile_steps=job.get("ours_profile_steps")),
                               lambda: written() >= job["steps"], lambda: written() >= 1)
    steps = read()
    if len(steps) < job["steps"]:
        note = f"{note or 'exited'}: {len(steps)} of {job['steps']} steps written, those kept"
    peak = lambda k: max((s[k] for s in steps if s[k] is not None), default=None)
    extra = dict(command=" ".join(cmd), reward_mean=[s["reward"] for s in steps],
                 peak_torch_allocated_gib=peak("peak_torch_allocated_gib"),
                 peak_torch_reserved_gib=peak("peak_torch_reserved_gib"), **({"note": note} if note else {}))
    return steps, extra, wall


def run_side(side: str, job: dict, work: str, timeout: int, hf_config=None) -> dict:
    """Run one side and return its row (:func:`tools.bench.vs_trl_report.summarize` plus framework, engine,
    memory, MFU, environment and log); a failed side gives ``{"side", "framework", "engine", "error", "log"}``."""
    from tools.bench.common import DeviceMemorySampler
    from tools.bench.vs_trl_report import summarize, update_mfu

    framework, engine = SIDES[side]
    base = dict(side=side, framework=framework, engine=engine,
                env=side_env(side, profile_steps=job.get("ours_profile_steps")),
                log=os.path.join(work, f"{side}.log"))
    runner = _run_trl_side if framework == "trl" else _run_ours_side
    sampler = DeviceMemorySampler() if job["device"] == "cuda" else None
    try:
        if sampler is not None:
            with sampler:
                steps, extra, wall = runner(side, job, work, timeout)
        else:
            steps, extra, wall = runner(side, job, work, timeout)
        row = dict(summarize(side, steps, job["batch"] * job["n"], wall), **base, **extra)
    except Exception as err:  # one side failing must not lose the others
        print(f"{side} failed: {err}", flush=True)
        return dict(base, error=str(err).splitlines()[0] if str(err) else repr(err))
    if sampler is not None:
        row.update(peak_gpu_used_gib=sampler.peak_gib, gpu_used_before_gib=sampler.baseline_gib,
                   gpu_memory_source=sampler.source)
    row["update_mfu"] = update_mfu(hf_config, row) if hf_config is not None and job["device"] == "cuda" else None
    return row


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


def notes(sides: list[str], job: dict) -> list[str]:
    """What differs between the sides and what each number covers, for the JSON's ``notes``."""
    out = ["step 1 is left out of every mean (compilation, warm-up); samples/s = batch*n / mean step seconds",
           "TRL trains HF Trainer's bf16 autocast (CUDA) over fp32 weights; ours DeepSpeed ZeRO-2, bf16 with fp32 "
           "master weights",
           "TRL step seconds: between on_step_end callbacks; ours: timing_s/step. TRL stages: exclusive timers around "
           "its methods (tools/bench/vs_trl_child.py); ours: trainer timers, with the engine's weight sync, "
           "wake-up and sleep (the worker's perf/rollout_s/* timers) taken out of 'gen'; detail_s: seconds inside "
           "the stages (the engine's generate call, each stage inside the worker)",
           "peak_gpu_used_gib: the whole device's memory in use (every process), sampled every 0.1 s; "
           "peak_torch_*: the side's PyTorch allocator (ours: the largest per-stage peak its workers log)"]
    if "trl" in sides:
        out.append("trl: model.generate on the training model (GenerationConfig disable_compile=True)")
    if "trl_vllm" in sides:
        out.append(f"trl_vllm: colocated vLLM, sleep mode (level 2 after each generation), gpu_memory_utilization "
                   f"{job['trl_vllm_gpu_util']}; TRL computes old log-probs for its vLLM importance-sampling "
                   "correction (its default)")
    if "ours_vllm" in sides:
        out.append(f"ours_vllm: rollout=vllm, gpu_memory_utilization {job['ours_vllm_gpu_util']}, sleep level 1")
    rnd = job.get("random_model")
    if rnd:
        out.append(f"random-weight {rnd['config']} architecture with the tokenizer of {rnd['tokenizer']}: "
                   f"vocab_size set to the tokenizer's length ({rnd['vocab_size']}), {rnd['parameters']:,} parameters")
    if job.get("ignore_eos"):
        out.append("ignore_eos: TRL generation_kwargs min_tokens (vLLM) / min_new_tokens (transformers) = response "
                   "length; ours " + ("actor_rollout_ref.rollout.ignore_eos=true" if all(
                       ours_ignore_eos_key(SIDES[s][1]) for s in sides if s.startswith("ours")) else
                       "has no rollout.ignore_eos key in this checkout: its responses end at EOS"))
    return out


def write_report(doc: dict, out: str) -> None:
    """``doc`` as JSON at ``out``, its markdown table at ``<out>.md`` (also printed), the split plot at
    ``<out>_split.png`` (when matplotlib is installed)."""
    from tools.bench.common import write_report_files
    from tools.bench.vs_trl_report import markdown, plot_split, ratios

    doc["ratios"] = ratios(doc["results"])
    write_report_files(doc, out, markdown(doc), plot_split, os.path.splitext(out)[0] + "_split.png")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".models/smollm2-135m-instruct", help="HF model folder")
    ap.add_argument("--random-config", help="random-weight model of this architecture (qwen2-1.5b, smollm2, ...)")
    ap.add_argument("--tokenizer", help="with --random-config: tokenizer folder (default: --model)")
    ap.add_argument("--random-dir", help="with --random-config: output folder (default: <work>/random_<name>)")
    ap.add_argument("--data", default="data/gsm8k/train.parquet", help="verl-layout parquet/jsonl (prompt, "
                    "reward_model.ground_truth, data_source)")
    ap.add_argument("--max-rows", type=int, default=None, help="use only the first N rows")
    ap.add_argument("--batch", type=int, default=16, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    ap.add_argument("--micro", type=int, default=16, help="rows per forward/backward")
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--max-prompt-len", type=int, default=256, help="longest prompt kept (tokens, chat template)")
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                    help="every response --response-len tokens (default: on with --random-config)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sides", help=f"comma list of {', '.join(SIDES)} (default: trl,ours_hf)")
    ap.add_argument("--trl-vllm", action="store_true", help="TRL side with colocated vLLM (without --sides)")
    ap.add_argument("--engine", help="ours' rollout engine(s) without --sides: hf, vllm or hf,vllm")
    ap.add_argument("--trl-vllm-gpu-util", type=float, default=0.3, help="TRL vllm_gpu_memory_utilization")
    ap.add_argument("--vllm-gpu-util", type=float, default=0.5, help="ours: rollout.gpu_memory_utilization")
    ap.add_argument("--ours-override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra trainer/main.py override for ours' sides (repeatable), e.g. "
                    "actor_rollout_ref.model.torch_compile_mode=reduce-overhead")
    ap.add_argument("--ours-profile-steps", default=None, metavar="N[,N]",
                    help="ours: run these steps' worker calls under torch.profiler (DSRL_PROFILE_STEPS; tables and "
                    "traces in <work>/ours_<engine>/profile/step_N, left out of the means)")
    ap.add_argument("--trl-cache-implementation", default=None, help="TRL GRPOConfig.cache_implementation")
    ap.add_argument("--peak-flops", type=float, default=989e12, help="per-GPU peak FLOP/s for the update MFU")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per side")
    ap.add_argument("--budget-s", type=int, default=None, help="seconds for all sides together: a side gets at "
                    "most what is left of it (and --timeout); a side with under 30 s left is not started")
    ap.add_argument("--work-dir", default=None, help="logs and run outputs (default: next to --out)")
    ap.add_argument("--tiny", action="store_true", help="CPU: embedded tiny model + synthetic task, 3 steps")
    ap.add_argument("--report-from", metavar="A.json[,B.json...]",
                    help="write the table and plot of this JSON (no runs); several files: one report of sides run in "
                         "separate calls of the same job on the same card (tools/bench/vs_trl_merge.py)")
    ap.add_argument("--out", default="bench_vs_trl.json")
    ap.add_argument("--trl-child", help=argparse.SUPPRESS)  # internal: run TRL from a job JSON file
    return ap


def _check(args, sides: list[str], device: str) -> None:
    """Refuse bad input before any side starts (SystemExit with a one-line message)."""
    if not args.random_config and not os.path.exists(os.path.join(args.model, "config.json")):
        raise SystemExit(f"error: --model: {os.path.join(args.model, 'config.json')} not found")
    if not os.path.exists(args.data):
        raise SystemExit(f"error: --data: {args.data} not found")
    for name in ("batch", "n", "micro", "response_len", "max_prompt_len", "steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if (args.batch * args.n) % args.micro:
        raise SystemExit(f"error: --micro ({args.micro}) must divide batch*n ({args.batch * args.n})")
    bad = [o for o in args.ours_override if "=" not in o]
    if bad:
        raise SystemExit(f"error: --ours-override {bad[0]!r}: expected KEY=VALUE")
    for flag, v in (("--trl-vllm-gpu-util", args.trl_vllm_gpu_util), ("--vllm-gpu-util", args.vllm_gpu_util)):
        if not 0 < v <= 1:
            raise SystemExit(f"error: {flag} must be in (0, 1], got {v}")
    need = {"trl"} if any(SIDES[s][0] == "trl" for s in sides) else set()
    need |= {"vllm"} if any(SIDES[s][1] == "vllm" for s in sides) else set()
    missing = sorted(m for m in need if importlib.util.find_spec(m) is None)
    if missing:
        raise SystemExit(f"error: sides {','.join(sides)} need {' and '.join(missing)} (pip install "
                         f"{' '.join('trl==1.16.0' if m == 'trl' else m for m in missing)})")
    if "vllm" in need and device != "cuda":
        raise SystemExit(f"error: the vLLM sides need CUDA (device {device})")


def main(argv=None) -> dict:
    from tools.bench.common import apply_tiny, print_table, run_meta

    ap = _parser()
    args = ap.parse_args(argv)
    if args.trl_child:
        from tools.bench.common import run_job_file
        from tools.bench.vs_trl_child import run_trl

        return run_job_file(args.trl_child, run_trl)
    if args.report_from:
        from tools.bench.vs_trl_merge import merge_vs_docs

        doc = merge_vs_docs([p for p in args.report_from.split(",") if p])
        write_report(doc, args.out)
        return doc
    try:
        sides = resolve_sides(args.sides, args.trl_vllm, args.engine)
    except ValueError as err:
        raise SystemExit(f"error: {err}")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    work = os.path.abspath(args.work_dir or os.path.splitext(os.path.abspath(args.out))[0] + "_work")
    os.makedirs(work, exist_ok=True)
    if args.tiny:
        model, data = tiny_assets(work)
        apply_tiny(args, ap, model=model, data=data, batch=4, n=4, micro=8, response_len=4, max_prompt_len=16,
                   steps=3, lr=1e-3)
        device = args.device or "cpu"
    _check(args, sides, device)
    random_model = None
    if args.random_config:
        from tools.bench.random_model import build_random_model, config_name

        try:
            config_name(args.random_config)
        except ValueError as err:
            raise SystemExit(f"error: --random-config: {err}")
        tok = args.tokenizer or args.model
        if not os.path.isdir(tok):
            raise SystemExit(f"error: --tokenizer: {tok} is not a folder (the random model takes its tokenizer)")
        args.model = args.random_dir or os.path.join(work, f"random_{args.random_config}")
        random_model = build_random_model(args.random_config, tok, args.model, seed=args.seed)
        print(f"random model: {random_model}", flush=True)
    ignore_eos = bool(args.random_config) if args.ignore_eos is None else args.ignore_eos
    job = dict(model=os.path.abspath(args.model), data=os.path.abspath(args.data), max_rows=args.max_rows,
               batch=args.batch, n=args.n, micro=args.micro, response_len=args.response_len,
               max_prompt_len=args.max_prompt_len, lr=args.lr, steps=args.steps, seed=args.seed, device=device,
               out_dir=work, cpus=1 if device == "cpu" else 4, ignore_eos=ignore_eos,
               trl_cache_implementation=args.trl_cache_implementation, trl_vllm_gpu_util=args.trl_vllm_gpu_util,
               ours_vllm_gpu_util=args.vllm_gpu_util, ours_overrides=args.ours_override, random_model=random_model,
               ours_profile_steps=args.ours_profile_steps)
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(job["model"])
    doc = dict(meta=run_meta(args), sides=sides, job=job, results=[], notes=notes(sides, job))
    end = None if args.budget_s is None else time.monotonic() + args.budget_s
    for side in sides:
        left = args.timeout if end is None else min(args.timeout, int(end - time.monotonic()))
        print(f"=== {side} (at most {left} s)", flush=True)
        if left < 30:
            framework, engine = SIDES[side]
            doc["results"].append(dict(side=side, framework=framework, engine=engine,
                                       error=f"not run: {left} s left of --budget-s {args.budget_s}"))
        else:
            doc["results"].append(run_side(side, job, work, left, hf_config=hf_config))
        write_report(doc, args.out)
    ok = [r for r in doc["results"] if not r.get("error")]
    print_table(ok, ["side", "timed_steps", "mean_step_s", "samples_per_s", "gen_tokens_per_s",
                     "trained_tokens_per_s", "first_step_s", "process_wall_s"],
                title=f"GRPO, {args.batch * args.n} samples/step ({device})")
    return doc


if __name__ == "__main__":
    main()
