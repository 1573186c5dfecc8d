"""Keep track of the processes below a forked worker, so that nothing a scorer starts outlives it (Linux).

A scorer may start processes of its own (a subprocess, a daemon whose parent exits at once, one that moves to a
process group or session of its own); killing the worker that ran the scorer does not end them. Each scoring worker
(:mod:`rewards.pool`) and each start-up probe (:mod:`trainer.reward_probe`) therefore first calls
:func:`guard_descendants`: the process forks once and becomes a guard, a child subreaper below which every process
the work starts stays, whatever group or session it joins. When the work ends, the guard kills what is left below it;
when the process that forked the guard dies, however it dies, the guard kills the work and everything below it.

:func:`kill_tree` kills a process and everything below it (each stopped first, so none forks unseen), found with
:func:`descendants` from ``/proc``; :func:`make_subreaper` keeps orphans below a process (the driver's
:mod:`trainer.leftovers` too); :func:`die_with_parent` ties a process's life to its parent's
(``PR_SET_PDEATHSIG``). Elsewhere than Linux, or without ``prctl``, no guard is forked and ``/proc`` is not read.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Sequence

__all__ = ["die_with_parent", "guard_descendants", "descendants", "kill_tree", "make_subreaper"]

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: the signal a guard receives when the process it watches ends (caught: it then kills what runs below it)
_GUARD_SIGNAL = signal.SIGUSR1


def _prctl(option: int, value: int) -> bool:
    """Linux ``prctl(option, value)``; False where it is not available or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 (no prctl)
        return False


