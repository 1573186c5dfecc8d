"""Whether a parsed answer is small enough for sympy to evaluate and compare: :func:`is_tame`, the post-parse bound
of :mod:`rewards.math_guards`.

An answer is measured, never evaluated. :func:`_size` bounds two things of every numeric sub-expression, in floating
point, from the sizes of its parts:

* its magnitude ``u``: an upper bound of ``log10 |value|`` (negative for values below 1, so ``1 + 1/10000`` is
  about 1, not 4 digits, and an exponent ``10^{-5}`` is at most 10^-5, not 10^5);
* its exact cost ``r``: the digits of the numerator and denominator that exact arithmetic carries
  (``(10001/10000)^{10000}`` is about 1 in value but 80,000 digits exactly; floats and constants cost nothing).

Measured (CPU time of one comparison against a wrong gold, without these bounds): exact rationals of 80,000 digits
take about 0.13 s (``(10001/10000)^{10000}``), 160,000 digits 0.55 s and 240,000 digits 0.75 s, hence
``MAX_EXACT_DIGITS``; integers of 20,000-100,000 digits (``2^{66000}``, ``3^{200000}``, ``10^{10^{6}}``) are fast
but ``10^{10^{4}}`` against ``10^{10000}`` did not finish in 15 s, hence ``MAX_DIGITS`` on the magnitude.
Variables that a sum, product or integral ranges over take the size of its bounds, so ``\\sum_{n=1}^{10} n^{n^{n}}``
is measured as ``10^{10^{10}}``. Free variables have no size; an expression in them is refused only for its shape:
a tower of powers, or a power of a sum that expands to more than ``MAX_EXPANDED_TERMS`` terms. Measured against a
wrong gold: ``(x+1)^{300}`` (301 terms) 0.31 s, ``(x+1)^{400}`` 0.47 s, ``(x+1)^{500}`` 0.7 s (past the 1 s limit
on a loaded machine), ``(x+y+z)^{30}`` (496 terms) 0.69 s, ``(x+y+z)^{50}`` (1,326 terms) 2 s; a power of a
monomial (``(2x)^{150}``, ``(xy)^{200}``) never expands and is not limited. ``binomial(x, k)`` with a variable ``x``
is a product of ``k`` factors: ``k = 25`` 0.18 s, ``k = 50`` 0.38 s, ``k = 100`` 1.6 s, hence ``MAX_SYMBOLIC_COUNT``.
A sum of roots and constants (``1+\\sqrt{2}+\\sqrt{3}``, ``1+\\pi+e``: :func:`holds_irrational`) has a size, but sympy
raises it to a power as it does a sum of variables, term by term (``simplify`` expands the multinomial before it
collects the terms), so such a power is refused above ``MAX_EXPANDED_TERMS`` terms too: measured against a wrong gold,
``(1+\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{7})^{n}`` took 0.7 s at ``n = 20`` (10,626 terms), 3.1 s at 30 and 10.7 s
at 40, ``(1+\\sqrt{2}+\\sqrt{3})^{100}`` (5,151 terms) 0.37 s, ``(1+\\sqrt{2})^{1000}`` 0.2 s, ``(1+\\pi+e)^{100}``
over 1 s. Rounding such a number (``\\lfloor\\rfloor``, ``\\lceil\\rceil``) is worse: near an integer, where powers
of ``2+\\sqrt{3}`` or ``1+\\sqrt{2}`` lie, sympy decides it by ``simplify`` (``\\lfloor (2+\\sqrt{3})^{60} \\rfloor``
2.5 ms, ``\\lfloor (2+\\sqrt{3})^{100} \\rfloor`` 56 ms, ``\\lceil (1+\\sqrt{2})^{250} \\rceil`` 0.1-0.3 s,
``\\lceil (1+\\sqrt{2})^{9000} \\rceil`` over 4 s), hence ``MAX_ROUNDED_TERMS`` for a rounded irrational number.
These bound each answer alone; what a pair costs to compare (products of such powers, denominators, the gold's own
terms) is bounded by :mod:`rewards.math_expand`.
"""
from __future__ import annotations

