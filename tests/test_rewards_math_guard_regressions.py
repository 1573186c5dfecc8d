"""The MATH scorer's guards refuse only what is slow: ordinary answers near the guards' limits still match.

Binomials with a big top and a small bottom, Gamma of a fraction, binomials of symbolic arguments, powers above 100
of sums or monomials in variables, values near 1 with big exponents, tiny exponents, and towers of small integer
literals all compare as equal to their other forms (both ways), while the answers whose evaluation has no bound
(``tests/test_rewards_math_blowups.py``) stay refused.
"""
import time

import pytest

from rewards import math as M
from rewards.math import compute_score
from rewards.math_guards import evaluated_commands_ok, structure_ok

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")

EQUAL = [
    ("\\binom{2024}{2}", "2047276"), ("\\binom{2003}{2}", "2005003"), ("\\binom{2007}{3}", "1345369035"),
    ("\\binom{1001}{2}", "500500"), ("\\binom{1500}{1}", "1500"),
    ("\\Gamma(1/2)", "\\sqrt{\\pi}"), ("\\Gamma(\\frac{1}{2})", "\\sqrt{\\pi}"),
    ("\\Gamma\\left(\\frac{1}{2}\\right)", "\\sqrt{\\pi}"),
    ("\\binom{n^2}{2}", "\\frac{n^2(n^2-1)}{2}"), ("\\binom{2^n}{2}", "2^{n-1}(2^n-1)"),
    ("\\binom{n_1}{2}", "\\frac{n_1(n_1-1)}{2}"), ("\\binom{n}{n/2}", "\\binom{n}{\\frac{n}{2}}"),
    ("\\binom{n}{\\lfloor n/2\\rfloor}", "\\binom{n}{\\left\\lfloor\\frac n2\\right\\rfloor}"),
    ("\\binom{n}{25}", "\\binom{n}{25}\\cdot 1"),
    ("(x+1)^{101}", "(1+x)^{101}"), ("(1+x)^{200}", "(x+1)^{200}"), ("(x^2+1)^{101}", "(1+x^2)^{101}"),
    ("(x-y)^{128}", "(-y+x)^{128}"), ("\\frac{1}{(1-x)^{101}}", "(1-x)^{-101}"), ("(2x)^{150}", "2^{150}x^{150}"),
    ("(2x)^{101}", "2^{101}x^{101}"), ("(-x)^{101}", "-x^{101}"), ("(xy)^{200}", "x^{200}y^{200}"),
    ("\\left(\\frac{x}{2}\\right)^{200}", "\\frac{x^{200}}{2^{200}}"), ("(\\sqrt{x})^{200}", "x^{100}"),
    ("(x^2)^{150}", "x^{300}"),
    ("1000\\left(1+\\frac{0.05}{365}\\right)^{3650}", "1000(1+0.05/365)^{3650}"),
    ("\\left(1+\\frac{1}{10000}\\right)^{10000}", "\\left(\\frac{10001}{10000}\\right)^{10000}"),
    ("\\left(\\frac{999}{1000}\\right)^{5000}", "\\left(0.999\\right)^{5000}"),
    ("x^{10^{-5}}", "x^{0.00001}"),
    ("2^{2^{2^{2}}}", "65536"), ("2^{2^{2^{1}}}", "16"),
    # a tower inside a group: the group's closing brace is not the tower's
    ("x^{2^{2^{2}}}", "x^{16}"), ("\\frac{1}{2^{2^{2^{2}}}}", "\\frac{1}{65536}"), ("\\frac{2^{2^{2^{2}}}}{2}", "32768"),
    ("\\sqrt{2^{2^{2^{2}}}}", "256"),
    # a small power of a number in a binomial's argument
    ("\\binom{2^5}{2}", "496"), ("\\binom{2^{5}}{2}", "496"), ("\\binom{3^2}{2}", "36"), ("\\binom{10}{2^{2}}", "210"),
]


@pytest.mark.parametrize("pred,gold", EQUAL)
def test_ordinary_answers_near_the_guards_match_both_ways(pred, gold):
    compute_score("\\boxed{" + pred + "}", gold)  # a shape's first parse may take a loaded machine's whole time limit
    assert compute_score("\\boxed{" + pred + "}", gold) == 1.0
    assert compute_score("\\boxed{" + gold + "}", pred) == 1.0


def test_a_tiny_exact_exponent_is_small():
    assert compute_score("\\boxed{2^{10^{-5}}}", "2^{0.00001}") == 1.0


def test_binomials_are_judged_by_their_value_and_symbolic_arguments_pass():
    for s in ("\\binom{2024}{2}", "\\binom{100000}{3}", "\\binom{100000}{99998}", "\\binom{1500}{1}",
              "\\binom{n^2}{2}", "\\binom{2^n}{2}", "\\binom{n_1}{2}", "\\binom{n}{n/2}", "\\binom{n}{25}",
              "\\binom{n}{\\lfloor n/2\\rfloor}", "\\Gamma(1/2)", "\\Gamma\\left(\\frac{1}{2}\\right)"):
        assert evaluated_commands_ok(s), s
    for s in ("\\binom{100000}{50000}", "\\binom{1000000}{500000}", "\\binom{40000}{20000}", "\\binom{n}{51}",
              "\\binom{10^{6}}{2}", "\\binom{2^{20}}{2}", "\\Gamma(\\frac{3000000}{2})", "\\binom{n!}{2}"):
        assert not evaluated_commands_ok(s), s


def test_towers_of_small_integer_literals_pass_big_or_symbolic_ones_do_not():
    for s in ("2^{2^{2^{2}}}", "2^{2^{2^{1}}}", "3^{3^{3^{1}}}+1", "2^{2^{2^{2}}}-x"):
        assert structure_ok(s), s
    for s in ("9^{9^{9^{9}}}", "2^{2^{2^{2^{2^{2}}}}}", "e^{e^{e^{e^{e}}}}", "x^{x^{x^{x}}}", "2^{2^{2^{n}}}",
              "2^{2^{2^{2}}}+x^{x^{x^{x}}}"):
        assert not structure_ok(s), s


def test_answers_measured_slow_are_refused_fast():
    # powers of sums that expand to more than 300 terms, binomials of more than 10^4 digits, exact rationals of
    # more than 10^5 digits and binomial(x, k) with k above 50 were measured slow
    compute_score("\\boxed{\\frac{1}{2}}", "0.5")
    for answer in ("(x+y+z+w)^{100}", "(x+y+z)^{50}", "(x+1)^{500}", "\\binom{40000}{20000}",
                   "\\left(\\frac{10001}{10000}\\right)^{20000}", "\\binom{x}{100}"):
        compute_score("\\boxed{" + answer + "}", "1")  # the parser has seen this shape once
        t0 = time.process_time()
        assert compute_score("\\boxed{" + answer + "}", "2") == 0.0
        assert (time.process_time() - t0) * 1e3 < 50.0, answer
