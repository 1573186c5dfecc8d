"""Ctrl-C, SIGTERM and SIGHUP of the driver (``python trainer/main.py``): one line, an exit code, no Ray processes
left. SIGHUP (the terminal or ssh session closed) is a SIGTERM here (:data:`STOP_SIGNALS`), with exit code 129; a
driver started with SIGHUP ignored (``nohup``) keeps ignoring it.

* SIGINT (Ctrl-C) at any time stops the run at once: ``interrupted at step N; last checkpoint: PATH`` on stderr
  (N is the step in progress, 0 before training; PATH the newest committed checkpoint, or ``none``), exit 130.
* Once the run's work is complete and saved (its ``done:`` line printed, :func:`run_complete`), SIGINT or SIGTERM
  only cuts the shut-down short: the run is not reported as interrupted, and it exits 0.
* SIGTERM during the training loop: the current step finishes, a checkpoint is saved when ``trainer.save_freq > 0``
  (else the HF export) and the run exits 143 (``RayPPOTrainer.fit``'s handler). SIGTERM before the loop starts, or
  a second SIGTERM while the step finishes, stops at once like Ctrl-C, with exit code 143. A failure after a
  SIGTERM asked the run to stop (its workers died of the same signal: Slurm signals every process of the job) ends
  the same way: the one line, exit 143.

"At once" means at the next point where raising is safe. The handler records the signal and raises
:class:`RunInterrupted` right away, except while the main thread is inside an import (an exception there leaves
half-initialised modules, torch's among them, that break the exit path), inside a ``__del__`` (Python prints and
drops the exception there), inside a :func:`deferred` section (``ray.init``: :func:`ray_init_guard`), or before the
entry point's ``try`` (:func:`install_handlers` with ``held=True``): it raises when that ends (a helper thread sends
the signal again once the main thread is out of the import). An exception swallowed anyway (Python ignores
exceptions in finalizers and callbacks) is raised again by :func:`check_interrupted`, which start-up and the
training loop call at their milestones (after ``ray.init``, after the workers start, before every step).

``ray.init`` replaces the driver's SIGTERM handling three ways: its Python handler ``sys.exit(15)`` (the run
exited 15, or the ``SystemExit`` was swallowed and the run trained on), a local head node's handler, and the core
worker's C-level failure signal handler, which prints a stack and can abort the driver (exit 134).
:func:`ray_init_guard` keeps ours in force: Ray's handlers are not installed in the driver (the call that installs
them is a no-op while ``ray.init`` runs, and Ray's C handler is off in the driver, ``RAY_DISABLE_FAILURE_SIGNAL_
HANDLER``), a signal during ``ray.init`` is acted on when it returns, and the local Ray's processes (GCS, raylet, and
the workers the raylet starts) run in a session of their own: a SIGTERM to the driver's process group (``timeout``,
``kill -TERM -PGID``) reaches the driver (and its forks), which finishes the step, and not the workers it needs for
that. They still die with the driver (Ray's kernel fate-sharing) and are shut down at its exit.

In every case Ray is shut down before exit: the local Ray's processes (and the workers in them) end; on a joined
cluster (``RAY_ADDRESS``) this job's actors are killed. Processes forked from the driver that receive the signal
die of it quietly (reward scoring workers ignore SIGTERM and end with the driver: :mod:`rewards.pool`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Iterator, NoReturn

from trainer.ray_shutdown import _is_ray_process, stop_ray  # noqa: F401  (_is_ray_process re-exported)

#: the signals that stop the run after the current step (the training loop's handler), as SIGTERM does
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_HANDLED = (signal.SIGINT, *STOP_SIGNALS)

# driver_pid: the process install_handlers ran in; signum: the signal stopping the run (None: none yet); raised:
# RunInterrupted was raised for it; exiting: exit_interrupted runs; held / deferred: the handler records, the
# raise waits (install_handlers(held=True), deferred()); redeliver: the next signal is the helper thread's
# re-sending; insist: a second signal came while the first waited (deferred sections are not waited for); step: the
# step in progress (check_interrupted); stop_signal / stop_step: a SIGTERM asked the loop to stop after step
# stop_step (request_stop); complete: the run's work is done and saved (run_complete)
_STATE: dict = {"driver_pid": None, "signum": None, "raised": False, "exiting": False, "held": False,
                "deferred": 0, "redeliver": False, "insist": False, "step": None, "stop_signal": None,
                "stop_step": None, "checkpoint_root": None, "complete": False}
_WAKE = threading.Event()  # set by the handler when a recorded signal waits for a safe point (the helper thread)
_HELPER: dict = {"thread": None, "pid": None}


class RunInterrupted(KeyboardInterrupt):
    """The driver received SIGINT, SIGTERM or SIGHUP (``signum``); ``step`` is the training step in progress."""

    def __init__(self, signum: int, step: int | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step = signum, step


def install_handlers(held: bool = False) -> None:
    """Make SIGINT, SIGTERM and SIGHUP (unless ignored: ``nohup``) raise :class:`RunInterrupted` in this (the
    driver) process. ``held``: a signal is only recorded until :func:`release` (the entry point's module-level
    imports, before its ``try``)."""
    _STATE["driver_pid"], _STATE["complete"] = os.getpid(), False
    if held:
        _STATE["held"] = True
    _start_helper()
    _install()


def release() -> None:
    """End the hold of ``install_handlers(held=True)``; raise the signal received meanwhile (if any)."""
    _STATE["held"] = False
    check_interrupted()


def reinstall_handlers() -> None:
    """Put the handlers of :func:`install_handlers` back if they were installed in this process (after something
    replaced them; ``ray.init`` in a process without :func:`ray_init_guard`)."""
    if _is_driver():
        _install()


def _install() -> None:
    for s in _HANDLED:
        if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(s, _raise_interrupted)


def stop_handlers(handler) -> dict:
    """Install ``handler`` for the :data:`STOP_SIGNALS` this driver handles (a SIGHUP ``nohup`` ignores stays
    ignored); returns the handlers replaced, for :func:`signal.signal` to put back."""
    return {s: signal.signal(s, handler) for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}


def _is_driver() -> bool:
    return _STATE["driver_pid"] == os.getpid()


def _must_wait(frame, sections: bool = True) -> bool:
    """Whether raising into ``frame`` (the main thread's) must wait: held, a deferred section (``sections``), an
    import or a ``__del__`` on the stack."""
    if _STATE["held"] or (sections and _STATE["deferred"]):
        return True
    depth = 0
    while frame is not None and depth < 500:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib._bootstrap") or code.co_name == "__del__":
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def _raise_interrupted(signum, frame) -> None:
    if os.getpid() != _STATE["driver_pid"]:  # a process forked from the driver inherits this handler: just die
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    redelivered, _STATE["redeliver"] = _STATE["redeliver"], False
    if _STATE["exiting"]:
        return
    if _STATE["signum"] is None:
        _STATE["signum"] = signum
    elif _STATE["raised"]:  # already stopping: a repeated Ctrl-C must not interrupt the clean-up
        return
    elif not redelivered:  # a second signal while the first waits: a deferred section (ray.init, which may hang)
        _STATE["insist"] = True  # is not waited for any more
    if _must_wait(frame, sections=not _STATE["insist"]):
        _WAKE.set()  # the helper thread sends the signal again once the main thread is past the import
        return
    _STATE["raised"] = True
    raise RunInterrupted(_STATE["signum"], _STATE["step"])


def _start_helper() -> None:
    """The thread that re-sends a recorded signal once the main thread can take the exception (started here, not
    in the handler: starting a thread there can deadlock on threading's own locks)."""
    if _HELPER["pid"] == os.getpid() and _HELPER["thread"] is not None and _HELPER["thread"].is_alive():
        return
    _HELPER["pid"] = os.getpid()
    _HELPER["thread"] = t = threading.Thread(target=_helper_loop, name="interrupt-redeliver", daemon=True)
    t.start()


def _helper_loop() -> None:
    main = threading.main_thread()
    while True:
        _WAKE.wait()
        while not (_STATE["raised"] or _STATE["exiting"]) and _STATE["signum"] is not None:
            time.sleep(0.01)
            if _STATE["held"] or (_STATE["deferred"] and not _STATE["insist"]):
                continue  # release() / the end of the section raise it
            frame = sys._current_frames().get(main.ident)
            if frame is None:
                return
            if not _must_wait(frame, sections=not _STATE["insist"]):
                signum = _STATE["signum"]
                if signal.getsignal(signum) is not _raise_interrupted:
                    break  # another handler now (the training loop's): check_interrupted raises it
                _STATE["redeliver"] = True
                signal.pthread_kill(main.ident, signum)
                time.sleep(0.05)
            del frame
        _WAKE.clear()


def check_interrupted(step: int | None = None) -> None:
    """A milestone of the run (``step``: the step about to start, or the start-up stage): raise the
    :class:`RunInterrupted` of a signal that was recorded but whose exception did not stop the run (held, deferred,
    or swallowed where Python ignores exceptions). No-op outside the driver or when no signal came."""
    if not _is_driver():
        return
    if step is not None:
        _STATE["step"] = step
    if _STATE["signum"] is not None and not _STATE["exiting"]:
        _STATE["raised"] = True
        raise RunInterrupted(_STATE["signum"], _STATE["step"])


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A section that a signal must not interrupt (in the driver): the signal is recorded and raised when the
    section ends (a second signal meanwhile raises at once). No-op in other processes."""
    if not _is_driver():
        yield
        return
    _STATE["deferred"] += 1
    try:
        yield
    finally:
        _STATE["deferred"] -= 1
    if not _STATE["deferred"]:  # reached when the section returned: the signal it held back is raised now
        check_interrupted()


@contextlib.contextmanager
def ray_init_guard() -> Iterator[None]:
    """Around ``ray.init`` in the driver: our handlers stay in force (Ray's SIGTERM handlers are not installed,
    nor Ray's C failure signal handler), a signal meanwhile is raised when ``ray.init`` returns (see the module
    doc), and a local Ray's processes start in a session of their own. Outside the driver of ``trainer/main.py``
    (no :func:`install_handlers` in this process) Ray behaves as it does by itself."""
    if not _is_driver():
        yield
        return
    restore = []

    def patch(module, name: str, value) -> None:
        if module is not None and hasattr(module, name):
            restore.append((module, name, getattr(module, name)))
            setattr(module, name, value)

    try:
        import ray._private.ray_constants as ray_constants
        import ray._private.services as services
        import ray._private.utils as ray_utils
    except ImportError:  # another Ray layout: its own handlers; reinstall_handlers puts ours back after
        ray_constants = services = ray_utils = None
    patch(ray_utils, "set_sigterm_handler", lambda handler: None)
    patch(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", True)
    popen = getattr(services, "ConsolePopen", None)
    fate_sharing = getattr(ray_utils, "detect_fate_sharing_support", lambda: False)
    if popen is not None and sys.platform.startswith("linux") and fate_sharing():
        # only where the kernel ends them with the driver (PR_SET_PDEATHSIG): without it Ray's reaper kills the
        # driver's process group, which they would have left
        class OwnSessionPopen(popen):
            def __init__(self, *args, **kwargs):
                kwargs["start_new_session"] = True
                super().__init__(*args, **kwargs)

        patch(services, "ConsolePopen", OwnSessionPopen)
    with deferred():
        try:
            yield
        finally:
            for module, name, value in reversed(restore):
                setattr(module, name, value)
            reinstall_handlers()


def request_stop(signum: int, step: int) -> None:
    """The training loop's handler took ``signum`` (SIGTERM) as "stop after step ``step``": a failure before the
    run ends (its workers died of the same signal) is reported as that interrupt (:func:`stop_requested`)."""
    _STATE["stop_signal"], _STATE["stop_step"] = signum, step


def loop_sigterm(trainer, signum: int) -> None:
    """The training loop's SIGTERM / SIGHUP handler (``RayPPOTrainer._on_sigterm``): the first asks the loop to stop
    after the current step (``trainer._stop_requested``, :func:`request_stop`); a second one stops at once as Ctrl-C
    (:func:`stop_now`). A process forked from the driver (a reward-scoring worker) inherits the handler: it dies."""
    if os.getpid() != trainer._driver_pid:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if trainer._stop_requested:
        stop_now(signum, trainer.global_step)
    trainer._stop_requested = True
    request_stop(signum, trainer.global_step)  # a failure before the end (workers killed too) ends as this SIGTERM
    import logging

    name = signal.Signals(signum).name
    logging.getLogger("trainer.ppo_trainer").warning(
        "%s received: the run stops after the current step (a second %s stops at once)", name, name)


def stop_requested() -> tuple[int, int] | None:
    """``(signum, step)`` of :func:`request_stop`, or None."""
    if _STATE["stop_signal"] is None:
        return None
    return _STATE["stop_signal"], _STATE["stop_step"]


def stop_now(signum: int, step: int | None) -> NoReturn:
    """Raise :class:`RunInterrupted` for ``signum`` (a second SIGTERM in the loop), recorded like the handler's
    (:func:`check_interrupted` raises it again if it is swallowed)."""
    if _is_driver() and _STATE["signum"] is None:
        _STATE["signum"] = signum
    _STATE["raised"] = True
    raise RunInterrupted(signum, step)


def interrupted_by() -> int | None:
    """The signal that is stopping the run, or None."""
    return _STATE["signum"]


def raised_by_code(exc: BaseException) -> bool:
    """Whether ``exc``, a ``KeyboardInterrupt``, was raised by code (``raise KeyboardInterrupt`` in a file the run
    imports) and not for a signal. Decidable only in the driver whose handler is in force (:func:`install_handlers`):
    there every SIGINT and SIGTERM is recorded before anything is raised for it, so a bare ``KeyboardInterrupt`` while
    none is recorded was raised by code. False elsewhere (Python's own SIGINT handler raises a bare one too)."""
    return (isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted) and _is_driver()
            and _STATE["signum"] is None and signal.getsignal(signal.SIGINT) is _raise_interrupted
            and signal.getsignal(signal.SIGTERM) is _raise_interrupted)


def as_interrupt(exc: KeyboardInterrupt, step: int | None = None) -> RunInterrupted:
    """``exc`` as a :class:`RunInterrupted` with ``step`` filled in when given. Ray's blocking calls turn the
    handler's exception into a bare ``KeyboardInterrupt``; the signal is then the one the handler recorded."""
    if not isinstance(exc, RunInterrupted):
        exc = RunInterrupted(interrupted_by() or signal.SIGINT)
    if step is not None:
        exc.step = step
    return exc


def own_checkpoints(checkpoint_root: str | None) -> None:
    """Name the folder (``trainer.default_local_dir``) whose checkpoints are this run's: a resume's from the start
    (``trainer/main.py``: unless ``resume_mode=disable``), a fresh run's once an earlier run's were set aside there
    (:func:`trainer.run_folder.settle_run_folder`). Until then :func:`exit_interrupted` reports none, not the earlier
    run's latest."""
    _STATE["checkpoint_root"] = checkpoint_root


def run_complete() -> None:
    """The run's work is complete and saved (its ``done:`` line printed): a Ctrl-C or SIGTERM from here on only cuts
    the shut-down short, and the run exits 0 (:func:`exit_interrupted`). No-op outside the driver."""
    if _is_driver():
        _STATE["complete"] = True


def quiet_exit() -> None:
    """After a complete run's shut-down (Ray down; the exit functions left, :mod:`trainer.leftovers`' among them):
    ignore Ctrl-C and SIGTERM, so that they run and the exit code stays 0. No-op before :func:`run_complete`."""
    if _is_driver() and _STATE["complete"]:
        _STATE["exiting"] = True
        for s in _HANDLED:
            signal.signal(s, signal.SIG_IGN)


def exit_interrupted(signum: int, step: int | None) -> NoReturn:
    """Shut Ray down, print the one line, exit ``128 + signum`` (130 SIGINT, 143 SIGTERM, 129 SIGHUP). ``step`` None:
    the step :func:`check_interrupted` last saw (0 before training). The line names the latest checkpoint in the
    folder :func:`own_checkpoints` named, or none. After :func:`run_complete` the signal only cut the shut-down
    short: the line says so and the exit code is 0."""
    _STATE["exiting"] = True
    for s in _HANDLED:
        signal.signal(s, signal.SIG_IGN)
    _STATE["signum"] = signum
    shutdown_ray()
    if _STATE["complete"]:
        print(f"{signal.Signals(signum).name} during the shut-down: the run had completed (its done line above); "
              "exit 0", file=sys.stderr, flush=True)
        sys.exit(0)
    step = _STATE["step"] if step is None else step
    print(f"interrupted at step {step or 0}; last checkpoint: {last_checkpoint()}", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def last_checkpoint() -> str:
    """The latest complete checkpoint in the folder :func:`own_checkpoints` named, or ``"none"``."""
    checkpoint_root = _STATE["checkpoint_root"]
    if checkpoint_root and os.path.isdir(checkpoint_root):  # no import of torch (checkpoint.base) otherwise
        from trainer.checkpoint.base import find_latest_checkpoint

        return find_latest_checkpoint(checkpoint_root) or "none"
    return "none"


def shutdown_ray(timeout_s: float = 15.0) -> None:
    """:func:`trainer.ray_shutdown.stop_ray` for this process (the driver of ``trainer/main.py`` or not): Ray shut
    down and the Ray processes this process started ended."""
    stop_ray(timeout_s, driver=_is_driver())
