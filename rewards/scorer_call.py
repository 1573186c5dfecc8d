"""Calling a scorer: an ``async def`` scorer's coroutine is run to its end, as verl's reward loop awaits an async
``compute_score`` (``inspect.iscoroutinefunction``), so that such a function scores instead of returning a coroutine
that no one awaits.

Each call runs its coroutine on an event loop of its own (``asyncio.run``): in a scoring process, in the driver's
main thread under the in-process timer, or, where the calling thread already runs an event loop, in a thread of
its own that the call waits for. The scorer's time limit covers the whole run of the coroutine.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

__all__ = ["call_scorer"]


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
