"""Bounds on the MATH scorer's time: checks that run before and after math-verify parses an answer, and a hard
time limit around the parse and comparison.

Why: math-verify parses LaTeX with latex2sympy, an ANTLR grammar in which plain groups (``{...}``, ``(...)``,
``[...]``, ``\\{...\\}``, subscripts) are ambiguous; each nested level makes ANTLR fall back to full-context
prediction, which is not cached, so the parse time grows steeply with the nesting depth (16 nested ``{`` took
minutes) while the text stays short. Then sympy evaluates what was parsed, which never finishes for
``9^{9^{9^{9}}}``. Three bounds, cheapest first:

1. :func:`collapse_braces` removes TeX-redundant braces (``{{x}}`` -> ``{x}``; braces around the whole answer),
   which change nothing in the typeset formula.
2. :func:`structure_ok` refuses answers nested deeper than ``MAX_NESTING`` groups of any kind, or
   ``MAX_PLAIN_NESTING`` plain groups (the ambiguous kinds above), or with more than ``MAX_BARS`` ``|`` bars
   (ambiguous too: a bar opens or closes), in one linear scan. Reference answers of MATH-500 nest at most 2
   groups deep.
3. :func:`is_tame` refuses parsed expressions that are too big to evaluate (node count, exponents, digits,
   factorial arguments), and :func:`time_bound` stops whatever is left after ``timeout_seconds`` (a ``SIGALRM``
   timer, main thread only; it cannot interrupt C code, which is why 1-3 come first).

math-verify's own ``parsing_timeout``/``timeout_seconds`` are not used: they are whole seconds of
``signal.alarm``, which replaces and then cancels a caller's timer (the reward manager's), and they end with an
exception that math-verify itself catches, so the parse goes on.
"""
from __future__ import annotations

import math as _pymath
import re
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["MAX_NESTING", "MAX_PLAIN_NESTING", "collapse_braces", "nesting_depths", "structure_ok", "is_tame",
           "ScorerTimeout", "time_bound", "note_limit_hit", "take_limit_hits"]

MAX_NESTING = 6  # groups of any kind inside each other (\frac{\sqrt{x^{2}}}{2} is 3)
MAX_PLAIN_NESTING = 3  # plain groups: (, [, \{, \left, a brace that is no command's argument, a subscript
MAX_BARS = 8  # absolute-value / norm bars (|, \|, \vert, \lvert, \rvert, \mid), which open and close alike
_BARS = re.compile(r"\\(?:[lr]?[vV]ert|mid)(?![a-zA-Z])|\\\||\|")
_MAX_NODES = 1000  # sympy tree size
_MAX_EXPONENT = 10_000  # |exponent| of any power with a numeric exponent
_MAX_DIGITS = 10_000  # log10 |base ** exponent| for numeric bases
_MAX_FACTORIAL_ARG = 1000
_MAX_DIGIT_RUN = 200  # digits in one literal

# one token: \left / \right with its delimiter, an escaped brace, a command name, any other escape, a bracket,
# or a superscript / subscript mark
_TOKENS = re.compile(r"\\left\s*(?:\\[a-zA-Z]+|\\.|.)|\\right\s*(?:\\[a-zA-Z]+|\\.|.)|\\[{}]|\\[a-zA-Z]+|\\.|"
                     r"[{}()\[\]^_]", re.S)
_OPEN, _CLOSE = frozenset("([") | {"\\{"}, frozenset(")]") | {"\\}"}


def _brace_pairs(s: str) -> dict[int, int]:
    """Positions of matching unescaped ``{`` -> ``}`` (unmatched ones are left out). Linear time."""
    pairs, stack, i, n = {}, [], 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def collapse_braces(s: str) -> str:
    """Remove braces that TeX typesets as nothing: a brace group whose whole content is one brace group
    (``{{x}}`` -> ``{x}``, any depth) and braces around the whole answer (``{x+1}`` -> ``x+1``). Linear time;
    never raises (non-str input is returned as it is)."""
    if not isinstance(s, str) or "{" not in s:
        return s
    pairs = _brace_pairs(s)
    drop = set()
    for i, j in pairs.items():
        if pairs.get(i + 1) == j - 1:  # {{...}}: the outer pair adds nothing
            drop.update((i, j))
    out = "".join(c for k, c in enumerate(s) if k not in drop) if drop else s
    while out.startswith("{") and _brace_pairs(out).get(0) == len(out) - 1:
        out = out[1:-1]
    return out


def nesting_depths(s: str) -> tuple[int, int]:
    """``(deepest nesting of groups of any kind, deepest nesting of plain groups)`` in the LaTeX text ``s``.

    Plain groups are ``(``, ``[``, ``\\{``, ``\\left<delim>``, subscripts ``_{...}`` and braces that do not follow a
    command name, ``^`` or a closing brace (an argument). Closers of any kind close the innermost group
    (``[1,2)`` is one group). One linear scan.
    """
    stack: list[bool] = []  # True: plain group
    depth = plain = deepest = deepest_plain = 0
    prev = ""
    for m in _TOKENS.finditer(s):
        tok = m.group(0)
        opener = tok in _OPEN or tok == "{" or (tok.startswith("\\left") and not tok.endswith("."))
        closer = tok in _CLOSE or tok == "}" or (tok.startswith("\\right") and not tok.endswith("."))
        if opener:
            is_plain = tok != "{" or not (prev == "^" or prev == "}" or (prev.startswith("\\") and prev[1:].isalpha()))
            stack.append(is_plain)
            depth += 1
            plain += is_plain
            deepest, deepest_plain = max(deepest, depth), max(deepest_plain, plain)
        elif closer and stack:
            plain -= stack.pop()
            depth -= 1
        prev = tok
    return deepest, deepest_plain


