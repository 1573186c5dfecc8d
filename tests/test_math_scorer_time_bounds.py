"""Short answers that held a MATH scoring call for its whole 1 s limit (case P28's kind: the scorer bounds its own
time): powers of sums of roots and constants, which sympy expands term by term (``(1+\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+
\\sqrt{7})^{60}``; ``(1+\\pi+e)^{100}``), their floor or ceiling near an integer (``\\lceil (1+\\sqrt{2})^{9000}
\\rceil``), such powers inside tuples and sets, and ``\\gcd`` / ``\\lcm`` of huge arguments, which the parser itself
computes (``\\gcd(2^{300000}-1, 3^{200000}-1)``). Each now scores 0 within a few milliseconds; the same kinds of
answers, when equal to the gold, still score 1.
"""
import pytest
from sympy import I, Pow
from sympy.core.cache import clear_cache

from rewards import math as M
from rewards.math import compute_score
from rewards.math_arguments import MAX_ARGUMENT_DIGITS, argument_digits, integer_arguments_ok
from rewards.math_expand import container_verdict, fast_verdict, simplify_units
from rewards.math_guards import structure_ok
from rewards.math_tame import holds_irrational, is_tame
from tests.scorer_time import scorer_cpu_ms

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
BOUND_MS = 200.0  # generous: each takes under 50 ms on an idle core; before, each took 0.2 s to the whole 1 s limit

RADICAL_POWERS = [
    "(1+\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{7})^{60}", "(1+\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{7})^{20}",
    "\\left(1+\\sqrt{2}+\\sqrt{3}+\\sqrt{5}\\right)^{40}", "(1+\\sqrt{2}+\\sqrt{3})^{100}", "(1+\\sqrt{2})^{1000}",
    "(\\sqrt{2}+\\sqrt{3})^{1000}", "(1+\\sqrt{2}+\\sqrt{3})^{30}(1+\\sqrt{5}+\\sqrt{7})^{30}",
    "(\\sqrt{2+\\sqrt{3}}+\\sqrt{5})^{150}", "(1+\\sqrt[3]{2}+\\sqrt[3]{4})^{120}", "(1+\\pi+e)^{100}",
    "(1+\\sqrt{2}+\\pi)^{60}", "(\\pi+1)^{250}", "\\frac{1}{(1+\\sqrt{2}+\\sqrt{3})^{40}}",
    "(x+\\sqrt{2})^{150}", "(a+b\\sqrt{c})^{100}", "(\\sqrt{x+1}+1)^{60}", "(1+\\sqrt{2})^{60}+(1-\\sqrt{2})^{60}",
]
INTEGER_FUNCTIONS = [
    "\\gcd(2^{300000}-1, 3^{200000}-1)", "\\operatorname{lcm}(2^{300000}-1, 3^{200000}-1)",
    "\\operatorname{gcd}(2^{300000}-1, 3^{200000}-1)", "\\lcm(2^{300000}, 3^{200000})", "\\gcd(2^{2^{20}}, 3)",
    "\\gcd\\left(2^{300000}, 3\\right)", "\\gcd((2^{1000})^{1000}, 6)", "\\gcd(2^{n+3000000}, 4)",
    "\\operatorname{gcd}(x^{100000}-1, x^{99999}-1)", "\\gcd(100000!, 3)",
    "\\lceil (1+\\sqrt{2})^{9000} \\rceil", "\\lceil (1+\\sqrt{2})^{250} \\rceil",
    "\\lfloor (2+\\sqrt{3})^{300} \\rfloor",
    "\\lfloor (1+\\sqrt{2})^{100}+(1-\\sqrt{2})^{100} \\rfloor",
    # already bounded (is_tame), kept here as the same kind: huge values under integer-valued functions
    "\\max(2^{300000}, 3^{200000})", "\\min(2^{9999}, 3^{6000})", "\\lfloor 2^{300000}/3 \\rfloor",
    "\\lfloor \\frac{2^{9999}}{3} \\rfloor", "\\lfloor 10^{9999}\\sqrt{2} \\rfloor", "\\lfloor \\pi^{9000} \\rfloor",
    "2^{300000} \\bmod 7", "(3^{9000}+1) \\bmod (2^{9000}+1)", "(1+\\sqrt{2})^{250} \\bmod 7",
    # multivariate gcd / lcm: far dearer per degree than a univariate one (1.4 s for the first)
    "\\gcd((x+y+z)^{15}-1, (x+y+z+1)^{15}-1)", "\\gcd((x+y)^{40}-1, (x+y+1)^{40}-1)",
    "\\operatorname{lcm}((x+y+z)^{12}+1, (x+2y+z)^{12}+1)",
]
CONTAINERS = [
    ("\\left((1+\\sqrt{2})^{250}, 1\\right)", "(5, 1)"), ("\\left((1+\\pi)^{100}, 1\\right)", "(5, 1)"),
    ("\\{(1+\\sqrt{2}+\\sqrt{3})^{20}, 1\\}", "\\{5, 1\\}"), ("\\left((x+\\sqrt{2})^{100}, 1\\right)", "(5, 1)"),
    ("\\left((x+1)^{250}, 1\\right)", "(5, 1)"), ("(1+\\sqrt{2})^{250}", "\\{5\\}"),
]


