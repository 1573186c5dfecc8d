"""Bounds on the MATH scorer's time: checks that run before and after math-verify parses an answer, and a hard
time limit around the parse and comparison.

Why: math-verify parses LaTeX with latex2sympy, an ANTLR grammar in which plain groups (``{...}``, ``(...)``,
``[...]``, ``\\{...\\}``, subscripts) are ambiguous; each nested level makes ANTLR fall back to full-context
prediction, which is not cached, so the parse time grows steeply with the nesting depth (16 nested ``{`` took
minutes) while the text stays short. Then sympy evaluates what was parsed, which never finishes for
``9^{9^{9^{9}}}``. Four bounds, cheapest first:

1. :func:`collapse_braces` removes TeX-redundant braces (``{{x}}`` -> ``{x}``; braces around the whole answer),
   which change nothing in the typeset formula.
2. :func:`structure_ok` refuses answers nested deeper than ``MAX_NESTING`` groups of any kind, or
   ``MAX_PLAIN_NESTING`` plain groups (the ambiguous kinds above), or with more than ``MAX_BARS`` ``|`` bars
   (ambiguous too: a bar opens or closes), in one linear scan. Reference answers of MATH-500 nest at most 2
   groups deep. It also refuses big arguments of the commands that latex2sympy evaluates while it parses
   (``\\binom{100000}{50000}``, ``\\Gamma(3000000)``: :func:`evaluated_commands_ok`; ``\\gcd(2^{300000}-1, 3)``:
   :mod:`rewards.math_arguments`) and towers of more than ``MAX_TOWER`` stacked superscripts (``e^{e^{e^{e^{e}}}}``,
   ``x^x^x^x``: :func:`tower_height`) other than towers of integer literals with a small value (``2^{2^{2^{2}}}``).
3. :func:`is_tame` (:mod:`rewards.math_tame`) refuses parsed expressions that are too big to evaluate, measured
   from their parts without evaluating them (digits of every numeric part: ``e^{e^{e^{e}}}``; towers of powers
   in variables; factorial, binomial, sum and product bounds).
4. A pair that passes 3 can still make ``simplify(gold - pred)`` run for seconds (``(x+1)^{100}(x+2)^{100}``,
   ``\\sin^{200}(x)``): decided by values at random points first (:mod:`rewards.math_expand`), where they can.
   :func:`time_bound` stops what is left after ``timeout_seconds`` (``SIGALRM``, main thread only; no C code).

math-verify's own ``parsing_timeout``/``timeout_seconds`` are not used: whole seconds of ``signal.alarm``, which
replaces and cancels a caller's timer (the reward manager's), ending in an exception that math-verify catches.
"""
from __future__ import annotations

import math
import re
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from rewards.math_arguments import integer_arguments_ok
from rewards.math_tame import MAX_DIGITS, MAX_EXPONENT, MAX_FACTORIAL_ARG, MAX_SYMBOLIC_COUNT, MAX_TOWER, is_tame
from rewards.option_rules import ValueRule

__all__ = ["MAX_NESTING", "MAX_PLAIN_NESTING", "collapse_braces", "nesting_depths", "structure_ok", "is_tame",
           "evaluated_commands_ok", "tower_height", "MAX_TOWER",
           "ScorerTimeout", "TIME_LIMIT_RULE", "time_bound", "note_limit_hit", "take_limit_hits"]

MAX_NESTING = 6  # groups of any kind inside each other (\frac{\sqrt{x^{2}}}{2} is 3)
MAX_PLAIN_NESTING = 3  # plain groups: (, [, \{, \left, a brace that is no command's argument, a subscript
MAX_BARS = 8  # absolute-value / norm bars (|, \|, \vert, \lvert, \rvert, \mid), which open and close alike
_BARS = re.compile(r"\\(?:[lr]?[vV]ert|mid)(?![a-zA-Z])|\\\||\|")
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


