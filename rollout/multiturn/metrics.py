"""Metrics of one multi-turn rollout batch (all plain floats, keys under ``multi_turn/``).

==========================================  =====================================================================
key                                         value
==========================================  =====================================================================
``multi_turn/num_turns/{mean,max,min}``     verl's ``num_turns``: model turns + tool turns + 1, per sample
``multi_turn/assistant_turns/{mean,max}``   model turns per sample
``multi_turn/tool_calls/{mean,max}``        tool calls per sample (malformed ones included)
``multi_turn/tool_calls_total``             calls in the batch
``multi_turn/tool_errors``                  calls answered with an error (malformed ones included), batch total
``multi_turn/malformed_calls``              unparsable calls, unknown tool names, arguments failing the schema
``multi_turn/tool_timeouts``                calls that ran out of time
``multi_turn/tool_seconds/{sum,max}``       seconds inside tool calls: summed over calls, of the slowest sample
``multi_turn/tool_wall_s``                  wall-clock seconds of the rounds' tool phases (calls run concurrently)
``multi_turn/generate_s``                   wall-clock seconds in ``engine.generate``
``multi_turn/tool_token_share``             tool-answer tokens / all response tokens
``multi_turn/template_token_share``         chat-template glue tokens / all response tokens
``multi_turn/dropped_after_call``           model tokens written after a tool call in the same turn (before its
                                            answer) and cut away, per sample
``multi_turn/stop_reason/<reason>``         share of samples that ended by ``no_tool_call``, ``length``,
                                            ``max_assistant_turns`` or ``max_user_turns``
tool metrics                                each tool's :meth:`rollout.tools.base.Tool.metrics`, e.g.
                                            ``tool/python/isolation_level``
==========================================  =====================================================================
"""
from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["multi_turn_metrics", "STOP_REASONS"]

STOP_REASONS = ("no_tool_call", "length", "max_assistant_turns", "max_user_turns")


def _stats(prefix: str, values: Sequence[float], keys=("mean", "max", "min")) -> dict[str, float]:
    out = {"mean": sum(values) / len(values), "max": max(values), "min": min(values)}
    return {f"{prefix}/{k}": float(out[k]) for k in keys}


def multi_turn_metrics(rows: Sequence, tools: Mapping, generate_s: float, tool_wall_s: float) -> dict[str, float]:
    """The table above for ``rows`` (the loop's per-sample records) and ``tools`` ({name: Tool})."""
    m: dict[str, float] = {}
    m.update(_stats("multi_turn/num_turns", [r.assistant_turns + r.user_turns + 1 for r in rows]))
    m.update(_stats("multi_turn/assistant_turns", [r.assistant_turns for r in rows], ("mean", "max")))
    m.update(_stats("multi_turn/tool_calls", [r.calls for r in rows], ("mean", "max")))
    m["multi_turn/tool_calls_total"] = float(sum(r.calls for r in rows))
    m["multi_turn/tool_errors"] = float(sum(r.errors for r in rows))
    m["multi_turn/malformed_calls"] = float(sum(r.malformed for r in rows))
    m["multi_turn/tool_timeouts"] = float(sum(r.timeouts for r in rows))
    m["multi_turn/tool_seconds/sum"] = float(sum(r.tool_seconds for r in rows))
    m["multi_turn/tool_seconds/max"] = float(max(r.tool_seconds for r in rows))
    m["multi_turn/tool_wall_s"] = float(tool_wall_s)
    m["multi_turn/generate_s"] = float(generate_s)
    total = sum(len(r.kind) for r in rows)
    m["multi_turn/tool_token_share"] = sum(r.kind.count(2) for r in rows) / total if total else 0.0
    m["multi_turn/template_token_share"] = sum(r.kind.count(3) for r in rows) / total if total else 0.0
    m["multi_turn/dropped_after_call"] = sum(r.dropped for r in rows) / len(rows)
    for reason in STOP_REASONS:
        m[f"multi_turn/stop_reason/{reason}"] = sum(r.stop_reason == reason for r in rows) / len(rows)
    for tool in tools.values():
        m.update({k: float(v) for k, v in tool.metrics().items()})
    return m
