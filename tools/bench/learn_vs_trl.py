"""Learning per GPU-minute: the same SVAMP GRPO job run by TRL and by this project for the same wall-clock budget,
both scored afterwards on the held-out set by one evaluator.

Sides (``--sides``, each seed of ``--seeds`` runs TRL then ours, one process at a time on the device):

- ``trl``: TRL 1.16 ``GRPOTrainer`` with its colocated vLLM (``use_vllm=True``, ``vllm_mode="colocate"``;
  ``tools/bench/learn_vs_trl_child.py`` lists every setting);
- ``ours``: ``trainer/main.py`` with ``rollout=--ours-engine`` (default ``hf``, the faster engine at this model
  size in docs/benchmarks.md).

The job (both sides): the rows of ``--train`` (SVAMP's first 700) with the format-aware reward (1 for a correct
``#### N``, ``--format-score`` for a well-formed wrong one, 0 otherwise: ours ``reward=format``, TRL the same
scorer through a reward function), the dataset's prompt through the tokenizer's chat template, ``--batch`` prompts
x ``--n`` samples per step at temperature 1, responses up to ``--response-len`` tokens, one optimizer step per
step (AdamW, constant ``--lr``, no warm-up, gradient clipping at 1), group-normalised advantages, token-mean loss,
a KL loss against the initial model at ``--kl-coef`` (k3 estimator; ours ``use_kl_loss`` with ``low_var_kl``).

Clock and checkpoints: each side's process gets ``--budget-s`` seconds counted from its own start (the operating
system's start time: imports, model loading, engine start-up and compilation count). Both save the policy as a
Hugging Face folder at the first step end at or after every ``--every-s`` seconds (ours: ``trainer.
export_hf_freq_s``; TRL: a callback with the same marks, folders and manifest, :mod:`trainer.hf_exports`); a
side is stopped once its last mark (= the budget) is saved, or at budget + ``--grace-s``. Saving counts against
the side's own clock; evaluation does not: after all runs one process (``tools/bench/learn_eval.py``) scores the
base model and every checkpoint on ``--test`` (SVAMP's last 300 rows) greedily, and the base model and each run's
last checkpoint on ``--gsm8k`` (GSM8K test, strict) when that file exists.

Output: ``--out`` JSON (job, the row split, every run's manifest and log, the evaluation), ``<out>.md`` (the table
per mark, the targets, GSM8K before/after; ``tools/bench/learn_report.py``) and ``<out>.png`` (accuracy and format
compliance against wall-clock minutes).

Across calls and sessions (:mod:`tools.bench.learn_merge`): ``--eval-from A.json,B.json`` scores together the runs of
un-evaluated files of one session (the checkpoints are on its disk); ``--report-from A.json,B.json`` combines
*evaluated* files of separate sessions (e.g. one seed each) into one report: every file's runs, the union of their
results, the first file's base model (a base accuracy that differs between files is kept in ``eval.base_spread``),
each run's ``file`` and each file's ``meta`` (``meta_by_file``). The jobs must agree but for seeds, sides and (for
``--report-from``) the folders of the model and data files; a (side, seed) run in two files is refused.
A file named ``PATH:SIDE`` gives only that side's runs (``old.json:trl,new.json:ours``: a new configuration of ours
beside TRL's recorded runs); the settings of one side alone are compared only between files that ran that side.
``--report-from`` also gives a file evaluated before the evaluator recorded the held-out set's one-answer baseline
that baseline, read from ``--test`` (:func:`add_constant_baseline`).

``--strict-format`` (both sides' reward and the evaluator): a response is well-formed only with one ``#### N``
and at most 64 characters after it (:func:`rewards.format_reward.single_final_answer`). Without it a policy that
repeats one answer to the length limit is rewarded as well-formed, and a small model can settle there.

Usage:
    python tools/bench/learn_vs_trl.py --model /tmp/smol_hf --train data/svamp/train.parquet \\
        --test data/svamp/test.parquet --gsm8k data/gsm8k/test.parquet --budget-s 720 --every-s 120 \\
        --seeds 1,2 --out learn.json
    python tools/bench/learn_vs_trl.py --seeds 1 --sides trl --skip-eval --work-dir W --out W/trl1.json ...
    python tools/bench/learn_vs_trl.py --eval-from W/trl1.json,W/ours1.json --work-dir W --out W/learn.json
    python tools/bench/learn_vs_trl.py --report-from learn.json --out learn.json     # table + plot again
    python tools/bench/learn_vs_trl.py --report-from s1/learn.json,s2/learn.json --out learn.json  # two sessions
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

from tools.bench.learn_merge import load_doc, merge_docs, parse_sources  # noqa: E402  (--eval-from, --report-from)
from tools.bench.learn_report import constant_baseline_of  # noqa: E402
from tools.bench.learn_report import SIDES  # noqa: E402
EXPECTED_ROWS = (700, 300)  # SVAMP: the first 700 rows train, the last 300 held out (tools/data_preprocess/svamp.py)


def _rows(path: str):
    import datasets

    kind = "parquet" if path.endswith(".parquet") else "json"
    return datasets.load_dataset(kind, data_files=path, split="train")


def _questions(path: str) -> list[str]:
    return [m[-1]["content"] if isinstance(m, list) else str(m) for m in _rows(path)["prompt"]]


def add_constant_baseline(doc: dict, test: str) -> bool:
    """Give an evaluated ``doc`` written before the evaluator recorded it the held-out set's one-answer baseline
    (:func:`tools.bench.learn_eval.constant_baseline`, in ``eval.sets``, with ``from`` = ``test``), read from the
    file ``test`` when it has the job's held-out file name (``job.test``'s last component) and number of rows.
    Returns whether it was added."""
    from tools.bench.learn_eval import constant_baseline
    from tools.bench.learn_report import SET

    ev = doc.get("eval")
    if not ev or SET in (ev.get("sets") or {}) or not os.path.exists(test):
        return False
    if os.path.basename(test) != os.path.basename(doc["job"].get("test") or ""):
        return False
    truths = [str(r["ground_truth"]) for r in _rows(test)["reward_model"]]
    if len(truths) != doc["job"].get("test_rows"):
        return False
    ev.setdefault("sets", {})[SET] = dict(constant_baseline(truths), **{"from": test})
    return True


def check_split(train: str, test: str, expected: tuple[int, int] | None = EXPECTED_ROWS) -> dict:
    """Row counts of the two files and the questions they share.

    Raises: ValueError when the held-out file repeats a training question, or (with ``expected``) the counts
    differ from (train rows, held-out rows)."""
    a, b = _questions(train), _questions(test)
    shared = len(set(a) & set(b))
    if shared:
        raise ValueError(f"{test} repeats {shared} questions of {train}; the held-out rows must be unseen")
    if expected and (len(a), len(b)) != tuple(expected):
        raise ValueError(f"{train} / {test} have {len(a)} / {len(b)} rows; expected {expected[0]} / {expected[1]} "
                         "(python tools/data_preprocess/svamp.py --out data/svamp)")
    return dict(train_rows=len(a), test_rows=len(b), shared_questions=shared)


def marks(budget_s: int, every_s: int) -> list[float]:
    """``every_s, 2 every_s, ..., budget_s``. Raises ValueError unless 0 < every_s <= budget_s and every_s divides
    budget_s."""
    if every_s <= 0 or budget_s < every_s or budget_s % every_s:
        raise ValueError(f"--every-s {every_s} must be > 0 and divide --budget-s {budget_s}")
    return [float(every_s * k) for k in range(1, budget_s // every_s + 1)]


def ours_command(job: dict, seed: int, out_dir: str) -> list[str]:
    """``trainer/main.py`` with the job's overrides (module docstring), then ``job["ours_overrides"]``."""
    kl = float(job["kl_coef"])
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    cmd = [sys.executable, os.path.join(ROOT, "trainer", "main.py"), "data=svamp", "model=smollm2", "reward=format",
           f"rollout={job['ours_engine']}", "algorithm=grpo", f"actor_rollout_ref.model.path={job['model']}",
           f"data.train_files={job['train']}", "data.val_files=null", f"data.train_batch_size={job['batch']}",
           f"data.max_prompt_length={job['max_prompt_len']}", f"data.max_response_length={job['response_len']}",
           f"{r}.n={job['n']}", f"{a}.ppo_mini_batch_size={job['batch']}",
           f"{a}.ppo_micro_batch_size_per_gpu={job['micro']}", f"{a}.optim.lr={job['lr']}",
           f"{a}.optim.lr_scheduler_type=constant", f"{a}.optim.lr_warmup_steps=0", f"{a}.loss_agg_mode=token-mean",
           f"{a}.use_kl_loss={'true' if kl > 0 else 'false'}", f"{a}.kl_loss_coef={kl}", f"{a}.kl_loss_type=low_var_kl",
           f"reward_model.scorer_kwargs.format_score={job['format_score']}", f"trainer.device={job['device']}",
           "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.cpus_per_worker={job['cpus']}",
           f"trainer.total_training_steps={job['max_steps']}", f"trainer.total_epochs={job['max_steps']}",
           f"trainer.seed={seed}", f"data.seed={seed}", "trainer.export_hf_on_end=false", "trainer.test_freq=-1",
           "trainer.save_freq=-1", "trainer.val_before_train=false", f"trainer.export_hf_freq_s={job['every_s']}",
           f"trainer.output_dir={out_dir}"]
    if job["ours_engine"] == "vllm":
        cmd.append(f"{r}.gpu_memory_utilization={job['ours_vllm_gpu_util']}")
    if job.get("strict_format"):
        cmd.append("reward_model.scorer_kwargs.strict_format=true")
    return cmd + list(job.get("ours_overrides") or [])


