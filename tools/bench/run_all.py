"""Run the benchmark suite (``tools/bench/suite.py``) on this machine: one JSON and one markdown table.

Each benchmark script runs as a subprocess from the repository root with its own time limit; what this machine
cannot run (no GPU, one GPU for a 2-GPU benchmark, no vLLM or TRL, no ``--model``) is skipped with the reason.
Results go to ``--out DIR``:

* ``DIR/results.json``: ``meta`` (date, command, host, GPUs, versions, git commit) and one entry per benchmark:
  ``status`` (``ok`` | ``failed`` | ``timeout`` | ``skipped``), ``reason``, ``seconds``, the command lines, the
  log file, the summary rows and the script's whole JSON (``result``; kept from a run cut short when the script
  wrote it). Rewritten after every benchmark, so a suite stopped half-way keeps what finished.
* ``DIR/results.md``: a table of every benchmark's status, then each one's summary rows.
* ``DIR/raw/``: the scripts' own outputs; ``DIR/logs/<name>.log``: their stdout and stderr.

Usage:
    python tools/bench/run_all.py --out bench_out                               # the whole suite, full sizes
    python tools/bench/run_all.py --out bench_out --quick                       # smaller sizes, fewer iterations
    python tools/bench/run_all.py --out bench_out --model HuggingFaceTB/SmolLM2-135M-Instruct --only rollout,vs_trl
    python tools/bench/run_all.py --out bench_out --only rl_runs --model /path/to/smollm2 --runs "svamp_e:0"
    python tools/bench/run_all.py --out /tmp/bench --tiny --only mfu,step_profile     # CPU smoke test
    python tools/bench/run_all.py --list
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools.bench.suite import MODES, Bench, Context, by_name, skip_reason  # noqa: E402

PROBE = """import json, torch, transformers
n = torch.cuda.device_count()
print(json.dumps(dict(torch=torch.__version__, transformers=transformers.__version__, cuda=torch.version.cuda, gpus=n,
    gpu_names=[torch.cuda.get_device_name(i) for i in range(n)],
    gpu_memory_gib=[torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(n)])))"""


def probe_machine(python: str = sys.executable, timeout_s: float = 120) -> dict:
    """The GPUs and versions seen by ``python`` (in a subprocess, so this process makes no CUDA context):
    ``{"torch", "transformers", "cuda", "gpus", "gpu_names", "gpu_memory_gib"}``; with ``"error"`` and
    ``gpus`` 0 when the probe fails."""
    try:
        proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as exc:
        err = f"{type(exc).__name__}: {exc}"
    return dict(gpus=0, gpu_names=[], gpu_memory_gib=[], error=f"machine probe failed: {err}")


def installed(names=("vllm", "trl")) -> frozenset:
    """The optional packages of ``names`` that this interpreter can import (found, not imported)."""
    return frozenset(n for n in names if importlib.util.find_spec(n) is not None)


def resolve_model(name: str) -> str:
    """A local HF model folder for ``name``: the folder itself when it is one, else a Hub repository id
    downloaded (or found in the cache) by ``huggingface_hub.snapshot_download``; returns its absolute path.

    Raises:
        ValueError: ``name`` is neither a folder with ``config.json`` nor a repository that could be fetched
            (the message holds the download error).
    """
    if os.path.isdir(name):
        if not os.path.exists(os.path.join(name, "config.json")):
            raise ValueError(f"--model {name!r} is a folder without config.json (not an HF model folder)")
        return os.path.abspath(name)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                                "*.jinja", "*.tiktoken"])
    except Exception as exc:  # not a repository id, offline without a cache, gated, ...
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"--model {name!r}: not a local folder and not fetched from the Hub ({line})") from None


def visible_gpus(count: int, environ=os.environ) -> list[str]:
    """The CUDA device ids the scripts may use: ``CUDA_VISIBLE_DEVICES``'s entries when set, else 0..count-1."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [d.strip() for d in cvd.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def run_command(argv: list[str], log_path: str, timeout_s: float, env: dict, grace_s: float = 30.0) -> tuple:
    """Run ``argv`` from the repository root, stdout and stderr appended to ``log_path``, in a new session so that
    the whole process tree can be stopped: past ``timeout_s`` seconds it gets SIGTERM (the trainer then finishes
    its step and stops Ray), ``grace_s`` seconds later SIGKILL.

    Returns:
        ``(returncode, timed_out)``; returncode None when the command could not be started (then the error is
        in the log).
    """
    with open(log_path, "ab") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.write(f"could not start: {exc}\n".encode())
            return None, False
        try:
            return proc.wait(timeout=max(timeout_s, 0.1)), False
        except subprocess.TimeoutExpired:
            _stop_group(proc, grace_s)
            log.write(f"\nstopped after {timeout_s:.0f} s\n".encode())
            return proc.returncode, True


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone already
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def last_error_line(log_path: str, limit: int = 240) -> str:
    """The last line of a log that looks like an error (``Error``/``error:``), else its last non-empty line."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines()[-400:] if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return ((errors or lines or [""])[-1])[:limit]


def _env_for(bench: Bench, ctx: Context, gpu_ids: list[str]) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **bench.environment(ctx))
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if ctx.mode != "tiny" and bench.gpus and gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids[:bench.gpus])
    return env


def _read_json(path: str):
    """A script's JSON, NaN and Infinity read as strings (so results.json stays strict JSON); None if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_constant=str)
    except (OSError, ValueError):
        return None


