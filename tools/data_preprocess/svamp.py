"""SVAMP json-lines -> parquet: the FIRST 700 rows are the training split, the LAST 300 the held-out test split.

    python tools/data_preprocess/svamp.py --src ../shared/data/svamp --out data/svamp

SVAMP has no train split of its own; this fixed rule is ours. The prompt is ``Body + " " + Question`` with the
same "answer after ####" instruction as GSM8K; ground truths are numbers (``12.0`` is written ``12``).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools.data_preprocess.common import make_row, read_jsonl, write_parquet  # noqa: E402

DATA_SOURCE = "svamp"
TRAIN_ROWS = 700


def _number(x) -> str:
    f = float(x)
    return str(int(f)) if f.is_integer() else repr(f)


def convert(src: str, out: str) -> dict[str, int]:
    rows = read_jsonl(os.path.join(src, "test.jsonl"))
    made = [make_row(DATA_SOURCE, f"{r['Body'].strip()} {r['Question'].strip()}", _number(r["Answer"]),
                     "train" if i < TRAIN_ROWS else "test", i, equation=r.get("Equation")) for i, r in enumerate(rows)]
    return {"train": write_parquet(made[:TRAIN_ROWS], os.path.join(out, "train.parquet")),
            "test": write_parquet(made[TRAIN_ROWS:], os.path.join(out, "test.parquet"))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=os.environ.get("SVAMP_DIR", "../shared/data/svamp"))
    p.add_argument("--out", default="data/svamp")
    a = p.parse_args(argv)
    print(convert(a.src, a.out))


if __name__ == "__main__":
    main()
