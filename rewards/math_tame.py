"""Whether a parsed answer is small enough for sympy to evaluate and compare: :func:`is_tame`, the post-parse bound
of :mod:`rewards.math_guards`.

An answer is measured, never evaluated: :func:`_size` bounds the number of decimal digits of every numeric
sub-expression (``|log10 |value||``, so ``10^{-10^6}`` is as big as ``10^{10^6}``) from the sizes of its parts,
in floating point. Variables that a sum, product or integral ranges over take the size of its bounds, so
``\\sum_{n=1}^{10} n^{n^{n}}`` is measured as ``10^{10^{10}}``. Free variables have no size; an expression in them
is refused only for its shape (a tower of powers, a power of a sum that would expand to too many terms).
"""
from __future__ import annotations

import math as _pymath

__all__ = ["is_tame", "MAX_DIGITS", "MAX_EXPONENT", "MAX_FACTORIAL_ARG", "MAX_TERMS", "MAX_SYMBOLIC_EXPONENT",
           "MAX_SYMBOLIC_COUNT", "MAX_TOWER"]

MAX_NODES = 1000  # sympy tree size
MAX_DEPTH = 100  # sympy tree depth
MAX_EXPONENT = 10_000  # |exponent| of any power with a numeric exponent
MAX_DIGITS = 10_000  # digits of any numeric sub-expression's value (of its inverse when below 1)
MAX_FACTORIAL_ARG = 1000  # n of n!, Gamma(n), binomial(n, k), rising / falling factorials
MAX_LITERAL_DIGITS = 200  # digits in one integer literal
MAX_TERMS = 1000  # terms of a sum or factors of a product with numeric bounds
MAX_SYMBOLIC_EXPONENT = 100  # a power of an expression in variables other than one variable: (x+1)^100 expands
MAX_SYMBOLIC_COUNT = 20  # k of binomial(x, k) or a rising / falling factorial with a variable: k factors
MAX_TOWER = 2  # powers stacked in exponents, with a variable in them (x^{x^{x}}, e^{x^2}: 2; x^{x^{x^{x}}}: 3)


class _Refused(Exception):
    """Raised inside :func:`_size` when a sub-expression is too big."""


def _digits(v: float) -> float:
    """Digits of a finite nonzero value, both ways (``|log10 |v||``); 0 for 0."""
    return abs(_pymath.log10(abs(v))) if v else 0.0


def _check(size: float | None) -> float | None:
    if size is not None and size > MAX_DIGITS:
        raise _Refused
    return size


def _number_size(node) -> float | None:
    """Size of a sympy number or constant; None for infinities and other non-finite values."""
    if node.is_Rational:  # integers too
        bits = max(abs(node.p).bit_length(), abs(node.q).bit_length())
        if bits > 3.33 * MAX_LITERAL_DIGITS:
            raise _Refused
        return _digits(node.p) + _digits(node.q) if bits < 1000 else bits * 0.30103
    if node.is_Float or node.is_NumberSymbol:  # pi, E, EulerGamma, ...
        return _digits(float(node)) if node.is_finite else None
    return None


def _value_bound(size: float) -> float:
    """The largest |value| of a given size (``10^size``), inf when it does not fit a float."""
    return 10.0 ** size if size < 300 else _pymath.inf


def _exact_value(node) -> float | None:
    """|node| as a float when it is a plain number, else None."""
    return float(abs(node)) if getattr(node, "is_Number", False) and node.is_finite else None


def _power_size(base, exp, env, depth) -> float | None:
    """Size of ``base ** exp`` (``exp(x)`` is ``E ** x``)."""
    sb, se = _size(base, env, depth), _size(exp, env, depth)
    if se is None:  # an exponent in free variables: only the shape is checked
        if _tower(exp) + 1 > MAX_TOWER:
            raise _Refused
        return None
    e = _exact_value(exp)
    e = _value_bound(se) if e is None else e
    if e > MAX_EXPONENT:
        raise _Refused
    if sb is None:
        if not base.is_Symbol and e > MAX_SYMBOLIC_EXPONENT:
            raise _Refused  # (x+1)^1000: sympy expands it into a thousand terms of huge coefficients
        return None
    return _check(e * sb)


def _tower(node) -> int:
    """How many powers are stacked in exponents in ``node`` (``x^2``: 1, ``e^{x^2}``: 2)."""
    if node.is_Pow or _is_exp(node):
        exp = node.args[-1]
        return 1 + (0 if exp.is_Number else _tower(exp))
    return max((_tower(a) for a in node.args), default=0)


def _is_exp(node) -> bool:
    import sympy
    return isinstance(node, sympy.exp)


def _magnitude(node, size: float) -> float:
    """|node| when it is a plain number, else the bound of its size."""
    v = _exact_value(node)
    return _value_bound(size) if v is None else v


