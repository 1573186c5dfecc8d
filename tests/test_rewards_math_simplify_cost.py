"""The MATH scorer decides fast the answers whose comparison would make sympy's ``simplify`` expand a huge polynomial
(case P28): products of powers of sums, powers of sums of several variables against a gold with many terms of its
own, symbolic binomials, big denominators against a wrong gold. Each answer is small enough to pass
``rewards.math_tame.is_tame``; the pair is what is too slow, so ``rewards.math_expand`` decides it without
``simplify`` when both sides are rational functions (exactly, at random points). Equal forms of such answers still
match, a wrong answer is refused whatever its coefficients, and every other pair is still compared by math-verify.
"""
import itertools
import time

import pytest
from sympy.core.cache import clear_cache

from rewards import math as M
from rewards.math import compute_score
from rewards.math_expand import (MAX_SIMPLIFY_UNITS, fast_verdict, rational_verdict, simplify_too_slow,
                                 simplify_units)
from tests.math500 import math500_rows, needs_math500
from tests.scorer_time import scorer_cpu_ms

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
FAST_MS = 50.0

# answer, wrong golds: each pair held a scoring call for its whole 1 s limit (or most of it) before
SLOW_PAIRS = [
    ("(x+1)^{100}(x+2)^{100}(x+3)^{100}", ("1", "2", "(x+1)^{100}(x+2)^{100}(x+4)^{100}")),
    ("(x+y+z)^{23}", ("1", "(x+y+z)^{22}")),
    ("\\binom{x}{50}\\binom{y}{50}", ("1", "\\binom{x}{50}\\binom{y}{49}", "\\frac{x}{y}")),
    ("\\frac{1}{(1-x)^{101}}", ("1", "2", "(1-x)^{101}", "\\frac{1}{(1+x)^{101}}")),
    # coefficients that differ by a multiple of 2^61 - 1, or a product with a quadratic: exact values tell them apart
    ("2^{61}(x^2-1)^{150}", ("(x-1)^{150}(x+1)^{150}",)), ("(x+2305843009213693952)^{150}", ("(x+1)^{150}",)),
    ("2^{61}\\binom{x}{50}", ("\\binom{x}{50}",)), ("2305843009213693951(x+1)^{250}", ("0",)),
    ("(x+1)^{150}(x^2-1171281765473759160x+558528551497523995)", ("(x+1)^{150}",)),
]


def _cold_cpu_ms(pred, gold):
    """Score and CPU milliseconds of a comparison with sympy's cache cleared (as for an answer not seen before; a
    repeated pair reuses the expansions that the cache keeps), the parser having seen the shape once."""
    compute_score("\\boxed{" + pred + "}", gold)
    clear_cache()
    return scorer_cpu_ms(compute_score, "\\boxed{" + pred + "}", gold)


@pytest.mark.parametrize("pred,gold", [(p, g) for p, golds in SLOW_PAIRS for g in golds])
def test_answers_whose_simplify_expands_too_far_are_decided_within_50ms(pred, gold):
    compute_score("\\boxed{\\frac{1}{2}}", "0.5")  # math-verify imported and warm
    for a, b in ((pred, gold), (gold, pred)):
        score, ms = _cold_cpu_ms(a, b)
        assert score == 0.0, (a, b)
        assert ms < FAST_MS, (a, b, ms)


EQUAL_FORMS = [
    ("(x+1)^{100}(x+2)^{100}(x+3)^{100}", "(3+x)^{100}(1+x)^{100}(2+x)^{100}"),
    ("(x+y+z)^{23}", "(x+y+z)^{22}(z+y+x)"), ("\\binom{x}{50}\\binom{y}{50}", "\\binom{y}{50}\\binom{x}{50}"),
    ("\\frac{1}{(1-x)^{101}}", "(1-x)^{-101}"), ("\\frac{1}{(1-x)^{101}}", "-\\frac{1}{(x-1)^{101}}"),
    ("(x^2-1)^{50}", "(x-1)^{50}(x+1)^{50}"), ("(x^2-y^2)^{15}", "(x-y)^{15}(x+y)^{15}"),
    ("\\frac{1}{(1-x)^{40}}", "\\frac{(1+x)^{40}}{(1-x^2)^{40}}"),
    ("\\frac{(x^2-1)^{150}}{2^{61}-1}", "\\frac{(x-1)^{150}(x+1)^{150}}{2^{61}-1}"),
    # terms that are the same on both sides cancel before simplify: what is left is small
    ("\\frac{1}{(1-x)^{101}}", "\\frac{1}{(1-x)^{101}}+\\sin^2 x+\\cos^2 x-1"),
]