# Commands that latex2sympy evaluates while it parses, in big-integer arithmetic that no time limit interrupts:
# binomials (``\\binom{100000}{50000}``, ``\\binom{x}{1000}``), Gamma, determinants.
_EVALUATED = re.compile(r"\\(?:[dt]?binom|choose|Gamma|det)(?![a-zA-Z])")
_MAX_DET_ENTRIES = 16  # a 4x4 determinant
# what an argument of an evaluated command may not hold: a factorial, a big operator, an evaluated command (checked
# apart), or a power of a number with a big value (10^{6}: the numbers are small, the value is not; checked apart)
_NOT_SMALL = re.compile(r"!|\\(?:sum|prod|int|lim)(?![a-zA-Z])")
_NUMBER_POWER = re.compile(r"([0-9.]+)\^(?:([0-9])|\{([^a-zA-Z{}]*)\})")  # a power of a number
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_INTEGER = re.compile(r"[0-9]+")
_ARG_COMMANDS = re.compile(r"\\([A-Za-z]+)")
_ONE_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|.", re.S)


def _argument(s: str, i: int, pairs: dict[int, int]) -> tuple[str, int]:
    """The argument of a command that ends before ``i``: a brace group, a parenthesised group or one token;
    ``(text, end)``."""
    while i < len(s) and s[i].isspace():
        i += 1
    if s.startswith("\\left", i):
        i += len("\\left")
    if i >= len(s):
        return "", i
    if s[i] == "{" and i in pairs:
        return s[i + 1:pairs[i]], pairs[i] + 1
    if s[i] == "(":
        depth = 0
        for j in range(i, len(s)):
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            if depth == 0:
                end = j - len("\\right") if s.endswith("\\right", 0, j) else j
                return s[i + 1:end], j + 1
        return s[i:], len(s)
    m = _ONE_TOKEN.match(s, i)
    return m.group(0), m.end()


def _power_digits(base: float, exponent: int) -> float:
    """Decimal digits of ``base ** exponent`` (``exponent * log10(base)``; 0 for a base of at most 1), not computed."""
    return exponent * math.log10(max(base, 1))


def _small(arg: str, limit: float) -> bool:
    """Whether an argument of an evaluated command is small: every number in it at most ``limit``, no factorial, big
    operator or evaluated command inside, and a power of a number only to an integer exponent with a value at most
    ``limit`` (``\\binom{2^5}{2}`` passes, ``\\binom{10^{6}}{2}`` does not). Fractions, powers and
    subscripts in variables, floors pass (``\\frac{1}{2}``, ``n^2``, ``2^n``, ``n_1``, ``\\lfloor n/2\\rfloor``): the
    parser keeps them symbolic or evaluates them cheaply."""
    arg = "".join(arg.split())
    if not arg:
        return True
    if _NOT_SMALL.search(arg) or any(float(n) > limit for n in _NUMBER.findall(arg)):
        return False
    for power in _NUMBER_POWER.finditer(arg):  # a power of a number: an integer exponent and a value <= limit
        exponent = power.group(2) or power.group(3)
        if not _INTEGER.fullmatch(exponent) or _power_digits(float(power.group(1) or 0), int(exponent)) > \
                math.log10(max(limit, 1)):
            return False
    return not any(_EVALUATED.fullmatch("\\" + c) for c in _ARG_COMMANDS.findall(arg))


def _binomial_ok(top: str, bottom: str) -> bool:
    """Whether the parser may evaluate ``binomial(top, bottom)``. Two integer literals: its ``min(k, n - k)`` factors
    give at most ``MAX_DIGITS`` digits (``\\binom{2024}{2}`` passes, ``\\binom{100000}{50000}`` with 30,000 digits
    does not); a numeric top is otherwise at most ``MAX_FACTORIAL_ARG``, and a top with a variable chooses at most
    ``MAX_SYMBOLIC_COUNT``."""
    top, bottom = "".join(top.split()), "".join(bottom.split())
    if _INTEGER.fullmatch(top) and _INTEGER.fullmatch(bottom):
        n, k = int(top), int(bottom)
        return min(k, max(n - k, 0)) * math.log10(n + 2) <= MAX_DIGITS
    variable = not _NUMBER.fullmatch(top)
    return _small(top, MAX_FACTORIAL_ARG) and _small(bottom, MAX_SYMBOLIC_COUNT if variable else MAX_FACTORIAL_ARG)