import math as _pymath
import re as _re

__all__ = ["is_tame", "unevaluated", "names_unevaluated", "log_power_terms", "holds_irrational", "MAX_DIGITS",
           "MAX_EXACT_DIGITS", "MAX_EXPONENT", "MAX_FACTORIAL_ARG", "MAX_TERMS", "MAX_EXPANDED_TERMS",
           "MAX_ROUNDED_TERMS", "MAX_SYMBOLIC_COUNT", "MAX_TOWER"]

MAX_NODES = 1000  # sympy tree size
MAX_DEPTH = 100  # sympy tree depth
MAX_EXPONENT = 10_000  # |exponent| of any power with a numeric exponent
MAX_DIGITS = 10_000  # magnitude: log10 |value| of any numeric sub-expression
MAX_EXACT_DIGITS = 100_000  # exact cost: digits of numerator and denominator of any exact numeric sub-expression
MAX_FACTORIAL_ARG = 1000  # n of n!, Gamma(n); n of binomial(n, k) when k is not a number
MAX_LITERAL_DIGITS = 200  # digits in one integer literal
MAX_TERMS = 1000  # terms of a sum or factors of a product with numeric bounds
MAX_EXPANDED_TERMS = 300  # terms of a power of a sum in variables once expanded ((x+1)^300: 301)
MAX_ROUNDED_TERMS = 50  # terms of an irrational number under floor / ceiling once expanded ((2+\sqrt{3})^{40}: 41)
MAX_SYMBOLIC_COUNT = 50  # k of binomial(x, k) or a rising / falling factorial with a variable: k factors
MAX_TOWER = 2  # powers stacked in exponents, with a variable in them (x^{x^{x}}, e^{x^2}: 2; x^{x^{x^{x}}}: 3)
_LOG10_2 = 0.30103


class _Refused(Exception):
    """Raised inside :func:`_size` when a sub-expression is too big."""


def _check(u: float, r: float) -> tuple[float, float]:
    if u > MAX_DIGITS or r > MAX_EXACT_DIGITS:
        raise _Refused
    return u, r


def _log10(v: float) -> float:
    """log10 |v|, 0 for 0 (an upper bound of 0's magnitude)."""
    return _pymath.log10(abs(v)) if v else 0.0


def _number_size(node) -> tuple[float, float] | None:
    """``(u, r)`` of a sympy number or constant; None for infinities and other non-finite values."""
    if node.is_Rational:  # integers too
        bp, bq = abs(node.p).bit_length(), node.q.bit_length()
        if max(bp, bq) > 3.33 * MAX_LITERAL_DIGITS:
            raise _Refused
        return _log10(node.p) - _log10(node.q), (bp + bq - 1) * _LOG10_2
    if node.is_Float or node.is_NumberSymbol:  # pi, E, EulerGamma, ...: no exact cost
        return (_log10(float(node)), 0.0) if node.is_finite else None
    return None


def _value_bound(u: float) -> float:
    """The largest |value| of magnitude ``u`` (``10^u``), inf when it does not fit a float."""
    return 10.0 ** u if u < 300 else _pymath.inf


def _magnitude(node, size: tuple[float, float]) -> float:
    """|node| when it is a plain number, else the bound of its magnitude."""
    if getattr(node, "is_Number", False) and node.is_finite:
        return float(abs(node))
    return _value_bound(size[0])


def _expanded_terms(node) -> float:
    """log10 of the number of terms of ``node`` once expanded (a power of a sum of ``t`` terms to ``e``:
    ``C(e + t - 1, t - 1)``; products multiply, sums add)."""
    if node.is_Add:
        return _pymath.log10(sum(10.0 ** min(_expanded_terms(a), 300.0) for a in node.args))
    if node.is_Mul:
        return sum(_expanded_terms(a) for a in node.args)
    if node.is_Pow and node.args[1].is_Integer:
        terms = 10.0 ** min(_expanded_terms(node.args[0]), 300.0)
        return log_power_terms(terms, abs(int(node.args[1]))) / _pymath.log(10)
    return 0.0


