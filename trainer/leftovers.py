"""Nothing that the process of ``python trainer/main.py`` starts outlives the run (Linux).

A process the driver starts outside Ray's management (a subprocess that a custom reward file starts at import, a
daemon whose parent exits at once, one that put itself in a process group or session of its own) is not ended by
Ray's shutdown, nor by a Ctrl-C to the terminal's process group, and one whose parent ended is re-parented to init,
out of the driver's reach. The entry point therefore makes its process a child subreaper (:func:`adopt_descendants`,
``PR_SET_CHILD_SUBREAPER``): every process started below the driver stays below it, whatever group or session it
joins, double-forked daemons included. At the driver's exit, however the run ends (the end of training, a config
error's exit 2, Ctrl-C's 130, SIGTERM's 143, an exception's traceback), :func:`end_descendants` kills what is left
below it (:func:`rewards.process_tree.kill_tree`). It is an ``atexit`` function registered before anything else the
run imports, so it runs after the other exit functions: after Ray's shutdown (the run's own, then Ray's exit
function) and after wandb's, whose helper process uploads the run's last records.

Only the process of the command line does this (and a run that ``tests/e2e_shared.py`` forks from a pre-imported
driver, which is that run's own process): a program or a test that calls the trainer's functions in its own process
keeps its other children. A process that is not below the driver (the processes of a Ray cluster that the run
joined through ``RAY_ADDRESS``, started by ``ray start`` or by another process) is never reached: only the driver's
descendants are looked at. The local Ray that the driver starts is below it, and is shut down before.

Zombies: the driver does not reap during the run. A ``SIGCHLD`` handler that waits for any child would take the
exit status of the driver's own children from the code that waits for them (Ray polls the ``Popen`` of its GCS and
raylet: a status taken reads as exit code 0, a dead process; ``subprocess`` calls would report 0 for a failure), and a
re-parented process cannot be told from them. A re-parented process that ends during the run (only a process whose
parent ended before it, which few do) stays a zombie, a table entry and no memory, until the driver's exit;
:func:`end_descendants` reaps them, with the processes it kills. Elsewhere than Linux nothing is done.

Not covered: a driver killed by SIGKILL (or the machine's OOM killer) runs no exit function; what it started then
stays, re-parented to the subreaper or init above the driver.
"""
from __future__ import annotations

import atexit
import os
import signal
import time

__all__ = ["adopt_descendants", "end_descendants"]

_DRIVER: dict = {"pid": None}
#: the longest :func:`end_descendants` waits for the killed processes to be gone (they are reaped meanwhile)
REAP_S = 5.0


def adopt_descendants() -> bool:
    """Make this process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``) and register :func:`end_descendants`
    to run at its exit. Called first by the entry point of ``trainer/main.py``, only in the command line's process.
    Returns whether it took effect (False elsewhere than Linux, or without ``prctl``)."""
    from rewards.process_tree import make_subreaper

    if not make_subreaper():
        return False
    if _DRIVER["pid"] is None:
        atexit.register(end_descendants)
    _DRIVER["pid"] = os.getpid()
    return True


def end_descendants(reap_s: float | None = None) -> None:
    """Kill every process below this one and reap those that are its children, waiting at most ``reap_s`` seconds
    (:data:`REAP_S`) for them to be gone. Ray is shut down first (:func:`trainer.interrupt.shutdown_ray`, which lets
    a local Ray's processes end by themselves; no-op when it is). Only in the process where
    :func:`adopt_descendants` ran (a process forked from it that runs the exit functions does nothing); Ctrl-C,
    SIGTERM and SIGHUP are ignored from here on, the process is exiting."""
    if _DRIVER["pid"] != os.getpid():
        return
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    try:
        from trainer.interrupt import shutdown_ray

        shutdown_ray()
    except Exception:  # noqa: BLE001 (what Ray leaves is killed below)
        pass
    from rewards.process_tree import descendants, kill_tree

    me = os.getpid()
    kill_tree(me, include_root=False)
    deadline = time.monotonic() + (REAP_S if reap_s is None else reap_s)
    while True:
        _reap()
        if not descendants(me) or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _reap() -> None:
    """Reap every child of this process that has ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