def evaluated_commands_ok(s: str) -> bool:
    """Whether the commands that the parser evaluates while parsing have small arguments: ``\\binom`` (``\\dbinom``,
    ``\\tbinom``, ``{n \\choose k}``) by :func:`_binomial_ok` (``\\binom{2024}{2}``, ``\\binom{2n}{n}``,
    ``\\binom{n^2}{2}``; not ``\\binom{100000}{50000}`` nor ``\\binom{10^{6}}{3}``), ``\\Gamma`` of arguments with
    numbers at most 1000 (:func:`_small`: ``\\Gamma(5)``, ``\\Gamma(\\frac{1}{2})``; not ``\\Gamma(3000000)``);
    ``\\det`` of at most 16 entries. Quadratic time at worst (the scorer checks answers of at most
    ``MAX_ANSWER_CHARS`` characters)."""
    pairs = _brace_pairs(s)
    for m in _EVALUATED.finditer(s):
        name = m.group(0)[1:]
        if name == "det":
            rest = s[m.end():]
            if rest.count("&") + rest.count("\\\\") + 1 > _MAX_DET_ENTRIES:
                return False
            continue
        if name == "choose":  # {n \choose k}: the enclosing group
            opens = [i for i, j in pairs.items() if i < m.start() and j > m.start()]
            group = s[max(opens) + 1:pairs[max(opens)]] if opens else s
            top, _, bottom = group.partition(m.group(0))
        elif name == "Gamma":  # the function; a bare \Gamma is a letter
            if not re.match(r"\s*(?:[({]|\\left)", s[m.end():]):
                continue
            if not _small(_argument(s, m.end(), pairs)[0], MAX_FACTORIAL_ARG):
                return False
            continue
        else:
            top, end = _argument(s, m.end(), pairs)
            bottom = _argument(s, end, pairs)[0]
        if not _binomial_ok(top, bottom):
            return False
    return True


def _superscript_end(s: str, i: int, pairs: dict[int, int]) -> int:
    """Where the argument of the ``^`` at ``i`` (a brace group or one token) and the spaces after it end."""
    j = len(s) - len(s[i + 1:].lstrip())
    if j < len(s):
        j = pairs[j] + 1 if s[j] == "{" and j in pairs else _ONE_TOKEN.match(s, j).end()
    return len(s) - len(s[j:].lstrip())


def tower_height(s: str) -> int:
    """How many superscripts are stacked in ``s``: ``x^2`` is 1, ``2^{2^{n}}`` 2, ``9^{9^{9^{9}}}`` 3 (a superscript
    group holding a ``^`` holding a ``^``); a chain of superscripts without braces stacks as well (``x^x^x^x``: 3,
    the parser nests it). One linear scan."""
    pairs = _brace_pairs(s)
    stack: list[int] = []  # per open group: the height it adds (a superscript group: its chain's length)
    chains: list[tuple[int, int]] = [(-1, 0)]  # per group: (where a chained ^ would stand, the chain's length)
    height, highest, prev = 0, 0, ""
    for m in _TOKENS.finditer(s):
        tok = m.group(0)
        if tok == "^":
            at, length = chains[-1]
            length = length + 1 if m.start() == at else 1
            chains[-1] = (_superscript_end(s, m.start(), pairs), length)
            highest = max(highest, height + length)
        elif tok == "{":
            stack.append(chains[-1][1] if prev == "^" else 0)
            height += stack[-1]
            chains.append((-1, 0))
        elif tok == "}" and stack:
            height -= stack.pop()
            chains.pop()
        prev = tok
    return highest


# a tower of integer literals: 2^{2^{2^{2}}}, 2^2^2 (each exponent one digit or a braced tower)
_LITERAL_TOWER = re.compile(r"[0-9]+(?:\s*\^\s*(?:\{\s*[0-9]+|[0-9]))+")  # its closing braces: _tower_end
_CLOSING = re.compile(r"\s*\}")


