"""The return value of every reachable scorer, checked before start-up (:func:`check_scorer_returns`, run by
:func:`trainer.config_checks.check_reward_scorers`).

At run time a scorer's failure scores 0 and is counted (``reward/num_errors``), so that one odd response never
stops training. A scorer that returns something other than a number or a dict with ``score`` (``None``, a string,
a dict without ``score``: a bug in a ``custom_reward_function``) fails on every response, and the run would train on
rewards that are all 0 without stopping. Each reachable scorer is therefore called once here on an empty response
and the row's ground truth; a scorer that raises on it (or whose process dies) is not judged (an empty response may
be an input it refuses), one that returns a value of the wrong kind stops the run in one line.

A scorer that does not return within the probe's bound (:func:`probe_bound`: ``min(reward_model.timeout_s,``
:data:`PROBE_BOUND_S` ``)``, 60 s) also stops the run in one line, naming the scorer and the time: an empty response
is the cheapest input a scorer gets, and one that hangs on it hangs or runs past ``timeout_s`` on every training
response too (each then scores 0 after ``timeout_s``, and the first batch stops the run only after
``timeout_s`` x its responses / scoring workers). A scorer that is slow only on its first call (a model or a large
table loaded lazily) passes when it loads at import: the file is imported in the driver before the probe, and the
probe and the scoring workers are forked from it. That import is bounded the same way: the file is first imported
in a forked probe (:func:`import_in_probe`, called by :func:`trainer.config_checks.custom_scorer`), and a file whose
import does not finish within the bound, or ends the process (``sys.exit``, ``os._exit``, a crash), stops the run in
one line; it is then imported in the driver (its import runs twice; what the probe's import prints is discarded).
Unlike a scorer's process, the import's process is judged when it dies: the driver's import would end the driver.

Each probe runs in a forked process under a guard (:func:`rewards.process_tree.guard_descendants`): the processes
the scorer or the import starts, whatever process group or session they put themselves in, are killed with the probe
when it ends or runs past the bound, and when the driver dies; nothing is left behind.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Any, Callable, Sequence

__all__ = ["PROBE_BOUND_S", "check_scorer_returns", "import_in_probe", "probe_bound", "run_probe"]

#: the longest a scorer may take on the probe's empty response (seconds; ``reward_model.timeout_s`` when shorter):
#: with the default ``timeout_s`` (10 s) a hung scorer costs 10 s at start-up; the cap keeps a large ``timeout_s``
#: (a remote judge's) from stalling start-up for minutes while leaving a slow first call room
PROBE_BOUND_S = 60.0


def probe_bound(timeout_s: float) -> float:
    """Seconds the probe waits for a scorer: ``min(timeout_s, PROBE_BOUND_S)``."""
    return min(float(timeout_s), PROBE_BOUND_S)


def _probe_child(conn, fn: Callable, args: tuple, kwargs: dict, parent: int) -> None:
    try:
        os.setpgid(0, 0)  # its own group (where no guard can be had: the group is what is killed)
    except OSError:
        pass
    from rewards.pool import run_scorer
    from rewards.process_tree import guard_descendants
    from rewards.scorer_call import call_scorer

    guard_descendants(parent, close=(conn,))  # nothing the scorer starts outlives the probe or a killed driver

    def probe(*a, **kw):
        try:
            return call_scorer(fn, a, kw)  # an async scorer's coroutine raises when it is awaited
        except BaseException:  # noqa: BLE001 - not judged: the scorer may refuse an empty response (KeyboardInterrupt
            return 0.0  # and sys.exit too, without a traceback; the scoring workers report them as its errors)

    try:
        conn.send(run_scorer(probe, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - a result that cannot be sent back
        conn.send(("error", f"the result could not be sent back: {exc!r}"[:500], 0.0))


def _kill_group(proc) -> None:
    from rewards.process_tree import kill_tree

    for kill in (lambda: kill_tree(proc.pid), lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    proc.join(timeout=5.0)


def run_probe(fn: Callable, args: tuple, kwargs: dict, bound_s: float) -> tuple[str, Any, float]:
    """Call ``fn(*args, **kwargs)`` in a forked process (under a guard,
    :func:`rewards.process_tree.guard_descendants`, in its own process group) and wait at most ``bound_s`` seconds.
    Returns ``(status, payload, seconds)``: ``"ok"`` (the normalised value, as :func:`rewards.pool.run_scorer`; 0.0
    when ``fn`` raised: not judged), ``"error"`` (it returned a value that is no score: the message), ``"raised"``
    (its process died: its exit code, negative for a signal's death, as ``multiprocessing``'s) or ``"timeout"``.
    The process and every process below it (and its group) are killed in every case."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_probe_child, args=(send, fn, args, kwargs, os.getpid()), daemon=True,
                       name="reward-probe")
    t0 = time.monotonic()
    proc.start()
    send.close()
    try:
        os.setpgid(proc.pid, proc.pid)  # also from here: the group exists before any kill below
    except OSError:
        pass
    try:
        if not recv.poll(bound_s):
            return "timeout", None, time.monotonic() - t0
        try:
            return recv.recv()
        except (EOFError, OSError):  # the process died (os._exit, a crash in C code)
            proc.join(timeout=1.0)
            return "raised", proc.exitcode, time.monotonic() - t0
    finally:
        _kill_group(proc)
        recv.close()


