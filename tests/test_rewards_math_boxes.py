"""Which box is the answer (case P04): a command whose name merely starts with ``\\fbox``/``\\boxed``
(``\\fboxsep``, ``\\fboxrule``, ``\\boxedx``) or a ``\\boxed`` with no argument is no box, and the search goes on to
the box before it; whatever TeX would box after the last ``\\boxed`` is the answer, never an earlier box; ``\\boxed5`` is ``\\boxed{5}`` (a digit cannot be part of a command name), in a response and as a
ground truth alike."""
import pytest

from rewards import math as M
from rewards.format_reward import single_final_answer
from rewards.math import compute_score, last_boxed_only_string, remove_boxed
from rewards.registry import get_scorer

PROSE = "The answer is $\\boxed{5}$.\n\nI put the final answer in \\boxed as requested."


@pytest.mark.parametrize("text", [
    "The answer is $\\boxed{5}$. \\fboxsep=2pt", "\\boxed{5}\\boxedx", "\\boxed{5}\\fboxrule=1pt",
    "\\boxed{5} as \\boxed.", "\\boxed{5}, shown with \\boxed, is final.", "\\fbox{5} \\boxed\n",
    "\\boxed{5} then \\boxed , \\fboxsep and \\boxedx",
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
    ("Initially \\boxed{4}. Final: \\boxed IV", "IV"), (PROSE, "as"),
])
def test_p04_token_forms_are_boxes(text, answer):
    """A later box TeX would typeset is the answer, never an earlier, superseded one."""
    assert remove_boxed(last_boxed_only_string(text)) == answer


def test_p04_boxed_digit_scores_as_a_response_and_as_a_ground_truth():
    assert compute_score("\\boxed5", "5") == 1.0 and compute_score("$\\boxed5$", "5") == 1.0
    assert compute_score("\\boxed{5}", "\\boxed5") == 1.0 and compute_score("\\boxed{6}", "\\boxed5") == 0.0
    assert M.gold_answer("so it is $\\boxed5$.") == "5" and remove_boxed("\\boxed5") == "5"
    assert get_scorer("format_boxed")("$\\boxed5$", "5")["acc"] == 1.0


@pytest.mark.parametrize("text", [
    "I use \\fboxsep here", "\\boxedx", "\\boxed.", "\\boxed{3", "so \\boxed{5} and \\boxed",
    "\\boxed{5} and \\boxed{6",
])
def test_p04_no_box_or_a_last_box_not_closed(text):
    assert last_boxed_only_string(text) is None  # a box that is not closed (a cut response) is not passed over


def test_p04_strict_format_counts_boxes_only():
    assert single_final_answer("The answer is $\\boxed{5}$. \\fboxsep=2pt", "boxed")
    assert not single_final_answer(PROSE, "boxed") and single_final_answer("$\\boxed5$.", "boxed")
    assert not single_final_answer("\\boxed{3} or \\boxed7", "boxed")
    assert not single_final_answer("\\boxed{5} \\fboxsep" + "x" * 80, "boxed")  # the tail after the box counts
