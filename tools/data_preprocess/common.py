"""Shared writer for the preprocessing tools: rows in verl's parquet layout."""
from __future__ import annotations

import json
import os
from typing import Iterable

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSON-lines file. Raises FileNotFoundError naming the path."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} not found (set the input folder, e.g. --src ../shared/data/gsm8k)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_row(data_source: str, question: str, answer: str, split: str, index: int, **extra) -> dict:
    """One row: ``prompt`` (chat messages), ``data_source``, ``ability``, ``reward_model``, ``extra_info``."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": f"{question.strip()} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "question": question, **extra},
    }


def write_parquet(rows: Iterable[dict], path: str) -> int:
    """Write rows to ``path`` as parquet (via ``datasets``); returns the number of rows."""
    import datasets

    rows = list(rows)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(path)
    return len(rows)
