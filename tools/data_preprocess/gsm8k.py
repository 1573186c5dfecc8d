"""GSM8K -> parquet in verl's layout (so verl's GSM8K parquet files load the same way).

    python tools/data_preprocess/gsm8k.py --out data/gsm8k                 # from the Hub: openai/gsm8k, "main"
    python tools/data_preprocess/gsm8k.py --src /path/to/gsm8k --out data/gsm8k   # a local copy: train/test.jsonl

Writes ``train.parquet`` (7,473 rows) and ``test.parquet`` (1,319 rows). The ground truth is the number after
``####`` in the reference answer, commas removed (``1,000`` -> ``1000``). ``--tool python`` (or ``calculator``)
writes prompts asking for that tool instead (multi-turn rollouts, see README: multi-turn).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools.data_preprocess.common import (add_tool_option, load_split, make_row, run_cli, tool_rows,  # noqa: E402
                                          write_parquet)

DATA_SOURCE = "openai/gsm8k"
HUB_CONFIG = "main"


def extract_answer(answer: str) -> str:
    """The final number of a GSM8K reference answer. Raises ValueError when there is no ``#### N`` line."""
    m = re.search(r"####\s*(-?[\d,\.]+)", answer)
    if not m:
        raise ValueError(f"GSM8K answer without '#### N': {answer[-80:]!r}")
    return m.group(1).replace(",", "").rstrip(".")


COLUMNS = {"question": str, "answer": str}  # a --src row (train.jsonl / test.jsonl)


def convert(src: str | None, out: str, splits=("train", "test"), tool: str | None = None) -> dict[str, int]:
    """Write ``<out>/<split>.parquet`` for each split, read from ``src`` or the Hub (prompts asking for ``tool``
    when given, see :func:`tools.data_preprocess.common.tool_rows`); returns the row counts."""
    own = {"instruction": ""} if tool else {}
    made = {}
    for split in splits:  # every split is read before any is written: a bad source changes no file
        made[split] = tool_rows([make_row(DATA_SOURCE, r["question"], extract_answer(r["answer"]), split, i, **own,
                                          reference=r["answer"])
                                 for i, r in enumerate(load_split(DATA_SOURCE, split, src, HUB_CONFIG, COLUMNS))], tool)
    return {split: write_parquet(rows, os.path.join(out, f"{split}.parquet")) for split, rows in made.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=os.environ.get("GSM8K_DIR"),
                   help="a local folder with train.jsonl/test.jsonl (default: $GSM8K_DIR, else the Hub)")
    p.add_argument("--out", default="data/gsm8k")
    add_tool_option(p)
    a = p.parse_args(argv)
    run_cli(p, convert, a.src, a.out, ("train", "test"), a.tool)


if __name__ == "__main__":
    main()
