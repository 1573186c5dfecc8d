"""Short answers that reached math-verify's ``simplify`` unbounded (case P28's kind: the scorer's time bound): powers
of trigonometric functions (``\\sin^{200}(x)``), powers of sums with ``e^{x}`` (``(e^{x}+1)^{150}``) and unbraced
chains of superscripts (``x^x^x^x^x^x^x^x^x^x^x^x``, whose parse alone took 0.5 s) each held a scoring call for its
whole 1 s limit. Now the chain counts as a tower (refused above ``MAX_TOWER``), the powers count in the simplify
estimate, and a pair above the estimate that is not a pair of rational functions is decided from its values at
random points (rewards/math_numeric.py)."""
import pytest

from rewards import math as M
from rewards.math import compute_score
from rewards.math_guards import tower_height
from rewards.math_numeric import numeric_verdict
from tests.scorer_time import scorer_cpu_ms

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
FAST_MS = 50.0
SLOW = ["\\sin^{200}(x)", "(\\sin x)^{200}", "\\cos(x)^{300}", "\\tan^{300}(x)", "(e^{x}+1)^{150}",
        "x^x^x^x^x^x^x^x^x^x^x^x", "\\sinh^{100}(x)+1"]


@pytest.mark.parametrize("answer", SLOW)
def test_p28_powers_of_functions_and_superscript_chains_score_0_quickly(answer):
    M.warm_math_verify()
    first = scorer_cpu_ms(compute_score, "\\boxed{" + answer + "}", "1")
    again = scorer_cpu_ms(compute_score, "\\boxed{" + answer + "}", "2")
    assert first[0] == 0.0 and first[1] < 500.0, (answer, first)  # the first value of a shape warms sympy's evalf
    assert again[0] == 0.0 and again[1] < FAST_MS, (answer, again)


@pytest.mark.parametrize("pred,gold", [
    ("(\\sin x)^{200}", "\\sin^{200}(x)"), ("\\sin^{200}(x)\\cos^{200}(x)", "\\frac{\\sin^{200}(2x)}{2^{200}}"),
    ("(e^{x}+1)^{150}", "(1+e^{x})^{150}"), ("\\cos(x)^{300}", "\\cos^{300}(x)"),
])
def test_p28_the_same_heavy_answer_written_otherwise_still_scores_1(pred, gold):
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 1.0, (a, b)


def test_p28_a_chain_of_superscripts_stacks_as_a_tower():
    assert [tower_height(s) for s in ("x^x", "x^x^x", "x^x^x^x", "x ^ x ^ x ^ x", "x^{x^x^x}", "x^2+y^2",
                                      "a^{b}c^{d}", "x^\\alpha^\\beta")] == [1, 2, 3, 3, 3, 1, 1, 2]
    assert compute_score("\\boxed{x^x^x}", "x^{x^{x}}") == 1.0  # two high: still compared


def test_numeric_verdict_decides_from_values_and_leaves_what_has_none():
    parse = lambda s: M._parse_latex(s)[0]  # noqa: E731
    assert numeric_verdict(parse("\\sin^{2}(x)+\\cos^{2}(x)"), parse("1")) is True
    assert numeric_verdict(parse("(\\pi+10^{-20})(x+1)^{150}"), parse("\\pi(x+1)^{150}")) is False
    assert numeric_verdict(parse("\\log(4)y"), parse("2\\log(2)y")) is True
    assert numeric_verdict(parse("f(x)"), parse("f(x)")) is None  # an undefined function has no value