def log_power_terms(terms: float, exponent: int) -> float:
    """Natural log of the number of terms of a sum of ``terms`` terms raised to ``exponent``, once expanded:
    ``C(exponent + terms - 1, terms - 1)`` (the multinomial count); 0 for a single term or exponent 0."""
    if terms <= 1.0 or exponent == 0:
        return 0.0
    return _pymath.lgamma(exponent + terms) - _pymath.lgamma(exponent + 1) - _pymath.lgamma(terms)


def holds_irrational(node) -> bool:
    """Whether a sympy number holds a part that sympy keeps symbolic in exact arithmetic: a root (``\\sqrt{2}``), a
    constant (``\\pi``, ``e``), a function value (``\\log 2``); so that a power of a sum of such parts is expanded term
    by term, as a polynomial is. Rationals, decimals and sympy's ``I`` are not (sympy computes ``(3+4I)^{n}`` by
    squaring). Never raises."""
    import sympy
    if node.is_Rational or node.is_Float or node is sympy.I:
        return False
    if node.is_Pow and not node.args[1].is_Integer:
        return True
    if node.is_Add or node.is_Mul or node.is_Pow:
        return any(holds_irrational(a) for a in node.args)
    return True


def _power_size(node, base, exp, env, depth) -> tuple[float, float] | None:
    """Size of ``base ** exp`` (``exp(x)`` is ``E ** x``)."""
    sb, se = _size(base, env, depth), _size(exp, env, depth)
    if se is None:  # an exponent in free variables: only the shape is checked
        if _tower(exp) + 1 > MAX_TOWER:
            raise _Refused
        return None
    e = _magnitude(exp, se)
    if e > MAX_EXPONENT:
        raise _Refused
    if (sb is None or holds_irrational(base)) and node.is_Pow and \
            _expanded_terms(node) > _pymath.log10(MAX_EXPANDED_TERMS):
        raise _Refused  # (x+1)^1000, (1+\sqrt{2})^{1000}: sympy expands it term by term
    if sb is None:
        return None
    if exp.is_Number and (exp >= 0 or base.is_Number):  # the sign of log10 |value| is known
        u = e * sb[0] * (1 if exp >= 0 else -1)
    else:  # 1 / base^e: base may be as small as its exact cost allows
        u = e * max(abs(sb[0]), sb[1])
    integer = exp.is_Integer or not exp.is_Number
    return _check(u, (e * sb[1] if integer else sb[1]) + se[1])


def _tower(node) -> int:
    """How many powers are stacked in exponents in ``node`` (``x^2``: 1, ``e^{x^2}``: 2)."""
    if node.is_Pow or _is_exp(node):
        exp = node.args[-1]
        return 1 + (0 if exp.is_Number else _tower(exp))
    return max((_tower(a) for a in node.args), default=0)


def _is_exp(node) -> bool:
    import sympy
    return isinstance(node, sympy.exp)


def _count_size(n, k, env, depth) -> tuple[float, float] | None:
    """Size of ``binomial(n, k)`` (rising / falling factorials alike). With numbers, ``min(k, n - k)`` factors of at
    most ``n``: its digits are bounded, not ``n`` (``binomial(2024, 2)`` is small, ``binomial(100000, 50000)`` has
    30,000 digits); with a variable ``n``, ``k`` is at most ``MAX_SYMBOLIC_COUNT`` (a product of ``k`` factors); with
    a variable ``k``, a number ``n`` is at most ``MAX_FACTORIAL_ARG``."""
    sn, sk = _size(n, env, depth), _size(k, env, depth)
    vn = None if sn is None else _magnitude(n, sn)
    vk = None if sk is None else _magnitude(k, sk)
    if vk is None:
        if (vn or 0) > MAX_FACTORIAL_ARG:
            raise _Refused
        return None
    if vn is None:
        if vk > MAX_SYMBOLIC_COUNT:
            raise _Refused
        return None
    factors = min(vk, max(vn - vk, 0.0)) if n.is_Integer else vk
    digits = factors * _pymath.log10(vn + 2.0) + 1.0
    return _check(digits, digits)


