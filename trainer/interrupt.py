"""Ctrl-C and SIGTERM of the driver (``python trainer/main.py``): one line, an exit code, no Ray processes left.

* SIGINT (Ctrl-C) at any time stops the run at once: ``interrupted at step N; last checkpoint: PATH`` on stderr
  (N is the step in progress, 0 before training; PATH the newest committed checkpoint, or ``none``), exit 130.
* SIGTERM during the training loop: the current step finishes, a checkpoint is saved when ``trainer.save_freq > 0``
  and the run exits 0 (``RayPPOTrainer.fit``'s handler). SIGTERM before the loop starts, or a second SIGTERM while
  the step finishes, stops at once like Ctrl-C, with exit code 143.

In every case Ray is shut down before exit: the local Ray's processes (and the workers in them) end; on a joined
cluster (``RAY_ADDRESS``) this job's actors are killed. Processes forked from the driver (reward scoring) that
receive the signal die of it quietly.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

_STATE: dict[str, int | None] = {"driver_pid": None, "signum": None}


class RunInterrupted(KeyboardInterrupt):
    """The driver received SIGINT or SIGTERM (``signum``); ``step`` is the training step in progress, if known."""

    def __init__(self, signum: int, step: int | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step = signum, step


def install_handlers() -> None:
    """Make SIGINT and SIGTERM raise :class:`RunInterrupted` in this (the driver) process."""
    _STATE["driver_pid"] = os.getpid()
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)


def reinstall_handlers() -> None:
    """Put the handlers of :func:`install_handlers` back if they were installed in this process: ``ray.init``
    installs Ray's own C-level SIGTERM handler, which dumps a stack and aborts the driver."""
    if _STATE["driver_pid"] == os.getpid():
        install_handlers()


def _raise_interrupted(signum, frame) -> None:
    if os.getpid() != _STATE["driver_pid"]:  # a process forked from the driver inherits this handler: just die
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _STATE["signum"] is not None:  # already stopping: a repeated Ctrl-C must not interrupt the clean-up
        return
    _STATE["signum"] = signum
    raise RunInterrupted(signum)


def interrupted_by() -> int | None:
    """The signal that is stopping the run, or None."""
    return _STATE["signum"]


def as_interrupt(exc: KeyboardInterrupt, step: int | None = None) -> RunInterrupted:
    """``exc`` as a :class:`RunInterrupted` with ``step`` filled in when given. Ray's blocking calls turn the
    handler's exception into a bare ``KeyboardInterrupt``; the signal is then the one the handler recorded."""
    if not isinstance(exc, RunInterrupted):
        exc = RunInterrupted(interrupted_by() or signal.SIGINT)
    if step is not None:
        exc.step = step
    return exc


def exit_interrupted(signum: int, step: int | None, checkpoint_root: str | None) -> NoReturn:
    """Shut Ray down, print the one line, exit ``128 + signum`` (130 for SIGINT, 143 for SIGTERM)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    _STATE["signum"] = signum
    shutdown_ray()
    from trainer.checkpoint.base import find_latest_checkpoint

    last = find_latest_checkpoint(checkpoint_root) or "none"
    print(f"interrupted at step {step or 0}; last checkpoint: {last}", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def _is_ray_process(cmdline: list[str]) -> bool:
    """A process of Ray's own (GCS, raylet, dashboard, monitors: a program under the ray package; workers: ``ray::``).
    Other children of the driver (wandb's service, which ends at the driver's exit) are left alone."""
    if not cmdline:
        return False
    return cmdline[0].startswith("ray::") or any(f"{os.sep}ray{os.sep}" in part for part in cmdline[:3])


def shutdown_ray(timeout_s: float = 15.0) -> None:
    """``ray.shutdown()``, then wait up to ``timeout_s`` for the Ray processes this driver started (a local Ray's
    GCS, raylet and worker processes, :func:`_is_ray_process`, and their descendants) to end; kill those still there.
    No-op when Ray is not initialized."""
    if "ray" not in sys.modules:
        return
    import ray

    if not ray.is_initialized():
        return
    import psutil  # shipped with Ray (ray/thirdparty_files)

    me = psutil.Process()
    started = []
    for p in me.children():
        try:  # Ray's processes and theirs; not the driver's forks (reward scoring) nor other libraries' helpers
            if _is_ray_process(p.cmdline()):
                started += [p, *p.children(recursive=True)]
        except psutil.Error:
            pass
    ray.shutdown()
    _, alive = psutil.wait_procs(started, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