def _cold_cpu_ms(pred, gold, warm_gold):
    """Score and CPU milliseconds of a comparison with sympy's cache cleared (as for an answer not seen before), the
    parser having seen the answer once (against ``warm_gold``)."""
    compute_score("\\boxed{" + pred + "}", warm_gold)
    clear_cache()
    return scorer_cpu_ms(compute_score, "\\boxed{" + pred + "}", gold)


@pytest.mark.parametrize("answer", RADICAL_POWERS)
def test_p28_powers_of_sums_of_roots_and_constants_score_0_fast(answer):
    M.warm_math_verify()
    score, ms = _cold_cpu_ms(answer, "6", "5")
    assert score == 0.0 and ms < BOUND_MS, (answer, ms)


@pytest.mark.parametrize("answer", INTEGER_FUNCTIONS)
def test_p28_integer_functions_of_huge_arguments_score_0_fast(answer):
    M.warm_math_verify()
    first = scorer_cpu_ms(compute_score, "\\boxed{" + answer + "}", "5")  # gcd / lcm: the parse is the cost
    clear_cache()
    again = scorer_cpu_ms(compute_score, "\\boxed{" + answer + "}", "6")
    assert first[0] == again[0] == 0.0, answer
    assert again[1] < BOUND_MS, (answer, again[1])
    if "gcd" in answer or "lcm" in answer:
        assert first[1] < BOUND_MS, (answer, first[1])


@pytest.mark.parametrize("pred,gold", CONTAINERS)
def test_p28_such_powers_inside_tuples_and_sets_score_0_fast(pred, gold):
    M.warm_math_verify()
    score, ms = _cold_cpu_ms(pred, gold, gold.replace("5", "7"))
    assert score == 0.0 and ms < BOUND_MS, (pred, ms)


EQUAL = [
    ("(1+\\sqrt{2})^{2}", "3+2\\sqrt{2}"), ("(\\sqrt{2}+\\sqrt{3})^{2}", "5+2\\sqrt{6}"),
    ("(1+\\sqrt{2})^{10}", "3363+2378\\sqrt{2}"), ("(2+\\sqrt{3})^{4}", "97+56\\sqrt{3}"),
    ("(1+\\sqrt{2}+\\sqrt{3})^{2}", "6+2\\sqrt{2}+2\\sqrt{3}+2\\sqrt{6}"), ("(1+\\sqrt{5})^{5}", "176+80\\sqrt{5}"),
    ("\\left(\\frac{1+\\sqrt{5}}{2}\\right)^{10}", "\\frac{123+55\\sqrt{5}}{2}"),
    ("(1+\\sqrt{2})^{40}", "1023286908188737+723573111879672\\sqrt{2}"),
    ("(1+\\sqrt{2})^{20}+(1-\\sqrt{2})^{20}", "45239074"), ("\\frac{1}{(1+\\sqrt{2})^{2}}", "3-2\\sqrt{2}"),
    ("(\\sqrt{2}+\\sqrt{3})^{30}(\\sqrt{3}-\\sqrt{2})^{30}", "1"), ("(1+\\sqrt{2})^{250}", "(\\sqrt{2}+1)^{250}"),
    ("\\lfloor (2+\\sqrt{3})^{4} \\rfloor", "193"), ("\\lceil (1+\\sqrt{2})^{6} \\rceil", "198"),
    ("(x+1)^{2}", "x^2+2x+1"), ("(x+\\sqrt{2})^{2}", "x^2+2\\sqrt{2}x+2"),
    ("(a+b\\sqrt{c})^{2}", "a^2+2ab\\sqrt{c}+cb^{2}"),
    ("\\gcd(12, 18)", "6"), ("\\operatorname{lcm}(4, 6)", "12"), ("\\gcd(2^{10}, 6^{3})", "8"),
    ("\\gcd(2^{1000}-1, 2^{600}-1)", "2^{200}-1"), ("\\gcd(x^2-1, x-1)", "x-1"), ("\\max(2^{10}, 3^{6})", "1024"),
    ("\\gcd(x^{200}-1, x^{120}-1)", "x^{40}-1"), ("\\gcd(x^{301}, x^{2})", "x^{2}"), ("\\gcd(x^2y, xy^2)", "xy"),
    ("\\left((1+\\sqrt{2})^{2}, 1\\right)", "(3+2\\sqrt{2}, 1)"),
    ("\\{(1+\\sqrt{2})^{2}, 1\\}", "\\{1, 3+2\\sqrt{2}\\}"),
    ("(3+4\\sqrt{-1})^{3}", "-117+44\\sqrt{-1}"),
]