def run_bench(bench: Bench, ctx: Context, logs_dir: str, gpu_ids: list[str], timeout_s: float | None = None,
              grace_s: float = 30.0) -> dict:
    """Run one benchmark (or skip it) and return its entry of ``results.json`` (see the module docstring)."""
    entry = dict(name=bench.name, what=bench.what, status="skipped", reason=skip_reason(bench, ctx))
    if entry["reason"]:
        return entry
    out = ctx.out(bench.name)
    log = os.path.join(logs_dir, f"{bench.name}.log")
    for old in (out, log):  # an old file must not pass for this run's output or log
        if os.path.exists(old):
            os.remove(old)
    commands = bench.commands(ctx, out)
    limit = float(timeout_s if timeout_s is not None else bench.timeout(ctx))
    env = _env_for(bench, ctx, gpu_ids)
    entry.update(commands=[shlex.join(c) for c in commands], log=os.path.relpath(log, os.path.dirname(logs_dir)),
                 timeout_s=limit)
    start, started = time.monotonic(), time.time()
    rc, timed_out = 0, False
    for argv in commands:
        rc, timed_out = run_command(argv, log, limit - (time.monotonic() - start), env, grace_s)
        if rc != 0 or timed_out:
            break
    if bench.collect is not None and not os.path.exists(out):
        try:
            bench.collect(ctx, out, started)
        except Exception as exc:  # a collection error is reported like a script error
            entry["collect_error"] = f"{type(exc).__name__}: {exc}"
    entry.update(seconds=round(time.monotonic() - start, 1), returncode=rc)
    return _finish(entry, bench, out, log, timed_out, os.path.dirname(logs_dir))


def _finish(entry: dict, bench: Bench, out: str, log: str, timed_out: bool, out_dir: str) -> dict:
    doc = _read_json(out)
    rc = entry["returncode"]
    if timed_out:
        entry.update(status="timeout", reason=f"stopped at its {entry['timeout_s']:.0f} s limit"
                     + ("; the JSON it had written is kept" if doc is not None else ""))
    elif rc != 0:
        entry.update(status="failed", reason=f"exit {rc}: {last_error_line(log)}")
    elif doc is None:
        entry.update(status="failed", reason=entry.get("collect_error") or f"exit 0 but no JSON at {out}")
    else:
        entry.update(status="ok", reason="")
    if doc is not None:
        entry["output"] = os.path.relpath(out, out_dir)
        try:
            entry["summary"] = bench.summarize(doc)
        except Exception as exc:  # a script's JSON changed shape: keep the JSON, say why there is no summary
            entry["summary"], entry["summary_error"] = [], f"{type(exc).__name__}: {exc}"
        entry["result"] = doc
    return entry


