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
variable with an integer ``k`` is a polynomial of degree ``k``), it is ``N + D + N * D / 5``, five times that when such
a binomial takes part, plus the same for the arguments of other functions. Measured (CPU time of math-verify's
comparison with sympy's cache cleared, median of 3, against ``2`` unless named, on a 2-core machine):

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
answers reaches 40) the pair is not given to ``simplify`` but decided by :func:`cheap_equal`. A pair with a single
symbol on one side is left to math-verify, which compares it by name without simplifying (``\\text{ab}`` is ``ab``).

:func:`cheap_equal` decides a pair of rational functions (sums, products and integer powers of variables and rational
numbers; binomials and rising / falling factorials with an integer ``k``: all the answers above) as ``simplify``
would, from their values at two points modulo the prime ``2^61 - 1``: values that differ prove the answers different;
equal values at both points make them equal, wrongly only when both points are roots of the difference's numerator
(probability below ``(degree / 2^61)^2``, under ``10^-20`` for the degrees that ``is_tame`` lets through). Other pairs
above the limit are equal when math-verify's steps before ``simplify`` find them so (the same expression, or a
difference that evaluates to 0: ``\\sqrt{2}(x+1)^{100}(x+2)^{100}`` and ``\\sqrt{2}(1+x)^{100}(2+x)^{100}``), or when,
rebuilt as sympy evaluates them (``(\\sqrt{2})^{2}`` is 2, ``\\sqrt{x^{2}}`` is ``|x|``; not when a decimal takes part,
whose products would be rounded), they are equal as rational functions with their other parts taken as unknowns of
their own and their decimals as the numbers written, by the same two points
(``\\sqrt{2}(x^2-1)^{50}`` and ``\\sqrt{2}(x-1)^{50}(x+1)^{50}``; ``0.5(x^2-1)^{50}`` and
``\\frac{(x-1)^{50}(x+1)^{50}}{2}``; decimals are compared exactly, as :mod:`rewards.math_exact` does, where
math-verify's floating-point ``simplify`` can miss an exact equality such as ``\\frac{0.6\\sqrt{2}}{z+0.9}`` and
``\\frac{\\sqrt{2}}{\\frac{5z}{3}+1.5}``); else they score 0, so an identity between such parts inside such a pair
(``\\sin^2 x + \\cos^2 x = 1``) is not found.
"""
from __future__ import annotations

import hashlib
import math
from fractions import Fraction

__all__ = ["MAX_SIMPLIFY_UNITS", "simplify_units", "simplify_too_slow", "rational_verdict", "cheap_equal"]

MAX_SIMPLIFY_UNITS = 200  # estimated work of simplify(gold - pred), see the module docstring
_QUOTIENT_WEIGHT = 0.2  # N * D / 5: the gcd of numerator and denominator (measured on 1/(1-x)^n against 2)
_BINOMIAL_WEIGHT = 5.0  # combsimp factors a binomial of a variable (measured on binom(x, k) against 2)
_CAP = 1e30  # counts are capped here (any value above the limit is as good as another)
_PRIME = 2 ** 61 - 1
_POINTS = 2  # evaluation points of rational_verdict
_COUNTS = ("binomial", "FallingFactorial", "RisingFactorial")


class _Undecided(Exception):
    """Raised by :func:`_mod_value` for a node outside the rational functions, or a division by zero."""


def _multinomial(terms: float, exponent: int) -> float:
    """Terms of a sum of ``terms`` terms raised to ``exponent``, expanded: ``C(exponent + terms - 1, terms - 1)``."""
    if terms <= 1.0 or exponent == 0:
        return 1.0
    log = math.lgamma(exponent + terms) - math.lgamma(exponent + 1) - math.lgamma(terms)
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
    a variable takes part. A number is one term: sympy evaluates it rather than expanding it."""
    if node.is_number:
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
            return _units(_shape(_evaluated(gold, numbers=False) - _evaluated(pred, numbers=False)))
        return sum(_units(_shape(p)) for obj in (gold, pred) for p in _parts(obj))
    except Exception:
        return 0.0


def simplify_too_slow(gold, pred) -> bool:
    """Whether math-verify's ``simplify`` on this pair would take too long (:func:`simplify_units` above
    ``MAX_SIMPLIFY_UNITS``). A pair with a single symbol on one side is never: math-verify compares it by name."""
    if getattr(gold, "is_Symbol", False) or getattr(pred, "is_Symbol", False):
        return False
    return simplify_units(gold, pred) > MAX_SIMPLIFY_UNITS