def _import_quietly(path: str, name: str) -> float | dict:
    """The probe's import: 0.0, or ``{"score": 0.0, "ended": how}`` when the import ended the process by raising
    ``SystemExit`` or ``KeyboardInterrupt`` (the file's own: a signal kills a probe forked from the driver, whose
    handler it inherits)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):  # what the import prints is printed once, by the driver's own import
        os.dup2(devnull, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # also where they are not file descriptors 1 and 2
    from rewards.registry import ImportEndedError, load_custom_scorer

    try:
        load_custom_scorer(path, name)
    except ImportEndedError as exc:
        return {"score": 0.0, "ended": exc.how}
    except KeyboardInterrupt:
        return {"score": 0.0, "ended": "KeyboardInterrupt raised at import"}
    return 0.0


def _death(exitcode: int | None) -> str:
    """How a process that sent nothing back ended, from its exit code (negative: the signal that killed it)."""
    if exitcode is None:
        return "the process ended"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode} without a Python exception: os._exit({exitcode}), or exit() in C code"


def import_in_probe(path: str, name: str, bound_s: float) -> tuple[str, str | None, float]:
    """Import the custom reward file ``path`` (and look up ``name`` in it) as
    :func:`rewards.registry.load_custom_scorer` does, in a forked process bounded like a scorer's probe
    (:func:`run_probe`, its output discarded), so that a file whose import hangs (a blocking network call, a
    ``sleep``) or ends the process (``sys.exit``, ``os._exit``) is found before the driver imports it. Returns
    ``(status, how, seconds)``: ``"ok"`` (imported, or it raised an exception: not judged here, the driver's own
    import reports it), ``"ended"`` (the import ended the process; ``how``: ``sys.exit(0)``, ``KeyboardInterrupt
    raised at import``, the exit code or signal of a process that died) or ``"timeout"`` (not finished within
    ``bound_s`` seconds; the process and everything it started were killed)."""
    status, payload, seconds = run_probe(_import_quietly, (path, name), {}, bound_s)
    if status == "raised":
        return "ended", _death(payload), seconds
    if status == "ok" and isinstance(payload, dict) and "ended" in payload:
        return "ended", str(payload["ended"]), seconds
    return ("timeout" if status == "timeout" else "ok"), None, seconds


def _scorer_name(manager: Any, fn: Callable, reward_fn_key: str, source: str) -> str:
    """The scorer as the run reaches it (a data source's scorer, ``reward_model.scorer`` or the custom reward
    function), with ``<function> of <file>``."""
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__name__', fn)}" + (f" of {code.co_filename}" if code is not None else "")
    where = f" for {reward_fn_key}={source}" if source else ""
    if manager.scorer is None:
        return f"the scorer of {reward_fn_key}={source} ({name})"
    if getattr(manager, "scorer_name", None):
        return f"the scorer reward_model.scorer={manager.scorer_name} ({name}){where}"
    return f"the custom_reward_function {name}{where}"


def check_scorer_returns(manager: Any, reward_fn_key: str, datasets: Sequence) -> None:
    """Call each scorer that the rows of ``datasets`` reach (the first row of each ``reward_fn_key`` value; the one
    scorer of ``reward_model.scorer`` / ``custom_reward_function`` on the first row) with an empty response, in
    a forked process bounded by :func:`probe_bound` of the manager's ``timeout_s``.

    Raises:
        ValueError: a scorer returned a value that is neither a number nor a dict with ``score`` (naming the scorer,
            the data source and what it returned), or did not return within the bound (naming the scorer, the data
            source and the time; the probe's processes are killed).
    """
    from trainer.protocol import DataProto

    firsts: dict = {}
    for ds in datasets:
        for row in ds.rows if ds is not None else ():
            firsts.setdefault(repr(row.get(reward_fn_key)) if manager.routes_by_key else "", row)
    if firsts:
        from rewards import math as math_reward

        math_reward.load_math_verify()  # imported once here, as before the scoring workers fork (not timed)
    bound = probe_bound(manager.timeout_s)
    for source, row in sorted(firsts.items()):
        one = DataProto.from_dict({}, {"reward_model": [row["reward_model"]], "extra_info": [row.get("extra_info")],
                                       reward_fn_key: [row.get(reward_fn_key)]})
        tasks, fns = manager._tasks(one, [""])
        (_, args, kwargs), fn = tasks[0], fns[0]
        status, payload, _ = run_probe(fn, args, kwargs, bound)
        if status == "timeout":
            raise ValueError(
                f"{_scorer_name(manager, fn, reward_fn_key, source)}, given an empty response, did not "
                f"return within {bound:g} s (the start-up probe's bound: min(reward_model.timeout_s="
                f"{manager.timeout_s:g}, {PROBE_BOUND_S:g}) s; its process was killed) and would hang or run past "
                "timeout_s on every response; fix the scorer (an empty response should score at once; load models "
                "or tables when its file is imported, not on the first call)")
        if status == "error":  # only the normalisation of what the scorer returned can fail now
            raise ValueError(f"{_scorer_name(manager, fn, reward_fn_key, source)}, given an empty "
                             f"response, returned a value it cannot score: {payload}")
