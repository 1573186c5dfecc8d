"""GSM8K jsonl -> parquet in verl's layout (so verl's GSM8K parquet files load the same way).

    python tools/data_preprocess/gsm8k.py --src ../shared/data/gsm8k --out data/gsm8k

Writes ``train.parquet`` (7,473 rows) and ``test.parquet`` (1,319 rows). The ground truth is the number after
``####`` in the reference answer, commas removed (``1,000`` -> ``1000``).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools.data_preprocess.common import make_row, read_jsonl, write_parquet  # noqa: E402

DATA_SOURCE = "openai/gsm8k"


def extract_answer(answer: str) -> str:
    """The final number of a GSM8K reference answer. Raises ValueError when there is no ``#### N`` line."""
    m = re.search(r"####\s*(-?[\d,\.]+)", answer)
    if not m:
        raise ValueError(f"GSM8K answer without '#### N': {answer[-80:]!r}")
    return m.group(1).replace(",", "").rstrip(".")


def convert(src: str, out: str, splits=("train", "test")) -> dict[str, int]:
    counts = {}
    for split in splits:
        rows = [make_row(DATA_SOURCE, r["question"], extract_answer(r["answer"]), split, i, reference=r["answer"])
                for i, r in enumerate(read_jsonl(os.path.join(src, f"{split}.jsonl")))]
        counts[split] = write_parquet(rows, os.path.join(out, f"{split}.parquet"))
    return counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=os.environ.get("GSM8K_DIR", "../shared/data/gsm8k"))
    p.add_argument("--out", default="data/gsm8k")
    a = p.parse_args(argv)
    print(convert(a.src, a.out))


if __name__ == "__main__":
    main()
