"""Shared writer for the preprocessing tools: rows in verl's parquet layout."""
from __future__ import annotations

import json
import os
from typing import Iterable

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSON-lines file. Raises FileNotFoundError naming the path."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} not found (--src names a folder with the dataset's <split>.jsonl files)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_split(hub_name: str, split: str, src: str | None = None, config: str | None = None) -> list[dict]:
    """The rows of one split: from ``<src>/<split>.jsonl`` when ``src`` is given (a local copy), else from the
    Hugging Face Hub by name through ``datasets.load_dataset(hub_name, config, split=split)`` (cached by
    ``datasets``; offline, set ``HF_DATASETS_OFFLINE=1`` with a filled cache, or use ``src``).

    Raises:
        FileNotFoundError: ``src`` lacks ``<split>.jsonl``.
    """
    if src:
        return read_jsonl(os.path.join(src, f"{split}.jsonl"))
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