def trl_job(job: dict, seed: int, out_dir: str) -> dict:
    """The TRL child's job: ``job`` with this run's seed and folder (keys of
    :func:`tools.bench.learn_vs_trl_child.learn_config_kwargs` and the throughput bench's ``trl_config_kwargs``)."""
    return dict(job, seed=seed, out_dir=out_dir, data=job["train"], steps=job["max_steps"])


def _stop(proc: subprocess.Popen, first: int) -> None:
    """Signal ``first`` to the process (SIGTERM: ours finishes its step and shuts Ray down), then SIGINT and
    SIGKILL to its session if it is still there."""
    for sig, grace, group in ((first, 45, False), (signal.SIGINT, 15, True), (signal.SIGKILL, 5, True)):
        try:
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
            proc.wait(timeout=grace)
            return
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue


def run_until_final_mark(cmd: list[str], log: str, env_extra: dict, exports_root: str, final_mark_s: float,
                         limit_s: float, poll_s: float = 1.0, exit_wait_s: float = 0.0) -> dict:
    """Run ``cmd`` in its own session (output to ``log``) until its manifest (``exports_root``) lists a mark >=
    ``final_mark_s``, it exits, or ``limit_s`` seconds pass; then stop it (:func:`_stop`), after waiting up to
    ``exit_wait_s`` seconds for it to end by itself once the last mark is saved (TRL's callback ends its run).

    Returns ``{"wall_s", "rc", "stop"}``: ``stop`` is ``last mark saved``, ``exited`` or ``time limit``."""
    from trainer.hf_exports import read_entries

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           **env_extra}
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        stop = "time limit"
        while time.monotonic() - t0 < limit_s:
            if proc.poll() is not None:
                stop = "exited"
                break
            if any(e["mark_s"] >= final_mark_s for e in read_entries(exports_root)):
                stop = "last mark saved"
                try:
                    proc.wait(timeout=exit_wait_s)
                except subprocess.TimeoutExpired:
                    pass
                break
            time.sleep(poll_s)
        if proc.poll() is None:
            _stop(proc, signal.SIGTERM)
    return dict(wall_s=time.monotonic() - t0, rc=proc.returncode, stop=stop)


