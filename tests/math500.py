"""MATH-500 rows for the tests that check every answer. The dataset is not part of the repository: ``MATH500_DIR``
names its folder (``test.jsonl``), else the data folder beside the checkout; tests marked :data:`needs_math500`
skip without it."""
import json
import os

import pytest

MATH500 = os.environ.get("MATH500_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "math500"))
needs_math500 = pytest.mark.skipif(not os.path.exists(os.path.join(MATH500, "test.jsonl")),
                                   reason=f"MATH-500 not found at {MATH500}")


def math500_rows() -> list[dict]:
    """Every row of MATH-500's ``test.jsonl`` (``problem``, ``solution``, ``answer``, ...), in file order."""
    with open(os.path.join(MATH500, "test.jsonl")) as f:
        return [json.loads(line) for line in f]