def _count_size(n, k, env, depth) -> float | None:
    """Size of ``binomial(n, k)`` (rising / falling factorials alike): both at most MAX_FACTORIAL_ARG, and k at
    most MAX_SYMBOLIC_COUNT unless n is an integer (``binomial(x, k)`` is a product of k factors)."""
    sn, sk = _size(n, env, depth), _size(k, env, depth)
    vn = None if sn is None else _magnitude(n, sn)
    vk = None if sk is None else _magnitude(k, sk)
    if (vn or 0) > MAX_FACTORIAL_ARG or (vk or 0) > MAX_FACTORIAL_ARG:
        raise _Refused
    if vk is not None and vk > MAX_SYMBOLIC_COUNT and not n.is_Integer:
        raise _Refused
    return None if vn is None or vk is None else _check(max(vn, vk) * 0.30103 + 1.0)


def _bounded_size(node, env, depth) -> float | None:
    """Size of a sum, product or integral: its variables take the size of their bounds."""
    import sympy
    inner = dict(env)
    count = 1.0
    for limit in node.limits:
        var, bounds = limit[0], limit[1:]
        sizes = [_size(b, env, depth) for b in bounds]
        inner[var] = None
        if len(bounds) == 2 and None not in sizes:
            inner[var] = max(sizes)
            lo, hi = (_exact_value(b) for b in bounds)
            span = abs(hi - lo) + 1 if lo is not None and hi is not None else 2 * _value_bound(max(sizes)) + 1
            if not isinstance(node, sympy.Integral):
                if span > MAX_TERMS:
                    raise _Refused  # sympy may add or multiply every term
                count *= span
    s = _size(node.function, inner, depth)
    if s is None or None in inner.values():
        return None
    if isinstance(node, sympy.Product):
        return _check(s * count)
    return _check(s + _pymath.log10(count) + max((v for v in inner.values() if v is not None), default=0.0))


def _size(node, env: dict, depth: int = 0) -> float | None:
    """Digits bound of ``node``'s value (see the module docstring); None when it depends on free variables.
    Raises :class:`_Refused` when some sub-expression is too big."""
    import sympy
    if depth > MAX_DEPTH:
        raise _Refused
    depth += 1
    if node.is_Symbol:
        return env.get(node)
    if node is sympy.I:
        return 0.0
    if node.is_Number or node.is_NumberSymbol:
        return _number_size(node)
    if node.is_Pow or _is_exp(node):
        base, exp = (node.args if node.is_Pow else (sympy.E, node.args[0]))
        return _power_size(base, exp, env, depth)
    if isinstance(node, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma)):
        s = _size(node.args[0], env, depth)
        v = None if s is None else _magnitude(node.args[0], s)
        if v is not None and v > MAX_FACTORIAL_ARG:
            raise _Refused
        return None if v is None else _check(v * _pymath.log10(v + 2.0) + 1.0)
    if isinstance(node, (sympy.binomial, sympy.RisingFactorial, sympy.FallingFactorial)):
        return _count_size(*node.args[:2], env, depth)
    if isinstance(node, (sympy.Sum, sympy.Product, sympy.Integral)):
        return _bounded_size(node, env, depth)
    sizes = [_size(a, env, depth) if isinstance(a, sympy.Basic) else None for a in node.args]
    if None in sizes or not sizes:
        return None
    if node.is_Mul:
        return _check(sum(sizes))
    if node.is_Add:
        return _check(max(sizes) + _pymath.log10(len(sizes)))
    if isinstance(node, sympy.log):
        return _pymath.log10(max(sizes) * 2.31 + 1.0)
    return max(sizes)


def is_tame(expr) -> bool:
    """True when a parsed (unevaluated) sympy object is small enough to compare safely.

    Rejects: more than 1000 tree nodes or 100 levels; an integer literal of more than 200 digits; any numeric
    sub-expression with more than 10^4 digits (``e^{e^{e^{e}}}``, ``\\pi^{\\pi^{\\pi^{\\pi}}}``, ``10^{-10^{5}}``); a
    power with a numeric exponent above 10^4 in size; a factorial, Gamma, binomial or rising / falling factorial of
    a number above 1000, or ``binomial(x, k)`` with a variable ``x`` and ``k`` above 20; a sum or product over more
    than 1000 numeric terms, whose variable otherwise takes the size of its bounds (``\\sum_{n=1}^{10} n^{n^{n}}``
    is too big), as does an integral's; a power of an expression in variables (other than one variable) with an
    exponent above 100 (``(x+1)^{1000}``); more than 2 powers stacked in exponents with a variable in them
    (``x^{x^{x^{x}}}``, ``2^{2^{2^{n}}}``); non-sympy objects other than str. Sizes are bounded from the parts, in
    floating point, without evaluating anything. Never raises.
    """
    try:
        from sympy import Basic, MatrixBase, postorder_traversal
    except Exception:
        return False
    if isinstance(expr, str):
        return True
    if isinstance(expr, MatrixBase) and not isinstance(expr, Basic):
        return len(expr) <= MAX_NODES and all(is_tame(e) for e in expr)
    if not isinstance(expr, Basic):
        return False
    try:
        for count, _ in enumerate(postorder_traversal(expr)):
            if count > MAX_NODES:
                return False
        _size(expr, {})
    except Exception:  # _Refused, RecursionError, anything sympy raises
        return False
    return True