def run_side(side: str, seed: int, job: dict, work: str) -> dict:
    """One run: its row ``{"side", "seed", "exports" (the manifest), "log", "wall_s", "rc", "stop"}`` plus, for
    TRL, ``trl`` (version, GRPOConfig arguments, per-step log) and for ours ``command``; ``signal``: the training
    signal between its saves (:func:`tools.bench.learn_signal.signal_by_mark`); ``error`` when it saved nothing or
    failed before its last mark."""
    from tools.bench.learn_signal import signal_by_mark, step_rows
    from tools.bench.vs_trl import side_env
    from trainer.hf_exports import EXPORTS_SUBDIR, read_entries

    out_dir = os.path.join(work, f"{side}_s{seed}")
    shutil.rmtree(out_dir, ignore_errors=True)  # a manifest left by an earlier call would end this run at once
    os.makedirs(out_dir)
    log = os.path.join(work, f"{side}_s{seed}.log")
    row = dict(side=side, seed=seed, log=log, out_dir=out_dir)
    if side == "trl":
        path = os.path.join(work, f"trl_s{seed}_job.json")
        tjob = dict(trl_job(job, seed, out_dir), trl_result=os.path.join(work, f"trl_s{seed}_result.json"))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tjob, f)
        cmd = [sys.executable, os.path.abspath(__file__), "--trl-child", path]
        env = side_env("trl_vllm") if job["device"] == "cuda" else {}
    else:
        cmd = ours_command(job, seed, out_dir)
        row["command"] = " ".join(cmd)
        env = side_env(f"ours_{job['ours_engine']}") if job["device"] == "cuda" else {}
    root = os.path.join(out_dir, EXPORTS_SUBDIR)
    row.update(run_until_final_mark(cmd, log, env, root, job["budget_s"], job["budget_s"] + job["grace_s"],
                                    exit_wait_s=30.0 if side == "trl" else 0.0))
    row["exports"] = read_entries(root)
    if side == "trl" and os.path.exists(tjob["trl_result"]):
        with open(tjob["trl_result"], encoding="utf-8") as f:
            res = json.load(f)
        row["trl"] = {k: res.get(k) for k in ("trl_version", "config", "steps")}
    row["signal"] = signal_by_mark(step_rows(row), row["exports"])
    if not row["exports"] or not any(e["mark_s"] >= job["budget_s"] for e in row["exports"]):
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-1500:]
        row["error"] = f"{len(row['exports'])} saves, the last mark not reached ({row['stop']}, rc {row['rc']})"
        row["log_tail"] = tail
    return row


