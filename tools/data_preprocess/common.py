"""Shared writer for the preprocessing tools: rows in verl's parquet layout."""
from __future__ import annotations

import json
import os
from typing import Iterable

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def read_jsonl(path: str, columns: dict | None = None) -> list[dict]:
    """Rows of a JSON-lines file, each a JSON object holding ``columns`` (``{name: type or tuple of types}``).

    Raises:
        FileNotFoundError: naming the path; ValueError: naming the file and line of a row that is not JSON, not an
            object, or lacks a column or has it of another type.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} not found (--src names a folder with the dataset's <split>.jsonl files)")
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_row(path, n, line, columns or {}))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return rows


def _row(path: str, n: int, line: str, columns: dict) -> dict:
    where = f"{path}, line {n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object per line, got a {type(row).__name__}")
    missing = [c for c in columns if c not in row]
    if missing:
        raise ValueError(f"{where}: no {missing} (has {sorted(row)}); expected the columns {list(columns)}")
    for c, kind in columns.items():
        if isinstance(row[c], bool) or not isinstance(row[c], kind):
            want = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            raise ValueError(f"{where}: {c}={row[c]!r}; expected a {want}")
    return row


def load_split(hub_name: str, split: str, src: str | None = None, config: str | None = None,
               columns: dict | None = None) -> list[dict]:
    """The rows of one split: from ``<src>/<split>.jsonl`` when ``src`` is given (a local copy; every row must hold
    ``columns``, see :func:`read_jsonl`), else from the Hugging Face Hub by name through
    ``datasets.load_dataset(hub_name, config, split=split)`` (cached by ``datasets``; offline, set
    ``HF_DATASETS_OFFLINE=1`` with a filled cache, or use ``src``).

    Raises:
        FileNotFoundError: ``src`` lacks ``<split>.jsonl``; ValueError: a row of it that is not usable.
    """
    if src:
        return read_jsonl(os.path.join(src, f"{split}.jsonl"), columns)
    import datasets

    return [dict(r) for r in datasets.load_dataset(hub_name, config, split=split)]


def make_row(data_source: str, question: str, answer: str, split: str, index: int,
             instruction: str = INSTRUCTION, **extra) -> dict:
    """One row: ``prompt`` (chat messages: the question, then ``instruction``), ``data_source``, ``ability``,
    ``reward_model``, ``extra_info``."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": f"{question.strip()} {instruction}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "question": question, **extra},
    }


TOOLS = ("python", "calculator")


def tool_rows(rows: list[dict], tool: str | None) -> list[dict]:
    """``rows`` unchanged (``tool`` None), or copies whose user message ends with the tool instruction of
    :func:`trainer.embedded_tool.with_tool_instruction` (``Use the python tool ... then give the final answer as
    '#### <number>'``) and whose ``extra_info.tool`` names the tool. Build the rows with ``instruction=""`` for a
    tool, so the prompt carries one instruction. The scorers read the final ``#### N`` only after the last tool
    answer (``answer_after``, :mod:`rewards.registry`), so a program printing ``#### N`` earns nothing.

    Raises:
        ValueError: ``tool`` not one of :data:`TOOLS`.
    """
    if tool is None:
        return rows
    if tool not in TOOLS:
        raise ValueError(f"--tool {tool!r}; expected one of {list(TOOLS)}")
    from trainer.embedded_tool import with_tool_instruction

    return [{**r, "extra_info": {**r["extra_info"], "tool": tool}} for r in with_tool_instruction(rows, tool)]


def add_tool_option(parser) -> None:
    """``--tool python|calculator`` of the preprocessing tools (see :func:`tool_rows`)."""
    parser.add_argument("--tool", choices=TOOLS, default=None,
                        help="write rows that ask for this tool (multi-turn rollouts with "
                             "actor_rollout_ref.rollout.multi_turn.tools=[<tool>]); the final answer is scored "
                             "only after the last tool answer")


def write_parquet(rows: Iterable[dict], path: str) -> int:
    """Write rows to ``path`` as parquet (via ``datasets``); returns the number of rows.

    Raises:
        ValueError: no rows (nothing is written, so a file already at ``path`` is kept).
    """
    import datasets

    rows = list(rows)
    if not rows:
        raise ValueError(f"no rows to write to {path} (an empty or unusable source split); nothing written"
                         + (", the existing file is kept" if os.path.exists(path) else ""))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(path)
    return len(rows)


def run_cli(parser, convert_fn, *args) -> None:
    """Print ``convert_fn(*args)``; a missing source file or an empty split ends the tool with one line
    (``parser.error``: usage plus the message, exit 2) instead of a traceback."""
    try:
        print(convert_fn(*args))
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
