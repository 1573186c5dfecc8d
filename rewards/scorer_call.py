"""Calling a scorer: an ``async def`` scorer's coroutine is run to its end, as verl's reward loop awaits an async
``compute_score`` (``inspect.iscoroutinefunction``), so that such a function scores instead of returning a coroutine
that no one awaits.

Each call runs its coroutine on an event loop of its own (``asyncio.run``): in a scoring process, in the driver's
main thread under the in-process timer, or, where the calling thread already runs an event loop, in a thread of
its own that the call waits for. The scorer's time limit covers the whole run of the coroutine.

Running one scorer, in a scoring process (:mod:`rewards.pool`) or in this one: :func:`run_scorer` turns its return
value into a plain result (:func:`to_plain_result`) and an exception into its error outcome, :func:`run_scorer_noted`
also collects the limits of the comparisons the scorer's own time bound cut short, and :func:`in_process` bounds the
call with a ``SIGALRM`` timer. :mod:`rewards.pool` re-exports these names.
"""
from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any, Callable

from rewards.failures import Outcome
from rewards.math_guards import take_limit_hits

__all__ = ["call_scorer", "to_plain_result", "run_scorer", "run_scorer_noted", "in_process"]


def call_scorer(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)``, with a coroutine it returns (an ``async def`` scorer's) awaited to its result.

    Raises:
        whatever ``fn`` or its coroutine raises.
    """
    result = fn(*args, **kwargs)
    if asyncio.iscoroutine(result):
        return _run_coroutine(result)
    return result


def _run_coroutine(coro) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread: the usual case
        return asyncio.run(coro)
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="async-scorer", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _plain_value(v: Any) -> Any:
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    try:
        return float(v)  # numpy / torch scalars
    except Exception:
        return repr(v)[:200]


def to_plain_result(res: Any) -> float | dict:
    """Normalise a scorer's return value: a float, or a dict of plain values whose ``"score"`` is a float.

    Accepts numbers (bool, int, float, numpy/torch scalars), dicts with a ``"score"`` key, and a tuple/list of one
    number. A sequence of several values is refused: verl's naive manager writes the returned value into one
    element of the reward tensor, which fails for several values, and taking one of them (a ``(format, accuracy)``
    pair) would train on the wrong one. Non-finite scores are returned as they are (the manager counts and zeroes
    them).

    Raises:
        TypeError: for a dict without ``"score"``, a tuple/list that does not hold exactly one value, or any other
            type.
        ValueError: when the score is not convertible to float.
    """
    if isinstance(res, dict):
        if "score" not in res:
            raise TypeError(f"a dict-returning scorer must include 'score'; got keys {sorted(map(str, res))}")
        out = {str(k): _plain_value(v) for k, v in res.items()}
        out["score"] = float(res["score"])
        return out
    if isinstance(res, (tuple, list)):
        if len(res) != 1:
            raise TypeError(f"a scorer must return one score (a float or a dict with 'score'), got a "
                            f"{type(res).__name__} of {len(res)} values: {res!r:.100}")
        return float(res[0])
    if isinstance(res, (str, bytes)) or res is None:
        raise TypeError(f"a scorer must return a float or a dict with 'score', got {type(res).__name__}")
    return float(res)


def run_scorer(fn: Callable, args: tuple, kwargs: dict) -> Outcome:
    """Call ``fn(*args, **kwargs)`` (an ``async def`` scorer awaited: :func:`rewards.scorer_call.call_scorer`) and
    normalise the result; exceptions become ``("error", message, s)``."""
    t0 = time.perf_counter()
    try:
        return "ok", to_plain_result(call_scorer(fn, args, kwargs)), time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a scorer failure must never stop training
        return "error", f"{type(e).__name__}: {e}"[:500], time.perf_counter() - t0


def run_scorer_noted(fn: Callable, args: tuple, kwargs: dict) -> tuple[Outcome, list[float]]:
    """:func:`run_scorer`, and the limits of the comparisons the scorer's own time bound cut short during the call
    (:func:`rewards.math_guards.take_limit_hits`; earlier ones of this process are dropped first)."""
    take_limit_hits()
    outcome = run_scorer(fn, args, kwargs)
    return outcome, take_limit_hits()


class _AlarmTimeout(BaseException):  # not an Exception: run_scorer must not swallow it
    pass


def in_process(fn: Callable, args: tuple, kwargs: dict, timeout_s: float) -> Outcome:
    """Run one scorer here (:func:`run_scorer`); a SIGALRM timer bounds it to ``timeout_s`` when this is the main
    thread (else no limit)."""
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if not use_alarm:
        return run_scorer(fn, args, kwargs)

    def on_alarm(signum, frame):
        raise _AlarmTimeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return run_scorer(fn, args, kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _AlarmTimeout:
        return "timeout", None, time.perf_counter() - t0
    finally:
        signal.signal(signal.SIGALRM, old)
