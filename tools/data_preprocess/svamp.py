"""SVAMP -> parquet: 700 training rows and 300 held-out test rows.

    python tools/data_preprocess/svamp.py --out data/svamp                  # from the Hub: ChilleD/SVAMP
    python tools/data_preprocess/svamp.py --src /path/to/svamp --out data/svamp     # a local test.jsonl

The original SVAMP has 1,000 problems and no train split. With ``--src`` (the 1,000-row ``test.jsonl`` of the
common evaluation harnesses) the FIRST 700 rows are the training split and the LAST 300 the held-out split (a fixed
rule of ours); from the Hub, ``ChilleD/SVAMP``'s own train (700) and test (300) splits are used. The prompt is ``Body + " " + Question`` with the
same "answer after ####" instruction as GSM8K; ground truths are numbers (``12.0`` is written ``12``).
``--tool python`` (or ``calculator``) writes the prompts asking for that tool instead (multi-turn rollouts,
see README: multi-turn), e.g. ``--src .gdata/svamp --out data/svamp_tool --tool python``.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools.data_preprocess.common import (add_tool_option, load_split, make_row, run_cli, tool_rows,  # noqa: E402
                                          write_parquet)

DATA_SOURCE = "svamp"
HUB_NAME = "ChilleD/SVAMP"
TRAIN_ROWS = 700
COLUMNS = {"Body": str, "Question": str, "Answer": (int, float, str)}  # a --src row (test.jsonl)


def _number(x) -> str:
    f = float(x)
    return str(int(f)) if f.is_integer() else repr(f)


def convert(src: str | None, out: str, tool: str | None = None) -> dict[str, int]:
    """Write ``<out>/train.parquet`` and ``<out>/test.parquet`` (prompts asking for ``tool`` when given, see
    :func:`tools.data_preprocess.common.tool_rows`); returns the row counts."""
    if src:
        rows = load_split(HUB_NAME, "test", src, columns=COLUMNS)
        splits = ["train" if i < TRAIN_ROWS else "test" for i in range(len(rows))]
    else:
        train, test = load_split(HUB_NAME, "train"), load_split(HUB_NAME, "test")
        rows, splits = train + test, ["train"] * len(train) + ["test"] * len(test)
    own = {"instruction": ""} if tool else {}  # a tool row carries the tool's instruction only
    made = tool_rows([make_row(DATA_SOURCE, f"{r['Body'].strip()} {r['Question'].strip()}", _number(r["Answer"]),
                               split, i, **own, equation=r.get("Equation"))
                      for i, (r, split) in enumerate(zip(rows, splits))], tool)
    n_train = splits.count("train")
    return {"train": write_parquet(made[:n_train], os.path.join(out, "train.parquet")),
            "test": write_parquet(made[n_train:], os.path.join(out, "test.parquet"))}


def check_same_questions(dir_a: str, dir_b: str) -> None:
    """Check that two written SVAMP folders (e.g. with and without ``--tool``) hold the same questions in the
    same splits, so runs on them compare.

    Raises:
        ValueError: a split whose questions differ (folders written from different sources), naming both.
    """
    import pandas as pd

    for split in ("train", "test"):
        a, b = ([e["question"] for e in pd.read_parquet(os.path.join(d, f"{split}.parquet"))["extra_info"]]
                for d in (dir_a, dir_b))
        if a != b:
            raise ValueError(f"{dir_a}/{split}.parquet and {dir_b}/{split}.parquet hold different questions "
                             f"({len(a)} and {len(b)} rows; written from different sources?): delete both and "
                             "write them from one source")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=os.environ.get("SVAMP_DIR"),
                   help="a local folder with the 1,000-row test.jsonl (default: $SVAMP_DIR, else the Hub)")
    p.add_argument("--out", default="data/svamp")
    add_tool_option(p)
    a = p.parse_args(argv)
    run_cli(p, convert, a.src, a.out, a.tool)


if __name__ == "__main__":
    main()