def _bounded_size(node, env, depth) -> tuple[float, float] | None:
    """Size of a sum, product or integral: its variables take the size of their bounds."""
    import sympy
    inner = dict(env)
    count = 1.0
    for limit in node.limits:
        var, bounds = limit[0], limit[1:]
        sizes = [_size(b, env, depth) for b in bounds]
        inner[var] = None
        if len(bounds) == 2 and None not in sizes:
            inner[var] = (max(s[0] for s in sizes), max(s[1] for s in sizes))
            lo, hi = (_magnitude(b, s) if b.is_Number else None for b, s in zip(bounds, sizes))
            span = abs(hi - lo) + 1 if lo is not None and hi is not None else 2 * _value_bound(inner[var][0]) + 1
            if not isinstance(node, sympy.Integral):
                if span > MAX_TERMS:
                    raise _Refused  # sympy may add or multiply every term
                count *= span
    s = _size(node.function, inner, depth)
    if s is None or None in inner.values():
        return None
    if isinstance(node, sympy.Product):
        return _check(s[0] * count, s[1] * count)
    largest = max((v[0] for v in inner.values() if v is not None), default=0.0)
    return _check(s[0] + _pymath.log10(count) + max(largest, 0.0), s[1] * count)


def _factorial_size(arg, env, depth) -> tuple[float, float] | None:
    s = _size(arg, env, depth)
    v = None if s is None else _magnitude(arg, s)
    if v is not None and v > MAX_FACTORIAL_ARG:
        raise _Refused
    return None if v is None else _check(v * _pymath.log10(v + 2.0) + 1.0, v * _pymath.log10(v + 2.0) + 1.0)


def _size(node, env: dict, depth: int = 0) -> tuple[float, float] | None:
    """``(magnitude, exact cost)`` bound of ``node``'s value (see the module docstring); None when it depends on
    free variables. Raises :class:`_Refused` when some sub-expression is too big."""
    import sympy
    if depth > MAX_DEPTH:
        raise _Refused
    depth += 1
    if node.is_Symbol:
        return env.get(node)
    if node is sympy.I:
        return 0.0, 0.0
    if node.is_Number or node.is_NumberSymbol:
        return _number_size(node)
    if node.is_Pow or _is_exp(node):
        base, exp = (node.args if node.is_Pow else (sympy.E, node.args[0]))
        return _power_size(node, base, exp, env, depth)
    if isinstance(node, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma)):
        return _factorial_size(node.args[0], env, depth)
    if isinstance(node, (sympy.binomial, sympy.RisingFactorial, sympy.FallingFactorial)):
        return _count_size(*node.args[:2], env, depth)
    if isinstance(node, (sympy.Sum, sympy.Product, sympy.Integral)):
        return _bounded_size(node, env, depth)
    if isinstance(node, (sympy.floor, sympy.ceiling, sympy.frac)) and node.args[0].is_number and \
            holds_irrational(node.args[0]) and _expanded_terms(node.args[0]) > _pymath.log10(MAX_ROUNDED_TERMS):
        raise _Refused  # near an integer, sympy decides the rounding by simplify, which expands the argument
    sizes = [_size(a, env, depth) if isinstance(a, sympy.Basic) else None for a in node.args]
    if None in sizes or not sizes:
        return None
    r = sum(s[1] for s in sizes)
    if node.is_Mul:
        return _check(sum(s[0] for s in sizes), r)
    if node.is_Add:
        return _check(max(s[0] for s in sizes) + _pymath.log10(len(sizes)), r)
    if isinstance(node, sympy.log):
        return _pymath.log10(max(max(abs(s[0]), s[1]) for s in sizes) * 2.31 + 1.0), r
    return max(s[0] for s in sizes), r


