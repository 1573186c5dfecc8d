"""The benchmark suite that ``tools/bench/run_all.py`` runs: for each benchmark, the script and its arguments in
each mode, what the machine must have for it to run, and which figures of its JSON go into the summary table.

Modes: ``full`` (the settings of docs/benchmarks.md), ``quick`` (smaller sizes and fewer iterations) and ``tiny``
(the scripts' own ``--tiny`` CPU smoke tests; the benchmarks without one are skipped). A benchmark without an entry for a mode in :attr:`Bench.timeout_s` has no such mode.

Requirements (:attr:`Bench.needs`, checked by :func:`skip_reason` before anything starts): ``cuda`` (one GPU),
``2gpus``, ``vllm`` / ``trl`` (importable), ``model`` (``--model`` given and resolved to a local folder), ``data``
(the ``--data`` parquet exists), ``runs`` (``--runs`` given). In ``tiny`` mode only :attr:`Bench.tiny_needs`
apply (everything runs on the CPU).

This module imports nothing heavy (no torch): it is read by the runner and by CPU tests.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Callable

MODES = ("full", "quick", "tiny")


@dataclass(frozen=True)
class Context:
    """What a benchmark's command line may depend on.

    Attributes:
        mode: one of :data:`MODES`.
        raw_dir: folder for the scripts' own outputs (JSON, traces, work folders).
        python: the interpreter that runs the scripts.
        model: local HF model folder (``--model`` resolved), or None.
        model_error: why ``--model`` could not be resolved (None: resolved or not given).
        data: verl-layout parquet/jsonl of prompts (``--data``).
        gpus: CUDA devices visible to the scripts (0: none).
        gpu_memory_gib: total memory of the first GPU in GiB (None without one).
        installed: optional packages importable here, a subset of ``{"vllm", "trl"}``.
        runs: the ``--runs`` spec (``"name:gpu name:gpu ..."``, ``tools/bench/rl_runs.sh``), "" for none.
        run_timeout_s: seconds per RL run (``T_LONG`` of ``rl_runs.sh``).
    """

    mode: str
    raw_dir: str
    python: str
    model: str | None = None
    model_error: str | None = None
    data: str = "data/gsm8k/train.parquet"
    gpus: int = 0
    gpu_memory_gib: float | None = None
    installed: frozenset = frozenset()
    runs: str = ""
    run_timeout_s: int = 1200

    def out(self, name: str, ext: str = ".json") -> str:
        """Path of ``<raw_dir>/<name><ext>``."""
        return os.path.join(self.raw_dir, name + ext)


Commands = Callable[[Context, str], "list[list[str]]"]


@dataclass(frozen=True)
class Bench:
    """One benchmark of the suite.

    Attributes:
        name: the key used by ``--only`` and in the results.
        what: one line saying what it measures.
        needs: requirements in ``full``/``quick`` mode (see the module docstring).
        commands: ``(ctx, out_json) -> [argv, ...]``: command lines run one after the other from the repository
            root, sharing the timeout; the last one writes ``out_json``.
        timeout_s: seconds per mode (all commands together); a mode missing here is not offered.
        summarize: ``doc -> rows`` (list of flat dicts) for the markdown table; ``doc`` is the JSON at ``out_json``.
        tiny_needs: requirements in ``tiny`` mode.
        gpus: CUDA devices the benchmark is given (``CUDA_VISIBLE_DEVICES`` is narrowed to the first ``gpus``;
            0: all of them).
        env: ``ctx -> {name: value}``, extra environment variables for its commands (None: none).
        collect: ``(ctx, out_json, started) -> None``, run after the commands (``started``: their start, epoch
            seconds): writes ``out_json`` itself, for commands that leave their results elsewhere (the RL runs'
            metrics files). None: the last command writes it.
        timeout_fn: ``ctx -> seconds``, used instead of ``timeout_s[mode]`` when the limit depends on the context.
    """

    name: str
    what: str
    needs: tuple[str, ...]
    commands: Commands
    timeout_s: dict[str, int]
    summarize: Callable[[dict], "list[dict]"]
    tiny_needs: tuple[str, ...] = ()
    gpus: int = 1
    env: Callable[[Context], "dict[str, str]"] | None = None
    collect: Callable[[Context, str, float], None] | None = None
    timeout_fn: Callable[[Context], int] | None = None

    def timeout(self, ctx: Context) -> int:
        """Seconds that all of this benchmark's commands together may take in ``ctx``."""
        return self.timeout_fn(ctx) if self.timeout_fn else self.timeout_s[ctx.mode]

    def environment(self, ctx: Context) -> dict[str, str]:
        """Extra environment variables of this benchmark's commands in ``ctx``."""
        return self.env(ctx) if self.env else {}


