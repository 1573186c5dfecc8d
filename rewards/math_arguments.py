"""Bounds, read from the answer's text before it is parsed, on the arguments of ``\\gcd`` and ``\\lcm``: the check of
:func:`rewards.math_guards.structure_ok` for the integer functions that latex2sympy evaluates while it parses.

latex2sympy carries out ``\\gcd(a, b)`` and ``\\lcm(a, b)`` (``\\operatorname{gcd}``, ``\\operatorname{lcm}``) as it
builds the parse: ``nsimplify`` of each argument, then sympy's ``gcd`` / ``lcm`` of the values, in big-integer and
polynomial arithmetic that no time limit interrupts, before :func:`rewards.math_tame.is_tame` sees anything.
``\\gcd(2^{300000}-1, 3^{200000}-1)`` (arguments of 90,000 digits) took 2.5-3 s to parse and held a scoring call for
its whole 1 s limit. Measured (parse of a new answer, sympy's cache cleared; about 22 ms for any ``\\gcd`` of small
numbers): integers of 3,000 digits in all add at most 10 ms; polynomials cost more per degree,
``\\operatorname{lcm}(x^{d}-1, x^{d-1}-1)`` adds 12 ms at ``d = 100``, 24 ms at 200, 38 ms at 300 and 130 ms at 600.
Hence :func:`argument_digits`, an upper bound of the digits of the arguments' values in which a letter counts as
``_LETTER_DIGITS`` digits (``_SEVERAL_LETTERS_DIGITS`` in arguments of two or more variables, whose gcd is
multivariate: ``\\gcd((x+y+z)^{15}-1, (x+y+z+1)^{15}-1)`` took 1.4 s), at most ``MAX_ARGUMENT_DIGITS`` (univariate
degrees up to about 600 in all: ``\\gcd(x^{300}-1, x^{200}-1)`` 35 ms); factorials, sums,
products and the commands that the parser evaluates (``\\binom``, ``\\Gamma``) are not allowed in an argument.
MATH-500 has no ``\\gcd`` or ``\\lcm`` answer.
"""
from __future__ import annotations

import math
import re
import string

__all__ = ["MAX_ARGUMENT_DIGITS", "argument_digits", "integer_arguments_ok"]

MAX_ARGUMENT_DIGITS = 3000  # digits of all the arguments of one \gcd / \lcm together
_LETTER_DIGITS = 5.0  # what a letter or command counts: a polynomial costs more per degree than an integer per digit
_SEVERAL_LETTERS_DIGITS = 100.0  # ... in arguments of two or more variables, where the gcd is multivariate
_COMMAND_NAME = re.compile(r"\\[a-zA-Z]+")
_GREEK = re.compile(r"\\(?:alpha|beta|gamma|delta|theta|lambda|mu|omega|phi|psi)(?![a-zA-Z])")
_COMMANDS = re.compile(r"\\(?:gcd|lcm)(?![a-zA-Z])|\\operatorname\*?\s*\{\s*(?:gcd|lcm)\s*\}")
# a number, a command name, an escaped character, a group mark or any other character
_TOKEN = re.compile(r"[0-9]+(?:\.[0-9]*)?|\\[a-zA-Z]+\*?|\\.|\s+|.", re.S)
_ARITHMETIC = re.compile(r"\\(?:[dt]?frac|sqrt|cdot|times|div|left|right)(?![a-zA-Z])")  # no variable in them
_REFUSED = re.compile(r"!|\\(?:sum|prod|int|lim|[dt]?binom|choose|Gamma|det)(?![a-zA-Z])")
_OPENERS, _CLOSERS = frozenset("({["), frozenset(")}]")
_NOTHING = frozenset(("\\left", "\\right", "\\cdot", "\\times", "\\div", "\\,", "\\;", "\\!", "\\ ", "\\quad"))


def _exponent(tokens: list[str], i: int) -> tuple[str, int]:
    """The text of the superscript (subscript) whose ``^`` (``_``) is at ``tokens[i]`` (a brace group or one token),
    and the index after it."""
    i += 1
    while i < len(tokens) and tokens[i].isspace():
        i += 1
    if i >= len(tokens) or tokens[i] != "{":
        return ("".join(tokens[i:i + 1]), i + 1)
    depth, j = 0, i
    for j in range(i, len(tokens)):
        depth += (tokens[j] == "{") - (tokens[j] == "}")
        if depth == 0:
            break
    return "".join(tokens[i + 1:j]), j + 1


