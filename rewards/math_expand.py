"""What sympy's ``simplify`` costs on a pair of parsed answers, and a cheap verdict for the pairs where it is too slow:
the comparison-time bound of :mod:`rewards.math_guards`, after :func:`rewards.math_tame.is_tame` has bounded each
answer alone.

math-verify decides that two symbolic answers differ only after ``simplify(gold - pred)``, whose ``cancel`` expands the
difference over a common denominator. Each answer can be small while that expansion is not: products of powers of
sums multiply their terms (``(x+1)^{100}(x+2)^{100}(x+3)^{100}``), a denominator is multiplied into every other term
and divided out again by a polynomial gcd (``\\frac{1}{(1-x)^{101}}`` against ``2``), ``combsimp`` factors a binomial
of a variable (``\\binom{x}{50}\\binom{y}{50}``), and the gold's terms add to the answer's (``(x+y+z)^{23}``, 300 terms,
against ``(x+y+z)^{22}``). These held a scoring call for 0.35 s (``(x+y+z)^{23}`` against ``1``) to its whole 1 s
limit, on every call.

:func:`simplify_units` estimates that work from the shapes of both answers, without expanding anything: with ``N`` and
``D`` the terms of the difference (both sides evaluated as sympy builds them, so that the terms they share cancel, as in
``simplify``) in its numerator and denominator once expanded over a common denominator (sums add, products multiply, a
power of a sum of ``t`` terms to ``e`` has ``C(e + t - 1, t - 1)``, a binomial or rising / falling factorial of a
variable with an integer ``k`` is a polynomial of degree ``k``; roots and constants count as variables there, since
sympy expands ``(1+\\sqrt{2}+\\sqrt{3})^{30}`` as it does ``(1+x+y)^{30}``), it is ``N + D + N * D / 5``, five times
that when such a binomial takes part, plus the same for the arguments of other functions. Measured (CPU time of
math-verify's comparison with sympy's cache cleared, median of 3, against ``2`` unless named, on a 2-core machine):

* polynomials: ``(x+1)^{200}`` (243 units) 0.18 s, ``(x+1)^{300}`` (363) 0.30 s, ``(x+y+z)^{20}`` (279) 0.30 s,
  ``(x+y+z)^{23}`` (362) 0.38 s, ``(x+y+z+w)^{8}`` (200) 0.22 s, ``(x+y+z+w)^{10}`` (345) 0.39 s,
  ``(x+1)^{17}(y+1)^{17}`` (391) 0.36 s, ``(x+y+z)^{10}`` against ``(x+y+z)^{9}`` (146) 0.16 s, ``(x+y+z)^{15}``
  against ``(x+y+z)^{14}`` (308) 0.40 s, ``(x+y+z)^{20}`` against ``(x+y+z)^{19}`` (530) 0.76 s; one variable
  collects terms as it goes, so products in it cost less than their units (``(x+1)^{100}(x+2)^{100}(x+3)^{100}``,
  1.2 million units, 2.4 s);
* quotients, ``\\frac{1}{(1-x)^{n}}``: ``n = 20`` (135 units) 0.10 s, 40 (427) 0.27 s, 60 (879) 0.59 s, 101
  (2,306) 1.6 s;
* binomials of a variable: ``\\binom{x}{30}`` (197) 0.17 s, ``\\binom{x}{50}`` (317) 0.33 s,
  ``\\binom{x}{10}\\binom{y}{10}`` (737) 0.43 s, ``\\binom{x}{20}\\binom{y}{20}`` (2,657) 3.8 s;
* irrational and decimal coefficients: ``\\sqrt{2}(x+1)^{100}`` against ``(x+1)^{100}`` (243) 0.20 s,
  ``\\sqrt{2}(x^2-1)^{50}`` against ``0.5(x^2-1)^{50}`` (123) 0.17 s, ``\\sqrt{2}(x^2-1)^{100}`` against
  ``0.5(x^2-1)^{100}`` (243) 0.42 s.

So 0.5 to 1.1 ms a unit up to 200 units with rational coefficients, up to 1.7 with irrational ones (and 1.5 to 2 above,
where it grows with the size): above ``MAX_SIMPLIFY_UNITS`` (200 units, at most about 0.35 s; no pair of MATH-500
answers reaches 40) a pair of rational functions is not given to ``simplify`` but decided by :func:`fast_verdict`. A
pair with a single symbol on one side is left to math-verify, which compares it by name without simplifying
(``\\text{ab}`` is ``ab``).

:func:`rational_verdict` decides a pair of rational functions (variables and rational numbers combined by sums,
products and integer powers; binomials and rising / falling factorials of them with an integer ``k``: all the answers
above) from their exact values (integers, no modulus) at two points drawn at random for each pair, each variable an
integer in ``[2^32, 2^40)`` (the same on both sides): values that differ prove the answers different; equal values at
both points make them equal. That is wrong only when both points are roots of the numerator of ``gold - pred``, a
nonzero polynomial of total degree ``d``: by the Schwartz-Zippel lemma (Schwartz, J. ACM 27(4), 1980; Zippel, 1979)
a random point is one with probability at most ``d / (2^40 - 2^32)``, so both are with probability at most
``(d / (2^40 - 2^32))^2``, under ``10^-17`` up to ``d = 3000`` (``(x+1)^{100}(x+2)^{100}(x+3)^{100}`` has 300), whatever
the answer: the points are drawn afresh
for every pair, so no answer can be built against them. A pole at a point (a denominator that is 0 there), or a
value past ``_MAX_BITS`` bits (one product of two such values takes about 1 ms) or ``_MAX_SPENT_BITS`` bits for the
whole pair, leaves the pair undecided. An expression pair above ``NUMERIC_FIRST_UNITS`` (a tenth of the estimate) that
this does not decide (functions, roots, logarithms, decimals, constants such as ``\\pi``, a pole), and any pair with a
function applied, is found different when its values at random points prove it
(:func:`rewards.math_numeric.numeric_differs`): irrational coefficients make ``simplify`` slower than rational ones
(``(x+\\sqrt{2})^{60}`` against ``6``, 75 units, took 0.12 s; ``(a+b\\sqrt{c})^{60}`` 0.1 s; ``(\\sqrt{x+1}+1)^{60}``
0.17 s), while valuing a pair takes 1-5 ms. Tuples, finite sets and intervals are compared by their elements
(:func:`container_verdict`): different when an element of the answer is proven different from every element of the gold
(``((1+\\pi)^{100}, 1)`` against ``(5, 1)`` took 80 ms in math-verify, ``((x+1)^{250}, 1)`` 0.22 s). What that leaves
(equal values, an undefined function, a pole, decimals, elements that some other element may match) and every matrix or
relation goes to math-verify as any other pair, within the scorer's time limit: a pair of equal answers of such shapes
can still take that limit, and so can a relation in variables (math-verify solves it: ``x+y = (x+1)^{100}`` against
``x+y = 5`` took 0.45 s).
"""
from __future__ import annotations

