"""Tool-call parsers: from one decoded model turn to a list of :class:`rollout.tools.base.ToolCall`.

Formats (``rollout.multi_turn.format``):

* ``hermes`` (Hermes / Qwen2.5 / Qwen3, verl's ``hermes``): each call is
  ``<tool_call>{"name": "...", "arguments": {...}}</tool_call>``; several per turn. ``arguments`` may also be a
  JSON string holding the object (some models write it so).
* ``python_block``: each fenced block opened by a line ```` ```python ```` (or ```` ```py ````) and closed by
  ```` ``` ```` is a call of the ``python`` tool with ``{"code": <block>}``.

A call that cannot be decoded (bad JSON, no ``name``, arguments that are not an object, an opening tag or fence
without its end) becomes a ``ToolCall`` with ``error`` set; the rollout answers it with that message.

Where a model turn ends (:func:`turn_calls`): the tool's answer must follow the call, so text the model wrote after
its call, before it could see the answer, is not part of the trajectory. ``hermes``: the turn ends after its last
complete ``</tool_call>`` (parallel calls); ``python_block``: after the first complete block (tool-integrated
reasoning, as in ToRA and Qwen2.5-Math's TIR: one program, its output, then the model goes on).
"""
from __future__ import annotations

import json
import re
from typing import Callable

from rollout.tools.base import ToolCall

__all__ = ["parse_hermes", "parse_python_block", "PARSERS", "get_parser", "turn_calls"]

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_FENCE_OPEN = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n")
_FENCE_CLOSE = re.compile(r"(?m)^[ \t]*```")
_MAX_SHOWN = 200  # characters of a malformed call quoted back to the model


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(None, None, f"tool call is not valid JSON ({exc.msg} at char {exc.pos}): {_short(body)}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(None, None, 'tool call must be a JSON object {"name": "<tool>", "arguments": {...}}, '
                                    f"got: {_short(body)}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(obj["name"], None, f"arguments of {obj['name']!r} are a string that is not JSON: "
                                               f"{_short(args)}")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], None, f"arguments of {obj['name']!r} must be a JSON object, got "
                                           f"{type(args).__name__}")
    return ToolCall(obj["name"], args)


def parse_hermes(text: str) -> list[ToolCall]:
    """All ``<tool_call>...</tool_call>`` calls in ``text``, in order (see the module docstring).

    A ``<tool_call>`` without a closing tag yields one malformed call; text outside the tags is ignored.
    """
    return [call for call, _ in _hermes_spans(text)]


def _hermes_spans(text: str) -> list[tuple[ToolCall, int | None]]:
    """(call, character offset after its closing tag; None for a call without one) of every call in ``text``."""
    calls, pos = [], 0
    while True:
        start = text.find(_HERMES_OPEN, pos)
        if start < 0:
            return calls
        end = text.find(_HERMES_CLOSE, start + len(_HERMES_OPEN))
        if end < 0:
            calls.append((ToolCall(None, None, f"{_HERMES_OPEN} without a closing {_HERMES_CLOSE}"), None))
            return calls
        pos = end + len(_HERMES_CLOSE)
        calls.append((_hermes_call(text[start + len(_HERMES_OPEN):end]), pos))


def parse_python_block(text: str) -> list[ToolCall]:
    """Every ```` ```python ```` fenced block in ``text`` as a ``python`` tool call with ``{"code": ...}``.

    An opening fence without a closing one yields one malformed call.
    """
    return [call for call, _ in _python_spans(text)]


def _python_spans(text: str) -> list[tuple[ToolCall, int | None]]:
    """(call, character offset after its closing fence and that line's break; None when unclosed) per block."""
    calls, pos = [], 0
    while True:
        m = _FENCE_OPEN.search(text, pos)
        if m is None:
            return calls
        close = _FENCE_CLOSE.search(text, m.end())
        if close is None:
            calls.append((ToolCall("python", None, "```python block without a closing ```"), None))
            return calls
        pos = close.end() + (text.startswith("\n", close.end()))
        calls.append((ToolCall("python", {"code": text[m.end():close.start()]}), pos))


def turn_calls(fmt: str, text: str) -> tuple[list[ToolCall], int | None]:
    """The tool calls of one decoded model turn in format ``fmt`` and the character offset where the turn ends
    for them (see the module docstring): ``hermes`` every call, ending after the last complete one;
    ``python_block`` the first block only, ending after its closing fence. The offset is None when the turn has no
    complete call (its calls, if any, are malformed: the turn keeps all its text).

    Raises:
        ValueError: an unknown ``fmt`` (:func:`get_parser`).
    """
    get_parser(fmt)
    spans = _hermes_spans(text) if fmt == "hermes" else _python_spans(text)[:1]
    ends = [end for _, end in spans if end is not None]
    if not ends:
        return [call for call, _ in spans], None
    return [call for call, end in spans if end is not None], max(ends)  # an unclosed last call is cut away


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes, "python_block": parse_python_block}


def get_parser(fmt: str) -> Callable[[str], list[ToolCall]]:
    """The parser of ``rollout.multi_turn.format``. Raises ValueError naming the known formats."""
    try:
        return PARSERS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"rollout.multi_turn.format={fmt!r}; expected one of {sorted(PARSERS)}") from None