def _residue(key: str, index: int) -> int:
    """A fixed value modulo ``_PRIME`` for ``key`` at evaluation point ``index`` (a hash: the same in every
    process)."""
    digest = hashlib.blake2b(f"{index}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _PRIME


def _inverse(v: int) -> int:
    if v == 0:
        raise _Undecided  # a pole at the point (or a denominator that the prime divides)
    return pow(v, -1, _PRIME)


def _mod_value(node, index: int, opaque: bool = False) -> int:
    """The value of a rational function at point ``index`` modulo ``_PRIME``: each variable a fixed residue of its
    name and assumptions (one name with other assumptions is another variable, as in sympy). Anything else (floats,
    constants, roots, other functions) raises :class:`_Undecided`, or with ``opaque`` is one more variable, named by
    its printed form (a decimal then is the number written)."""
    if node.is_Symbol:
        return _residue(f"{node.name}:{sorted(node.assumptions0.items())}", index)
    if node.is_Rational:
        return node.p * _inverse(node.q % _PRIME) % _PRIME
    if node.is_Add or node.is_Mul:
        values = [_mod_value(a, index, opaque) for a in node.args]
        out = 0 if node.is_Add else 1
        for v in values:
            out = (out + v) % _PRIME if node.is_Add else out * v % _PRIME
        return out
    if node.is_Pow and node.args[1].is_Integer:
        base, e = _mod_value(node.args[0], index, opaque), int(node.args[1])
        return pow(base if e >= 0 else _inverse(base), abs(e), _PRIME)
    k = _count_arg(node)
    if k is None:
        if not opaque:
            raise _Undecided
        if node.is_Float:  # the decimal that was written (0.5 is 1/2), as rewards.math_exact reads it
            exact = Fraction(str(node))
            return exact.numerator * _inverse(exact.denominator % _PRIME) % _PRIME
        from sympy import srepr
        return _residue("part:" + srepr(node), index)
    n, name, out = _mod_value(node.args[0], index, opaque), type(node).__name__, 1
    for i in range(k):
        out = out * (n + i if name == "RisingFactorial" else n - i) % _PRIME
    return out * _inverse(math.factorial(k) % _PRIME) % _PRIME if name == "binomial" else out


def rational_verdict(gold, pred, opaque: bool = False) -> bool | None:
    """Whether two rational functions are equal, from their values at ``_POINTS`` points modulo ``_PRIME`` (see the
    module docstring); None when either is something else or a point is a pole. With ``opaque``, other parts
    (``\\sqrt{2}``, ``\\pi``, ``e^{x}``) are unknowns of their own: equal is then still proved, different is not
    (``(\\sqrt{2})^2`` and ``2`` differ as unknowns). Never raises."""
    if not (_is_expression(gold) and _is_expression(pred)):
        return None
    try:
        for index in range(_POINTS):
            if _mod_value(gold, index, opaque) != _mod_value(pred, index, opaque):
                return False
    except (_Undecided, RecursionError, TypeError, ValueError, AttributeError):
        return None
    return True


def _evaluated(node, numbers: bool = True):
    """``node`` rebuilt as sympy builds it by default, bottom up: ``(\\sqrt{2})^{2}`` is 2, ``\\sqrt{x^{2}}`` of a real
    ``x`` is ``|x|``, ``\\frac{1}{(1-x)^{101}}`` is ``(1-x)^{-101}``; products of sums are not expanded. Without
    ``numbers``, parts without a variable are kept as they are (``(1+1/10000)^{10000}`` is not computed). Parts that
    cannot be rebuilt are kept."""
    if not getattr(node, "args", ()) or (not numbers and getattr(node, "is_number", False)):
        return node
    try:
        return node.func(*[_evaluated(a, numbers) for a in node.args])
    except Exception:
        return node


def _equal_as_unknowns(gold, pred) -> bool:
    """``rational_verdict`` with ``opaque`` on both sides evaluated (:func:`_evaluated`), or as written when a
    decimal takes part: evaluating would round its products (``3.5 \\cdot 0.571428571428571`` would be 2.0)."""
    from sympy import Float
    if not (gold.has(Float) or pred.has(Float)):
        gold, pred = _evaluated(gold), _evaluated(pred)
    return rational_verdict(gold, pred, opaque=True) is True


def cheap_equal(gold, pred) -> bool:
    """The verdict on a pair too slow to simplify: :func:`rational_verdict` for rational functions; else equal when,
    as in math-verify's steps before ``simplify``, it is the same expression or a difference that evaluates to 0 at
    15 digits without expanding, or when it is equal with its other parts as unknowns and its decimals as written
    (:func:`_equal_as_unknowns`); tuples, intervals, relations and matrices of
    one kind part by part, sets element by element in any order. Never raises."""
    verdict = rational_verdict(gold, pred)
    if verdict is not None:
        return verdict
    try:
        if gold == pred:
            return True
        if _is_expression(gold) or _is_expression(pred):
            return _is_expression(gold) and _is_expression(pred) and (
                (gold - pred).evalf(chop=True, n=15) == 0 or _equal_as_unknowns(gold, pred))
        if type(gold) is not type(pred) or len(gold.args) != len(pred.args):
            return False
        if getattr(gold, "is_FiniteSet", False):
            return all(any(cheap_equal(g, p) for p in pred.args) for g in gold.args) and all(
                any(cheap_equal(g, p) for g in gold.args) for p in pred.args)
        return all(cheap_equal(g, p) for g, p in zip(gold.args, pred.args))
    except Exception:
        return False
