"""The ``calculator`` tool: exact arithmetic on integers and decimals, evaluated from a parsed syntax tree.

The expression is parsed with :func:`ast.parse` (``mode="eval"``) and walked over a whitelist of node types:
numbers, ``+ - * / // % **``, unary ``+ -``, parentheses and the functions ``abs``, ``round``, ``min``,
``max``, ``sqrt``. Names, attributes, calls of anything else, subscripts, comprehensions and strings are
refused, so no code runs. Integers are exact and of any size up to :data:`MAX_DIGITS` digits; decimals are
:class:`fractions.Fraction` (``0.1 + 0.2`` is exactly ``0.3``), printed as an integer when whole and as a decimal
rounded to 12 significant digits otherwise. Powers are bounded before they are computed (the result's size is
estimated from the operands), so ``9**9**9`` is refused instantly instead of running for hours.
"""
from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from rollout.tools.base import Tool, ToolError

__all__ = ["CalculatorTool", "evaluate", "MAX_DIGITS", "MAX_EXPRESSION_CHARS", "MAX_NESTING"]

MAX_DIGITS = 4000  # Python refuses int -> str beyond 4300 digits by default
MAX_EXPRESSION_CHARS = 2000
MAX_NESTING = 600  # nesting deeper than this is refused, whatever sys.getrecursionlimit() is
_MAX_BITS = int(MAX_DIGITS * math.log2(10))
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def _bits(x: Fraction) -> int:
    """Bits of the larger of numerator and denominator of ``x``."""
    return max(abs(x.numerator).bit_length(), x.denominator.bit_length())


def _check_size(x: Fraction) -> Fraction:
    if _bits(x) > _MAX_BITS:
        raise ToolError(f"result has more than {MAX_DIGITS} digits")
    return x


def _sqrt(x: Fraction) -> Fraction:
    if x < 0:
        raise ToolError("sqrt of a negative number")
    if x.denominator == 1:
        r = math.isqrt(x.numerator)
        if r * r == x.numerator:
            return Fraction(r)
    return Fraction(math.sqrt(x))


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        if exp == Fraction(1, 2):
            return _sqrt(base)
        raise ToolError("only integer exponents (and ** 0.5) are supported")
    e = exp.numerator
    if base == 0 and e < 0:
        raise ToolError("division by zero (0 raised to a negative power)")
    if abs(base) not in (0, 1) and abs(e) * (_bits(base) - 1) > _MAX_BITS:
        raise ToolError(f"power too large: the result would have more than {MAX_DIGITS} digits")
    return base ** e


def _round(x: Fraction, ndigits: Fraction | None = None) -> Fraction:
    if ndigits is None:
        return Fraction(round(x))
    if ndigits.denominator != 1 or abs(ndigits.numerator) > 100:
        raise ToolError("round(x, n) needs an integer n with |n| <= 100")
    return Fraction(round(x, int(ndigits)))


_FUNCS = {"abs": (abs, 1, 1), "round": (_round, 1, 2), "min": (min, 1, 64), "max": (max, 1, 64),
          "sqrt": (_sqrt, 1, 1)}


def _depth(tree: ast.AST) -> int:
    """Nesting depth of ``tree``, walked with an explicit stack (no recursion)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _check_size(_power(_eval(node.left), _eval(node.right)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        out = _BINOPS[type(node.op)](left, right)
        return _check_size(Fraction(out))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and \
            not node.keywords:
        fn, lo, hi = _FUNCS[node.func.id]
        if not lo <= len(node.args) <= hi:
            raise ToolError(f"{node.func.id}() takes {lo}..{hi} arguments, got {len(node.args)}")
        return Fraction(fn(*(_eval(a) for a in node.args)))
    raise ToolError(f"unsupported syntax: {type(node).__name__} (numbers, + - * / // % **, parentheses and "
                    f"{', '.join(sorted(_FUNCS))} only)")


def _format(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.12g}" if _bits(x) < 1000 else str(x)


def evaluate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly; returns the result as text (``"12"``, ``"0.3"``).

    ``^`` is read as a power (``2^10`` = 1024) and thousands separators ``1,000`` are not accepted (a comma
    separates function arguments).

    Raises:
        ToolError: a syntax error, a refused construct, division by zero, nesting deeper than ``MAX_NESTING``, or a
            result beyond ``MAX_DIGITS``.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
        if _depth(tree) > MAX_NESTING:
            raise ToolError(f"expression nested too deeply (more than {MAX_NESTING} levels)")
        return _format(_eval(tree))
    except SyntaxError as exc:
        raise ToolError(f"cannot parse expression: {exc.msg}") from None
    except (OverflowError, ValueError, ZeroDivisionError) as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from None
    except (RecursionError, MemoryError):
        raise ToolError("expression nested too deeply") from None


class CalculatorTool(Tool):
    """``calculator(expression: str) -> str``: exact arithmetic (see :func:`evaluate`), no code execution."""

    name = "calculator"
    description = ("Evaluate an arithmetic expression exactly. Supports integers of any size, decimals, "
                   "+ - * / // % ** and parentheses, and abs, round, min, max, sqrt.")
    parameters = {"type": "object",
                  "properties": {"expression": {"type": "string",
                                                "description": "the expression, e.g. 123456789 * 987654321"}},
                  "required": ["expression"]}
    timeout_s = 5.0

    def call(self, args: dict) -> str:
        """Evaluate ``args["expression"]``. Raises ToolError (message for the model) on a bad expression."""
        return evaluate(args["expression"])
