"""A local Ray instance shared by the end-to-end tests of one pytest process, and a warm ``trainer/main.py`` on it.

Starting Ray (GCS, raylet) and stopping it again takes about 5 s of every run of ``trainer/main.py`` on 2 CPU
cores, and the entry point's own imports a few more. Tests whose subject is a run's training, not Ray's start-up
or the driver process, can instead

* join one Ray instance of the test session (:func:`shared_ray_env`): ``trainer/main.py`` connects through
  ``RAY_ADDRESS``, as on a cluster started with ``ray start``; each run is its own Ray job, whose workers and
  placement group Ray removes when the run's driver disconnects;
* run the entry point in a warm driver process on that instance (:func:`run_main_warm`): the script
  ``trainer/main.py`` run as ``__main__`` (``runpy``) with the run's arguments, one run after the other in one
  interpreter, so that the imports are paid once.

Both processes are this module run as a script (``holder`` / ``driver``); they end when the pytest process closes
their stdin (at its exit, or when it dies).
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

    def ask(self, request: dict | None, timeout: float) -> dict | None:
        """Send ``request`` (None: only read) and return the reply; None when the process died or ran over
        ``timeout`` seconds (then it is killed)."""
        if request is not None:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
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


def run_main_warm(out_dir: str, *overrides: str, timeout: int = 600,
                  check: bool = True) -> subprocess.CompletedProcess:
    """``trainer/main.py trainer.output_dir=<out_dir> <overrides>`` in the warm driver on the shared Ray instance.

    Returns a ``CompletedProcess`` whose ``returncode`` is the run's exit code (2 for a user error, as the entry
    point) and whose ``stdout`` and ``stderr`` both hold the run's combined output (also in ``<out_dir>.log``).
    """
    ray_env = shared_ray_env()
    driver = _CHILDREN.get("driver")
    if driver is None or not driver.alive():
        driver = _CHILDREN["driver"] = _Child("driver", {**os.environ, **ENV, **ray_env})
    log = f"{out_dir}.log"
    args = [f"trainer.output_dir={out_dir}", *overrides]
    reply = driver.ask({"args": args, "log": log}, timeout=timeout)
    text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
    rc = reply["rc"] if reply is not None else -9
    proc = subprocess.CompletedProcess(["trainer/main.py (warm)", *args], rc, text, text)
    if check and rc != 0:
        raise AssertionError(f"main.py (warm driver) exited {rc}{'' if reply else ' (died or timed out)'}\n"
                             f"OUTPUT:\n{text[-8000:]}")
    return proc


# ---- the two processes --------------------------------------------------------------------------------------
def _hold() -> None:
    import logging
    import time

    import ray

    # a new instance (``address="local"``), not a cluster that ``ray start`` left on this machine
    ctx = ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    print(json.dumps({"address": ctx.address_info["gcs_address"], "auth_mode": os.environ.get("RAY_AUTH_MODE")}),
          flush=True)
    for line in sys.stdin:
        deadline = time.monotonic() + float(json.loads(line)["idle"])
        while True:
            total, free = ray.cluster_resources(), ray.available_resources()
            idle = all(free.get(k, 0.0) >= total[k] for k in ("CPU", "GPU") if k in total)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        print(json.dumps({"idle": idle, "free": free, "total": total}), flush=True)
    ray.shutdown()


def _drive() -> None:
    import runpy
    import traceback

    from hydra.core.global_hydra import GlobalHydra

    from trainer.interrupt import shutdown_ray

    entry = os.path.join(ROOT, "trainer", "main.py")
    replies = os.fdopen(os.dup(1), "w")  # fds 1 and 2 go to the runs' logs from here on
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        rc = 0
        sys.argv = [entry, *req["args"]]
        try:
            runpy.run_path(entry, run_name="__main__")  # the script as `python trainer/main.py <args>` runs it
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # noqa: BLE001 (reported as the interpreter would: traceback, exit 1)
            traceback.print_exc()
            rc = 1
        finally:
            shutdown_ray()  # the run's Ray job ends (main shuts Ray down only after a run that finished)
            GlobalHydra.instance().clear()
            sys.stdout.flush()
            sys.stderr.flush()
        replies.write(json.dumps({"rc": rc}) + "\n")
        replies.flush()


if __name__ == "__main__":
    {"holder": _hold, "driver": _drive}[sys.argv[1]]()