def make_subreaper() -> bool:
    """Linux: make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process below it whose parent
    ends is re-parented to it (not to init), whatever process group or session it is in. Not inherited by the
    processes it forks. Returns whether it took effect (False elsewhere, or without ``prctl``)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(parent: int) -> None:
    """Linux: the kernel sends this process SIGKILL when the thread that forked it ends (the main thread: when
    the parent process ends); if the parent is already gone, exit now."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # elsewhere the caller's idle checks end the process
    if os.getppid() != parent:
        os._exit(0)


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process, read from ``/proc`` ({} without it)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    out[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # ended meanwhile
                pass
    return out


def descendants(pid: int) -> list[int]:
    """The pids of every process below ``pid`` (children, their children, ...), parents before their children;
    [] where ``/proc`` is not available."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_pids().items():
        children.setdefault(parent, []).append(child)
    out, seen, todo = [], {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def kill_tree(pid: int, include_root: bool = True) -> None:
    """SIGKILL every process below ``pid`` (found with :func:`descendants`), and ``pid`` itself with
    ``include_root``. Each is stopped (SIGSTOP) before the next look, so none starts a new one unseen; a process
    that left the tree before (re-parented to a process outside it) is not reached, which a guard
    (:func:`guard_descendants`) prevents. Processes that end meanwhile are skipped. The killed processes below
    ``pid`` that are, or become, this process's children are reaped (:func:`_reap_killed`; up to 1 s)."""
    def signal_all(pids, sig):
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass

    found: list[int] = [pid] if include_root else []
    signal_all(found, signal.SIGSTOP)
    for _ in range(10):  # a process that forked while being stopped shows up in the next look
        new = [p for p in descendants(pid) if p not in found]
        if not new:
            break
        signal_all(new, signal.SIGSTOP)
        found += new
    signal_all(found, signal.SIGKILL)
    _reap_killed([p for p in found if p != pid], set(found) | {pid})


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _reap_killed(pids: list[int], killed: set[int], bound_s: float = 1.0) -> None:
    """Reap those of ``pids`` (killed by :func:`kill_tree`, below its root) that are or become children of this
    process: re-parented to it when their parent died, as they are when it is a child subreaper
    (:func:`make_subreaper`), they would stay zombies until it exits. A process re-parented elsewhere (init) is
    left to its new parent, and one whose parent (among ``killed``) has not ended within ``bound_s`` seconds too.
    The root is never reaped here: its own parent waits for it (``Popen``, ``multiprocessing``)."""
    import time

    me, pending = os.getpid(), set(pids)
    deadline = time.monotonic() + bound_s
    while pending:
        for p in list(pending):
            try:
                if os.waitpid(p, os.WNOHANG)[0]:  # ours, and ended: reaped
                    pending.discard(p)
                continue  # ours, not ended yet
            except ChildProcessError:
                pass
            parent = _parent_of(p)
            if parent is None or (parent != me and parent not in killed):  # gone, or another process's child now
                pending.discard(p)
        if not pending or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def guard_descendants(parent: int | None, close: Sequence = ()) -> None:
    """Called first in a forked process (a scoring worker, the start-up probe): make sure that nothing it starts
    outlives it. On Linux this process forks once and becomes a guard: the call returns in the new child, which
    goes on with the work (and dies with the guard: ``PR_SET_PDEATHSIG``); the guard never returns. It is a child
    subreaper (``PR_SET_CHILD_SUBREAPER``): a process below it whose parent ends is re-parented to it, whatever
    process group or session it put itself in, so every process the work started stays below the guard. When the
    work ends, the guard kills what is left below it (:func:`kill_tree`) and exits with the work's status (a
    signal's death as that signal); when ``parent`` (the process that forked this one; None: the parent at the
    start) ends, however it ends, the guard kills the work and everything below it, then exits. The guard ignores
    SIGINT, SIGTERM and SIGHUP (a signal to the process group is the parent's to act on) and reaps the processes
    re-parented to it. ``close``: connections the work keeps and the guard must not hold (so that the parent sees
    their end when the work dies).

    Elsewhere, or without ``prctl``, nothing is forked: with ``parent`` this process dies with it
    (:func:`die_with_parent`), and the work's own processes are not tracked."""
    if not make_subreaper():
        if parent is not None:
            die_with_parent(parent)
        return
    saved = _watch_parent(os.getppid() if parent is None else parent)
    _flush_std_streams()  # nothing buffered is written twice
    guard = os.getpid()
    work = os.fork()
    if work == 0:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        die_with_parent(guard)
        return
    for c in close:
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass
    _exit_as(guard, _wait_for_work(work))


def _watch_parent(watched: int) -> dict:
    """Make this process (the guard to be) kill what runs below it and exit once ``watched`` is no longer its
    parent: on the guard signal (``PR_SET_PDEATHSIG``) and on each SIGALRM of the timer that :func:`_wait_for_work`
    sets; at once when it is already gone. SIGINT, SIGTERM and SIGHUP are ignored. Returns the handlers replaced, for
    the work to restore."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, _GUARD_SIGNAL,
                                              signal.SIGALRM)}

    def check_parent(*_):  # the guard signal (the parent ended, or only the thread that forked this one) and a timer
        if os.getppid() != watched:
            kill_tree(os.getpid(), include_root=False)
            os._exit(1)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    signal.signal(_GUARD_SIGNAL, check_parent)
    signal.signal(signal.SIGALRM, check_parent)
    _prctl(_PR_SET_PDEATHSIG, _GUARD_SIGNAL)
    check_parent()
    return saved


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _wait_for_work(work: int) -> int:
    """Reap the processes re-parented to the guard until the work (pid ``work``) ends; its wait status. The
    parent is looked at each second meanwhile (:func:`_watch_parent`'s timer)."""
    # the parent is looked at each second too: no death signal comes when a thread other than the main thread
    # forked this one
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)
    status = 0
    while True:
        try:
            pid, status = os.wait()  # the work, or a process re-parented here
        except ChildProcessError:
            break
        if pid == work:
            break
    signal.setitimer(signal.ITIMER_REAL, 0)
    return status


def _exit_as(guard: int, status: int) -> None:
    """Kill what is left below the guard (pid ``guard``, this process), then end it as the work ended (wait
    status ``status``): the same signal's death, else its exit code (1 when neither)."""
    kill_tree(guard, include_root=False)
    if os.WIFSIGNALED(status):  # the same death for the parent to see
        try:
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP
            pass
        os.kill(guard, os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