def eval_job(doc: dict, work: str, args) -> dict:
    """The evaluator's job (:func:`tools.bench.learn_eval.evaluate`): the base model and every checkpoint saved
    within its run's budget on the held-out set, then GSM8K (when given) on the base model and each run's last such
    checkpoint."""
    from tools.bench.learn_report import ckpt_id, within_budget

    job = doc["job"]
    ckpts, plan, last = {"base": job["model"]}, [["base", "svamp"]], []
    sets = {"svamp": {"path": job["test"], "max_rows": None}}
    for run in within_budget(doc)["runs"]:
        ex = sorted(run.get("exports") or [], key=lambda e: e["mark_s"])
        for e in ex:
            ckpts[ckpt_id(run["side"], run["seed"], e["mark_s"])] = e["path"]
        if ex:
            last.append(ckpt_id(run["side"], run["seed"], ex[-1]["mark_s"]))
    by_mark = sorted((k for k in ckpts if k != "base"), key=lambda k: (k.rsplit("_t", 1)[1], k))
    plan += [[k, "svamp"] for k in by_mark]
    if job.get("gsm8k"):
        sets["gsm8k"] = {"path": job["gsm8k"], "max_rows": job.get("gsm8k_rows")}
        plan = [["base", "svamp"], ["base", "gsm8k"]] + plan[1:]
        plan += [[k, "gsm8k"] for k in last]
    return dict(model=job["model"], engine=args.eval_engine, gpu_util=args.eval_gpu_util,
                max_new_tokens=job["response_len"], max_prompt_len=args.eval_max_prompt_len,
                format_score=job["format_score"], strict_format=bool(job.get("strict_format", False)), sets=sets,
                checkpoints=ckpts, plan=plan,
                out=os.path.join(work, "eval.json"))