@pytest.mark.parametrize("pred,gold", EQUAL_FORMS)
def test_equal_forms_of_such_answers_still_match_fast(pred, gold):
    compute_score("\\boxed{\\frac{1}{2}}", "0.5")
    for a, b in ((pred, gold), (gold, pred)):
        score, ms = _cold_cpu_ms(a, b)
        assert score == 1.0, (a, b)
        assert ms < FAST_MS, (a, b, ms)


@pytest.mark.parametrize("pred,gold", [
    ("(x+1)^{101}", "(x+1)^{101}"), ("(x+1)^{101}", "(1+x)^{101}"), ("(x+1)^5(x-1)^3", "(x-1)^3(x+1)^5"),
    ("(a+b)^{10}", "(b+a)^{10}"), ("\\binom{2024}{2}", "2047276"), ("x^{100}y^{100}", "(xy)^{100}"),
    ("(1+1/10000)^{10000}", "\\left(\\frac{10001}{10000}\\right)^{10000}"), ("2^{2^{2^{2}}}", "65536"),
    ("(x+1)^2", "x^2+2x+1"), ("x^2+2x+1", "(x+1)^2"), ("\\binom{n}{25}", "\\binom{n}{25}\\cdot 1"),
])
def test_ordinary_answers_still_match_and_a_wrong_gold_stays_with_math_verify(pred, gold):
    compute_score("\\boxed{" + pred + "}", gold)
    assert compute_score("\\boxed{" + pred + "}", gold) == 1.0
    assert compute_score("\\boxed{" + gold + "}", pred) == 1.0
    assert compute_score("\\boxed{" + pred + "}", pred) == 1.0
    two = M._parse_latex("2")[0]
    assert not any(simplify_too_slow(two, p) for p in M._parse_latex(pred))


def test_the_units_follow_the_expansion():
    two = M._parse_latex("2")[0]

    def units(s, gold=two):
        return simplify_units(M._parse_latex(gold)[0] if isinstance(gold, str) else gold, M._parse_latex(s)[0])

    # terms multiply across a product and add across the pair; a power of t addends has C(e + t - 1, t - 1)
    assert units("(x+1)^{100}(x+2)^{100}(x+3)^{100}") > 10 ** 6
    assert 300 < units("(x+y+z)^{23}") < 400 and units("(x+y+z)^{15}", "(x+y+z)^{14}") > MAX_SIMPLIFY_UNITS
    assert units("(x+1)^{101}") < MAX_SIMPLIFY_UNITS < units("(x+1)^{200}")
    # a denominator multiplies: 1/(1-x)^40 costs more than (x+1)^{101}
    assert units("\\frac{1}{(1-x)^{40}}") > MAX_SIMPLIFY_UNITS > units("\\frac{1}{(1-x)^{20}}")
    # a binomial of a variable is a polynomial of its degree, weighted for combsimp
    assert units("\\binom{x}{50}") > MAX_SIMPLIFY_UNITS > units("\\binom{x}{20}")
    assert units("\\binom{x}{50}\\binom{y}{50}") > 10 ** 4
    # monomials and symbolic exponents do not expand
    assert units("x^{100}y^{100}") < 5 and units("(x+1)^{n}") < 10
    x, ab = M._parse_latex("(x+1)^{100}(x+2)^{100}")[0], M._parse_latex("ab")[0]
    assert simplify_too_slow(x, two) and not simplify_too_slow(M._parse_latex("x")[0], x)  # a symbol: by name
    assert not simplify_too_slow(ab, ab)


POOL = ["(x+1)^2", "x^2+2x+1", "\\frac{x^2-1}{x-1}", "x+1", "\\frac{x+1}{x}", "\\frac{1}{x}+1", "\\binom{x}{2}",
        "\\frac{x(x-1)}{2}", "\\frac{x}{x}", "1", "x-x", "0", "2^{-1}x", "\\frac{x}{2}", "(x-1)^{3}", "-(1-x)^{3}",
        "(x-1)^{-2}", "\\frac{1}{x^2-2x+1}", "xy", "x y^{-1}", "\\frac{x}{y}", "\\binom{n}{3}",
        "\\frac{n(n-1)(n-2)}{6}", "\\frac{1}{1-x}", "-\\frac{1}{x-1}", "\\frac{2}{4}", "0.5", "0.5x", "\\sqrt{x}",
        "k!", "\\pi x", "\\frac{x}{2}\\pi", "(\\sqrt{x})^2", "\\sqrt{x}\\sqrt{x}", "\\sqrt{x^2}", "|x|", "0.333333x",
        "\\sin^2 x+\\cos^2 x", "e^{x}e^{-x}", "\\sqrt{2}+x", "x+1.4142136"]


