"""Exact cross-check of numeric answers, so that float rounding cannot make unequal values equal.

math-verify compares a number written as a decimal by rounding both sides to 6 places (``float_rounding=6``):
it accepts ``0.333333`` for ``\\frac{1}{3}``, ``1.4142136`` for ``\\sqrt{2}`` and ``3.14159265`` for ``\\pi``; and
numeric differences are evaluated at 15 digits with small parts chopped to zero. Here, when math-verify says
two answers are equal and they are numbers (or tuples, sets or intervals of numbers), the values are compared
again:

* rational values exactly, as :class:`fractions.Fraction`: integers, decimals (a decimal literal is the exact
  decimal that was written, ``0.3333333333 = 3333333333/10^10``), fractions, sums, products and integer powers
  (``10^{20}+1`` differs from ``10^{20}``);
* anything else (roots, ``\\pi``, logarithms, ...) numerically at 50 significant digits: equal when the
  difference is below ``10^-40`` times the larger magnitude (so ``2\\sqrt{3}`` equals ``\\sqrt{12}``, and no
  decimal approximation of an irrational number up to 40 digits long equals it).

A percentage ``X\\%`` matches either ``X`` or ``X/100`` (math-verify accepts both). There is no other tolerance:
a reference answer given as a rounded decimal only matches that decimal (trailing zeros aside).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any

__all__ = ["exact_rational", "numbers_agree", "answers_agree"]

_MAX_EXPONENT = 10_000  # as in rewards.math_tame.is_tame, which runs first
_PRECISION = 50  # significant digits of the numeric comparison
_TOLERANCE_DIGITS = 40  # equal when the difference is below 10^-40 of the magnitude


def exact_rational(expr: Any) -> Fraction | None:
    """The exact value of a sympy expression built from integers, rationals, decimal literals, ``+``, ``*`` and
    integer powers (``|exponent| <= 10^4``); None for anything else (symbols, roots, constants, functions) and
    for a division by zero. Never raises."""
    try:
        return _rational(expr)
    except (ArithmeticError, ValueError, TypeError, AttributeError):
        return None


def _rational(e) -> Fraction | None:
    if getattr(e, "is_Rational", False):
        return Fraction(int(e.p), int(e.q))
    if getattr(e, "is_Float", False):
        return Fraction(str(e))  # sympy prints the decimal literal that was parsed, e.g. 0.333333333300000
    func = type(e).__name__
    if func == "UnevaluatedExpr":
        return _rational(e.args[0])
    if getattr(e, "is_Add", False) or getattr(e, "is_Mul", False):
        vals = [_rational(a) for a in e.args]
        if any(v is None for v in vals):
            return None
        out = Fraction(0) if e.is_Add else Fraction(1)
        for v in vals:
            out = out + v if e.is_Add else out * v
        return out
    if getattr(e, "is_Pow", False):
        base, exp = _rational(e.args[0]), _rational(e.args[1])
        if base is None or exp is None or exp.denominator != 1 or abs(exp) > _MAX_EXPONENT:
            return None
        return base ** int(exp)
    return None


def _percent_value(e):
    """``X`` for math-verify's percentage form ``X * UnevaluatedExpr(1/100)``, else None."""
    try:
        from sympy import Mul, Rational, UnevaluatedExpr

        if isinstance(e, Mul) and len(e.args) == 2 and e.args[1] == UnevaluatedExpr(Rational(1, 100)):
            return e.args[0]
    except Exception:
        pass
    return None


def _is_number(e) -> bool:
    from sympy import Expr, MatrixBase

    return isinstance(e, Expr) and not isinstance(e, MatrixBase) and not e.free_symbols and bool(e.is_number)


def _numeric_equal(a, b) -> bool:
    """Exact for rational values, else at 50 significant digits (relative 1e-40). Unevaluable: False."""
    ra, rb = exact_rational(a), exact_rational(b)
    if ra is not None and rb is not None:
        return ra == rb
    try:
        from sympy import Abs, Float, Max, Rational

        exact = {f: Rational(str(f)) for f in (a - b).atoms(Float)}  # decimal literals as written
        a, b = a.xreplace(exact), b.xreplace(exact)
        diff = Abs((a - b).evalf(_PRECISION)).evalf(_PRECISION)
        scale = Max(1, Abs(a.evalf(_PRECISION)), Abs(b.evalf(_PRECISION))).evalf(_PRECISION)
        return bool(diff <= Rational(1, 10 ** _TOLERANCE_DIGITS) * scale)
    except Exception:
        return False


def numbers_agree(a, b) -> bool | None:
    """For two numbers (sympy expressions without symbols): whether they are equal (see the module doc).
    None when either is not a number. A percentage on either side may stand for ``X`` or ``X/100``."""
    try:
        pa, pb = _percent_value(a), _percent_value(b)
        if pa is not None or pb is not None:
            from sympy import Rational

            options_a = [a] if pa is None else [pa, pa * Rational(1, 100)]
            options_b = [b] if pb is None else [pb, pb * Rational(1, 100)]
            if not all(_is_number(x) for x in options_a + options_b):
                return None
            return any(_numeric_equal(x, y) for x in options_a for y in options_b)
        if not (_is_number(a) and _is_number(b)):
            return None
        return _numeric_equal(a, b)
    except Exception:
        return None


def _unwrap_assignment(e, other):
    """``x = 3`` -> ``3`` when ``other`` is not a relation (math-verify compares it so)."""
    from sympy.core.relational import Relational

    if isinstance(e, Relational) and not isinstance(other, Relational):
        return e.rhs
    return e


def answers_agree(gold, pred) -> bool | None:
    """The exact cross-check of two parsed answers that math-verify found equal: False when they are numeric
    (numbers, or tuples / sets / intervals / matrices of numbers) and not equal by :func:`numbers_agree`;
    True when numeric and equal; None when not numeric (math-verify's verdict stands). Never raises."""
    try:
        from sympy import FiniteSet, Interval, MatrixBase, Tuple

        gold, pred = _unwrap_assignment(gold, pred), _unwrap_assignment(pred, gold)
        if isinstance(gold, MatrixBase) and isinstance(pred, MatrixBase):
            if gold.shape != pred.shape:
                return None
            return _all_agree(list(gold), list(pred))
        if isinstance(gold, Tuple) and isinstance(pred, Tuple):
            return _all_agree(list(gold.args), list(pred.args)) if len(gold) == len(pred) else None
        if isinstance(gold, FiniteSet) and isinstance(pred, FiniteSet):
            return _sets_agree(list(gold.args), list(pred.args))
        if isinstance(gold, Interval) and isinstance(pred, Interval):
            if (gold.left_open, gold.right_open) != (pred.left_open, pred.right_open):
                return None
            return _all_agree([gold.start, gold.end], [pred.start, pred.end])
        return numbers_agree(gold, pred)
    except Exception:
        return None


def _all_agree(gold: list, pred: list) -> bool | None:
    """Element by element: False if any pair disagrees, True if all agree, else None."""
    verdicts = [answers_agree(g, p) for g, p in zip(gold, pred)]
    return False if False in verdicts else (True if all(v is True for v in verdicts) else None)


def _sets_agree(gold: list, pred: list) -> bool | None:
    """Each element of ``pred`` must be matched by a distinct element of ``gold`` (both numeric), else False."""
    if len(gold) != len(pred):
        return None
    free = list(gold)
    for p in pred:
        for k, g in enumerate(free):
            verdict = answers_agree(g, p)
            if verdict is None:
                return None
            if verdict:
                del free[k]
                break
        else:
            return False
    return True