import math
import random

from rewards.math_tame import holds_irrational, log_power_terms

__all__ = ["MAX_SIMPLIFY_UNITS", "NUMERIC_FIRST_UNITS", "simplify_units", "simplify_too_slow", "rational_verdict",
           "container_verdict", "fast_verdict"]

MAX_SIMPLIFY_UNITS = 200  # estimated work of simplify(gold - pred), see the module docstring
NUMERIC_FIRST_UNITS = 20  # above it, a pair that rational_verdict does not decide is valued at random points first
_QUOTIENT_WEIGHT = 0.2  # N * D / 5: the gcd of numerator and denominator (measured on 1/(1-x)^n against 2)
_BINOMIAL_WEIGHT = 5.0  # combsimp factors a binomial of a variable (measured on binom(x, k) against 2)
_CAP = 1e30  # counts are capped here (any value above the limit is as good as another)
_POINTS = 2  # evaluation points of rational_verdict
_LOW, _HIGH = 2 ** 32, 2 ** 40  # each variable's value at a point is drawn from [_LOW, _HIGH)
_MAX_BITS = 65_536  # bits of one value (numerator and denominator): one product of two takes about 1 ms
_MAX_SPENT_BITS = 1_000_000  # bits of all values computed for one pair: at most about 20 ms in all
_COUNTS = ("binomial", "FallingFactorial", "RisingFactorial")
_MAX_PAIRS = 64  # pairs of elements of two tuples / sets that container_verdict compares


