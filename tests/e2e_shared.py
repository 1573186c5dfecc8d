"""A local Ray instance shared by the end-to-end tests of one pytest process, and a pre-imported ``trainer/main.py``.

Starting Ray (GCS, raylet) and stopping it again takes about 5 s of every run of ``trainer/main.py`` on 2 CPU
cores, and the entry point's imports (torch, transformers, Ray, datasets, the trainer) about 4 s more. Tests whose
subject is a run's training, not Ray's start-up or the driver process's signals, can instead

* join one Ray instance of the test session (:func:`shared_ray_env`): ``trainer/main.py`` connects through
  ``RAY_ADDRESS``, as on a cluster started with ``ray start``; each run is its own Ray job, whose workers and
  placement group Ray removes when the run's driver disconnects;
* run the entry point in a driver forked from a process that has imported what the entry point imports
  (:func:`run_main_forked`): each run is a new process, forked from that never-run parent, with the environment a
  ``subprocess`` of the test would get, that runs the script ``trainer/main.py`` as ``__main__`` (``runpy``) and
  exits; nothing of one run (module state, caches, handlers, threads) is in the next one's process. As the command
  line's process, the run's process is a child subreaper that kills what it started at its exit
  (``trainer/leftovers.py``); it never reaches the shared Ray instance's processes, which are not below it.

Both long-lived processes are this module run as a script (``holder`` / ``driver``); they end when the pytest
process closes their stdin (at its exit, or when it dies); a forked run dies with its parent.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0", "HF_HUB_OFFLINE": "1"}


class _Child:
    """A ``python -m tests.e2e_shared <role>`` process answering one JSON line per request line."""

    def __init__(self, role: str, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.e2e_shared", role], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def replied(self) -> bool:
        """Whether a reply (or the end of the process's output) can be read now, without waiting."""
        return bool(select.select([self.proc.stdout], [], [], 0)[0])

    def ask(self, request: dict | None, timeout: float) -> dict | None:
        """Send ``request`` (None: only read) and return the reply; None when the process died or ran over
        ``timeout`` seconds (then it is killed)."""
        if request is not None:
            self.send(request)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close(kill=True)
            return None
        return json.loads(line)

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_CHILDREN: dict[str, _Child] = {}
_RAY_ENV: dict[str, str] = {}


def _close_all() -> None:
    for role in ("driver", "holder"):  # the driver's runs first, then the Ray instance they ran on
        if role in _CHILDREN:
            _CHILDREN.pop(role).close()


atexit.register(_close_all)


def shared_ray_env(idle_timeout_s: float = 120.0) -> dict[str, str]:
    """``RAY_ADDRESS`` (and ``RAY_AUTH_MODE``) of the session's Ray instance, started on first use, once its CPUs
    and GPUs are all free again (the previous run's workers are removed asynchronously)."""
    holder = _CHILDREN.get("holder")
    if holder is None or not holder.alive():
        holder = _CHILDREN["holder"] = _Child("holder", {**os.environ, **ENV})
        info = holder.ask(None, timeout=120)
        assert info is not None, "the shared Ray instance did not start"
        _RAY_ENV.clear()
        _RAY_ENV["RAY_ADDRESS"] = info["address"]
        if info.get("auth_mode"):
            _RAY_ENV["RAY_AUTH_MODE"] = info["auth_mode"]
    reply = holder.ask({"idle": idle_timeout_s}, timeout=idle_timeout_s + 30)
    assert reply is not None and reply["idle"], f"the shared Ray instance is still busy: {reply}"
    return dict(_RAY_ENV)


def run_main_forked(out_dir: str, *overrides: str, timeout: int = 600, check: bool = True,
                    env: dict | None = None) -> subprocess.CompletedProcess:
    """``trainer/main.py trainer.output_dir=<out_dir> <overrides>`` as :func:`tests.e2e_utils.run_main` runs it, but
    forked from the pre-imported driver and on the shared Ray instance.

    ``env``: more environment variables for the run (a value None leaves that variable out). Returns a
    ``CompletedProcess`` whose ``returncode`` is the run's exit code (2 for a user error, as the entry point; -9 when
    it ran over ``timeout`` seconds and was killed) and whose ``stdout`` and ``stderr`` are the run's (also in
    ``<out_dir>.stdout.log`` / ``<out_dir>.stderr.log``).
    """
    run = ForkedRun(out_dir, *overrides, timeout=timeout, env=env)
    rc = run.finish(timeout + 60)
    out, err = run.output()
    proc = subprocess.CompletedProcess(["trainer/main.py (forked driver)", *run.args], rc, out, err)
    if check and rc != 0:
        why = " (ran over its timeout)" if run.timed_out else ""
        raise AssertionError(f"main.py (forked driver) exited {rc}{why}\nSTDOUT:\n{out[-4000:]}\n"
                             f"STDERR:\n{err[-8000:]}")
    return proc


class ForkedRun:
    """:func:`run_main_forked` without waiting, for a test that acts on the run while it runs, with the methods of
    :class:`tests.e2e_utils.MainRun`: ``text()`` (its output so far, stdout then stderr), ``wait_for(done, what)``
    (the run must stay alive meanwhile), ``stepped(n)``, ``finish(timeout)`` (its exit code; -9 when it ran over its
    ``timeout`` or ``finish``'s, then it is killed). The driver serves no other run before this one has finished."""

    def __init__(self, out_dir: str, *overrides: str, timeout: int = 600, env: dict | None = None):
        ray_env = shared_ray_env()
        driver = _CHILDREN.get("driver")
        if driver is None or not driver.alive():  # Ray reads its authentication mode at import: the runs' one
            driver = _CHILDREN["driver"] = _Child("driver", {**os.environ, **ENV, **ray_env})
        self.out, self.driver, self.rc, self.timed_out = out_dir, driver, None, False
        self.logs = {"stdout": f"{out_dir}.stdout.log", "stderr": f"{out_dir}.stderr.log"}
        self.args = [f"trainer.output_dir={out_dir}", *overrides]
        run_env = {k: v for k, v in {**os.environ, **ENV, **ray_env, **(env or {})}.items() if v is not None}
        driver.send({"args": self.args, **self.logs, "env": run_env, "timeout": timeout})
        started = driver.ask(None, timeout=60)
        assert started is not None, "the e2e driver did not fork the run"
        self.pid = started["pid"]

    def output(self) -> tuple[str, str]:
        return tuple(open(p, encoding="utf-8", errors="replace").read() if os.path.exists(p) else ""
                     for p in self.logs.values())

    def text(self) -> str:
        return "".join(self.output())

    def poll(self) -> int | None:
        """The exit code once the run has ended, else None."""
        if self.rc is None and self.driver.replied():
            self.finish(0)
        return self.rc

    def finish(self, timeout: float = 90) -> int:
        if self.rc is None:
            reply = self.driver.ask(None, timeout=timeout)
            self.rc = reply["rc"] if reply is not None else -9
            self.timed_out = reply is None or reply.get("timed_out")
        return self.rc

    def kill(self) -> int:
        """Kill the run (SIGKILL to it and every process below it) unless it has ended; its exit code."""
        import signal

        from rewards.process_tree import kill_tree

        if self.poll() is None:
            kill_tree(self.pid)
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return self.finish(60)

    def wait_for(self, done, what: str, timeout: float = 300) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.poll() is None, self.text()[-5000:]
            if done():
                return
            time.sleep(0.2)
        raise AssertionError(f"{what} not reached in {timeout} s\n{self.text()[-5000:]}")

    def stepped(self, step: int = 1) -> bool:
        from tests.e2e_utils import MainRun

        return MainRun.stepped(self, step)


# ---- the two processes --------------------------------------------------------------------------------------
def _reply_channel():
    """The process's stdout as the channel for its replies; what libraries print goes to stderr from here on."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return replies


def _reply(replies, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def _hold() -> None:
    import logging
    import time

    import ray

    replies = _reply_channel()
    # a new instance (``address="local"``), not a cluster that ``ray start`` left on this machine
    ctx = ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    _reply(replies, {"address": ctx.address_info["gcs_address"], "auth_mode": os.environ.get("RAY_AUTH_MODE")})
    for line in sys.stdin:
        deadline = time.monotonic() + float(json.loads(line)["idle"])
        while True:
            total, free = ray.cluster_resources(), ray.available_resources()
            idle = all(free.get(k, 0.0) >= total[k] for k in ("CPU", "GPU") if k in total)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        _reply(replies, {"idle": idle, "free": free, "total": total})
    ray.shutdown()


# what trainer/main.py imports in a run (the embedded task's Llama included), imported once by the driver before it
# forks; a module missing here is imported by each run itself. Importing them starts no Python thread.
_PREIMPORT = ("torch", "transformers", "datasets", "deepspeed", "ray", "hydra", "omegaconf", "math_verify",
              "accelerate", "safetensors.torch", "torch.distributed.checkpoint", "ray.dag",
              "transformers.modeling_utils", "transformers.quantizers", "transformers.processing_utils",
              "transformers.models.auto.modeling_auto", "transformers.models.llama.modeling_llama",
              "trainer.launch", "trainer.ppo_trainer", "trainer.workers.actor", "trainer.dataset", "trainer.interrupt",
              "trainer.core_algos", "trainer.placement", "trainer.recovery", "trainer.verl_checks", "rewards.manager",
              "rollout.multiturn.loop")


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that forked it dies (no run outlives a dead driver)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run_entry(entry: str, args: list[str]) -> int:
    """The script ``entry`` run as ``python <entry> <args>`` runs it, in this process; returns its exit code."""
    import runpy
    import traceback

    sys.argv = [entry, *args]
    rc = 0
    try:
        runpy.run_path(entry, run_name="__main__")
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 (reported as the interpreter would: traceback, exit 1)
        traceback.print_exc()
        rc = 1
    atexit._run_exitfuncs()  # what the interpreter runs at exit (Ray's shutdown among them)
    return rc


def _run_forked(req: dict, entry: str, replies_fd: int) -> None:
    """The forked child: the run as ``python trainer/main.py <args>`` in the request's environment, its stdout and
    stderr in the request's files; never returns."""
    import traceback

    rc = 1
    try:
        os.setpgid(0, 0)  # its own process group: the driver kills the whole run on a timeout
        _die_with_parent()
        os.close(replies_fd)
        os.environ.clear()
        os.environ.update(req["env"])
        streams = [os.open(os.devnull, os.O_RDONLY)] + [
            os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for name in ("stdout", "stderr")]
        for dst, fd in enumerate(streams):  # fds 0, 1, 2
            os.dup2(fd, dst)
            os.close(fd)
        rc = _run_entry(entry, req["args"])
    except BaseException:  # noqa: BLE001 (the set-up failed: say why on the driver's stderr or the log)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """The exit code of the forked run ``pid`` (negative: killed by that signal), and whether it ran over
    ``timeout`` seconds (then it was killed with every process below it, whatever session they joined: the run's
    process keeps them below it, as the command line's does, ``trainer/leftovers.py``, and its process group)."""
    import signal
    import time

    from rewards.process_tree import kill_tree

    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            kill_tree(pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), True
        time.sleep(0.05)


def _drive() -> None:
    import importlib
    import threading

    entry = os.path.join(ROOT, "trainer", "main.py")
    replies = _reply_channel()
    for name in _PREIMPORT:  # only what the runs would import anyway: a module missing here is imported by none
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            print(f"e2e driver: not pre-importing {name} ({e})", file=sys.stderr)
    for line in sys.stdin:
        req = json.loads(line)
        assert threading.active_count() == 1, f"threads before fork: {threading.enumerate()}"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked(req, entry, replies.fileno())
        _reply(replies, {"pid": pid})
        rc, timed_out = _wait(pid, float(req["timeout"]))
        _reply(replies, {"rc": rc, "timed_out": timed_out})


if __name__ == "__main__":
    {"holder": _hold, "driver": _drive}[sys.argv[1]]()
