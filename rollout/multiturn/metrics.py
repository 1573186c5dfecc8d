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
``multi_turn/tool_wall_s``                  wall-clock seconds of the rounds' tool phases (calls run concurrently) of
                                            one worker's call; in the step's metrics the slowest worker's
``multi_turn/generate_s``                   wall-clock seconds in ``engine.generate`` of one worker's call (ditto)
``multi_turn/tool_token_share``             tool-answer tokens / all response tokens
``multi_turn/template_token_share``         chat-template glue tokens / all response tokens
``multi_turn/dropped_after_call``           model tokens written after a tool call in the same turn (before its
                                            answer) and cut away, per sample
``multi_turn/stop_reason/<reason>``         share of samples that ended by ``no_tool_call``, ``length``,
                                            ``max_assistant_turns`` or ``max_user_turns``
tool metrics                                each tool's :meth:`rollout.tools.base.Tool.metrics`, e.g.
                                            ``tool/python/isolation_level``; in the step's metrics joined over
                                            the workers (:func:`trainer.protocol.join_tool_metrics`)
==========================================  =====================================================================

Every key but the two wall-clock ones and the tool metrics is computed from per-sample values that travel with the
rows as non-tensor columns (:data:`ROW_COLUMNS`, :func:`row_columns`), so the trainer computes them on the driver
over the whole batch (every worker's rows; :func:`trainer.multi_turn.generation_metrics`), as ``num_turns`` is.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["multi_turn_metrics", "row_columns", "column_metrics", "ROW_COLUMNS", "STOP_REASONS"]

STOP_REASONS = ("no_tool_call", "length", "max_assistant_turns", "max_user_turns")

#: the per-sample figures of a rollout, as non-tensor columns of the trainer's rows (numpy arrays, one entry per row):
#: the metrics of a batch are computed from them on the driver, over every worker's rows (:func:`column_metrics`)
ROW_COLUMNS = ("num_turns", "mt_assistant_turns", "mt_tool_calls", "mt_tool_errors", "mt_malformed_calls",
               "mt_tool_timeouts", "mt_tool_seconds", "mt_dropped_after_call", "mt_tool_tokens", "mt_template_tokens",
               "mt_response_tokens", "mt_stop_reason")


def row_columns(rows: Sequence) -> dict[str, np.ndarray]:
    """The :data:`ROW_COLUMNS` of ``rows`` (the loop's per-sample records): ``num_turns`` (verl's: model turns +
    tool turns + 1), the counts (int64), ``mt_tool_seconds`` (float64), ``mt_*_tokens`` (tool-answer, template-glue
    and all response tokens of the sample) and ``mt_stop_reason`` (object array of :data:`STOP_REASONS`)."""
    def ints(values):
        return np.asarray(list(values), dtype=np.int64)

    stop = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        stop[i] = r.stop_reason
    return {
        "num_turns": ints(r.assistant_turns + r.user_turns + 1 for r in rows),
        "mt_assistant_turns": ints(r.assistant_turns for r in rows),
        "mt_tool_calls": ints(r.calls for r in rows),
        "mt_tool_errors": ints(r.errors for r in rows),
        "mt_malformed_calls": ints(r.malformed for r in rows),
        "mt_tool_timeouts": ints(r.timeouts for r in rows),
        "mt_tool_seconds": np.asarray([float(r.tool_seconds) for r in rows], dtype=np.float64),
        "mt_dropped_after_call": ints(r.dropped for r in rows),
        "mt_tool_tokens": ints(r.kind.count(2) for r in rows),
        "mt_template_tokens": ints(r.kind.count(3) for r in rows),
        "mt_response_tokens": ints(len(r.kind) for r in rows),
        "mt_stop_reason": stop,
    }


def _stats(prefix: str, values: np.ndarray, keys=("mean", "max", "min")) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    out = {"mean": values.mean(), "max": values.max(), "min": values.min()}
    return {f"{prefix}/{k}": float(out[k]) for k in keys}


def column_metrics(columns: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The per-sample part of the table above (every key but ``tool_wall_s``, ``generate_s`` and the tools' own)
    from :data:`ROW_COLUMNS` of a batch (any rows: one worker's, or every worker's joined); ``{}`` for no rows or
    when a column is missing (single-turn rows)."""
    if any(k not in columns for k in ROW_COLUMNS) or not len(columns["num_turns"]):
        return {}
    c = {k: np.asarray(columns[k]) if k == "mt_stop_reason" else np.asarray(columns[k], dtype=np.float64)
         for k in ROW_COLUMNS}
    n = len(c["num_turns"])
    m: dict[str, float] = {}
    m.update(_stats("multi_turn/num_turns", c["num_turns"]))
    m.update(_stats("multi_turn/assistant_turns", c["mt_assistant_turns"], ("mean", "max")))
    m.update(_stats("multi_turn/tool_calls", c["mt_tool_calls"], ("mean", "max")))
    m["multi_turn/tool_calls_total"] = float(c["mt_tool_calls"].sum())
    m["multi_turn/tool_errors"] = float(c["mt_tool_errors"].sum())
    m["multi_turn/malformed_calls"] = float(c["mt_malformed_calls"].sum())
    m["multi_turn/tool_timeouts"] = float(c["mt_tool_timeouts"].sum())
    m["multi_turn/tool_seconds/sum"] = float(c["mt_tool_seconds"].sum())
    m["multi_turn/tool_seconds/max"] = float(c["mt_tool_seconds"].max())
    total = float(c["mt_response_tokens"].sum())
    m["multi_turn/tool_token_share"] = float(c["mt_tool_tokens"].sum()) / total if total else 0.0
    m["multi_turn/template_token_share"] = float(c["mt_template_tokens"].sum()) / total if total else 0.0
    m["multi_turn/dropped_after_call"] = float(c["mt_dropped_after_call"].sum()) / n
    reasons = list(c["mt_stop_reason"])
    for reason in STOP_REASONS:
        m[f"multi_turn/stop_reason/{reason}"] = sum(r == reason for r in reasons) / n
    return m


def multi_turn_metrics(rows: Sequence, tools: Mapping, generate_s: float, tool_wall_s: float) -> dict[str, float]:
    """The table above for ``rows`` (the loop's per-sample records) and ``tools`` ({name: Tool})."""
    m = column_metrics(row_columns(rows))
    m["multi_turn/tool_wall_s"] = float(tool_wall_s)
    m["multi_turn/generate_s"] = float(generate_s)
    for tool in tools.values():
        m.update({k: float(v) for k, v in tool.metrics().items()})
    return m