def git_commit() -> str | None:
    """``git describe --always --dirty`` of the repository, or None outside a git checkout."""
    try:
        proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                              timeout=20)
        return proc.stdout.strip() or None if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def make_meta(args, argv: list[str], machine: dict, ctx: Context, model_error: str | None) -> dict:
    """Provenance of the suite run: date, command (``argv``: its arguments), host, python, the probe's versions
    and GPUs, commit, inputs."""
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=shlex.join(["python", os.path.relpath(os.path.abspath(__file__), ROOT)] + list(argv)),
                host=platform.node(), python=platform.python_version(), commit=git_commit(), mode=ctx.mode,
                model=args.model, model_path=ctx.model, model_error=model_error, data=ctx.data,
                installed=sorted(ctx.installed), **machine)


# ------------------------------------------------------------------------------------------------ output
def _cell(v) -> str:
    """One markdown table cell: floats to 4 significant digits (whole numbers from 1,000 up), dicts as
    ``k: v; ...``, lists joined by ``->``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return str(v) if not math.isfinite(v) else (f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}")
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_cell(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        return " -> ".join(_cell(x) for x in v) or "-"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict]) -> list[str]:
    """Lines of a markdown table over the union of the rows' keys (first-seen order); missing cells are ``-``."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    if not cols:
        return []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return lines + ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]


def markdown(doc: dict) -> str:
    """The markdown report of a ``results.json`` document: provenance, the status table, each summary."""
    m = doc["meta"]
    gpus = ", ".join(f"{n} ({g:.0f} GiB)" for n, g in zip(m.get("gpu_names", []), m.get("gpu_memory_gib", [])))
    lines = [f"# Benchmark suite, {m['date']}", "",
             f"Machine: {m['host']}, {m.get('gpus', 0)} GPU(s){': ' + gpus if gpus else ''}; python {m['python']}, "
             f"torch {m.get('torch', '-')}, transformers {m.get('transformers', '-')}, installed: "
             f"{', '.join(m['installed']) or 'neither vLLM nor TRL'}; commit {m.get('commit') or '-'}; "
             f"mode {m['mode']}; model {m.get('model_path') or m.get('model') or '-'}.", "",
             f"Command: `{m['command']}`", ""]
    if m.get("error"):
        lines += [f"The {m['error']}: every benchmark that needs a GPU was skipped.", ""]
    if m["mode"] == "tiny":
        lines += ["Tiny mode: the scripts' CPU smoke tests; the figures only show that each script runs end to end.",
                  ""]
    lines += markdown_table([dict(benchmark=e["name"], status=e["status"], seconds=e.get("seconds"),
                                  note=e.get("reason") or e["what"]) for e in doc["benches"]])
    for e in doc["benches"]:
        if e["status"] == "skipped":
            continue
        lines += ["", f"## {e['name']}", "", f"{e['what']}. Log: `{e.get('log')}`."]
        if e.get("summary_error"):
            lines.append(f"No summary: {e['summary_error']}.")
        table = markdown_table(e.get("summary") or [])
        lines += [""] + table if table else []
    return "\n".join(lines) + "\n"


def write_results(doc: dict, out_dir: str) -> None:
    """Write ``results.json`` and ``results.md`` into ``out_dir`` (each replaced whole, never half-written)."""
    for name, text in (("results.json", json.dumps(doc, indent=1, allow_nan=False, default=str)),
                       ("results.md", markdown(doc))):
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, name))


