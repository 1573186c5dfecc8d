"""Short answers that reached math-verify's ``simplify`` unbounded (case P28's kind: the scorer's time bound): powers
of trigonometric functions (``\\sin^{200}(x)``), powers of sums with ``e^{x}`` (``(e^{x}+1)^{150}``) and unbraced
chains of superscripts (``x^x^x^x^x^x^x^x^x^x^x^x``, whose parse alone took 0.5 s) each held a scoring call for its
whole 1 s limit. Now the chain counts as a tower (refused above ``MAX_TOWER``), the powers count in the simplify
estimate, and a pair with a function applied (or above the estimate and not rational) is found different when its
values at random points prove it (rewards/math_numeric.py); equal values never make a pair equal there."""
import pytest

from rewards import math as M
from rewards.math import compute_score
from rewards.math_guards import tower_height
from rewards.math_numeric import numeric_differs
from tests.scorer_time import scorer_cpu_ms

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
FAST_MS = 50.0
SLOW = ["\\sin^{200}(x)", "(\\sin x)^{200}", "\\cos(x)^{300}", "\\tan^{300}(x)", "(e^{x}+1)^{150}",
        "x^x^x^x^x^x^x^x^x^x^x^x", "\\sinh^{100}(x)+1", "\\sin^{15}(x)\\cos^{15}(x)", "(\\sin x+\\cos x)^{20}",
        "(1+\\sin x)^{30}", "\\sin^{30}(2x)"]


@pytest.mark.parametrize("answer", SLOW)
def test_p28_powers_of_functions_and_superscript_chains_score_0_quickly(answer):
    M.warm_math_verify()
    first = scorer_cpu_ms(compute_score, "\\boxed{" + answer + "}", "1")
    again = scorer_cpu_ms(compute_score, "\\boxed{" + answer + "}", "2")
    assert first[0] == 0.0 and first[1] < 500.0, (answer, first)  # the first value of a shape warms sympy's evalf
    assert again[0] == 0.0 and again[1] < FAST_MS, (answer, again)


@pytest.mark.parametrize("pred,gold", [
    ("(\\sin x)^{200}", "\\sin^{200}(x)"), ("\\sin^{2}x+\\cos^{2}x", "1"),
    ("(e^{x}+1)^{150}", "(1+e^{x})^{150}"), ("\\cos(x)^{300}", "\\cos^{300}(x)"),
])
def test_p28_the_same_heavy_answer_written_otherwise_still_scores_1(pred, gold):
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 1.0, (a, b)


def test_p28_a_chain_of_superscripts_stacks_as_a_tower():
    assert [tower_height(s) for s in ("x^x", "x^x^x", "x^x^x^x", "x ^ x ^ x ^ x", "x^{x^x^x}", "x^2+y^2",
                                      "a^{b}c^{d}", "x^\\alpha^\\beta")] == [1, 2, 3, 3, 3, 1, 1, 2]
    assert compute_score("\\boxed{x^x^x}", "x^{x^{x}}") == 1.0  # two high: still compared


A, B = "\\sin^{40}(x)", "(1-\\cos^2(x))^{20}"  # equal, and above the estimate


@pytest.mark.parametrize("pred,gold", [
    (A + "+|x-1|", B + "+x-1"), (A + "+\\lfloor x\\rfloor", B + "+1"), (A + "+\\max(x,1)", B + "+x"),
    (A + "+\\frac{x}{|x|}", B + "+1"), (A + "+\\arctan(\\tan x)", B + "+x"), (A + "+10^{60}", B + "+10^{60}+1"),
    (A + "+2^{200}", B + "+2^{200}+1"), (A + "+e^{100x^2}", B + "+e^{100x^2}+1"),
    ("\\frac{" + A + "}{10^{60}}", "\\frac{" + B + "}{10^{59}}"), ("e^{-200x}" + A, "2e^{-200x}" + B),
    (A + "+\\pi", B + "+3.14159265358979323846264338327950288419716939937510582097494459"),
])
def test_p28_different_answers_that_agree_somewhere_or_nearly_are_never_found_equal_by_their_values(pred, gold):
    """Values at points in [1, 2), a tolerance relative to large values or absolute below 1, decimals: each of
    these different pairs once scored 1 through a verdict from values; values now only ever prove a difference."""
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 0.0, (a, b)


def test_numeric_differs_proves_differences_only():
    parse = lambda s: M._parse_latex(s)[0]  # noqa: E731
    assert numeric_differs(parse("\\sin^{200}(x)"), parse("1"))
    assert numeric_differs(parse("(\\pi+10^{-20})(x+1)^{150}"), parse("\\pi(x+1)^{150}"))
    assert numeric_differs(parse("\\frac{\\sin(x)}{10^{80}}"), parse("\\frac{\\sin(x)}{10^{79}}"))
    assert not numeric_differs(parse("\\sin^{2}(x)+\\cos^{2}(x)"), parse("1"))  # equal: no certain nonzero value
    assert not numeric_differs(parse("\\log(4)y"), parse("2\\log(2)y"))
    assert not numeric_differs(parse("f(x)"), parse("g(x)"))  # undefined functions have no value
    assert not numeric_differs(parse("\\pi"), parse("3.14"))  # decimals: the exact rule's


@pytest.mark.parametrize("pred,gold", [("x+\\frac{2^{60}+1}{2^{60}}", "x+1"), ("2x + \\frac{1}{10^{20}}", "2x"),
                                       ("x+1+\\frac{1}{2^{60}}", "x+1")])
def test_p28_rational_answers_differing_below_15_digits_are_different(pred, gold):
    """math-verify compares at 15 digits and took these for equal; a pair of rational functions is now decided
    exactly (rewards.math_expand.rational_verdict), whatever its size."""
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 0.0, (a, b)
    assert compute_score("\\boxed{\\frac{x^2-1}{x-1}}", "x+1") == 1.0


@pytest.mark.parametrize("pred,gold", [("navin", "\\text{Navin}"), ("East", "\\text{east}"), ("EVELYN", "\\text{Evelyn}"),
                                       ("a\\cdot b", "\\text{ab}"), ("\\text{ab}", "a\\cdot b"), ("\\mathit{ab}", "ab")])
def test_p28_a_word_answer_is_still_compared_by_name(pred, gold):
    """A single symbol (a word) against a product of letters: the exact rational check once valued both and scored
    these 0; such a pair is math-verify's, which compares by name."""
    assert compute_score("\\boxed{" + pred + "}", gold) == 1.0
