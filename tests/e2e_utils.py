"""Helpers for end-to-end tests that run the real entry point in a subprocess."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(out_dir: str, *overrides: str, timeout: int = 600, launcher: list[str] | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    """Run ``trainer/main.py`` with ``overrides`` writing into ``out_dir``; returns the completed process."""
    cmd = (launcher or [sys.executable]) + [os.path.join(ROOT, "trainer", "main.py"),
                                            f"trainer.output_dir={out_dir}", *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"main.py exited {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\n"
                             f"STDERR:\n{proc.stderr[-8000:]}")
    return proc


def run_tool(script: str, *args: str, out: str, timeout: int = 600) -> dict:
    """Run ``python <script> *args --out <out>`` from the repository root; assert it exits 0 (the message holds
    the output's tail) and return the JSON it wrote to ``out``."""
    proc = subprocess.run([sys.executable, script, *args, "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def read_metrics(out_dir: str) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# a short embedded run: 2 steps, small batches (2 CPU workers)
SHORT = ["trainer.total_training_steps=2", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a spawned process group's MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs, read from ``/proc`` (Linux): a zombie no one reaped counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class MainRun:
    """``trainer/main.py`` started in its own session (``Popen``), its output in ``<out_dir>.log``, with SIGHUP at its
    default disposition as from a terminal (a test session started under ``nohup`` would pass its ignored SIGHUP on).

    ``wait_for(done)`` polls ``done()`` until it is true (the run must stay alive meanwhile); ``stepped(n)`` is
    true once step ``n`` is in ``metrics.jsonl``; ``finish()`` waits for the exit code (the session is killed if
    it runs over)."""

    def __init__(self, out_dir: str, *overrides: str, env: dict | None = None):
        self.out = out_dir
        self.log = open(f"{out_dir}.log", "w+")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "trainer", "main.py"),
                                      f"trainer.output_dir={out_dir}", *overrides], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_default_sighup)

    def text(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait_for(self, done, what: str, timeout: float = 300) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.text()[-5000:]
            if done():
                return
            time.sleep(0.2)
        raise AssertionError(f"{what} not reached in {timeout} s\n{self.text()[-5000:]}")

    def stepped(self, step: int = 1) -> bool:
        path = os.path.join(self.out, "metrics.jsonl")
        return os.path.exists(path) and any(r.get("step", 0) >= step and "actor/pg_loss" in r
                                            for r in read_metrics(self.out))

    def finish(self, timeout: float = 90) -> int:
        import signal

        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)


def _gloo_rank(rank: int, world: int, port: int, out_dir: str, body) -> None:
    """One spawned rank of :func:`run_gloo_ranks`: a gloo group, ``body(rank, world, errors)``, its errors to JSON."""
    import traceback
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    errors: list[str] = []
    try:
        body(rank, world, errors)
    except Exception:
        errors.append(traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(errors, f)
    dist.destroy_process_group()


def run_gloo_ranks(world: int, body, preload: str) -> list[str]:
    """Run ``body(rank, world, errors)`` (a module-level function of the module ``preload``) on ``world`` CPU ranks
    of one gloo group, forked from a forkserver that imported ``preload`` once; returns every rank's recorded errors
    (each rank records failures instead of raising, so that no rank leaves a collective early)."""
    import tempfile

    import torch.multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload([preload])
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_gloo_rank, args=(world, free_port(), d, body), nprocs=world, join=True,
                           start_method="forkserver")
        return [f"rank {r}: {e}" for r in range(world) for e in json.load(open(os.path.join(d, f"rank{r}.json")))]


def resolved_config(*overrides: str) -> dict:
    """The composed ``configs/ppo_trainer.yaml`` with ``overrides``, resolved as a run resolves it
    (:func:`trainer.launch.resolve_config`), for tests that build a trainer or a worker without running main."""
    from hydra import compose, initialize_config_dir

    from trainer.launch import resolve_config

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return resolve_config(compose("ppo_trainer", overrides=list(overrides)))


def refused_in_one_line(check, cfg, *needles: str) -> None:
    """``check(cfg)`` raises :class:`trainer.launch.ConfigError` with exactly one line holding ``needles[0]``, and
    that line holds every needle."""
    import pytest

    from trainer.launch import ConfigError

    with pytest.raises(ConfigError) as info:
        check(cfg)
    lines = [ln for ln in str(info.value).splitlines() if needles[0] in ln]
    assert len(lines) == 1, str(info.value)
    for n in needles:
        assert n in lines[0], (n, lines[0])


def one_process_group():
    """A one-process gloo group for DeepSpeed, made once per test process (reused when a test made one already):
    a free port, DeepSpeed's shared-memory all-reduce op off (a ~60 s JIT build, useless for one rank), and
    ``MASTER_ADDR`` / ``MASTER_PORT`` restored afterwards (the group holds the port: child processes of later tests
    must not inherit it). Returns the ``deepspeed`` module."""
    import socket

    import deepspeed
    import torch

    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        try:
            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return deepspeed
