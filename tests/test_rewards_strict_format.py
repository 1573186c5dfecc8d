"""``strict_format``: the format reward's whole-response rule (one answer marker, a short tail at most after it).

Without it, a response repeating ``#### 1`` to the length limit is well-formed and right whenever the answer is 1:
the degenerate policy both TRL and this project reached on the SVAMP learning job (docs/results.md)."""
import pytest

from rewards.format_reward import compute_score, single_final_answer
from rewards.registry import get_scorer

SPAM = "#### 1\n" * 40


@pytest.mark.parametrize("text, ok", [
    ("3 + 4 = 7\n#### 7", True),
    ("#### 7  \n\n", True),
    ("#### 12 apples", True),
    ("#### 3/4", True),
    ("#### Step 1: add\n3 + 4 = 7\n#### 7", True),  # a Markdown heading without a number is no answer marker
    ("#### 32\nThe answer is 32.", True),   # a short closing sentence, as SmolLM2 writes one
    ("#### 7\r\n", True),
    ("So 3 + 4 = 7.\r\n#### 7\r\n", True),
    ("#### 7\n" + "x" * 63, True),          # 64 characters after the number
    ("#### 7\n" + "x" * 64, False),
    ("#### 7" + "\n" * 100, False),         # blank lines to the length limit
    ("#### 13\n" + "\nThe answer is 13.\n" * 10, False),  # the answer said again and again
    ("#" * 50 + " 7", False),                # the marker is exactly four '#'
    ("####  7", True),
    ("####" + " " * 3000 + "7", False),      # blanks to the length limit inside the answer
    ("#### $" + " " * 50 + "7", False),
    ("#### -$5", True),
    ("#### \u22125", True),
    ("##### 7", False),
    ("####7", False),                       # and a space, as GSM8K writes it
    ("#### 1. Find the total\n3 + 4 = 7\n#### 7", False),  # a numbered heading is a '#### N' marker too
    ("#### 1 " + "1 " * 40, False),         # one marker, then the answer repeated on its line to the limit
    (SPAM, False),                          # the repeated constant answer
    ("#### 3\n#### 7", False),
    ("no marker, 7", False),
    ("", False),
])
def test_gsm8k_single_final_answer(text, ok):
    assert single_final_answer(text, "gsm8k") is ok


@pytest.mark.parametrize("text, ok", [
    ("So the answer is $\\boxed{7}$.", True),
    ("\\[\\boxed{\n\\frac{1}{2}\n}\\]", True),   # a box over several lines, closing math after it
    ("\\fbox{7}", True),
    ("\\boxed{7} because 3 + 4 = 7.", True),  # a short tail
    ("\\boxed{3} or \\boxed{7}", False),
    ("\\boxed{3} and \\fbox{7}", False),         # the two commands count together
    ("\\boxed{7", False),                        # never closed
    ("\\boxed  7", True),                       # the space form, however many spaces
    ("\\boxed{7}" + "." * 100, False),          # a long tail
    ("\\boxed {7}", True),
    ("\\boxed" + " " * 50 + "7", False),        # blanks inside the answer
])
def test_boxed_single_final_answer(text, ok):
    assert single_final_answer(text, "boxed") is ok


def test_strict_format_scores_a_repeated_answer_zero_and_keeps_the_default_rule():
    assert compute_score(SPAM, "1") == {"score": 1.0, "acc": 1.0, "format": 1.0}  # default: last marker
    assert compute_score(SPAM, "1", strict_format=True) == {"score": 0.0, "acc": 0.0, "format": 0.0}
    assert compute_score("3 + 4 = 7\n#### 7", "7", strict_format=True)["score"] == 1.0
    assert compute_score("3 + 4 = 8\n#### 8", "7", strict_format=True, format_score=0.1)["score"] == 0.1
    # a correct last answer after a wrong one is not in format, so not correct either
    assert compute_score("#### 3\n#### 7", "7", strict_format=True)["acc"] == 0.0


def test_strict_format_reads_after_the_last_tool_answer():
    tool_out = "<tool_response>\n#### 99\n</tool_response>\nSo 3 + 4 = 7.\n#### 7"
    got = compute_score(tool_out, "7", strict_format=True, answer_after="</tool_response>")
    assert got["acc"] == 1.0
    assert compute_score(tool_out, "7", strict_format=True)["format"] == 0.0  # two markers in the whole text


@pytest.mark.parametrize("name", ["format_gsm8k", "format_boxed"])
def test_registered_format_scorers_take_strict_format(name):
    text = SPAM if name == "format_gsm8k" else "\\boxed{1} \\boxed{1}"
    score = get_scorer(name)
    assert score(text, "1")["format"] == 1.0
    assert score(text, "1", strict_format=True)["format"] == 0.0


def test_unknown_answer_format_is_refused():
    with pytest.raises(ValueError, match="answer_format must be one of"):
        single_final_answer("#### 1", "latex")


def test_the_tool_answer_end_marker_the_model_writes_is_replaced():
    from rewards.response_text import solution_text

    marker, blank = "</tool_response>", " " * 16
    assert solution_text("#### 1\n#### 1" + marker + "#### 1", None, marker) == "#### 1\n#### 1" + blank + "#### 1"
    assert solution_text("x", ("tool said #### 9" + marker, "me: " + marker + "#### 2"), marker) == \
        "tool said #### 9" + marker + marker + "me: " + blank + "#### 2"
    assert solution_text("a" + marker + "b", None, None) == "a" + marker + "b"  # a scorer reading everything
    # a user's own answer_after (one the model is meant to write) is left as the model wrote it
    assert solution_text("<think>#### 3</think>#### 42", None, "</think>") == "<think>#### 3</think>#### 42"


def test_the_trl_reward_and_the_evaluator_read_a_response_as_the_reward_manager_does():
    from tools.bench import learn_eval, learn_vs_trl_child

    marker = "</tool_response>"
    for text, truth in [("#### 7\nThe answer is 7." + marker * 40, "7"), ("####" + marker + "7", "7"),
                        ("#### 1 #### 1 " + marker + " #### 1", "1"), ("#### 7" + marker + "7", "7")]:
        ours = get_scorer("format_gsm8k")(solution_text_of(text), truth, strict_format=True)["score"]
        assert learn_vs_trl_child.make_format_reward(0.1, True)([text], [truth]) == [ours], text
        assert learn_eval.score_texts([text], [truth], 0.1, True)["score"] == ours, text


def solution_text_of(text):
    from rewards.response_text import solution_text

    return solution_text(text, None, "</tool_response>")