class _Undecided(Exception):
    """Raised by :func:`_value` for a node outside the rational functions, a pole, or a value too large."""


def _multinomial(terms: float, exponent: int) -> float:
    """Terms of a sum of ``terms`` terms raised to ``exponent``, expanded (:func:`rewards.math_tame.log_power_terms`),
    capped at ``_CAP``."""
    log = log_power_terms(terms, exponent)
    return _CAP if log > math.log(_CAP) else math.exp(log)


def _count_arg(node):
    """``k`` of a binomial or rising / falling factorial of a non-number with an integer ``k >= 0``, else None."""
    if type(node).__name__ in _COUNTS and len(node.args) == 2:
        n, k = node.args
        if k.is_Integer and int(k) >= 0 and not n.is_Number:
            return int(k)
    return None


def _combine(parts: list, add: bool) -> tuple[float, float, float, bool]:
    """The shape of a sum (``add``) or a product of parts of the given shapes: denominators multiply; a sum's
    numerator is each numerator times the other denominators."""
    den = min(math.prod(p[1] for p in parts), _CAP)
    num = sum(min(p[0] * den / p[1], _CAP) for p in parts) if add else math.prod(p[0] for p in parts)
    return min(num, _CAP), den, sum(p[2] for p in parts), any(p[3] for p in parts)


def _shape(node) -> tuple[float, float, float, bool]:
    """``(N, D, inner, binomial)`` of ``node``: terms of its numerator and denominator once expanded over a common
    denominator, the units of the arguments of other functions (simplified one by one), and whether a binomial of
    a variable takes part. A rational number, a constant or a root of a number is one term: sympy evaluates it rather
    than expanding it; sums, products and powers of roots and constants are expanded as polynomials in them
    (:func:`rewards.math_tame.holds_irrational`), and a function's value as a function's."""
    root = node.is_Pow and not node.args[1].is_Integer
    if node.is_number and (node.is_Atom or root or not holds_irrational(node)):
        return 1.0, 1.0, 0.0, False
    if node.is_Add or node.is_Mul:
        return _combine([_shape(a) for a in node.args], node.is_Add)
    if node.is_Pow and node.args[1].is_Integer:
        num, den, inner, binomial = _shape(node.args[0])
        e = int(node.args[1])
        num, den = _multinomial(num, abs(e)), _multinomial(den, abs(e))
        return (num, den, inner, binomial) if e >= 0 else (den, num, inner, binomial)
    k = _count_arg(node)
    if k is not None:  # a polynomial of degree k in its argument
        num, den, inner, _ = _shape(node.args[0])
        return _multinomial(num + 1.0, k), _multinomial(den, k), inner, True
    inner = sum(_units(_shape(a)) for a in node.args if _is_expression(a))
    return 1.0, 1.0, inner, False


def _units(shape: tuple[float, float, float, bool]) -> float:
    num, den, inner, binomial = shape
    work = num + den + _QUOTIENT_WEIGHT * num * den
    return min(work * (_BINOMIAL_WEIGHT if binomial else 1.0) + inner, _CAP)


def _is_expression(obj) -> bool:
    """Whether ``obj`` is a sympy expression (relations and sets are not)."""
    from sympy import Expr
    return isinstance(obj, Expr)


def _parts(obj) -> list:
    """The expressions that math-verify simplifies in ``obj``: itself, the sides of a relation, the entries of a
    tuple, set, interval or matrix."""
    if _is_expression(obj):
        return [obj]
    if getattr(obj, "is_Relational", False):
        return [obj.lhs, obj.rhs]
    if getattr(obj, "is_Matrix", False):
        return list(obj)
    return [p for a in getattr(obj, "args", ()) for p in _parts(a)]