def run_eval(doc: dict, work: str, args, limit_s: float) -> dict:
    """The evaluator in its own process (bounded by ``limit_s``); returns what it wrote (partial when cut; a result
    file left in ``work`` by an earlier evaluation is removed first, so it is never taken for this one's)."""
    ej = eval_job(doc, work, args)
    if os.path.exists(ej["out"]):
        os.remove(ej["out"])
    path = os.path.join(work, "eval_job.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ej, f)
    from tools.bench.vs_trl import VLLM_ENV

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **{k: os.environ.get(k, v) for k, v in
                                                                             VLLM_ENV.items()}}
    t0 = time.monotonic()
    with open(os.path.join(work, "eval.log"), "w", encoding="utf-8") as f:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--evaluate", path], cwd=ROOT, env=env,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(limit_s, 1))
        except subprocess.TimeoutExpired:
            _stop(proc, signal.SIGINT)
    out = dict(engine=None, results={}, errors={})
    if os.path.exists(ej["out"]):
        with open(ej["out"], encoding="utf-8") as f:
            out = json.load(f)
    out.update(wall_s=time.monotonic() - t0, rc=proc.returncode, log=os.path.join(work, "eval.log"),
               gsm8k_rows=ej["sets"].get("gsm8k", {}).get("max_rows"))
    return out