@pytest.mark.parametrize("pred,gold", EQUAL)
def test_p28_equal_answers_of_these_kinds_still_score_1(pred, gold):
    for a, b in ((pred, gold), (gold, pred)):
        assert compute_score("\\boxed{" + a + "}", b) == 1.0, (a, b)


def test_p28_gcd_and_lcm_arguments_rule():
    for s in ("\\gcd(12, 18)", "\\operatorname{lcm}(4, 6)", "\\gcd(2^{1000}-1, 2^{600}-1)", "\\gcd(x^2-1, x-1)",
              "\\gcd(2^{n}, 4)", "\\gcd(x_{1}^{2}, x_{1})", "\\lcm\\left(\\frac{1}{2}, 3\\right)",
              "\\gcd(a, b) + 2^{50000}"):
        assert integer_arguments_ok(s) and structure_ok(s), s
    for s in ("\\gcd(2^{300000}-1, 3^{200000}-1)", "\\operatorname{lcm}(2^{2^{20}}, 3)", "\\gcd(x^{100000}-1, x-1)",
              "\\gcd(100!, 3)", "\\gcd(2^{n+300000}, 4)", "\\gcd(\\binom{100}{50}, 3)", "\\lcm 2^{100000}, 3",
              "\\gcd(x_{1}^{1000}, 2)"):
        assert not integer_arguments_ok(s) and not structure_ok(s), s
    assert argument_digits("2^{3000}-1, 3^{2000}-1") < MAX_ARGUMENT_DIGITS < argument_digits("x^{700}-1, x^{699}-1")
    assert integer_arguments_ok("\\gcd(x^{300}-1, x^{299}-1)") and not integer_arguments_ok("\\gcd(x^{700}, 2)")
    assert not integer_arguments_ok("\\gcd((x+y)^{20}, 2)") and integer_arguments_ok("\\gcd(x^{2}y, xy^{2})")
    assert not integer_arguments_ok("\\gcd((xy+1)^{20}, 2)")  # letters side by side are two variables too
    assert argument_digits("\\sum_{n=1}^{5} n") == float("inf")


def test_p28_powers_of_irrational_sums_are_measured_like_polynomials():
    parse = lambda s: M._parse_latex(s)[0]  # noqa: E731
    assert [holds_irrational(parse(s)) for s in ("\\frac{1}{2}", "0.5", "1+\\sqrt{2}", "\\pi", "\\log 2")] == \
        [False, False, True, True, True]
    assert not holds_irrational(3 + 4 * I) and is_tame(Pow(3 + 4 * I, 500, evaluate=False))  # computed by squaring
    for s in ("(1+\\sqrt{2})^{300}", "(1+\\pi+e)^{30}", "((1+\\sqrt{2})^{20})^{20}",
              "\\lfloor (2+\\sqrt{3})^{50} \\rfloor"):
        assert not is_tame(parse(s)), s
    for s in ("(1+\\sqrt{2})^{299}", "(2\\sqrt{3})^{1000}", "\\lfloor (2+\\sqrt{3})^{40} \\rfloor",
              "\\lfloor 10^{9999}\\sqrt{2} \\rfloor", "(1+\\frac{1}{10000})^{10000}"):
        assert is_tame(parse(s)), s
    five = parse("5")
    assert simplify_units(five, parse("(1+\\sqrt{2}+\\sqrt{3})^{30}")) > 400  # 496 terms
    assert simplify_units(five, parse("(1+\\sqrt{2})^{2}")) < 20 and simplify_units(five, parse("\\sqrt{2}")) < 5


def test_p28_containers_are_different_only_when_an_element_matches_nothing():
    parse = lambda s: M._parse_latex(s)[0]  # noqa: E731
    assert container_verdict(parse("(5, 1)"), parse("\\left((1+\\pi)^{100}, 1\\right)")) is False
    assert container_verdict(parse("\\{1, 2\\}"), parse("\\{2, 1\\}")) is None  # every element matches one
    assert container_verdict(parse("(2, 1)"), parse("(1, 2)")) is None  # math-verify decides the order
    assert container_verdict(parse("\\{5\\}"), parse("(1+\\sqrt{2})^{250}")) is False
    assert container_verdict(parse("x+1"), parse("x+2")) is None  # not containers
    assert fast_verdict(parse("(5, 1)"), parse("\\left(0.5, 1\\right)")) is None  # decimals are never valued
