"""Proof that two symbolic answers differ, from their values at random points, before sympy's ``simplify`` is tried
(:func:`rewards.math_expand.fast_verdict` calls it for pairs above a tenth of the simplify estimate and for pairs with
functions).

Powers of trigonometric functions (``\\sin^{200}(x)``, ``(1+\\sin x)^{30}``), powers of sums with ``e^{x}`` and
products of large powers inside functions held math-verify's ``simplify`` for the scorer's whole time limit (1 s) on
every call, while the answer was simply wrong. Here the difference ``gold - pred`` (as sympy builds it: terms both
sides share cancel) is evaluated at :data:`POINTS` points, each variable a random rational in ``[1, 2)`` (the same
on both sides; positive, so that roots and logarithms of a variable stay real), with sympy's ``evalf`` in strict mode:
a value is returned only when all of its :data:`DIGITS` digits are certain (the working precision is raised up to
:data:`MAX_DIGITS` digits, so cancellation is followed), else the point tells nothing. A certain nonzero value proves
the answers different. Nothing here ever finds two answers equal: a pair whose values agree (or cannot be certified:
a zero difference, a pole, an undefined function) goes on to math-verify as before, within the time limit. Answers
with decimals are not valued here (a decimal against a symbolic value has its own exact rule,
:func:`rewards.math_exact.answers_agree`).
"""
from __future__ import annotations

import random

__all__ = ["numeric_differs", "DIGITS", "MAX_DIGITS", "POINTS"]

DIGITS = 30  # certain digits of the difference's value at a point
MAX_DIGITS = 300  # the working precision evalf may raise to
POINTS = 2
_SCALE = 2 ** 64  # a variable's value: a random integer in [_SCALE, 2 * _SCALE) over _SCALE


def numeric_differs(gold, pred) -> bool:
    """Whether the sympy expressions ``gold`` and ``pred`` certainly differ: the difference has a certain nonzero
    value at one of :data:`POINTS` random points (see the module docstring). False means not shown (equal values,
    no certain value, decimals, anything evalf cannot value). Never raises.

    Args:
        gold, pred: sympy expressions (not relations, tuples or sets).
    """
    from sympy import Float, Rational, nan, zoo

    try:
        if gold.has(Float) or pred.has(Float):
            return False
        diff = gold - pred
        if diff == 0:
            return False
        symbols = sorted(diff.free_symbols, key=str)
        rng = random.SystemRandom()
        for _ in range(POINTS):
            point = {s: Rational(rng.randrange(_SCALE, 2 * _SCALE), _SCALE) for s in symbols}
            try:
                value = diff.evalf(DIGITS, subs=point, strict=True, maxn=MAX_DIGITS)
            except Exception:  # noqa: BLE001 - PrecisionExhausted (a zero, a cancellation too deep) or no value
                continue
            if value.is_number and not value.has(nan, zoo) and value.is_finite is not False and value != 0:
                return True
        return False
    except Exception:  # noqa: BLE001 - an expression evalf cannot value: not shown
        return False
