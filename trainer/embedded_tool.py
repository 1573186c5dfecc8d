"""A generated task that needs a tool: exact products (and sums/differences) of large integers.

``make_rows`` writes rows in verl's column layout (as :mod:`trainer.embedded` does for the digits task):
``data_source`` ``synthetic/arith_tool``, ``prompt`` (one user message asking to use the tool and to end with
``#### <answer>``), ``reward_model.ground_truth`` (the exact integer as a string), ``extra_info`` (operands,
operator, index, split). Scored by :mod:`rewards.arith_tool` (exact match of the final ``#### N`` after the last
tool answer). With 6-9 digit operands a model without the tool rarely gets a product exactly right, so the reward
measures tool use. :func:`with_tool_instruction` adds the same instruction to other math rows (GSM8K, SVAMP).
"""
from __future__ import annotations

import json
import os
import random

from rewards.arith_tool import TASK_NAME

__all__ = ["TASK_NAME", "make_rows", "write_task", "with_tool_instruction", "tool_instruction"]

_OPS = {"*": lambda a, b: a * b, "+": lambda a, b: a + b, "-": lambda a, b: a - b}
_TOOL_WORDS = {"python": "the python tool (write a program that prints the result)",
               "calculator": "the calculator tool"}


def tool_instruction(tool: str = "python") -> str:
    """The sentence asking for the tool and the answer format. Raises ValueError for a tool other than
    ``python`` / ``calculator``."""
    if tool not in _TOOL_WORDS:
        raise ValueError(f"tool={tool!r}; expected one of {sorted(_TOOL_WORDS)}")
    return f"Use {_TOOL_WORDS[tool]} to compute it exactly, then give the final answer as '#### <number>'."


def make_rows(num_rows: int, seed: int, min_digits: int = 6, max_digits: int = 9, ops: tuple[str, ...] = ("*",),
              tool: str = "python") -> list[dict]:
    """``num_rows`` questions ``a <op> b`` with operands of ``min_digits..max_digits`` digits (uniform count).

    Raises:
        ValueError: digits out of order or < 1, an operator other than ``* + -``, an unknown tool.
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    bad = [op for op in ops if op not in _OPS]
    if bad or not ops:
        raise ValueError(f"ops={list(ops)}; expected a non-empty subset of {sorted(_OPS)}")
    hint = tool_instruction(tool)
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        a, b = (rng.randint(10 ** (d - 1), 10 ** d - 1) for d in
                (rng.randint(min_digits, max_digits), rng.randint(min_digits, max_digits)))
        op = rng.choice(ops)
        rows.append({
            "data_source": TASK_NAME,
            "prompt": [{"role": "user", "content": f"What is {a} {op} {b}? {hint}"}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(_OPS[op](a, b))},
            "extra_info": {"index": i, "split": f"seed{seed}", "a": a, "b": b, "op": op},
        })
    return rows


def with_tool_instruction(rows: list[dict], tool: str = "python") -> list[dict]:
    """Copies of verl-layout math rows whose last user message ends with :func:`tool_instruction` (for GSM8K /
    SVAMP with a tool). Rows are not modified in place.

    Raises:
        ValueError: a row whose ``prompt`` is not a list of messages with a user message.
    """
    hint = tool_instruction(tool)
    out = []
    for i, row in enumerate(rows):
        prompt = [dict(m) for m in row.get("prompt") or []] if isinstance(row.get("prompt"), list) else None
        users = [m for m in prompt or [] if m.get("role") == "user"]
        if not users:
            raise ValueError(f"row {i}: prompt must be a list of chat messages with a user message")
        users[-1]["content"] = f"{users[-1]['content'].rstrip()} {hint}"
        out.append({**row, "prompt": prompt})
    return out


def write_task(out_dir: str, train_rows: int = 2048, val_rows: int = 64, seed: int = 0, **kwargs) -> tuple[str, str]:
    """Write ``train.jsonl`` and ``val.jsonl`` (``kwargs`` go to :func:`make_rows`); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, n, s in (("train", train_rows, seed), ("val", val_rows, seed + 1)):
        path = os.path.join(out_dir, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for row in make_rows(n, s, **kwargs):
                f.write(json.dumps(row) + "\n")
        paths.append(path)
    return paths[0], paths[1]