def skip_reason(bench: Bench, ctx: Context) -> str | None:
    """Why ``bench`` cannot run in ``ctx`` (one line), or None when it can."""
    if ctx.mode not in bench.timeout_s:
        return f"no {ctx.mode} mode" + (" (CUDA only)" if ctx.mode == "tiny" else "")
    checks = {
        "cuda": (ctx.gpus >= 1, "no CUDA device visible (torch.cuda.device_count() == 0)"),
        "2gpus": (ctx.gpus >= 2, f"needs 2 GPUs, found {ctx.gpus}"),
        "vllm": ("vllm" in ctx.installed, "vLLM is not installed (pip install vllm)"),
        "trl": ("trl" in ctx.installed, "TRL is not installed (pip install trl==1.16.0)"),
        "model": (ctx.model is not None,
                  ctx.model_error or "needs --model (an HF model folder or Hub name, with its tokenizer)"),
        "data": (os.path.exists(ctx.data), f"--data {ctx.data} not found (python tools/data_preprocess/gsm8k.py "
                                           "--out data/gsm8k writes the default)"),
        "runs": (bool(ctx.runs.strip()), "no --runs given (e.g. --runs 'gsm8k_grpo:0')"),
    }
    for need in (bench.tiny_needs if ctx.mode == "tiny" else bench.needs):
        ok, why = checks[need]
        if not ok:
            return why
    return None


# ------------------------------------------------------------------------------------------------ summaries
def pick(rows, keys) -> list[dict]:
    """Each row of ``rows`` (dicts) reduced to ``keys`` that it has, in that order."""
    return [{k: r[k] for k in keys if k in r} for r in rows or []]


def _mfu_rows(doc):
    return pick(doc["results"], ("model", "path", "kernels", "tokens_per_s", "tflops_per_s", "mfu", "peak_mem_gib"))


def _profile_rows(doc):
    rows = []
    prof = doc.get("profile")
    if prof:
        ks = prof.get("kernel_summary") or {}
        rows.append(dict(part="actor update (profiler on)", kernels=prof.get("kernels"),
                         tokens_per_s=prof.get("tokens_per_s"), seconds=prof.get("seconds"),
                         gpu_busy=ks.get("busy_fraction"), gpu_idle=ks.get("idle_fraction")))
    steps = doc.get("steps")
    if steps:
        rows += [dict(part=f"stage {s['stage']}", seconds=s.get("mean_s"), share=s.get("share")) for s in
                 steps["stages"]]
        rows.append(dict(part="tokens/s per GPU", tokens_per_s=steps.get("tokens_per_s_per_gpu")))
    return rows


def _ulysses_rows(doc):
    rows = pick(doc.get("throughput"), ("model", "sp", "tokens", "seqs", "status", "tokens_per_s_per_gpu",
                                        "peak_mem_gib"))
    rows += [dict(model=r.get("model"), sp=r.get("sp"), status="longest", tokens=r.get("longest_tokens"),
                  peak_mem_gib=r.get("peak_mem_gib")) for r in doc.get("search") or []]
    rows += [dict(model=r.get("model"), sp=r.get("sp"), tokens=r.get("tokens"), status="log-prob check",
                  max_abs_diff=r.get("max_abs_diff")) for r in doc.get("equivalence") or []]
    return rows


def _rollout_rows(doc):
    return pick(doc["rows"], ("name", "tok_per_s", "seconds", "compile_s", "gib_per_s"))


def _sdpa_rows(doc):
    rows = [dict(variant=k, ms_per_call=v) for k, v in doc["ms_per_call"].items()]
    return rows + [dict(variant="max |repeat_kv - enable_gqa|", max_abs_diff=doc.get("max_abs_diff"))]


def _vllm_memory_rows(doc):
    return [dict(mode=m, median_step_s=r.get("median_step_s"), error=r.get("error")) for m, r in
            doc["modes"].items()]


def _vs_trl_rows(doc):
    return pick(doc["results"], ("side", "mean_step_s", "samples_per_s", "gen_tokens_per_s", "trained_tokens_per_s",
                                 "peak_gpu_used_gib", "error"))


