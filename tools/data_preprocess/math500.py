"""MATH -> parquet in verl's layout: MATH's training problems, with MATH-500 held out for validation.

    python tools/data_preprocess/math500.py --out data/math500                  # from the Hub
    python tools/data_preprocess/math500.py --src /path/to/math --out data/math500   # local test.jsonl + train.jsonl
    python tools/data_preprocess/math500.py --src /path/to/math500 --splits test --out data/math500

Writes ``test.parquet``: MATH-500 (Hub ``HuggingFaceH4/MATH-500``, split ``test``: 500 problems of the MATH test
set), and ``train.parquet``: the 7,500 training problems of MATH (Hub ``DigitalLearningGmbH/MATH-lighteval``, split
``train``, a copy of Hendrycks et al.'s release). A local copy (``--src``) holds ``test.jsonl`` (MATH-500 rows:
``problem``, ``solution``, ``answer``, ``subject``, ``level``, ``unique_id``) and ``train.jsonl`` (MATH rows:
``problem``, ``solution``, ``level``, ``type``); ``--splits test`` writes the held-out file only.

The ground truth is the row's ``answer`` field when it has one (MATH-500), else the content of the last
``\\boxed{}`` of the reference solution, found as the ``math`` scorer finds a response's answer
(:func:`rewards.math.last_boxed_only_string`, nested braces, ``\\fbox``, ``\\boxed 5``). Rows without either are
left out, and so are training problems whose text is a MATH-500 problem; the counts say how many. The prompt is the
problem followed by "Let's think step by step and output the final answer within \\boxed{}."; ``data_source`` is
``HuggingFaceH4/MATH-500`` (test) or ``lighteval/MATH`` (train), both scored by the ``math`` scorer.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from rewards.math import last_boxed_only_string, remove_boxed  # noqa: E402
from tools.data_preprocess.common import BOXED_INSTRUCTION, load_split, make_row, run_cli, write_parquet  # noqa: E402

TEST_HUB = "HuggingFaceH4/MATH-500"
TRAIN_HUB = "DigitalLearningGmbH/MATH-lighteval"
DEFAULT_OUT = "data/math500"  # configs/data/math500.yaml reads train.parquet and test.parquet here
COLUMNS = {"problem": str}  # a --src row (its answer: an 'answer' field or the boxed one of 'solution')
DATA_SOURCES = {"test": "HuggingFaceH4/MATH-500", "train": "lighteval/MATH"}  # rewards.registry aliases of "math"


def reference_answer(row: dict) -> str | None:
    """The ground truth of a MATH row: its ``answer`` field, else the last boxed answer of its ``solution``
    (None when neither is there)."""
    answer = row.get("answer")
    if isinstance(answer, str) and answer.strip():
        return answer.strip()
    boxed = remove_boxed(last_boxed_only_string(row.get("solution") or ""))
    return boxed.strip() if boxed and boxed.strip() else None


def _rows(split: str, raw: list[dict], skip_problems: set[str]) -> tuple[list[dict], int, int]:
    """Rows of one split in verl's layout; also the numbers left out for no answer and for being held out."""
    rows, no_answer, held_out = [], 0, 0
    for r in raw:
        problem = r["problem"]
        answer = reference_answer(r)
        if answer is None:
            no_answer += 1
            continue
        if problem.strip() in skip_problems:
            held_out += 1
            continue
        extra = {k: r[k] for k in ("subject", "type", "level", "unique_id") if r.get(k) is not None}
        rows.append(make_row(DATA_SOURCES[split], problem, answer, split, len(rows), BOXED_INSTRUCTION,
                             solution=r.get("solution"), **extra))
    return rows, no_answer, held_out


def convert(src: str | None, out: str, splits=("train", "test")) -> dict[str, int]:
    """Write ``<out>/<split>.parquet`` for each of ``splits`` (``train``, ``test``), read from ``src`` (a folder of
    ``<split>.jsonl``) or the Hub. Returns the row counts written per split and, as ``<split>_no_answer`` /
    ``train_in_test``, the rows left out.

    Raises:
        ValueError: an unknown split name. FileNotFoundError: ``src`` lacks a split's jsonl file.
    """
    bad = [s for s in splits if s not in DATA_SOURCES]
    if bad:
        raise ValueError(f"--splits: unknown split {bad[0]!r}; expected train and/or test")
    # the test split is read for train too (its problems stay out of training), and every split before any is written
    test_raw = load_split(TEST_HUB, "test", src, columns=COLUMNS)
    counts: dict[str, int] = {}
    for split in [s for s in ("train", "test") if s in splits]:
        raw = test_raw if split == "test" else load_split(TRAIN_HUB, "train", src, columns=COLUMNS)
        skip = {r["problem"].strip() for r in test_raw} if split == "train" else set()
        rows, no_answer, held_out = _rows(split, raw, skip)
        counts[split] = write_parquet(rows, os.path.join(out, f"{split}.parquet"))
        counts[f"{split}_no_answer"] = no_answer
        if split == "train":
            counts["train_in_test"] = held_out
    return counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=os.environ.get("MATH_DIR"),
                   help="a local folder with test.jsonl (MATH-500) and train.jsonl (MATH training problems) "
                        "(default: $MATH_DIR, else the Hub)")
    p.add_argument("--splits", default="train,test", help="comma list: train, test (default both)")
    p.add_argument("--out", default=DEFAULT_OUT)
    a = p.parse_args(argv)
    run_cli(p, convert, a.src, a.out, tuple(s.strip() for s in a.splits.split(",") if s.strip()))


if __name__ == "__main__":
    main()