def structure_ok(s: str) -> bool:
    """True when ``s`` nests at most ``MAX_NESTING`` groups, at most ``MAX_PLAIN_NESTING`` of them plain
    (:func:`nesting_depths`), has at most ``MAX_BARS`` bars and no digit run longer than 200. Never raises."""
    if not isinstance(s, str) or re.search(r"[0-9]{%d}" % (_MAX_DIGIT_RUN + 1), s):
        return False
    if len(_BARS.findall(s)) > MAX_BARS:
        return False
    deepest, deepest_plain = nesting_depths(s)
    return deepest <= MAX_NESTING and deepest_plain <= MAX_PLAIN_NESTING


def _abs_float(expr) -> float | None:
    """|expr| as a float (inf when too large); None if not a finite/infinite real-or-complex number."""
    try:
        v = expr.evalf(15)
        return float(abs(complex(v)))
    except OverflowError:
        return _pymath.inf
    except Exception:
        return None


def _node_ok(node, big_funcs) -> bool:
    if getattr(node, "is_Integer", False) and node.p.bit_length() > 3.33 * _MAX_DIGIT_RUN:
        return False
    if getattr(node, "is_Pow", False):
        base, exp = node.args
        if exp.free_symbols:
            return True
        e = _abs_float(exp)
        if e is None or e > _MAX_EXPONENT:
            return False
        if not base.free_symbols:
            b = _abs_float(base)
            if b is None or (b > 1 and e * _pymath.log10(b) > _MAX_DIGITS):
                return False
    elif isinstance(node, big_funcs):
        for a in node.args:
            if not a.free_symbols:
                v = _abs_float(a)
                if v is None or v > _MAX_FACTORIAL_ARG:
                    return False
    return True


def is_tame(expr) -> bool:
    """True when a parsed (unevaluated) sympy object is small enough to compare safely.

    Rejects: more than 1000 tree nodes; an integer literal of more than 200 digits; a power with a numeric
    exponent above 10^4 in size, or with a numeric base whose value would have more than 10^4 digits;
    factorial-like functions of a number above 1000; non-sympy objects other than str. Each numeric
    sub-expression is evaluated (``evalf``, floats) only after all of its own sub-expressions passed, so the
    check itself stays cheap. Never raises.
    """
    try:
        import sympy
        from sympy import Basic, MatrixBase, postorder_traversal
    except Exception:
        return False
    if isinstance(expr, str):
        return True
    if isinstance(expr, MatrixBase) and not isinstance(expr, Basic):
        return len(expr) <= _MAX_NODES and all(is_tame(e) for e in expr)
    if not isinstance(expr, Basic):
        return False
    big_funcs = (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.binomial, sympy.gamma,
                 sympy.RisingFactorial, sympy.FallingFactorial)
    try:
        for count, node in enumerate(postorder_traversal(expr)):
            if count > _MAX_NODES or not _node_ok(node, big_funcs):
                return False
    except Exception:
        return False
    return True


class ScorerTimeout(BaseException):
    """Raised by :func:`time_bound` when its time is up. A ``BaseException``, so that the libraries' own
    ``except Exception`` blocks do not swallow it; catch it where the bounded work is called (and record it there
    with :func:`note_limit_hit`)."""


# The limits (seconds) of the comparisons that the scorer's own bound (time_bound) ended since the last
# take_limit_hits(), in this process. A comparison cut short scores 0 like a wrong answer (verl does the same), so the
# scorer's return value cannot tell them apart: the reward manager takes these around each scorer call (in its scoring
# processes too, which send them back with the outcome) and counts the responses in ``reward/num_scorer_timeouts``.
_LIMIT_HITS: list[float] = []


def note_limit_hit(seconds: float | None) -> None:
    """Record that a comparison did not finish within the scorer's own limit of ``seconds`` (its
    ``timeout_seconds``) and was scored as not equal."""
    _LIMIT_HITS.append(float(seconds) if seconds is not None else float("nan"))


def take_limit_hits() -> list[float]:
    """The limits recorded by :func:`note_limit_hit` since the last call (one entry per comparison cut short), and
    forget them."""
    hits = list(_LIMIT_HITS)
    _LIMIT_HITS.clear()
    return hits


@contextmanager
def time_bound(seconds: float | None) -> Iterator[None]:
    """Raise :class:`ScorerTimeout` in the enclosed block once ``seconds`` (wall clock) have passed.

    A ``SIGALRM`` interval timer that fires every 5 ms after the first time, until the block ends (so a swallowed
    exception is raised again). An enclosing timer of the caller (``ITIMER_REAL``, e.g. the reward manager's
    in-process limit) is kept: if it is due first it is left alone, otherwise it is re-armed with its remaining
    time afterwards and its handler restored. No bound (the block just runs) outside the main thread, where
    signals cannot be used, or when ``seconds`` is None or <= 0. Python code is interrupted between bytecodes; a
    single long C call (big-integer arithmetic) is not.
    """
    if (not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "setitimer")):
        yield
        return
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if outer_delay and outer_delay <= seconds:
        yield
        return
    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:
            raise ScorerTimeout(f"past {seconds} s")

    t0 = time.monotonic()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.005)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_delay:
            left = outer_delay - (time.monotonic() - t0)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), outer_interval)
