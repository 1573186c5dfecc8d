"""The strict GSM8K answer is the whole number after ``####``, never a prefix of it (the same kind of fault as case
P03: the extractor reads less of the answer than the model wrote). Found by trying it: ``#### 3/4`` scored as 3
(1.0 against the ground truth 3, 0.0 against 0.75), ``#### 2^10`` as 2, ``#### 1.5e3`` as 1.5."""
import time

import pytest

from rewards.gsm8k import compute_score, extract_solution


@pytest.mark.parametrize("text,truth,score", [
    ("#### 3/4", "0.75", 1.0), ("#### 3/4", "3", 0.0), ("#### -3/4", "-0.75", 1.0), ("#### 1,000/4", "250", 1.0),
    ("#### 3/4 of the cake", "3/4", 1.0),
    ("#### 1.5e3", "1500", 1.0), ("#### 1.5e3", "1.5", 0.0), ("#### 1e1234", "1", 0.0),
    ("#### 2^10", "2", 0.0), ("#### 2^10", "1024", 0.0),   # a power is not read: no answer, never its base
    ("#### 1/2.5", "1", 0.0),
    # unchanged: a trailing slash, period or letter is not part of the number
    ("#### 42/", "42", 1.0), ("#### 42.", "42", 1.0), ("#### 5e", "5", 1.0), ("#### 7 apples", "7", 1.0),
    ("#### 1\n#### 3/4", "0.75", 1.0),
])
def test_the_whole_number_after_the_marker_is_read(text, truth, score):
    assert compute_score(text, truth) == score, extract_solution(text)


def test_long_tails_stay_fast():
    t0 = time.process_time()  # CPU time: the scorer's own cost, whatever else shares the cores
    for text in ("#### 1/" + "1" * 100_000, "#### 2" + "/1" * 100_000, "#### 1e" + "1" * 100_000):
        assert compute_score(text, "1") == 0.0
    assert time.process_time() - t0 < 0.5


@pytest.mark.parametrize("text", ["#### 12/25/2023", "#### 1/2/3", "#### 3/-4", "#### 2**10",
                                  "#### 2 ^ 10", "#### 10-3", "#### 1e3/4", "#### 1/0", "#### 1e1234"])
def test_a_chain_of_attachments_or_an_unreadable_number_is_no_answer(text):
    assert extract_solution(text) is None
    assert compute_score(text, "1", format_score=0.1) == 0.0


def test_a_bare_fraction_denominator_is_read():
    assert extract_solution("#### 3/.5") == "3/.5" and compute_score("#### 3/.5", "6") == 1.0
