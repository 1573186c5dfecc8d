"""GSM8K -> parquet in verl's layout (so verl's GSM8K parquet files load the same way).

    python tools/data_preprocess/gsm8k.py --out data/gsm8k                 # from the Hub: openai/gsm8k, "main"
    python tools/data_preprocess/gsm8k.py --src /path/to/gsm8k --out data/gsm8k   # a local copy: train/test.jsonl

Writes ``train.parquet`` (7,473 rows) and ``test.parquet`` (1,319 rows). The ground truth is the number after the
last ``####`` of the reference answer, read as the gsm8k scorer reads an answer (:func:`extract_answer`; ``1,000``
-> ``1000``, ``$5`` -> ``5``, ``5/2`` stays a fraction), so that every reference solution scores 1.0 against its own
ground truth; an answer the scorer reads no number from (``#### 10 - 3``, ``#### 1,2``) stops the tool naming the
file (or Hub split) and the row, and nothing is written. ``--tool python`` (or ``calculator``)
writes prompts asking for that tool instead (multi-turn rollouts, see README: multi-turn).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from rewards.gsm8k import extract_solution  # noqa: E402
from tools.data_preprocess.common import (add_tool_option, load_split, make_row, run_cli, tool_rows,  # noqa: E402
                                          write_parquet)

DATA_SOURCE = "openai/gsm8k"
HUB_CONFIG = "main"


def extract_answer(answer: str, where: str = "a GSM8K answer") -> str:
    """The final answer of a GSM8K reference solution as the gsm8k scorer reads it (strict: the number after the
    last ``#### ``, :func:`rewards.gsm8k.extract_solution`), a plain decimal string without thousands separators or
    ``$`` (``"1000"``, ``"-3"``, ``"3.50"``) or a fraction (``"5/2"``): the solution scores 1.0 against it.

    Raises:
        ValueError: naming ``where`` (the file or split and the row) and the answer's end, when the scorer reads no
            number there (no ``#### N``, an expression such as ``10 - 3``, commas that are not thousands separators
            such as ``1,2``).
    """
    truth = extract_solution(answer, "strict")  # None for a value that is not a str
    if truth is None:
        raise ValueError(f"{where}: the answer ends {str(answer)[-80:]!r}, where the gsm8k scorer reads no '#### N' "
                         "(N one number, such as 42, -3, 1,234, 3.5, $5 or 5/2); fix or drop this row")
    return truth


def _where(src: str | None, split: str, index: int) -> str:
    """How an error names a source row: its file (or Hub split) and its index among the split's rows."""
    place = os.path.join(src, f"{split}.jsonl") if src else f"{DATA_SOURCE} split {split!r}"
    return f"{place}, row {index} (counted from 0)"


COLUMNS = {"question": str, "answer": str}  # a --src row (train.jsonl / test.jsonl)


def convert(src: str | None, out: str, splits=("train", "test"), tool: str | None = None) -> dict[str, int]:
    """Write ``<out>/<split>.parquet`` for each split, read from ``src`` or the Hub (prompts asking for ``tool``
    when given, see :func:`tools.data_preprocess.common.tool_rows`); returns the row counts."""
    own = {"instruction": ""} if tool else {}
    made = {}
    for split in splits:  # every split is read before any is written: a bad source changes no file
        rows = load_split(DATA_SOURCE, split, src, HUB_CONFIG, COLUMNS)
        truths = [extract_answer(r["answer"], _where(src, split, i)) for i, r in enumerate(rows)]
        made[split] = tool_rows([make_row(DATA_SOURCE, r["question"], truth, split, i, **own, reference=r["answer"])
                                 for i, (r, truth) in enumerate(zip(rows, truths))], tool)
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