# ------------------------------------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (results.json, results.md, raw/, logs/)")
    ap.add_argument("--only", help="comma list of benchmarks to run (default: all; --list names them)")
    ap.add_argument("--model", help="HF model folder or Hub repository id (rollout, vllm_memory, vs_trl, rl_runs); "
                    "without it the rollout benchmarks use random weights and the others are skipped")
    ap.add_argument("--data", default="data/gsm8k/train.parquet", help="verl-layout prompts for vs_trl")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes and fewer iterations")
    size.add_argument("--tiny", action="store_true", help="the scripts' CPU smoke tests (--tiny) only")
    ap.add_argument("--timeout", type=float, help="seconds per benchmark for every one (default: each its own)")
    ap.add_argument("--runs", default="", help="RL runs of tools/bench/rl_runs.sh for the rl_runs entry, as "
                    "'name:gpu name:gpu' (e.g. 'gsm8k_grpo:0 svamp_e:1')")
    ap.add_argument("--run-timeout", type=int, help="seconds per RL run (default 1200; --quick 300)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the scripts (default: this one)")
    ap.add_argument("--grace-s", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL at a timeout")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and what each needs, then exit")
    return ap


def _list(benches: list[Bench]) -> str:
    rows = [dict(benchmark=b.name, needs=", ".join(b.needs), modes=", ".join(m for m in MODES if m in b.timeout_s),
                 what=b.what) for b in benches]
    return "\n".join(markdown_table(rows))


def build_context(args, machine: dict, benches: list[Bench]) -> tuple[Context, str | None]:
    """The :class:`Context` of this run and the ``--model`` resolution error (None when resolved or not asked)."""
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    model, model_error = None, None
    if args.model and mode != "tiny" and any("model" in b.needs for b in benches):
        try:
            model = resolve_model(args.model)
        except ValueError as exc:
            model_error = str(exc)
    mem = machine.get("gpu_memory_gib") or [None]
    raw = os.path.join(os.path.abspath(args.out), "raw")
    ctx = Context(mode=mode, raw_dir=raw, python=args.python, model=model, model_error=model_error,
                  data=os.path.abspath(args.data), gpus=len(visible_gpus(machine.get("gpus", 0))),
                  gpu_memory_gib=mem[0], installed=installed(), runs=args.runs,
                  run_timeout_s=args.run_timeout or (300 if mode == "quick" else 1200))
    return ctx, model_error


def main(argv=None) -> int:
    """Run the suite; returns 0 when nothing failed or timed out (skips are not failures), else 1."""
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        benches = by_name(args.only)
    except ValueError as exc:
        ap.error(str(exc))
    if args.list:
        print(_list(benches))
        return 0
    if not args.out:
        ap.error("--out DIR is required")
    machine = probe_machine(args.python)
    ctx, model_error = build_context(args, machine, benches)
    os.makedirs(ctx.raw_dir, exist_ok=True)
    logs = os.path.join(os.path.abspath(args.out), "logs")
    os.makedirs(logs, exist_ok=True)
    doc = dict(meta=make_meta(args, sys.argv[1:] if argv is None else argv, machine, ctx, model_error), benches=[])
    gpu_ids = visible_gpus(machine.get("gpus", 0))
    for i, bench in enumerate(benches, 1):
        print(f"[{i}/{len(benches)}] {bench.name} ...", flush=True)
        entry = run_bench(bench, ctx, logs, gpu_ids, args.timeout, args.grace_s)
        doc["benches"].append(entry)
        write_results(doc, os.path.abspath(args.out))
        print(f"[{i}/{len(benches)}] {bench.name}: {entry['status']}"
              + (f" ({entry['seconds']} s)" if "seconds" in entry else "")
              + (f": {entry['reason']}" if entry.get("reason") else ""), flush=True)
    print(f"wrote {os.path.join(args.out, 'results.json')} and results.md", flush=True)
    return int(any(e["status"] in ("failed", "timeout") for e in doc["benches"]))


if __name__ == "__main__":
    sys.exit(main())