def _power(digits: float, exponent: str) -> float:
    """Digits of a value of ``digits`` digits raised to ``exponent`` (text): an integer literal multiplies them; with a
    letter in it (a variable, a constant) by the value of its numbers, letters taken as 1 (``2^{n+300000}`` and
    ``2^{3000000 n}`` are powers of ``2^{n}`` and ``2`` of such degrees); any other by 10 to its own digits
    (``2^{2^{20}}``, ``2^{\\frac{600}{2}}``)."""
    text = "".join(exponent.split()).lstrip("+-")
    if text.isdigit():
        return digits * int(text) if len(text) < 300 else math.inf
    letter = 0.0 if re.search(r"[a-zA-Z]", _ARITHMETIC.sub("", text)) else _LETTER_DIGITS
    return digits * 10.0 ** min(argument_digits(text, letter), 300.0)


def argument_digits(text: str, letter: float = _LETTER_DIGITS) -> float:
    """An upper bound of the decimal digits of the value of the LaTeX arithmetic ``text`` (numbers combined by sums,
    products, fractions, roots and powers), each letter or command counted as a number of ``letter`` digits (a
    polynomial's degree costs more than an integer's digits). inf for a factorial, a sum, product, integral or limit,
    or a command that the parser evaluates (``\\binom``, ``\\Gamma``, ``\\det``); a float, inf past the float range.
    Raises RecursionError only for superscripts nested past Python's recursion limit."""
    if _REFUSED.search(text):
        return math.inf
    tokens = _TOKEN.findall(text)
    stack: list[list[float]] = [[]]  # per open group: the digits of its items so far
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("^", "_"):  # a superscript raises the last item to its power; a subscript is part of a name
            exponent, i = _exponent(tokens, i)
            if tok == "^" and stack[-1]:
                stack[-1][-1] = _power(stack[-1][-1], exponent)
            continue
        if tok in _OPENERS:
            stack.append([])
        elif tok in _CLOSERS and len(stack) > 1:
            group = stack.pop()
            stack[-1].append(sum(group))
        elif tok[0].isdigit():
            whole, _, fraction = tok.partition(".")
            stack[-1].append(math.log10(max(int(whole[:15]), 1)) + max(len(whole) - 15, 0) + len(fraction))
        elif (tok[0].isalpha() or tok.startswith("\\")) and tok not in _NOTHING:
            stack[-1].append(letter)
        i += 1
    return sum(sum(group) for group in stack)


def _argument(s: str, i: int) -> str:
    """The argument of a command that ends at ``i``: a parenthesised or braced group (``\\left(...\\right)`` too), or
    the rest of ``s``."""
    j = i + len(s[i:]) - len(s[i:].lstrip())
    if s.startswith("\\left", j):
        j += len("\\left")
    if j >= len(s) or s[j] not in "({":
        return s[i:]
    opener, closer, depth = s[j], ")" if s[j] == "(" else "}", 0
    for k in range(j, len(s)):
        depth += (s[k] == opener) - (s[k] == closer)
        if depth == 0:
            return s[j + 1:k]
    return s[j + 1:]


def _letter_digits(arg: str) -> float:
    """What one letter of the arguments ``arg`` counts: a multivariate gcd (two or more distinct variables) costs far
    more per degree than a univariate one (``\\gcd((x+y+z)^{15}-1, (x+y+z+1)^{15}-1)`` took 1.4 s)."""
    names = set(_COMMAND_NAME.sub(" ", arg)) & set(string.ascii_letters) | set(_GREEK.findall(arg))
    return _SEVERAL_LETTERS_DIGITS if len(names) > 1 else _LETTER_DIGITS


def integer_arguments_ok(s: str) -> bool:
    """Whether every ``\\gcd`` / ``\\lcm`` of the LaTeX answer ``s`` has arguments of at most ``MAX_ARGUMENT_DIGITS``
    digits in all (:func:`argument_digits`): ``\\gcd(12, 18)``, ``\\gcd(2^{1000}-1, 2^{600}-1)``, ``\\gcd(x^2-1, x-1)``
    pass; ``\\gcd(2^{300000}-1, 3^{200000}-1)``, ``\\operatorname{lcm}(2^{2^{20}}, 3)``, ``\\gcd(x^{100000}-1, x-1)``,
    ``\\gcd(100!, 3)`` do not. Quadratic time at worst (the scorer checks answers of at most ``MAX_ANSWER_CHARS``
    characters). Never raises (non-str input: False)."""
    if not isinstance(s, str):
        return False
    try:
        return all(argument_digits(arg, _letter_digits(arg)) <= MAX_ARGUMENT_DIGITS
                   for arg in (_argument(s, m.end()) for m in _COMMANDS.finditer(s)))
    except RecursionError:  # superscripts nested past Python's recursion limit
        return False
