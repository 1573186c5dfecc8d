"""Rule scorer for GSM8K-style answers (``... #### 42``), also used for SVAMP and the synthetic digits task.

Answer format (GSM8K, Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems"): the reference
solution ends with a line ``#### <number>``; numbers may carry thousands separators (``#### 1,000``).

Two extraction methods, with the same names as verl's ``gsm8k.compute_score``:

* ``strict``: the number right after the LAST well-formed ``#### N`` marker anywhere in the text (the whole
  text is searched: a model that keeps writing after its marker still gets credit).
* ``flexible``: the last number anywhere in the text.

All scans are linear in the text length: markers are found with ``str.rfind`` and numbers with regexes
that have no nested or overlapping quantifiers, so there is no catastrophic backtracking; a 1 MB response
scores in milliseconds. Answers are compared as exact decimals (``fractions.Fraction``), so ``42.0 == 42``.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

__all__ = ["extract_solution", "normalize_number", "numbers_equal", "compute_score", "TOOL_RESPONSE_END",
           "final_answer_text"]

_MARKER = "####"
# The end of a tool answer in Hermes/Qwen chat templates (``<tool_response>...</tool_response>``): plain text, so
# it survives decoding with ``skip_special_tokens=True``.
TOOL_RESPONSE_END = "</tool_response>"
# Longest number we accept (characters, commas included). Longer digit runs are junk, and Python refuses
# int() on more than 4300 digits anyway.
_MAX_NUMBER_CHARS = 200

# A marker, then optional spaces, sign and currency in either order (``-$3``, ``$-3``), then the number.
# Every quantifier is possessive or separated by a required character, so a run of spaces or '#' is never
# re-scanned (linear time; needs Python >= 3.11 for possessive quantifiers).
# The number is digits/commas with an optional fraction, or a bare fraction (``.5``). A trailing period with
# no digits after it (end of sentence, ``42.``) is not part of the number.
_STRICT_RE = re.compile(
    r"(?<!#)#{4,}+"  # a run of 4+ '#', taken whole (possessive, no backtracking into the run)
    r"[ \t]*+(?:(?P<sign1>[-+\u2212])[ \t]*+)?(?:\$[ \t]*+)?(?P<sign2>[-+\u2212])?"
    r"(?P<num>[0-9][0-9,]*+(?:\.[0-9]+)?|\.[0-9]+)"
)
# Any number in free text (flexible mode): commas only as thousands separators (``1,000``) so that a list
# ``1, 2, 3`` is read as separate numbers. It is matched on the REVERSED text, so that ``search`` finds the
# last number first (one left-to-right scan in C, no Python loop over all numbers). Reversed number:
# optional ``fraction.``, then ``ddd,`` groups, then digits, then optional ``$`` and minus sign.
_REV_NUMBER_RE = re.compile(
    r"(?:[0-9]++\.(?![0-9])"  # a bare fraction ``.5``
    r"|(?:[0-9]+\.(?=[0-9]))?+(?:[0-9]{3},(?=[0-9]))*+[0-9]++)"  # ``1,234.5``
    r"\$?(?P<sign>[-\u2212])?"
)
# What may follow the strict number and changes its value: ``/d`` (the answer is the fraction ``3/4``, not ``3``),
# an exponent (``1.5e3``), or ``^`` (a power, which is not read: no answer rather than its base).
_AFTER_RE = re.compile(r"/(?P<den>[0-9][0-9,]*+(?:\.[0-9]++)?)|(?P<exp>[eE][-+]?[0-9]++)|\^")
_DIGIT_RE = re.compile(r"[0-9]")  # a plain char class: ``search`` skips non-digits at C speed
# How far back from the last marker we look for the start of its '#' run on the fast path.
_FAST_RUN_LOOKBACK = 64


def _clean(sign: str | None, num: str) -> str | None:
    num = num.replace(",", "")
    if not num or len(num) > _MAX_NUMBER_CHARS:
        return None
    if sign in ("-", "\u2212"):
        num = "-" + num
    return num


def extract_solution(text: str, method: str = "strict") -> str | None:
    """Extract the final numeric answer from a model response.

    Args:
        text: the decoded response (any length; non-str input gives None).
        method: ``"strict"`` (number after the last ``#### `` marker followed by a number) or ``"flexible"``
            (last number anywhere in the text).

    Returns:
        The answer as a plain decimal string without commas or ``$`` (``"-3"``, ``"1000"``, ``"42"``,
        ``"0.5"``), or None when no answer is found.

    Raises:
        ValueError: if ``method`` is not ``"strict"`` or ``"flexible"``.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if not isinstance(text, str) or not text:
        return None
    if method == "strict":
        return _extract_strict(text)
    rev = text[::-1]
    d = _DIGIT_RE.search(rev)
    if d is None:
        return None
    m = _REV_NUMBER_RE.match(rev, d.start())  # every digit starts a (reversed) number, so this matches
    return _clean(m.group("sign"), m.group(0)[::-1].lstrip("-\u2212$"))


def _extract_strict(text: str) -> str | None:
    pos = text.rfind(_MARKER)
    if pos < 0:
        return None
    # Fast path: the last marker's '#' run starts within a short look-back and is followed by a number.
    start = pos
    while start > 0 and pos - start < _FAST_RUN_LOOKBACK and text[start - 1] == "#":
        start -= 1
    if start == 0 or text[start - 1] != "#":
        m = _STRICT_RE.match(text, start)
        if m is not None:
            return _strict_answer(text, m)
    # General path (last marker not followed by a number, or a very long '#' run): one linear scan.
    last = None
    for m in _STRICT_RE.finditer(text):  # matches never overlap, so the last one belongs to the last marker
        last = m
    if last is None:
        return None
    return _strict_answer(text, last)


def _strict_answer(text: str, m: re.Match) -> str | None:
    """The number of a strict match, with what follows it and changes its value (:data:`_AFTER_RE`): ``3/4`` is
    the fraction, ``1.5e3`` the exponent form, ``2^10`` no answer (never its prefix ``3`` or ``2``)."""
    num = _clean(m.group("sign1") or m.group("sign2"), m.group("num"))
    after = _AFTER_RE.match(text, m.end())
    if num is None or after is None:
        return num
    if after.group("den") is not None:
        den = after.group("den").replace(",", "")
        return f"{num}/{den}" if len(den) <= _MAX_NUMBER_CHARS else None
    if after.group("exp") is not None:
        exp = after.group("exp")
        return num + exp if len(exp) <= 6 else None  # normalize_number bounds the value (|x| <= 1e30)
    return None


def normalize_number(value: Any) -> Fraction | None:
    """Parse a number written as GSM8K/SVAMP writes answers into an exact ``Fraction``.

    Accepts ints, floats (``12.0`` from SVAMP; via their shortest ``repr``), and strings such as
    ``"1,000"``, ``"-3"``, ``"$42."``, ``"42.0"`` or a full reference solution ending in ``#### N``.
    Returns None for anything else (never raises).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        value = repr(value)
    if not isinstance(value, str):
        try:  # numpy scalars and the like
            return normalize_number(value.item())
        except Exception:
            return None
    s = value.strip()
    if _MARKER in s:
        s = extract_solution(s, "strict") or ""
    s = s.replace(",", "").replace("$", "").replace("\u2212", "-").strip().rstrip(".")
    if not s or len(s) > _MAX_NUMBER_CHARS:
        return None
    try:
        if "e" in s.lower():  # scientific notation, e.g. "1e3"; bounded to avoid huge integers
            f = float(s)
            if f != f or abs(f) == float("inf") or abs(f) > 1e30:
                return None
            return Fraction(repr(f))
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are the same number (``"42.0"`` == ``42`` == ``"42."``); False otherwise."""
    x, y = normalize_number(a), normalize_number(b)
    return x is not None and y is not None and x == y


def final_answer_text(text: Any, answer_after: str | None) -> tuple[str, bool]:
    """The part of a trajectory where the model's own final answer is read: the text after the LAST occurrence
    of ``answer_after`` (e.g. :data:`TOOL_RESPONSE_END`, the end of the last tool answer), so that a tool output
    such as a program printing ``#### 42`` is never taken for the answer. ``answer_after`` None or empty, or
    absent from the text (no tool answered): the whole text.

    Returns:
        (text to search, whether ``answer_after`` occurred). A non-str ``text`` gives ``("", False)``.
    """
    if not isinstance(text, str):
        return "", False
    cut = text.rfind(answer_after) if answer_after else -1
    if cut < 0:
        return text, False
    return text[cut + len(answer_after):], True


def compute_score(solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0, answer_after: str | None = None) -> float:
    """Score a GSM8K response: ``score`` if the extracted answer equals the ground truth, ``format_score`` if an
    answer was extracted but is wrong, 0.0 if there is no answer.

    Args:
        solution_str: the decoded model response.
        ground_truth: the reference answer (``"18"``, ``"1,000"``, ``12.0`` or a full ``... #### 18`` solution).
        method: ``"strict"`` or ``"flexible"``, see :func:`extract_solution`.
        format_score: reward for a well-formed but wrong answer.
        score: reward for a correct answer.
        answer_after: read the answer only after the last occurrence of this string (see
            :func:`final_answer_text`); None reads the whole response.

    Returns:
        A Python float. Never raises on any ``solution_str``.

    Raises:
        ValueError: for an unknown ``method`` (a configuration error, not a property of the response).
    """
    answer = extract_solution(final_answer_text(solution_str, answer_after)[0], method=method)
    if answer is None:
        return 0.0
    return float(score) if numbers_equal(answer, ground_truth) else float(format_score)
