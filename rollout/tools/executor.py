"""Run a turn's tool calls concurrently, each under its tool's timeout, and turn every failure into a message.

Async tools run on one event loop; sync tools run in a thread pool created per batch (a sync tool that ignores
its timeout keeps its thread until it returns, but no later batch waits for it).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from typing import Mapping, Sequence

from rollout.tools.base import Tool, ToolCall, ToolError, ToolOutcome, ToolTimeoutError

__all__ = ["run_tool_calls", "truncate_text", "TRUNCATE_SIDES"]

TRUNCATE_SIDES = ("left", "right", "middle")


def truncate_text(text: str, max_chars: int, side: str = "middle") -> str:
    """Cut ``text`` to ``max_chars`` characters (verl's ``tool_response_truncate_side`` semantics).

    ``left`` keeps the start and appends ``...(truncated)``; ``right`` keeps the end after ``(truncated)...``;
    ``middle`` keeps both halves around ``...(truncated)...``. Text within the limit is returned unchanged.

    Raises:
        ValueError: ``side`` not one of :data:`TRUNCATE_SIDES` or ``max_chars`` < 1.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side={side!r}; expected one of {list(TRUNCATE_SIDES)}")
    if int(max_chars) < 1:
        raise ValueError(f"max_tool_response_length must be >= 1, got {max_chars}")
    if len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - (max_chars - half):]


async def _one(call: ToolCall, tools: Mapping[str, Tool], pool: concurrent.futures.Executor) -> ToolOutcome:
    if call.error is not None:
        return ToolOutcome(name=call.name or "<malformed>", text=f"Error: {call.error}", status="error",
                           malformed=True)
    tool = tools.get(call.name)
    if tool is None:
        return ToolOutcome(name=call.name or "<malformed>", status="error", malformed=True,
                           text=f"Error: unknown tool {call.name!r}; available tools: {sorted(tools)}")
    bad = tool.validation_error(call.arguments)
    if bad is not None:
        return ToolOutcome(name=tool.name, text=f"Error: {bad}", status="error", malformed=True)
    t0 = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(tool.call):
            aw = tool.call(call.arguments)
        else:
            aw = asyncio.get_running_loop().run_in_executor(pool, tool.call, call.arguments)
        text = await asyncio.wait_for(aw, timeout=float(tool.timeout_s))
        if inspect.isawaitable(text):  # a sync ``call`` that returned a coroutine
            text = await asyncio.wait_for(text, timeout=max(1e-3, tool.timeout_s - (time.perf_counter() - t0)))
        status, text = "ok", str(text)
    except ToolTimeoutError as exc:
        status, text = "timeout", f"Error: tool {tool.name!r} timed out: {exc}"
    except asyncio.TimeoutError:
        status, text = "timeout", f"Error: tool {tool.name!r} timed out after {tool.timeout_s:g} s"
    except ToolError as exc:
        status, text = "error", f"Error: {exc}"
    except Exception as exc:  # a tool's own bug: reported to the model and counted, the rollout goes on
        status, text = "error", f"Error: tool {tool.name!r} failed: {type(exc).__name__}: {exc}"
    return ToolOutcome(name=tool.name, text=text, status=status, seconds=time.perf_counter() - t0)


async def _gather(calls: Sequence[ToolCall], tools: Mapping[str, Tool],
                  pool: concurrent.futures.Executor) -> list[ToolOutcome]:
    return list(await asyncio.gather(*(_one(c, tools, pool) for c in calls)))


def run_tool_calls(calls: Sequence[ToolCall], tools: Mapping[str, Tool]) -> list[ToolOutcome]:
    """Run ``calls`` concurrently; returns one :class:`ToolOutcome` per call, in order.

    Malformed calls, unknown tool names and arguments that fail the tool's schema are answered without calling
    anything (``malformed=True``). A call slower than its tool's ``timeout_s`` is answered with a timeout message.
    Exceptions of a tool become error messages; nothing raised by a tool leaves this function.

    Works from plain threads and from threads that already run an event loop (then a helper thread runs the
    batch's own loop).
    """
    if not calls:
        return []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(64, len(calls)), thread_name_prefix="tool")
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_gather(calls, tools, pool))
        box: list = []
        worker = threading.Thread(target=lambda: box.append(asyncio.run(_gather(calls, tools, pool))))
        worker.start()
        worker.join()
        return box[0]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