def test_the_rational_verdict_is_math_verifys_wherever_it_decides():
    verify = M.load_math_verify()[1]
    parsed = {s: M._parse_latex(s)[0] for s in POOL}
    decided = 0
    for a, b in itertools.product(POOL, POOL):
        g, p = parsed[a], parsed[b]
        verdict = rational_verdict(g, p)
        if verdict is not None:  # rational functions: both ways
            decided += 1
            assert verdict == verify([g], [p], timeout_seconds=None), (a, b)
    assert decided > 500
    # floats, roots, constants, functions and factorials are not rational functions: left undecided
    for s in ("0.5x", "\\sqrt{x}", "k!", "\\pi x", "e^{x}e^{-x}", "|x|", "\\sin^2 x+\\cos^2 x"):
        assert rational_verdict(parsed[s], parsed[s]) is None


def test_poles_and_values_too_large_are_left_undecided_fast():
    from sympy import Add, Pow, Symbol, binomial
    x = Symbol("x")
    assert rational_verdict(Pow(Add(x, -x, evaluate=False), -1, evaluate=False), x) is None  # a pole at every point
    t0 = time.process_time()
    assert rational_verdict((x + 1) ** 5000, (x + 1) ** 4999) is None  # 200,000 bits: past the bound
    assert rational_verdict(((x + 1) ** 1500 + 1) ** 3, 1) is None
    assert rational_verdict(binomial(x, 2000) * binomial(x, 2000), 1) is None
    assert (time.process_time() - t0) * 1e3 < FAST_MS


# answers equal to the gold in shapes that rational_verdict does not read: left to math-verify, as any other pair,
# however long its simplify is estimated to take (each is above the estimate; math-verify decides them within 1 s;
# their values at random points agree, so rewards/math_numeric.py shows no difference)
OTHER_SHAPES = [
    ("(x^2-1)^{70}, 2", "\\left((x-1)^{70}(x+1)^{70}, 2\\right)"), ("y+z = (x^2-1)^{50}", "(x-1)^{50}(x+1)^{50} = y+z"),
    ("y < (x^2-1)^{70}", "(x-1)^{70}(x+1)^{70} > y"), ("\\sin((x^2-1)^{30})", "\\sin((x-1)^{30}(x+1)^{30})"),
    ("e^{x+1}(x^2-1)^{70}", "e\\cdot e^{x}(x-1)^{70}(x+1)^{70}"),
    ("\\log(4)(x^2-1)^{70}", "2\\log(2)(x-1)^{70}(x+1)^{70}"),
    ("(1+\\sqrt{2})^{2}(x^2-1)^{70}", "(3+2\\sqrt{2})(x-1)^{70}(x+1)^{70}"),
]


@pytest.mark.parametrize("pred,gold", OTHER_SHAPES)
def test_other_shapes_above_the_estimate_go_to_math_verify(pred, gold):
    g, p = M._parse_latex(gold)[0], M._parse_latex(pred)[0]
    assert simplify_too_slow(g, p) and fast_verdict(g, p) is None
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 1.0, (a, b)


@pytest.mark.parametrize("pred,gold", [
    ("(\\pi+10^{-20})(x+1)^{150}-\\pi(x+1)^{150}", "0"), ("2+(\\pi+10^{-20})(x+1)^{150}-\\pi(x+1)^{150}", "2"),
])
def test_a_difference_below_15_digits_is_not_taken_for_zero(pred, gold):
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 0.0, (a, b)




@needs_math500
def test_no_pair_of_math500_answers_is_too_slow_to_simplify():
    answers = sorted({r["answer"] for r in math500_rows()})
    parsed = [p for a in answers if len(a) <= M.MAX_ANSWER_CHARS for p in M._parse_latex(M.collapse_braces(a))]
    worst = max(simplify_units(g, p) for g in parsed for p in parsed)
    assert worst < MAX_SIMPLIFY_UNITS / 4, worst