def _runs_rows(doc):
    return pick(doc["runs"], ("run", "exit", "steps", "first_score", "last_score", "val", "mean_step_s"))


# ------------------------------------------------------------------------------------------------ commands
def _script(ctx: Context, script: str, *args) -> list[str]:
    return [ctx.python, f"tools/bench/{script}", *[str(a) for a in args]]


def _mode_args(ctx: Context, full, quick, tiny=()) -> list:
    return list({"full": full, "quick": quick, "tiny": tiny}[ctx.mode])


def _mfu(ctx, out):
    args = _mode_args(ctx, ["--deepspeed", "--models", "qwen2-1.5b,smollm2-135m", "--iters", 20, "--warmup", 4],
                      ["--deepspeed", "--models", "smollm2-135m", "--iters", 8, "--warmup", 2], ["--tiny"])
    return [_script(ctx, "mfu.py", *args, "--out", out)]


def _mfu_graphs(ctx, out):
    args = _mode_args(ctx, ["--models", "qwen2-1.5b", "--iters", 48, "--warmup", 8],
                      ["--models", "smollm2-135m", "--iters", 16, "--warmup", 8])
    return [_script(ctx, "mfu.py", "--deepspeed", "--compile-mode", "reduce-overhead", *args, "--out", out)]


def _step_profile(ctx, out):
    args = _mode_args(ctx, ["--profile", "--deepspeed", "--compile-mode", "reduce-overhead", "--model", "qwen2-1.5b",
                            "--tokens", 4096],
                      ["--profile", "--model", "smollm2-135m", "--tokens", 2048, "--micro-batches", 2], ["--tiny"])
    return [_script(ctx, "step_profile.py", *args, "--trace", ctx.out("step_profile", ".trace.json"), "--out", out)]


def _grpo_step(ctx, out):
    run = ctx.out("grpo_step", "_run")
    steps, device = (5, "cpu") if ctx.mode == "tiny" else (30 if ctx.mode == "full" else 12, "cuda")
    train = [ctx.python, "trainer/main.py", f"trainer.device={device}", "trainer.n_gpus_per_node=1",
             f"trainer.total_training_steps={steps}", f"trainer.output_dir={run}", "trainer.export_hf_on_end=false"]
    return [train, _script(ctx, "step_profile.py", "--metrics", os.path.join(run, "metrics.jsonl"), "--out", out)]


def _model_or_random(ctx) -> list[str]:
    return ["--model", ctx.model] if ctx.model else ["--random", "smollm2"]


def _rollout(ctx, out):
    args = _mode_args(ctx, ["--attn", "sdpa,sdpa_gqa", "--prompts", 512, "--n", 1, "--new-tokens", 512],
                      ["--attn", "sdpa_gqa", "--prompts", 64, "--n", 2, "--new-tokens", 128, "--skip-sync"])
    return [_script(ctx, "rollout.py", "--engine", "hf", "--skip-plain", *_model_or_random(ctx), *args,
                    "--max-batch", 512, "--out", out)]


def _rollout_vllm(ctx, out):
    args = _mode_args(ctx, ["--prompts", 512, "--n", 1, "--new-tokens", 512],
                      ["--prompts", 64, "--n", 2, "--new-tokens", 128])
    return [_script(ctx, "rollout.py", "--engine", "vllm", "--skip-plain", "--skip-sync", "--vllm-gpu-util", 0.4,
                    *_model_or_random(ctx), *args, "--out", out)]


def _sdpa_gqa(ctx, out):
    return [_script(ctx, "sdpa_gqa.py", "--out", out)]


def _vllm_memory(ctx, out):
    # the training stage leaves half the GPU cached (70 GiB on a 141 GiB H200, the script's default)
    fill = max(1, round(0.5 * ctx.gpu_memory_gib)) if ctx.gpu_memory_gib else 70
    steps = 4 if ctx.mode == "full" else 2
    return [_script(ctx, "vllm_memory.py", "--model", ctx.model, "--eager", "--fill-gib", fill, "--steps", steps,
                    "--out", out)]


def _ulysses(ctx, out):
    args = _mode_args(ctx, ["--models", "qwen2-1.5b", "--tokens", "8192,16384", "--tokens-per-gpu", "--iters", 8,
                            "--warmup", 3, "--accum", 4, "--compile-mode", "reduce-overhead", "--timeout", 120],
                      ["--models", "qwen2-1.5b", "--tokens", 8192, "--tokens-per-gpu", "--iters", 3, "--warmup", 1,
                       "--equiv-tokens", 4096, "--timeout", 120],
                      ["--tiny", "--tokens", 256])
    return [_script(ctx, "ulysses.py", "--no-search", *args, "--out", out)]