def simplify_units(gold, pred) -> float:
    """Estimated work of ``simplify(gold - pred)`` (see the module docstring) when both are expressions: the shapes
    of both sides added, and above ``MAX_SIMPLIFY_UNITS`` the shape of the difference of both sides evaluated
    (:func:`_evaluated`; terms that both sides share cancel there); else the sum of their parts' (sides of
    relations, entries of tuples, sets, matrices). Never raises (a shape it cannot read costs nothing)."""
    try:
        if _is_expression(gold) and _is_expression(pred):
            sides = _units(_combine([_shape(gold), _shape(pred)], add=True))
            if sides <= MAX_SIMPLIFY_UNITS:  # cancelling shared terms only lowers it
                return sides
            # as simplify starts: both sides evaluated, so that the terms they share cancel
            return _units(_shape(_evaluated(gold) - _evaluated(pred)))
        return sum(_units(_shape(p)) for obj in (gold, pred) for p in _parts(obj))
    except Exception:
        return 0.0


def simplify_too_slow(gold, pred) -> bool:
    """Whether math-verify's ``simplify`` on this pair would take too long (:func:`simplify_units` above
    ``MAX_SIMPLIFY_UNITS``). A pair with a single symbol on one side is never: math-verify compares it by name."""
    if getattr(gold, "is_Symbol", False) or getattr(pred, "is_Symbol", False):
        return False
    return simplify_units(gold, pred) > MAX_SIMPLIFY_UNITS


def _evaluated(node):
    """``node`` rebuilt as sympy builds it by default, bottom up: ``\\sqrt{x^{2}}`` of a real ``x`` is ``|x|``,
    ``\\frac{1}{(1-x)^{101}}`` is ``(1-x)^{-101}``; products of sums are not expanded, and parts without a variable
    are kept as they are (``(1+1/10000)^{10000}`` is not computed). Parts that cannot be rebuilt are kept."""
    if not getattr(node, "args", ()) or getattr(node, "is_number", False):
        return node
    try:
        return node.func(*[_evaluated(a) for a in node.args])
    except Exception:
        return node


class _Point:
    """One evaluation point: a random integer in ``[2^32, 2^40)`` for each variable (the same for a variable on both
    sides), and the bits that evaluating at it has produced so far (:func:`_checked`)."""

    def __init__(self, rng: random.Random):
        self.rng, self.values, self.spent = rng, {}, 0

    def value(self, symbol) -> int:
        if symbol not in self.values:  # sympy's equality: one name with other assumptions is another variable
            self.values[symbol] = self.rng.randrange(_LOW, _HIGH)
        return self.values[symbol]


def _checked(point: _Point, num: int, den: int) -> tuple[int, int]:
    """``num / den`` (not reduced), or :class:`_Undecided` for a pole or a value past the size bounds."""
    if den == 0:
        raise _Undecided  # a pole at the point
    bits = num.bit_length() + den.bit_length()
    point.spent += bits
    if bits > _MAX_BITS or point.spent > _MAX_SPENT_BITS:
        raise _Undecided
    return num, den


def _combine_values(point: _Point, values: list, add: bool) -> tuple[int, int]:
    num, den = values[0]
    for n, d in values[1:]:
        if not add:
            num, den = _checked(point, num * n, den * d)
        elif d == den:
            num, den = _checked(point, num + n, den)
        else:
            num, den = _checked(point, num * d + n * den, den * d)
    return num, den


def _value(node, point: _Point) -> tuple[int, int]:
    """The exact value of a rational function at ``point``, as a numerator and a denominator; anything else (floats,
    constants, roots, other functions, symbolic exponents) raises :class:`_Undecided`."""
    if node.is_Symbol:
        return point.value(node), 1
    if node.is_Rational:
        return int(node.p), int(node.q)
    if node.is_Add or node.is_Mul:
        return _combine_values(point, [_value(a, point) for a in node.args], node.is_Add)
    if node.is_Pow and node.args[1].is_Integer:
        (num, den), e = _value(node.args[0], point), int(node.args[1])
        if e < 0:
            num, den, e = den, num, -e
        if max(num.bit_length(), den.bit_length()) * e > _MAX_BITS:  # checked before computing it
            raise _Undecided
        return _checked(point, num ** e, den ** e)
    k = _count_arg(node)
    if k is None:
        raise _Undecided
    (num, den), name = _value(node.args[0], point), type(node).__name__
    out = (1, 1)
    for i in range(k):
        out = _combine_values(point, [out, (num + i * den if name == "RisingFactorial" else num - i * den, den)],
                              add=False)
    return _checked(point, out[0], out[1] * math.factorial(k)) if name == "binomial" else out


