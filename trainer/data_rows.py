"""Single rows of a prompt data file: why a row cannot be used, and how an error names it.

:func:`row_problem` says why a row is skipped as unusable (no prompt or ground truth, a chat message without its role
or content), :func:`row_tools` reads a row's ``tools`` column, :func:`row_place` and :func:`row_origins` name a row by
its file and index (counted from 0), and :func:`check_reward_key` makes sure every row names its reward scorer in
``data.reward_fn_key``. A row that cannot be used is a :class:`DataError` naming its file and index
(:class:`trainer.dataset.PromptDataset` reads the files and puts the place in front).
"""
from __future__ import annotations

import json
from typing import Any


class DataError(ValueError):
    """A data file is missing, empty, lacks a column or holds no usable rows."""


def row_place(path: str, index: int) -> str:
    """How an error names a row: ``row <index> of <file> (counted from 0)``."""
    return f"row {index} of {path} (counted from 0)"


def row_tools(row: dict) -> list:
    """A row's ``tools`` column as a list of function definitions (``[]`` when absent or empty).

    Raises:
        DataError: the column is neither a list of mappings nor the JSON text of one (the message does not name
            the row: :class:`trainer.dataset.PromptDataset` puts its file and index in front).
    """
    tools = row.get("tools")
    if tools is None or (hasattr(tools, "__len__") and len(tools) == 0):
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise DataError(f"its 'tools' is not JSON ({exc.msg}): {tools[:80]!r}; expected a list of function "
                            "definitions or its JSON text") from exc
    tools = list(tools) if not isinstance(tools, (str, dict)) and hasattr(tools, "__iter__") else tools
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise DataError(f"its 'tools' is a {type(tools).__name__}; expected a list of function definitions "
                        "({'type': 'function', 'function': {...}})")
    return tools


def row_problem(row: dict, prompt_key: str = "prompt") -> str | None:
    """Why ``row`` is skipped as unusable: no prompt (in the column ``prompt_key``) or an empty one, no
    ``reward_model.ground_truth``, or a chat message without its ``role`` or ``content`` (it would render as
    nothing); None for a usable row."""
    prompt = row.get(prompt_key)
    rm = row.get("reward_model")
    if prompt is None:
        return f"no {prompt_key!r} value"
    if not prompt:
        return f"an empty {prompt_key!r}"
    if not isinstance(rm, dict):
        return f"its 'reward_model' is {rm!r}, not a mapping with a 'ground_truth'"
    if rm.get("ground_truth") is None:
        return "no 'reward_model.ground_truth' value"
    if rm.get("ground_truth") == "":
        return "an empty 'reward_model.ground_truth'"
    if not isinstance(prompt, str):
        for i, m in enumerate(prompt):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), (str, list))):
                shown = repr(m) if len(repr(m)) <= 80 else repr(m)[:77] + "..."
                return f"chat message {i} of its {prompt_key!r} lacks its role or content: {shown}"
    return None


def row_origins(ds: Any) -> list[tuple[str, int]]:
    """``(file, index in that file)`` of each row of ``ds`` (a :class:`trainer.dataset.PromptDataset`, or anything
    with ``rows`` and ``files``: then the index among all its rows, its files named together)."""
    rows = list(getattr(ds, "rows", None) or ())
    origins = list(getattr(ds, "origins", None) or ())
    if len(origins) != len(rows):
        files = [str(f) for f in (getattr(ds, "files", None) or ())]
        origins = [(", ".join(files) or "the data", i) for i in range(len(rows))]
    return origins


def _scorer_name_problem(row: dict, key: str) -> str | None:
    """What keeps ``row``'s value in the column ``key`` from naming a reward scorer (scorers are registered under
    non-empty strings); None for a non-empty string."""
    value = row.get(key)
    if value is None:
        return f"has no {key!r} value"
    if not isinstance(value, str):
        return f"has {key}={value!r} ({type(value).__name__}), not a scorer name"
    if not value.strip():
        return f"has an empty {key!r} value ({value!r})"
    return None


def check_reward_key(ds: Any, key: str, allow_none: bool = False) -> None:
    """Every row of ``ds`` (a :class:`trainer.dataset.PromptDataset`, or anything with ``rows`` and ``files``) names
    its reward scorer in the column ``key`` (``data.reward_fn_key``): a non-empty string. A JSON-lines row without it, or a
    parquet null, reads as None; an empty string or a value of another type (a number, a list) names no scorer
    either: the run would stop with ``no reward scorer registered for ...`` naming neither the file nor the row.
    ``allow_none``: only a file without the column is refused (a custom reward function that takes
    ``data_source`` is given each row's value as it is, None included).

    Raises:
        DataError: one line naming ``data.reward_fn_key``, the file and the row (counted from 0) with its value, or
            that the column is missing from the file, and the ways out.
    """
    rows, origins = list(getattr(ds, "rows", None) or ()), row_origins(ds)
    problems = [(i, _scorer_name_problem(row, key)) for i, row in enumerate(rows) if key not in row or not allow_none]
    bad = [(i, why) for i, why in problems if why is not None]
    if not bad:
        return
    first, why = bad[0]
    path = origins[first][0]
    of_file = [i for i, (p, _) in enumerate(origins) if p == path]
    if all(key not in rows[i] for i in of_file):
        have = sorted(k for k in rows[first] if k != "input_ids")
        where = f"the column {key!r} is missing from {path} (its columns: {have})"
    else:
        others = f"; {len(bad) - 1} more row(s) name no scorer either" if len(bad) > 1 else ""
        where = f"{row_place(*origins[first])} {why}{others}"
    out = ("or drop the data_source parameter of the custom reward function" if allow_none else
           "or force one scorer for every row with reward_model.scorer=<name>")
    raise DataError(f"data.reward_fn_key={key!r}: {where}; the reward scorer of a row is picked by this column (a "
                    f"scorer name): give every row a {key!r} string, set data.reward_fn_key=<a column every row has>, "
                    f"{out}")