def write_report(doc: dict, out: str) -> None:
    """``doc`` as JSON at ``out``, its markdown at ``<out>.md`` (printed too) and the plot at ``<out>.png``."""
    from tools.bench.common import write_report_files
    from tools.bench.learn_report import mark_table, markdown, plot, targets, within_budget

    view = within_budget(doc)  # what the table, targets, markdown and plot read: no save after a run's budget
    if doc.get("eval"):
        doc["table"] = mark_table(view)
        doc["targets"] = targets(doc["table"])
    write_report_files(doc, out, markdown(view), lambda _doc, path: plot(view, path),
                       os.path.splitext(out)[0] + ".png")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".models/smollm2-135m-instruct", help="HF model folder (the initial policy)")
    ap.add_argument("--train", default="data/svamp/train.parquet", help="training rows (SVAMP's first 700)")
    ap.add_argument("--test", default="data/svamp/test.parquet", help="held-out rows (SVAMP's last 300)")
    ap.add_argument("--expect-rows", default="700,300", help="train,held-out row counts to insist on ('none': any)")
    ap.add_argument("--gsm8k", default="data/gsm8k/test.parquet", help="GSM8K test for before/after (skipped "
                    "when the file is absent)")
    ap.add_argument("--gsm8k-rows", type=int, default=None, help="score only the first N GSM8K rows")
    ap.add_argument("--sides", default="trl,ours", help="comma list of trl, ours")
    ap.add_argument("--seeds", default="1,2", help="comma list; each seed runs every side")
    ap.add_argument("--budget-s", type=int, default=720, help="wall-clock seconds per run, from its process start")
    ap.add_argument("--every-s", type=int, default=120, help="save (and later score) every this many seconds")
    ap.add_argument("--grace-s", type=int, default=90, help="a run is stopped at budget + this when its last mark "
                    "is not saved by then")
    ap.add_argument("--batch", type=int, default=32, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    ap.add_argument("--micro", type=int, default=64, help="rows per forward/backward")
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--max-prompt-len", type=int, default=256, help="longest training prompt (tokens)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--kl-coef", type=float, default=0.001, help="KL loss coefficient (TRL beta); 0: none")
    ap.add_argument("--format-score", type=float, default=0.1, help="reward of a well-formed wrong answer")
    ap.add_argument("--strict-format", action="store_true", help="both sides and the evaluator: well-formed only "
                    "with one '#### N' and at most 64 characters after it (rewards.format_reward strict_format)")
    ap.add_argument("--ours-engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--vllm-gpu-util", type=float, default=0.3, help="ours with --ours-engine vllm")
    ap.add_argument("--trl-vllm-gpu-util", type=float, default=0.3, help="TRL vllm_gpu_memory_utilization")
    ap.add_argument("--trl-vllm-sleep", action="store_true", help="TRL vllm_enable_sleep_mode (default off)")
    ap.add_argument("--ours-override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra trainer/main.py override (repeatable)")
    ap.add_argument("--eval-engine", choices=["auto", "vllm", "hf"], default="auto")
    ap.add_argument("--eval-gpu-util", type=float, default=0.5)
    ap.add_argument("--eval-max-prompt-len", type=int, default=1024, help="longest prompt scored (tokens)")
    ap.add_argument("--eval-limit-s", type=int, default=1800, help="seconds for the whole evaluation")
    ap.add_argument("--total-budget-s", type=int, default=None, help="seconds for the whole tool: a run is not "
                    "started when less than its budget + grace is left, the evaluation gets what is left")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    ap.add_argument("--work-dir", default=None, help="runs, checkpoints and logs (default: next to --out)")
    ap.add_argument("--report-from", help="write the table and plot of this JSON (no runs); a comma list of "
                    "evaluated JSON files (e.g. one seed per GPU session) combines them: their runs, the union of "
                    "their results, the first file's base model; PATH:SIDE takes one side's runs of a file "
                    "(tools/bench/learn_merge.py)")
    ap.add_argument("--eval-from", help="comma list of this tool's JSON files: score their runs together (no "
                    "training); the job is the first file's")
    ap.add_argument("--skip-eval", action="store_true", help="train only (score later with --eval-from)")
    ap.add_argument("--out", default="learn_vs_trl.json")
    ap.add_argument("--trl-child", help=argparse.SUPPRESS)  # internal: a TRL run from a job JSON file
    ap.add_argument("--evaluate", help=argparse.SUPPRESS)  # internal: the evaluator from a job JSON file
    return ap


def _check(args) -> tuple[list[str], list[int], list[float]]:
    """Refuse bad input before any run starts (SystemExit with a one-line message); the sides, seeds and marks."""
    import importlib.util

    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or any(s not in SIDES for s in sides) or len(set(sides)) != len(sides):
        raise SystemExit(f"error: --sides {args.sides!r}: expected distinct names from {list(SIDES)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        mk = marks(args.budget_s, args.every_s)
    except ValueError as err:
        raise SystemExit(f"error: {err}" if "every" in str(err) else f"error: --seeds {args.seeds!r}: expected "
                         "integers separated by commas")
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"error: --seeds {args.seeds!r}: expected distinct integers")
    for path, flag in ((os.path.join(args.model, "config.json"), "--model"), (args.train, "--train"),
                       (args.test, "--test")):
        if not os.path.exists(path):
            raise SystemExit(f"error: {flag}: {path} not found")
    for name in ("batch", "n", "micro", "response_len", "max_prompt_len", "grace_s"):
        if getattr(args, name) < (2 if name == "n" else 1):
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= {2 if name == 'n' else 1}, "
                             f"got {getattr(args, name)}")
    if (args.batch * args.n) % args.micro:
        raise SystemExit(f"error: --micro ({args.micro}) must divide batch*n ({args.batch * args.n})")
    if args.kl_coef < 0 or args.lr <= 0:
        raise SystemExit(f"error: --kl-coef must be >= 0 and --lr > 0, got {args.kl_coef} and {args.lr}")
    bad = [o for o in args.ours_override if "=" not in o]
    if bad:
        raise SystemExit(f"error: --ours-override {bad[0]!r}: expected KEY=VALUE")
    if "trl" in sides and importlib.util.find_spec("trl") is None:
        raise SystemExit("error: --sides trl needs TRL (pip install trl==1.16.0)")
    return sides, seeds, mk


def _expected_rows(text: str) -> tuple[int, int] | None:
    if text.strip().lower() == "none":
        return None
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"error: --expect-rows {text!r}: expected TRAIN,HELD_OUT (e.g. 700,300) or none")
    return a, b


def _internal(args) -> dict | None:
    """The child modes (--trl-child, --evaluate) and --report-from; None for a normal run."""
    if args.trl_child:
        from tools.bench.common import run_job_file
        from tools.bench.learn_vs_trl_child import run_trl_learn

        return run_job_file(args.trl_child, run_trl_learn)
    if args.evaluate:
        from tools.bench.learn_eval import evaluate

        with open(args.evaluate, encoding="utf-8") as f:
            return evaluate(json.load(f))
    if args.report_from:
        sources = parse_sources(args.report_from, "--report-from")
        if len(sources) > 1 or sources[0][1]:  # evaluated files of separate sessions (tools/bench/learn_merge.py)
            doc = merge_docs(sources, evaluated=True, flag="--report-from")
        else:
            doc = load_doc(sources[0][0], "--report-from")
        if not add_constant_baseline(doc, args.test) and doc.get("eval") and not constant_baseline_of(doc):
            print(f"note: no one-answer baseline in the report: {args.test} is missing or is not the job's "
                  f"held-out file ({os.path.basename(doc['job'].get('test') or '?')}, "
                  f"{doc['job'].get('test_rows')} rows)", flush=True)
        write_report(doc, args.out)
        return doc
    return None