def is_tame(expr) -> bool:
    """True when a parsed (unevaluated) sympy object is small enough to compare safely.

    Rejects: more than 1000 tree nodes or 100 levels; an integer literal of more than 200 digits; any numeric
    sub-expression above 10^4 in magnitude (``log10 |value|``: ``e^{e^{e^{e}}}``, ``\\pi^{\\pi^{\\pi^{\\pi}}}``) or
    above 10^5 digits of exact numerator and denominator; a power with a numeric exponent above 10^4 in absolute value
    (``10^{-10^{5}}``); a factorial or Gamma of a number above 1000; a binomial or rising / falling factorial of numbers
    whose value has too many digits (``min(k, n - k) log10 n``), of a variable ``x`` with ``k`` above 50, or of a number
    above 1000 with a variable ``k``; a sum or product over more than 1000 numeric terms, whose variable otherwise takes
    the size of its bounds (``\\sum_{n=1}^{10} n^{n^{n}}`` is too big), as does an integral's; a power in variables, or
    of a sum of roots and constants, that expands to more than 300 terms (``(x+1)^{1000}``, ``(1+\\sqrt{2})^{1000}``,
    ``(1+\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{7})^{60}``; ``(x+1)^{200}``, ``(2x)^{150}`` and ``(2\\sqrt{3})^{1000}``
    pass); the floor or ceiling of a number with roots or constants that expands to more than 50 terms (``\\lceil
    (1+\\sqrt{2})^{250} \\rceil``); more than 2 powers stacked in exponents with a variable in them (``x^{x^{x^{x}}}``,
    ``2^{2^{2^{n}}}``); non-sympy objects other than str. Sizes are bounded from the parts, in floating point, without
    evaluating anything (see the module docstring for the measurements behind the limits). Never raises.
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


def unevaluated(expr) -> bool:
    """True when a parsed answer holds an operation left for sympy to carry out: an integral, a limit, a derivative,
    or a sum or product over infinitely many or a variable number of terms (``\\sum_{n=1}^{\\infty}``,
    ``\\sum_{k=1}^{n}``). Such an answer restates a question rather than answering it, and math-verify would carry it
    out (``Integral.doit``, then ``simplify``) on every comparison: ``\\int_0^1 \\sin(x^{x}) dx`` took 0.5-1.5 s,
    ``\\int_0^1 x^{x} \\cos(x^{x}) \\sin(x) dx`` over 1 s, ``\\sum_{n=1}^{\\infty} \\sin(n^{n})`` over 5 s and
    ``\\prod_{n=1}^{\\infty} (1+\\frac{1}{n^2})`` 0.8-1 s against ``1`` (sympy 1.13, one core; measured with the
    scorer's limit lifted). A sum or product over a fixed number of terms (``\\sum_{k=1}^{10} k``, bounds written as
    arithmetic too: ``\\sum_{k=1}^{10^2} k``) is arithmetic and stays evaluated (bounded by :func:`is_tame`). No
    MATH-500 answer holds any of these. Never raises."""
    try:
        import sympy
        if not isinstance(expr, sympy.Basic):
            return False
        if expr.atoms(sympy.Integral, sympy.Limit, sympy.Derivative):
            return True
        return any(len(lim) != 3 or not all(b.is_number and b.is_finite for b in lim[1:])
                   for node in expr.atoms(sympy.Sum, sympy.Product) for lim in node.limits)
    except Exception:
        return True


# an integral or limit command (not ``\\limits``, ``\\limsup``, ``\\interval``)
_UNEVALUATED_COMMANDS = _re.compile(r"\\(?:int|iint|iiint|iiiint|idotsint|oint|oiint|intop|smallint|lim)(?![a-zA-Z])")


def names_unevaluated(text: str) -> bool:
    """True when an answer's LaTeX writes an integral or a limit (``\\int``, ``\\iint``, ``\\oint``, ``\\lim``):
    read from the text, before parsing, since latex2sympy's parse of an integral alone takes 50-120 ms for each new
    answer (``\\int_0^{7} x^{x} \\cos(x^{x}) \\sin(x) dx``; 300 ms for a shape's first, warmed parser). The parsed
    forms, derivatives and unbounded sums included, are caught by :func:`unevaluated`."""
    return isinstance(text, str) and _UNEVALUATED_COMMANDS.search(text) is not None
