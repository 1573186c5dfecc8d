"""Which box is the answer (case P04): a command whose name merely starts with ``\\fbox``/``\\boxed``
(``\\fboxsep``, ``\\fboxrule``, ``\\boxedx``) is no box, and the box before it is the answer; the last box command's
argument is read as TeX reads it (``\\boxed5`` is ``\\boxed{5}``: a digit cannot be part of a command name), in a
response and as a ground truth alike, and never passed over for an earlier, superseded box."""
import pytest

from rewards import math as M
from rewards.format_reward import single_final_answer
from rewards.math import compute_score, last_boxed_only_string, remove_boxed
from rewards.registry import get_scorer

PROSE = "The answer is $\\boxed{5}$.\n\nI put the final answer in \\boxed as requested."


@pytest.mark.parametrize("text", [
    "The answer is $\\boxed{5}$. \\fboxsep=2pt", "\\boxed{5}\\boxedx", "\\boxed{5}\\fboxrule=1pt",
    "\\boxed{5} then \\fboxsep and \\boxedx",
])
def test_p04_a_command_that_is_no_box_leaves_the_earlier_box_the_answer(text):
    assert remove_boxed(last_boxed_only_string(text)) == "5"
    assert compute_score(text, "5") == 1.0 and compute_score(text, "6") == 0.0
    assert get_scorer("format_boxed")(text, "5") == {"score": 1.0, "acc": 1.0, "format": 1.0}


@pytest.mark.parametrize("text,answer", [
    ("\\boxed5", "5"), ("$\\boxed5$", "5"), ("so \\boxed5.", "5."), ("\\boxed12 apples", "12"), ("\\fbox7", "7"),
    ("\\boxed 5", "5"), ("\\boxed x", "x"), ("\\boxed A", "A"), ("\\boxed \\frac12", "\\frac12"),
    ("\\boxed{3} then \\boxed 7.", "7."), ("\\boxed{3} then \\boxed7", "7"), ("\\boxed\\pi", "\\pi"),
    ("\\boxed{2} then \\boxed\\infty", "\\infty"), ("\\boxed{3} then \\boxed\n{5}", "5"), ("\\boxed Yes", "Yes"),
    ("Initially \\boxed{4}. Final: \\boxed IV", "IV"), (PROSE, "as"), ("\\boxed{3}. Correction: \\boxed -5", "-5"),
    ("\\boxed{3} then \\boxed(1,2)", "(1,2)"), ("\\boxed{3} then \\boxed [0,1]", "[0,1]"), ("\\boxed .5", ".5"),
    ("\\boxed{3} then \\boxed~4", "~4"), ("\\boxed{5} as \\boxed.", "."), ("\\boxed-5", "-5"),
])
def test_p04_the_last_box_is_read_as_tex_reads_it_never_an_earlier_one(text, answer):
    assert remove_boxed(last_boxed_only_string(text)) == answer


@pytest.mark.parametrize("text,gold", [
    ("The answer is \\boxed -5", "-5"), ("$\\boxed -5$.", "-5"), ("The answer is \\boxed -\\frac{1}{2}", "-\\frac{1}{2}"),
    ("The answer is \\boxed (1,2)", "(1,2)"), ("The answer is \\boxed [0,1]", "[0,1]"), ("The answer is \\boxed .5", "0.5"),
])
def test_p04_a_token_box_scores(text, gold):
    assert compute_score(text, gold) == 1.0


def test_p04_boxed_digit_scores_as_a_response_and_as_a_ground_truth():
    assert compute_score("\\boxed5", "5") == 1.0 and compute_score("$\\boxed5$", "5") == 1.0
    assert compute_score("\\boxed{5}", "\\boxed5") == 1.0 and compute_score("\\boxed{6}", "\\boxed5") == 0.0
    assert M.gold_answer("so it is $\\boxed5$.") == "5" and remove_boxed("\\boxed5") == "5"
    assert get_scorer("format_boxed")("$\\boxed5$", "5")["acc"] == 1.0


@pytest.mark.parametrize("text", [
    "I use \\fboxsep here", "\\boxedx", "\\boxed{3", "so \\boxed{5} and \\boxed", "\\boxed{5} and \\boxed{6",
    "\\boxed{3}, but rechecking, the answer is \\boxed ", "\\boxed{3} then \\boxed\n", "\\fbox{5} \\boxed\n",
    "I got \\boxed{3}, but rechecking, the answer is \\boxed $4$.", "\\boxed{3} and {\\boxed}",
])
def test_p04_no_box_or_a_last_box_not_closed(text):
    """A box that is not closed, or a last box command with no argument (a response cut after it), is no answer:
    the earlier box is not read instead."""
    assert last_boxed_only_string(text) is None
    assert compute_score(text, "3") == 0.0 and compute_score(text, "5") == 0.0


def test_p04_strict_format_counts_boxes_only():
    assert single_final_answer("The answer is $\\boxed{5}$. \\fboxsep=2pt", "boxed")
    assert not single_final_answer(PROSE, "boxed") and single_final_answer("$\\boxed5$.", "boxed")
    assert not single_final_answer("\\boxed{3} or \\boxed7", "boxed")
    assert not single_final_answer("\\boxed{5} \\fboxsep" + "x" * 80, "boxed")  # the tail after the box counts