def main(argv=None) -> dict:
    from tools.bench.common import run_meta

    args = _parser().parse_args(argv)
    done = _internal(args)
    if done is not None:
        return done
    work = os.path.abspath(args.work_dir or os.path.splitext(os.path.abspath(args.out))[0] + "_work")
    os.makedirs(work, exist_ok=True)
    end = None if args.total_budget_s is None else time.monotonic() + args.total_budget_s
    if args.eval_from:
        doc = merge_docs(parse_sources(args.eval_from, "--eval-from"))
    else:
        doc = _train_all(args, work, run_meta(args), end)
    if args.skip_eval:
        write_report(doc, args.out)
        return doc
    limit = args.eval_limit_s if end is None else min(args.eval_limit_s, end - time.monotonic() - 10)
    doc["eval"] = run_eval(doc, work, args, limit)
    write_report(doc, args.out)
    return doc


def _train_all(args, work: str, meta: dict, end: float | None = None) -> dict:
    """Check the input, then every (seed, side) run in turn (one with less than its budget + grace left before
    ``end``, a ``time.monotonic()`` value, is reported as not run); the report document (rewritten after each)."""
    sides, seeds, mk = _check(args)
    try:
        split = check_split(args.train, args.test, _expected_rows(args.expect_rows))
    except ValueError as err:
        raise SystemExit(f"error: {err}")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    job = dict(model=os.path.abspath(args.model), train=os.path.abspath(args.train), test=os.path.abspath(args.test),
               gsm8k=os.path.abspath(args.gsm8k) if args.gsm8k and os.path.exists(args.gsm8k) else None,
               gsm8k_rows=args.gsm8k_rows, test_rows=split["test_rows"], batch=args.batch, n=args.n,
               micro=args.micro, response_len=args.response_len, max_prompt_len=args.max_prompt_len, lr=args.lr,
               kl_coef=args.kl_coef, format_score=args.format_score, strict_format=bool(args.strict_format),
               budget_s=float(args.budget_s),
               every_s=args.every_s, marks_s=mk, grace_s=args.grace_s, seeds=seeds, sides=sides, device=device,
               cpus=1 if device == "cpu" else 4, max_steps=1000, ours_engine=args.ours_engine,
               ours_vllm_gpu_util=args.vllm_gpu_util, trl_vllm_gpu_util=args.trl_vllm_gpu_util,
               trl_vllm_sleep=args.trl_vllm_sleep, ours_overrides=args.ours_override, trl_cache_implementation=None)
    doc = dict(meta=meta, job=job, split=split, runs=[])
    for seed in seeds:
        for side in sides:
            print(f"=== {side} seed {seed} ({args.budget_s} s budget)", flush=True)
            left = None if end is None else end - time.monotonic()
            if left is not None and left < args.budget_s + args.grace_s:
                doc["runs"].append(dict(side=side, seed=seed, exports=[], wall_s=0.0, stop="not run",
                                        error=f"not run: {left:.0f} s left of --total-budget-s"))
                continue
            row = run_side(side, seed, job, work)
            print(f"{side} seed {seed}: {len(row['exports'])} saves, {row['stop']}, {row['wall_s']:.0f} s"
                  + (f"; {row['error']}" if row.get("error") else ""), flush=True)
            doc["runs"].append(row)
            write_report(doc, args.out)
    return doc


if __name__ == "__main__":
    _doc = main()
    _rc = ((_doc or {}).get("eval") or {}).get("rc")
    if _rc not in (None, 0):
        sys.exit(f"error: the evaluator exited {_rc} (its log: {_doc['eval'].get('log')})")