def _ulysses_search(ctx, out):
    return [_script(ctx, "ulysses.py", "--models", "qwen2-1.5b", "--tokens", 8192, "--iters", 1, "--equiv-tokens", 0,
                    "--search-start", 32768, "--search-max", 131072, "--search-refine", 3, "--timeout", 60,
                    "--out", out)]


def vs_trl_sides(ctx: Context) -> str:
    """TRL and this project with transformers generation; with vLLM installed, both with vLLM as well."""
    return "trl,ours_hf" + (",trl_vllm,ours_vllm" if "vllm" in ctx.installed and ctx.mode != "tiny" else "")


def _vs_trl(ctx, out):
    budget = VS_TRL.timeout_s[ctx.mode] - 60  # the script stops starting sides in time and keeps the finished ones
    if ctx.mode == "tiny":
        return [_script(ctx, "vs_trl.py", "--tiny", "--budget-s", budget, "--out", out)]
    args = _mode_args(ctx, ["--batch", 16, "--response-len", 256, "--steps", 6],
                      ["--batch", 8, "--response-len", 128, "--steps", 3])
    return [_script(ctx, "vs_trl.py", "--model", ctx.model, "--data", ctx.data, "--n", 8, "--micro", 64, *args,
                    "--sides", vs_trl_sides(ctx), "--budget-s", budget, "--out", out)]


def _rl_runs(ctx, out):
    return [["bash", "tools/bench/rl_runs.sh"]]


def _rl_runs_env(ctx: Context) -> dict[str, str]:
    """Environment of ``tools/bench/rl_runs.sh``: the runs, the model folder, where the runs write, their limit,
    the interpreter."""
    return {"RUNS": ctx.runs, "MODEL": ctx.model or "", "OUT": ctx.out("rl_runs", ""),
            "T_LONG": str(ctx.run_timeout_s), "PYTHON": ctx.python}


VS_TRL = Bench("vs_trl", "the same GRPO job by TRL's GRPOTrainer and by trainer/main.py: samples/s, step split",
               ("cuda", "trl", "model", "data"), _vs_trl, {"full": 1800, "quick": 900, "tiny": 600}, _vs_trl_rows,
               tiny_needs=("trl",))

BENCHES: list[Bench] = [
    Bench("sdpa_gqa", "decoding attention: K/V repeated per head group vs SDPA enable_gqa", ("cuda",), _sdpa_gqa,
          {"full": 300, "quick": 300}, _sdpa_rows),
    Bench("mfu", "actor-update MFU on packed micro-batches, DeepSpeed ZeRO-2 (random-weight Qwen2-1.5B, SmolLM2)",
          ("cuda",), _mfu, {"full": 600, "quick": 300, "tiny": 300}, _mfu_rows),
    Bench("mfu_graphs", "the same with torch.compile + CUDA graphs (torch_compile_mode=reduce-overhead)", ("cuda",),
          _mfu_graphs, {"full": 600, "quick": 400}, _mfu_rows),
    Bench("step_profile", "torch.profiler of one actor-update loop: GPU busy/idle share, top host ops", ("cuda",),
          _step_profile, {"full": 400, "quick": 300, "tiny": 300}, _profile_rows),
    Bench("grpo_step", "the trainer's embedded default (tiny model, generated task): stage split of a step",
          ("cuda",), _grpo_step, {"full": 600, "quick": 400, "tiny": 600}, _profile_rows),
    Bench("rollout", "transformers engine generation (sdpa vs sdpa_gqa) and the bucketed trainer -> engine weight "
          "sync", ("cuda",), _rollout, {"full": 600, "quick": 300}, _rollout_rows),
    Bench("rollout_vllm", "vLLM engine generation on the same prompts", ("cuda", "vllm"), _rollout_vllm,
          {"full": 600, "quick": 400}, _rollout_rows),
    Bench("vllm_memory", "vLLM colocated with training: the empty_cache rule, without it, and overdone",
          ("cuda", "vllm", "model"), _vllm_memory, {"full": 600, "quick": 400}, _vllm_memory_rows),
    Bench("ulysses", "Ulysses SP=1 vs SP=2 at equal tokens per GPU, and the SP=2 vs SP=1 log-prob check",
          ("cuda", "2gpus"), _ulysses, {"full": 900, "quick": 400, "tiny": 600}, _ulysses_rows, gpus=2),
    Bench("ulysses_search", "the longest trainable sequence at SP=1 and SP=2 (doubling, then bisection)",
          ("cuda", "2gpus"), _ulysses_search, {"full": 900}, _ulysses_rows, gpus=2),
    VS_TRL,
]