def rational_verdict(gold, pred) -> bool | None:
    """Whether two rational functions are equal, from their exact values at ``_POINTS`` random points (see the
    module docstring); None when either is something else, a point is a pole, or a value grows past the size
    bounds. Never raises."""
    if not (_is_expression(gold) and _is_expression(pred)):
        return None
    rng = random.SystemRandom()
    try:
        for _ in range(_POINTS):
            point = _Point(rng)
            (gn, gd), (pn, pd) = _value(gold, point), _value(pred, point)
            if gn * pd != pn * gd:
                return False
    except (_Undecided, RecursionError, TypeError, ValueError, AttributeError):
        return None
    return True


def _same_expression(gold, pred) -> bool:
    """Whether both sides, rebuilt as sympy builds them (:func:`_evaluated`), are the same expression (sympy's
    structural equality: the order of terms and factors does not matter, nothing is expanded). Never raises."""
    try:
        return bool(_evaluated(gold) == _evaluated(pred))
    except Exception:
        return False


def _has_function(*exprs) -> bool:
    """Whether a function (``\\sin``, ``e^{x}``, ``\\log``, ...) is applied in one of ``exprs``."""
    from sympy import Function

    return any(e.has(Function) for e in exprs)


def _elements(obj, other) -> list | None:
    """What math-verify compares element by element: the entries of a tuple or finite set, the endpoints of an
    interval, an expression alone against one of these (math-verify puts it in a set); None for anything else."""
    from sympy import FiniteSet, Interval, Tuple

    if isinstance(obj, (Tuple, FiniteSet)):
        return list(obj.args)
    if isinstance(obj, Interval):
        return [obj.start, obj.end]
    return [obj] if _is_expression(obj) and _elements(other, None) else None


def container_verdict(gold, pred) -> bool | None:
    """False when ``gold`` and ``pred`` are tuples, finite sets or intervals (or one of these and an expression) and
    some element of ``pred`` is shown different from every element of ``gold`` by :func:`fast_verdict` (so no
    matching of their elements, in order or not, can make them equal); else None, for math-verify. At most
    ``_MAX_PAIRS`` pairs of elements are compared, and elements that are containers are not. Never raises."""
    g, p = _elements(gold, pred), _elements(pred, gold)
    if g is None or p is None or len(g) * len(p) > _MAX_PAIRS:
        return None
    if not all(_is_expression(x) for x in g + p):
        return None
    return False if any(all(fast_verdict(a, b) is False for a in g) for b in p) else None


def fast_verdict(gold, pred) -> bool | None:
    """The verdict on a pair without math-verify's ``simplify``, or None to leave it to math-verify: True for the
    same expression (:func:`_same_expression`); None when one side is a single symbol (a word or a name, compared
    by name by math-verify); for a pair of rational functions with a variable,
    :func:`rational_verdict` (exact: math-verify's 15-digit comparison took ``x+\\frac{1}{10^{20}}`` for ``x``);
    for a pair it does not decide whose estimate is above ``NUMERIC_FIRST_UNITS`` (:func:`simplify_units`) or that
    has a function applied, False when its values prove it different (:func:`rewards.math_numeric.numeric_differs`);
    for tuples, sets and intervals, :func:`container_verdict`; None for any other pair. Never raises."""
    if not (_is_expression(gold) and _is_expression(pred)):  # tuples, sets: by their elements; relations: math-verify
        return container_verdict(gold, pred)
    if _same_expression(gold, pred):
        return True
    if getattr(gold, "is_Symbol", False) or getattr(pred, "is_Symbol", False):
        return None  # a word or a name (``\\text{Navin}`` against ``navin``): math-verify compares it by name
    units = simplify_units(gold, pred)
    slow = units > MAX_SIMPLIFY_UNITS
    verdict = rational_verdict(gold, pred) if slow or gold.free_symbols or pred.free_symbols else None
    if verdict is None and (units > NUMERIC_FIRST_UNITS or _has_function(gold, pred)):
        from rewards.math_numeric import numeric_differs

        verdict = False if numeric_differs(gold, pred) else None
    return verdict
