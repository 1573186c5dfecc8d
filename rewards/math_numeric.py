"""A verdict on two symbolic answers from their values at random points, for the pairs that sympy's ``simplify`` would
take too long on and that are not rational functions (:func:`rewards.math_expand.fast_verdict` calls it).

Powers of trigonometric functions (``\\sin^{200}(x)``), powers of sums with ``e^{x}`` (``(e^{x}+1)^{150}``) and
products of large powers inside functions held math-verify's ``simplify`` for the scorer's whole time limit (1 s) on
every call. Here both answers are evaluated with :data:`DIGITS` significant digits (sympy's ``evalf``, which raises its
working precision until the result has them) at :data:`POINTS` points, each variable a random rational in ``[1, 2)``
(the same on both sides; positive, so that roots and logarithms of a variable stay real): two values that differ by
more than ``10^-TOLERANCE_DIGITS`` times the larger of their sizes and 1 prove the answers different; equal values at
every point are taken as equal answers. The points are drawn afresh for every pair, so no answer can be built against them.

What it can get wrong: two different expressions whose values agree to 50 digits at two random points (a difference
below ``10^-50`` relative, or absolute below 1: ``(\\pi + 10^{-60}) x`` against ``\\pi x``, ``10^{-60}`` against
``0``), or two equal ones written with other branches of a root or logarithm than the points take. A pair with a value that is not a finite number at a point (a pole,
an undefined function) is left undecided (None), and math-verify decides it within the time limit, as before.
Measured on a 2-core machine: ``\\sin^{200}(x)`` against ``1``, ``\\sin((x^2-1)^{30})`` against
``\\sin((x-1)^{30}(x+1)^{30})``: a few milliseconds each.
"""
from __future__ import annotations

import random

__all__ = ["numeric_verdict", "DIGITS", "TOLERANCE_DIGITS", "POINTS"]

DIGITS = 80  # significant digits of each value
TOLERANCE_DIGITS = 50  # values closer than 10^-50 relative are the same value
POINTS = 2
_SCALE = 2 ** 64  # a variable's value: a random integer in [_SCALE, 2 * _SCALE) over _SCALE


def _value(expr, point: dict):
    """``expr`` at ``point`` as an mpmath number with :data:`DIGITS` digits, or None when it is not a finite
    number there."""
    import mpmath

    value = expr.evalf(DIGITS, subs=point)
    if not value.is_number:
        return None
    out = value._to_mpmath(mpmath.mp.prec)  # raises for a value that is not a number (nan, zoo): caught above
    return out if not (mpmath.isnan(out) or mpmath.isinf(out)) else None


def numeric_verdict(gold, pred) -> bool | None:
    """Whether two sympy expressions are equal, from their values at :data:`POINTS` random points (see the module
    docstring): False as soon as the values at a point differ, True when they agree at every point, None when a
    value is not a finite number (or cannot be computed). Never raises.

    Args:
        gold, pred: sympy expressions (not relations, tuples or sets).
    """
    from sympy import Rational

    try:
        import mpmath

        symbols = sorted(gold.free_symbols | pred.free_symbols, key=str)
        rng = random.SystemRandom()
        with mpmath.workdps(DIGITS):
            for _ in range(POINTS):
                point = {s: Rational(rng.randrange(_SCALE, 2 * _SCALE), _SCALE) for s in symbols}
                g, p = _value(gold, point), _value(pred, point)
                if g is None or p is None:
                    return None
                if abs(g - p) > mpmath.mpf(10) ** -TOLERANCE_DIGITS * max(abs(g), abs(p), 1):
                    return False
        return True
    except Exception:  # noqa: BLE001 - any expression evalf cannot value: left to math-verify
        return None
