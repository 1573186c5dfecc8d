"""Run scorers with a hard per-sample time limit: a persistent pool of forked worker processes.

Why processes: a scorer can hang in C code that no signal interrupts (sympy evaluating ``9**9**9**9``,
a regex with catastrophic backtracking), so the only reliable limit is killing the process that runs it.
The pool is persistent (forked once, reused across steps) so that the usual case costs one pipe round
trip per sample (about 0.1 ms); a worker is killed and re-forked only when its sample runs past the limit
or it dies. Each sample has its own deadline, counted from when a worker starts it (not from submission).

Workers end with the process that forked them: on Linux their guard (:mod:`rewards.process_tree`) kills them when
it dies, however it dies (a parent-death signal, ``PR_SET_PDEATHSIG``, and a look each second), a pool still open at
its normal exit is closed then (before :mod:`multiprocessing`'s exit handler would SIGTERM and wait for them), and
elsewhere an idle worker notices within a second. Workers ignore SIGINT and SIGTERM: a signal to the whole process
group (Ctrl-C, ``timeout``, ``kill -TERM -PGID``) is the parent's to act on (the trainer finishes its step on SIGTERM,
scoring included); they do not die under the step and leave its scores to errors. SIGKILL ends one.

Nothing a scorer starts outlives its worker: on Linux each worker runs under a guard process
(:func:`rewards.process_tree.guard_descendants`) that every process below the worker stays below, whatever process
group or session it joins; a worker killed for its timeout or closed is killed with all of them
(:func:`rewards.process_tree.kill_tree`), and when the parent dies the guard kills them (the worker too, even one
stuck in C code).

verl's PRIME manager uses a ``ProcessPoolExecutor`` with a 300 s timeout and had to terminate the pool's
children in a ``finally`` to avoid a hang (verl issue #1466); this pool kills
exactly the worker that overran and keeps the others.

Start method: ``fork`` (default) hands the scorer table to the children without pickling (lambdas, closures,
functions loaded from files all work); ``forkserver``/``spawn`` need picklable scorers.

Running one scorer (its result made plain, its error an outcome, the in-process ``SIGALRM`` limit of
:func:`in_process`) is :mod:`rewards.scorer_call`'s; those names are importable from here too.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import wait as _wait_conns
from typing import Any, Callable, Sequence

# the failure rules (rewards.failures) and the process-tree helpers are named in __all__ too: importable from here
from rewards.failures import (EARLY_STOP_FAILURES, WORKER_DIED, FailureWatch, Outcome, ScorerError,
                              check_not_all_failed)
from rewards.process_tree import descendants, die_with_parent, guard_descendants, kill_tree
# running one scorer in this process (rewards.scorer_call) is importable from here too
from rewards.scorer_call import in_process, run_scorer, run_scorer_noted, to_plain_result

__all__ = ["to_plain_result", "run_scorer", "run_scorer_noted", "in_process", "ScoringPool", "Outcome", "ScorerError",
           "check_not_all_failed",
           "FailureWatch", "EARLY_STOP_FAILURES", "die_with_parent", "guard_descendants", "descendants", "kill_tree"]

# One task: (scorer key, positional args, keyword args); one outcome: rewards.failures.Outcome.
Task = tuple[Any, tuple, dict]


def _worker_main(conn, table: dict, resolve: Callable[[Any], Callable] | None, close_fds: Sequence,
                 parent: int | None = None) -> None:
    # Ctrl-C and a SIGTERM / SIGHUP to the process group are the parent's business: it closes the pool (at its exit
    # too, _close_at_exit), or its death ends this process (die_with_parent)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    guard_descendants(parent, close=[conn, *close_fds])  # what the scorers start ends with this worker
    for c in close_fds:  # other workers' pipe ends inherited through fork
        try:
            c.close()
        except Exception:
            pass
    parent = os.getppid()
    while True:
        try:
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    return
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        idx, key, args, kwargs = msg
        try:
            fn = table[key] if key in table else resolve(key)
        except Exception as e:  # noqa: BLE001
            out = (idx, ("error", f"cannot resolve scorer {key!r}: {e}"[:500], 0.0), [])
        else:
            try:
                out = (idx, *run_scorer_noted(fn, args, kwargs))  # (idx, outcome, the scorer's own limit hits)
            except SystemExit as e:  # sys.exit in a scorer: its error, not a worker to replace
                out = (idx, ("error", f"SystemExit: {e.code!r} (the scorer called sys.exit)"[:500], 0.0), [])
            except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt (SIGINT is ignored here: the scorer's own
                out = (idx, ("error", f"{type(e).__name__}: {e}"[:500], 0.0), [])  # raise), GeneratorExit: its error
        try:
            conn.send(out)
        except Exception as e:  # an unpicklable dict value, say
            conn.send((idx, ("error", f"scorer result could not be sent back: {e!r}"[:500], out[1][2]), []))


class _Worker:
    __slots__ = ("proc", "conn")

    def __init__(self, proc, conn):
        self.proc, self.conn = proc, conn


class _Batch:
    """One :meth:`ScoringPool.run`: its tasks, their outcomes so far (None until finished), the tasks not yet sent,
    the idle workers and the busy ones (each with its task and the time it started), and whether ``stop`` ended it."""

    def __init__(self, tasks: Sequence[Task], workers: Sequence[_Worker], stop: Callable[[int, Outcome], bool] | None):
        self.tasks = tasks
        self.results: list[Outcome | None] = [None] * len(tasks)
        self.limit_hits: list[list[float]] = [[] for _ in tasks]  # per task: rewards.math_guards.take_limit_hits
        self.pending = deque(range(len(tasks)))
        self.idle = list(workers)
        self.busy: dict[_Worker, tuple[int, float]] = {}
        self.stopped = False
        self._stop = stop

    def finish(self, i: int, outcome: Outcome) -> None:
        """Record task ``i``'s outcome and ask ``stop`` whether the run ends now."""
        self.results[i] = outcome
        self.stopped = self.stopped or (self._stop is not None and bool(self._stop(i, outcome)))


