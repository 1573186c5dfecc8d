"""Answers that leave an operation for sympy to carry out (an integral, a limit, a derivative, a sum or product over
infinitely many or a variable number of terms) are not final answers (case P28): they match only the same text or
the same parsed expression, are never carried out, and take no more than a millisecond after a warm-up call, where
math-verify's ``Integral.doit`` and ``simplify`` held a scoring call for its whole time limit (or past it) on every
call. Ordinary answers and every MATH-500 answer are unaffected."""
import time

import pytest

from rewards import math as M
from rewards.math_tame import names_unevaluated, unevaluated
from rewards.registry import get_scorer
from tests.math500 import math500_rows, needs_math500

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
FAST_MS = 50.0

# each one took 0.3-1.5 s against "1" (the 1 s limit, one ran to 1.44 s; 30 s with timeout_seconds=30)
SLOW_INTEGRALS = ["\\int_0^1 x^{x} \\cos(x^{x}) \\sin(x) dx", "\\int_0^1\\int_0^1 \\sin(x^{y}) dx dy",
                  "\\int_0^1 \\sin(x^{x^{x}}) dx", "\\int_0^1 \\sin(x^{x}) dx", "\\int_0^1 x^{x^{x}} dx"]
# the same kind: 0.8 s to over 5 s against "1"
SLOW_OTHERS = ["\\sum_{n=1}^{\\infty} \\sin(n^{n})", "\\prod_{n=1}^{\\infty} (1+\\frac{1}{n^2})",
               "\\lim_{x\\to\\infty} x^{x^{x}}\\sin(x)", "\\frac{d}{dx} \\sin(x^{x})"]


def _call_ms(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, (time.perf_counter() - t0) * 1000


@pytest.mark.parametrize("answer", SLOW_INTEGRALS)
def test_p28_an_integral_scores_0_within_50ms_on_its_first_call(answer, monkeypatch):
    f = get_scorer("math")
    f("\\boxed{\\frac{x}{2}}", "x/2")  # warm-up
    parses = []
    real_parse = M._parse_latex
    monkeypatch.setattr(M, "_parse_latex", lambda s: parses.append(s) or real_parse(s))
    for gold in ("1", "\\frac{\\pi^2}{6}"):
        score, ms = _call_ms(f, "\\boxed{" + answer + "}", gold)
        assert score == 0.0 and ms < FAST_MS, (answer, gold, ms)
    # decided from its text, fresh answers too: math-verify never parses it (one parse of an integral took 50-120 ms)
    score, ms = _call_ms(f, "\\boxed{" + answer.replace("_0^1", "_0^{7}") + "}", "3")
    assert score == 0.0 and ms < FAST_MS and parses == [], (answer, ms, parses)


@pytest.mark.parametrize("answer", SLOW_OTHERS)
def test_p28_a_limit_derivative_or_unbounded_sum_scores_0_within_50ms_after_its_first_call(answer):
    f = get_scorer("math")
    golds = ("1", "\\frac{\\pi^2}{6}")
    for warm in ("\\boxed{" + answer + "}", "\\boxed{x}"):  # a shape's first parse may take longer (the parser's own)
        for gold in golds + ("2",):
            f(warm, gold)
    for gold in golds:
        score, ms = _call_ms(f, "\\boxed{" + answer + "}", gold)
        assert score == 0.0 and ms < FAST_MS, (answer, gold, ms)


@pytest.mark.parametrize("pred,gold", [
    ("\\int_0^{1} x^{2} dx", "\\frac{1}{3}"), ("\\sum_{n=1}^{\\infty} \\frac{1}{2^n}", "1"),
    ("\\lim_{x\\to 0} \\frac{\\sin x}{x}", "1"), ("\\frac{d}{dx} x^{2}", "2x"), ("\\sum_{k=1}^{n} k", "\\frac{n(n+1)}{2}"),
])
def test_p28_a_restated_question_is_not_its_answer(pred, gold):
    """Before, math-verify carried the operation out: the question written back in a box scored 1.0."""
    assert M.compute_score("\\boxed{" + pred + "}", gold) == 0.0
    assert M.compute_score("\\boxed{" + gold + "}", pred) == 0.0


@pytest.mark.parametrize("pred,gold", [
    ("\\int_0^1 x^2 dx", "\\int_0^1 x^2 dx"), ("\\int_0^1 x^2 \\, dx", "\\int_0^1 x^2 dx"),
    ("\\lim_{x\\to 0} \\frac{\\sin x}{x}", "\\lim_{x \\to 0} \\frac{\\sin x}{x}"),
    ("\\frac{d}{dx} x^2", "\\frac{d}{dx} x^{2}"), ("\\sum_{n=1}^{\\infty} \\frac{1}{2^n}", "\\sum_{n=1}^{\\infty}\\frac{1}{2^{n}}"),
])
def test_p28_an_unevaluated_answer_still_matches_the_same_expression(pred, gold):
    assert M.compute_score("\\boxed{" + pred + "}", gold) == 1.0


@pytest.mark.parametrize("pred,gold", [
    ("\\sum_{n=1}^{5} n", "15"), ("\\sum_{k=0}^{10} 2^{k}", "2047"), ("\\prod_{k=1}^{4} k", "24"),
    ("\\frac{1}{2}", "0.5"), ("\\sqrt{8}", "2\\sqrt{2}"), ("x^2+2x+1", "(x+1)^2"), ("\\left[ 0, 1 \\right)", "[0,1)"),
    ("\\lfloor 2.5 \\rfloor", "2"),
])
def test_p28_ordinary_answers_and_finite_sums_still_match(pred, gold):
    assert M.compute_score("\\boxed{" + pred + "}", gold) == 1.0


def test_p28_unevaluated_rule():
    for s in ("\\int x dx", "\\iint_D f", "\\oint_C f", "\\displaystyle\\int\\limits_0^1 x dx", "\\lim_{n\\to\\infty} a_n",
              "\\lim\\limits_{x\\to 0} x"):
        assert names_unevaluated(s), s
    for s in ("\\limits", "\\limsup", "\\interval", "x_{int}", "\\mathrm{lim}", "5", "[0, 1)"):
        assert not names_unevaluated(s), s
    parsed = {s: M._parse_latex(s)[0] for s in ("\\frac{d}{dx} x^{2}", "\\sum_{n=1}^{\\infty} \\frac{1}{n}",
                                                "\\sum_{k=1}^{n} k", "\\prod_{n=2}^{\\infty} n", "\\sum_{n=1}^{10} n",
                                                "\\prod_{k=1}^{4} k", "x^2+1")}
    assert [unevaluated(p) for p in parsed.values()] == [True, True, True, True, False, False, False]
    assert not unevaluated("\\int x dx") and not unevaluated(None)  # math-verify's text parse, not an expression
    for s in ("\\sum_{k=1}^{10^2} k", "\\sum_{k=1}^{2\\cdot 5} k", "\\sum_{k=0}^{-1+11} k", "\\prod_{k=1}^{2^2} k"):
        assert not unevaluated(M._parse_latex(s)[0]), s  # bounds written as arithmetic are numbers




@needs_math500
def test_p28_no_math500_answer_is_an_unevaluated_operation():
    answers = sorted({r["answer"] for r in math500_rows()})
    assert not [a for a in answers if names_unevaluated(a)]
    assert not [a for a in answers if len(a) <= M.MAX_ANSWER_CHARS and M.structure_ok(M.collapse_braces(a))
                and any(unevaluated(p) for p in M._parse_latex(M.collapse_braces(a)))]