RL_RUNS = Bench("rl_runs", "the GRPO/GAE/PRIME runs of docs/results.md (tools/bench/rl_runs.sh; --runs picks them)",
                ("cuda", "model", "runs"), _rl_runs,
                {"full": 0, "quick": 0},  # the modes offered; the limit is timeout_fn's
                _runs_rows, gpus=0, env=_rl_runs_env,
                collect=lambda ctx, out, started: collect_runs(ctx.out("rl_runs", ""), out, since=started),
                # rl_runs.sh stops each run at T_LONG; the runs of a batch go concurrently, the paired ones
                # (save/resume, Megatron) one after the other within about 15 minutes
                timeout_fn=lambda ctx: ctx.run_timeout_s + 900)
BENCHES.append(RL_RUNS)


def by_name(names: str | None) -> list[Bench]:
    """The benchmarks named in the comma list ``names`` (all when None or empty), in suite order.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if not names:
        return list(BENCHES)
    want = [n.strip() for n in names.split(",") if n.strip()]
    known = {b.name: b for b in BENCHES}
    bad = [n for n in want if n not in known]
    if bad:
        raise ValueError(f"--only: unknown benchmark {bad[0]!r}; expected a comma list of {', '.join(known)}")
    return [b for b in BENCHES if b.name in want]


# ------------------------------------------------------------------------------------------------ RL runs
def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line, parse_constant=str)  # NaN as "NaN": strict JSON out
            except ValueError:  # a line cut off by a stopped run
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _exit_code(folder: str) -> int | None:
    """The ``exit N`` line that rl_runs.sh appends to a run's console.log (None: not there, e.g. still running)."""
    path = os.path.join(folder, "console.log")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        codes = [line.split()[1] for line in f if line.startswith("exit ") and len(line.split()) == 2]
    return int(codes[-1]) if codes and codes[-1].lstrip("-").isdigit() else None


def run_summary(name: str, rows: list[dict], exit_code: int | None) -> dict:
    """One run's row: steps logged, ``critic/score/mean`` at the first and last step, each validation accuracy
    (``val/<source>/[greedy/]acc``) at its first and last validation, mean ``timing_s/step`` without step 1."""
    def num(v):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    steps = [r for r in rows if num(r.get("timing_s/step")) is not None]
    scores = [r["critic/score/mean"] for r in steps if num(r.get("critic/score/mean")) is not None]
    val: dict[str, list] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("val/") and k.endswith("/acc") and num(v) is not None:
                val.setdefault(k, []).append(v)
    times = [r["timing_s/step"] for r in steps[1:]] or [r["timing_s/step"] for r in steps]
    return dict(run=name, exit=exit_code, steps=len(steps), first_score=scores[0] if scores else None,
                last_score=scores[-1] if scores else None, val={k: [v[0], v[-1]] for k, v in val.items()},
                mean_step_s=sum(times) / len(times) if times else None)


def collect_runs(runs_dir: str, out_json: str, since: float | None = None) -> None:
    """Write ``out_json``: ``{"runs_dir", "runs": [run_summary, ...]}`` over every metrics file that
    ``tools/bench/rl_runs.sh`` left in ``runs_dir`` (``<run>/metrics.jsonl``; paired runs: ``<run>/<part>.jsonl``,
    named ``<run>/<part>``), leaving out files last written before ``since`` (epoch seconds: earlier batches in
    the same folder). Raises FileNotFoundError when ``runs_dir`` does not exist."""
    runs = []
    for folder in sorted(glob.glob(os.path.join(runs_dir, "*", ""))):
        name = os.path.basename(os.path.dirname(folder))
        for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
            if since is not None and os.path.getmtime(path) < since:
                continue
            stem = os.path.splitext(os.path.basename(path))[0]
            label = name if stem == "metrics" else f"{name}/{stem}"
            runs.append(run_summary(label, _read_jsonl(path), _exit_code(folder)))
    if not os.path.isdir(runs_dir):
        raise FileNotFoundError(f"{runs_dir} not found: rl_runs.sh wrote nothing")
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"runs_dir": os.path.abspath(runs_dir), "runs": runs}, f, indent=1)