class ScoringPool:
    """``num_workers`` persistent worker processes that run scorer tasks with a per-task time limit.

    Args:
        num_workers: number of processes (>= 1).
        table: scorer functions by key, handed to the workers when they start (inherited through fork).
        resolve: called in the worker for keys not in ``table`` (e.g. ``rewards.registry.get_scorer``).
        start_method: multiprocessing start method (``"fork"``, ``"forkserver"``, ``"spawn"``).

    Raises:
        ValueError: for ``num_workers < 1`` or an unknown start method.
    """

    def __init__(self, num_workers: int, table: dict | None = None, resolve: Callable | None = None,
                 start_method: str = "fork"):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} not available here; have {mp.get_all_start_methods()}")
        self.num_workers = num_workers
        self._table = dict(table or {})
        self._resolve = resolve
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = []
        self.num_restarts = 0  # workers killed (timeouts) or found dead, and replaced
        self._exiting = False

    # ---- process management ---------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        self._check_not_exiting()
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        others = [w.conn for w in self._workers] if self._ctx.get_start_method() == "fork" else []
        # forked workers die with the thread that forks them (die_with_parent): only the main thread lives as long
        # as this process (a forkserver's workers are the server's children)
        forked_here = self._ctx.get_start_method() == "fork" and threading.current_thread() is threading.main_thread()
        parent = os.getpid() if forked_here else None
        proc = self._ctx.Process(target=_worker_main, args=(child_conn, self._table, self._resolve, others, parent),
                                 daemon=True, name="reward-scorer")
        proc.start()
        child_conn.close()
        if self._exiting:  # closed at exit while this thread was forking: the worker ignores SIGTERM, so kill it
            kill_tree(proc.pid)
            proc.kill()
        return _Worker(proc, parent_conn)

    def start(self) -> None:
        """Start the workers (done lazily by :meth:`run`)."""
        if len(self._workers) < self.num_workers:
            _close_at_exit(self)
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())

    def _check_not_exiting(self) -> None:
        if self._exiting:  # closed at this process's exit: no new worker (another thread may still be in run)
            raise RuntimeError("the scoring pool was closed at the exit of its process")

    def _kill(self, w: _Worker) -> None:
        try:
            w.conn.close()
        except Exception:
            pass
        if w.proc.is_alive():
            kill_tree(w.proc.pid)  # the worker's guard, the worker and what its scorers started
            w.proc.kill()
        w.proc.join(timeout=5.0)

    def _replace(self, w: _Worker) -> _Worker:
        self._kill(w)
        self._workers.remove(w)
        self.num_restarts += 1
        new = self._spawn()
        self._workers.append(new)
        return new

    def close(self) -> None:
        """Stop all workers (ask politely, then kill). Safe to call twice."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except Exception:
                pass
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(w)
        self._workers = []

    # ---- running ----------------------------------------------------------------------------------------
    def run(self, tasks: Sequence[Task], timeout_s: float,
            stop: Callable[[int, Outcome], bool] | None = None,
            limit_hits: list | None = None) -> list[Outcome]:
        """Run every task; returns one ``(status, payload, seconds)`` per task, in order. ``limit_hits``, when given,
        is filled with one list per task: the limits of the comparisons that the scorer's own time bound cut short
        (:func:`rewards.math_guards.note_limit_hit`; empty for a task that timed out, died or was skipped).

        A task still running ``timeout_s`` seconds after its worker started it gets ``("timeout", None, t)``
        and its worker is killed and replaced; a worker that dies gives ``("error", "scorer worker died ...", t)``.
        ``stop(i, outcome)``, called as each task finishes, may end the run early: the tasks still running are
        killed with their workers (started again by the next run) and every unfinished task gets
        ``("skipped", None, 0.0)``.

        Raises:
            ValueError: if ``timeout_s`` is not a positive finite number.
        """
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.start()
        batch = _Batch(tasks, self._workers, stop)
        while (batch.pending or batch.busy) and not batch.stopped:
            self._send_pending(batch)
            if not batch.busy or batch.stopped:
                continue
            self._receive(batch, timeout_s)
            self._end_overdue(batch, timeout_s)
        for w in batch.busy:  # stopped early: what is still running is not waited for
            self._kill(w)
            self._workers.remove(w)
            self.num_restarts += 1
        if limit_hits is not None:
            limit_hits[:] = batch.limit_hits
        return [r if r is not None else ("skipped", None, 0.0) for r in batch.results]

    def _send_pending(self, batch: _Batch) -> None:
        """Hand the batch's pending tasks to its idle workers; a worker found dead is replaced and its task sent
        again, a task that cannot be sent is its error."""
        while batch.idle and batch.pending and not batch.stopped:
            w, i = batch.idle.pop(), batch.pending.popleft()
            key, args, kwargs = batch.tasks[i]
            try:
                w.conn.send((i, key, args, kwargs))
            except (BrokenPipeError, ConnectionError, EOFError):  # the worker died while idle
                batch.idle.append(self._replace(w))
                batch.pending.appendleft(i)
                continue
            except Exception as e:  # the task itself cannot be pickled
                batch.finish(i, ("error", f"task could not be sent to a worker: {e!r}"[:500], 0.0))
                batch.idle.append(w)
                continue
            batch.busy[w] = (i, time.monotonic())

    def _receive(self, batch: _Batch, timeout_s: float) -> None:
        """Take the outcomes that arrive before the earliest deadline of the busy workers; a worker that died
        instead is replaced and its task gets :data:`rewards.failures.WORKER_DIED` with its exit code."""
        next_deadline = min(t0 for _, t0 in batch.busy.values()) + timeout_s
        by_conn = {w.conn: w for w in batch.busy}
        for conn in _wait_conns(list(by_conn), timeout=max(0.0, next_deadline - time.monotonic())):
            w = by_conn[conn]
            i, t0 = batch.busy.pop(w)
            try:
                idx, outcome, hits = conn.recv()
                batch.idle.append(w)
                batch.limit_hits[idx] = list(hits)
                batch.finish(idx, outcome)
            except (EOFError, OSError, ConnectionError):
                w.proc.join(timeout=5.0)  # its exit code (a loaded machine may take seconds to end the process)
                code = w.proc.exitcode if w.proc.exitcode is not None else "unknown"
                batch.idle.append(self._replace(w))
                batch.finish(i, ("error", f"{WORKER_DIED} (exit code {code})", time.monotonic() - t0))

    def _end_overdue(self, batch: _Batch, timeout_s: float) -> None:
        """Kill and replace the workers whose task has run ``timeout_s`` or longer; the task is a timeout."""
        now = time.monotonic()
        for w, (i, t0) in list(batch.busy.items()):
            if now - t0 >= timeout_s:
                del batch.busy[w]
                batch.idle.append(self._replace(w))
                batch.finish(i, ("timeout", None, now - t0))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


_OPEN_POOLS: "weakref.WeakSet[ScoringPool]" = weakref.WeakSet()
_AT_EXIT: dict = {"pid": None}


def _close_at_exit(pool: ScoringPool) -> None:
    """Close ``pool`` when this process exits, if it is still open then: a finalizer of :mod:`multiprocessing`'s
    exit handler, run before that handler SIGTERMs daemon processes and waits for them (the workers ignore SIGTERM);
    a worker still busy a second later is killed."""
    from multiprocessing import util

    _OPEN_POOLS.add(pool)
    if _AT_EXIT["pid"] != os.getpid():  # once per process
        _AT_EXIT["pid"] = os.getpid()
        util.Finalize(None, _close_open_pools, exitpriority=100)


def _close_open_pools() -> None:
    for pool in list(_OPEN_POOLS):
        pool._exiting = True
    for pool in list(_OPEN_POOLS):
        try:
            pool.close()
        except Exception:  # noqa: BLE001
            pass
    # a worker another thread forked meanwhile ignores the SIGTERM that multiprocessing's exit handler sends before
    # it joins its daemon children: kill every scorer left, so the exit does not wait on one
    for child in mp.active_children():
        if child.name == "reward-scorer":
            kill_tree(child.pid)
            child.kill()