def _tower_value_ok(tower: str) -> bool:
    """Whether a tower of integer literals has a small value: from the top down, every exponent at most
    ``MAX_EXPONENT`` and the value at most ``MAX_DIGITS`` digits (``2^{2^{2^{2}}}`` = 65536 passes,
    ``9^{9^{9^{9}}}`` does not: its second exponent already has 369,693,100 digits)."""
    numbers = [int(n) for n in _INTEGER.findall(tower)]
    exponent = numbers[-1]
    for base in reversed(numbers[:-1]):
        if exponent > MAX_EXPONENT or _power_digits(base, exponent) > MAX_DIGITS:
            return False
        exponent = base ** exponent
    return True


def _towers_ok(s: str) -> bool:
    """At most ``MAX_TOWER`` superscripts stacked (:func:`tower_height`), once towers of integer literals with a
    small value (:func:`_tower_value_ok`) are set aside."""
    if tower_height(s) <= MAX_TOWER:
        return True
    rest, last = [], 0
    for m in _LITERAL_TOWER.finditer(s):
        end = _tower_end(s, m)
        if end < 0 or not _tower_value_ok(s[m.start():end]):
            return False
        rest.append(s[last:m.start()] + "0")
        last = end
    return tower_height("".join(rest) + s[last:]) <= MAX_TOWER


def _tower_end(s: str, m: re.Match) -> int:
    """Where the tower ``m`` of :data:`_LITERAL_TOWER` ends: after one closing brace per brace it opened (the
    braces of a group around it stay outside); -1 when they are not all closed."""
    end = m.end()
    for _ in range(m.group(0).count("{")):
        close = _CLOSING.match(s, end)
        if close is None:
            return -1
        end = close.end()
    return end


def structure_ok(s: str) -> bool:
    """True when ``s`` nests at most ``MAX_NESTING`` groups, at most ``MAX_PLAIN_NESTING`` of them plain
    (:func:`nesting_depths`), has at most ``MAX_BARS`` bars, no digit run longer than 200, at most ``MAX_TOWER``
    superscripts stacked (:func:`tower_height`: ``x^{x^{x^{x}}}``, ``e^{e^{e^{e^{e}}}}``, ``9^{9^{9^{9}}}`` are
    refused; their values have no bound, and parsing them alone costs more than refusing) unless the tower is of
    integer literals with a small value (:func:`_towers_ok`: ``2^{2^{2^{2}}}``), and the commands that the parser
    evaluates have small arguments (:func:`evaluated_commands_ok`; ``\\gcd``, ``\\lcm``:
    :func:`rewards.math_arguments.integer_arguments_ok`). Never raises."""
    if not isinstance(s, str) or re.search(r"[0-9]{%d}" % (_MAX_DIGIT_RUN + 1), s) or len(_BARS.findall(s)) > MAX_BARS:
        return False
    deepest, deepest_plain = nesting_depths(s)
    return (deepest <= MAX_NESTING and deepest_plain <= MAX_PLAIN_NESTING and _towers_ok(s)
            and evaluated_commands_ok(s) and integer_arguments_ok(s))


def _finite_positive(value) -> bool:
    try:
        return not isinstance(value, bool) and math.isfinite(value) and value > 0
    except TypeError:
        return False


#: what a time limit in seconds (the MATH scorer's ``timeout_seconds``) may be: a finite number > 0, or None for no
#: limit. 0, a negative number, inf or nan are refused (ValueError; before start-up as a scorer option): 0 and a
#: negative number meant no limit, and nan made every comparison end at once and score 0.
TIME_LIMIT_RULE = ValueRule(_finite_positive, "a finite number of seconds > 0, or null (None) for no limit")


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
    signals cannot be used, or when ``seconds`` is None. Raises ValueError for any other ``seconds`` than None or a
    finite number > 0 (:data:`TIME_LIMIT_RULE`). Python code is interrupted between bytecodes; a
    single long C call (big-integer arithmetic) is not.
    """
    TIME_LIMIT_RULE.check("timeout_seconds", seconds)
    if (seconds is None or threading.current_thread() is not threading.main_thread()
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
    old = signal.getsignal(signal.SIGALRM)
    try:  # armed inside: a limit that passes before the block starts still ends disarmed, the handler restored
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds, 0.005)
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_delay:
            left = outer_delay - (time.monotonic() - t0)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), outer_interval)
