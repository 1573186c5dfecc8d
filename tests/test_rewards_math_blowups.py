"""The MATH scorer refuses, fast, short answers whose evaluation has no bound (case P28): towers of constants or
variables, binomials, Gamma, sums and products with big numbers, powers of sums that expand to huge polynomials.

Such an answer is no match, decided by the guards in ``rewards.math_guards`` (before parsing: the commands that the
parser itself evaluates, stacked superscripts) and ``rewards.math_tame`` (after parsing: sizes measured from the
parts); ordinary MATH answers of the same kinds still compare as before.
"""
import time

import pytest

from rewards import math as M
from rewards.math import compute_score
from rewards.math_guards import evaluated_commands_ok, structure_ok, time_bound, tower_height
from tests.math500 import math500_rows, needs_math500
from tests.scorer_time import scorer_cpu_ms

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
FAST_MS = 50.0

BLOWUPS = [
    "\\binom{100000}{50000}", "\\binom{1000000}{500000}", "\\dbinom{100000}{50000}", "{100000 \\choose 50000}",
    "\\binom{10^{6}}{5 \\cdot 10^{5}}", "\\binom{\\pi \\cdot 10^{6}}{500000}", "\\binom{x}{1000}", "\\binom{\\pi}{100}",
    "\\Gamma(3000000)", "e^{e^{e^{e^{e}}}}", "\\sqrt{e^{e^{e^{e}}}}", "\\sin(10^{10^{5}})", "x^{x^{x^{x}}}",
    "\\pi^{\\pi^{\\pi^{\\pi}}}", "\\sum_{n=1}^{10^{6}} \\frac{1}{n}", "\\sum_{n=1}^{10} n^{n^{n}}",
    "\\prod_{n=1}^{100000} n", "\\prod_{n=1}^{1000} n^{1000}", "(x+1)^{1000}", "10^{-10^{5}}",
    "\\det\\begin{pmatrix}a&b&c&d&e\\\\g&h&i&j&k\\\\m&n&o&p&q\\\\s&t&u&v&w\\\\z&A&B&C&D\\end{pmatrix}",
]


def _cpu_ms(text, gold, **kw):
    return scorer_cpu_ms(compute_score, text, gold, **kw)


@pytest.mark.parametrize("answer", BLOWUPS)
def test_p28_unbounded_answers_are_refused_within_50ms(answer):
    compute_score("\\boxed{\\frac{1}{2}}", "0.5")  # math-verify imported and warm
    first = _cpu_ms("\\boxed{" + answer + "}", "1")
    # the second call (another gold): the parser has seen this shape once; without the guards both reach the limit
    again = _cpu_ms("\\boxed{" + answer + "}", "2")
    assert first[0] == again[0] == 0.0
    # the first call's time is the parser's first sight of the shape (and whatever the process collects meanwhile:
    # 611 ms once in a long test process, 27 ms alone); the second is the guard's own cost
    assert again[1] < FAST_MS, (answer, first[1], again[1])


def test_p28_no_time_limit_needed_for_a_tower():
    t0 = time.process_time()
    with time_bound(30.0):  # without the guards the tower did not finish in 60 s: this test fails instead
        assert compute_score("\\boxed{e^{e^{e^{e^{e}}}}}", "1", timeout_seconds=None) == 0.0
        assert compute_score("\\boxed{\\sum_{n=1}^{10^{6}} \\frac{1}{n}}", "1", timeout_seconds=None) == 0.0
    assert time.process_time() - t0 < 2.0


@pytest.mark.parametrize("answer", BLOWUPS)
def test_p28_guards_refuse_before_or_after_parsing(answer):
    text = M.collapse_braces(answer)
    if structure_ok(text):
        with time_bound(5.0):  # the parser itself evaluates binomials and Gamma (uninterruptible, when big)
            parsed = M._parse_latex(text)
        assert not all(M.is_tame(p) for p in parsed), answer


@pytest.mark.parametrize("pred,gold", [
    ("\\binom{5}{2}", "10"), ("\\dbinom{10}{3}", "120"), ("\\binom{1000}{2}", "499500"),
    ("\\Gamma(5)", "24"), ("e^{2}", "e^2"), ("\\pi^2", "\\pi^{2}"), ("2^{2^{3}}", "256"), ("9^{9}", "387420489"),
    ("\\sum_{n=1}^{5} n", "15"), ("\\sum_{k=0}^{10} 2^{k}", "2047"), ("\\prod_{k=1}^{4} k", "24"),
    ("e^{-x^2}", "e^{-x^{2}}"), ("2^{2^{n}}+1", "1+2^{2^n}"),
    ("(x+1)^{2}", "x^2+2x+1"), ("\\binom{2n}{n}", "\\binom{2n}{n}"), ("x^{x^{x}}", "x^{x^{x}}"),
    ("100!", "\\Gamma(101)"), ("\\frac{1}{2^{100}}", "2^{-100}"),
])
def test_p28_ordinary_answers_of_the_same_kinds_still_match(pred, gold):
    compute_score("\\boxed{" + pred + "}", gold)  # a shape's first parse may take a loaded machine's whole time limit
    assert compute_score("\\boxed{" + pred + "}", gold) == 1.0


def test_p28_evaluated_commands_rule():
    for s in ("\\binom{5}{2}", "\\binom{2n}{n}", "\\binom{n}{k}", "\\binom{n+1}{2}", "\\Gamma(5)", "\\Gamma",
              "\\Gamma + 1", "\\tbinom{1000}{500}", "\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "{n \\choose 2}",
              "\\binom{1001}{2}", "{2000 \\choose 3}", "\\binom{x}{21}", "\\binom{10^{3}}{2}", "\\binom{2^5}{2}"):
        assert evaluated_commands_ok(s), s
    for s in ("\\binom{100000}{50000}", "\\binom{x}{51}", "\\binom{10^{4}}{2}", "\\binom{5!}{2}", "\\Gamma(1001)",
              "\\Gamma\\left(10^{7}\\right)", "{20000 \\choose 10000}", "\\binom{\\binom{9}{3}}{2}"):
        assert not evaluated_commands_ok(s), s
    assert [tower_height(s) for s in ("x", "x^2", "2^{2^{n}}", "9^{9^{9^{9}}}", "{x^{2}}^{3}")] == [0, 1, 2, 3, 1]




@needs_math500
def test_p28_every_math500_answer_passes_the_guards():
    rows = math500_rows()
    refused = []
    for row in rows:
        for answer in {row["answer"], M.gold_answer(row["solution"])}:
            text = M.collapse_braces(answer.strip())
            if len(text) <= M.MAX_ANSWER_CHARS and not (
                    structure_ok(text) and all(M.is_tame(p) for p in M._parse_latex(text))):
                refused.append(answer)
    assert refused == []
