r"""Rule scorer for GSM8K-style answers (``... #### 42``), also used for SVAMP and the synthetic digits task.

Answer format (GSM8K, Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems"): the reference
solution ends with a line ``#### <number>``; numbers may carry thousands separators (``#### 1,000``).

Two extraction methods, with the same names as verl's ``gsm8k.compute_score``:

* ``strict``: the number right after the LAST well-formed ``#### N`` marker anywhere in the text (the whole
  text is searched: a model that keeps writing after its marker still gets credit).
* ``flexible``: the last number anywhere in the text.

Both methods read a number the same way:

* Commas count only as thousands separators (``1,000``, ``12,345,678``, ``1,234.5``). A number whose commas are not
  thousands groups (``1,2``, ``3,4,5``, ``5,00``, ``1234,567``, ``0,5``) is ambiguous (a list, or a European decimal)
  and gives no answer (score 0, as a response without an answer; never ``12``). A comma not followed by a digit
  (``#### 42, so``) is punctuation, as is a period at the end of a sentence (``42.``); ``1, 2, 3`` is three numbers.
* What is attached to the number and changes its value is read with it, never cut off: ``3/4`` (spaces allowed
  around the slash; ``1⁄2`` with a fraction slash too) is the fraction 3/4, ``1.5e3`` is 1500 and ``1.5e-3`` 0.0015.
  A mixed number is read whole, as one improper fraction: ``3 1/2``, ``7\frac{1}{2}``, ``2\frac34`` and ``3½`` are
  ``7/2``, ``15/2``, ``11/4`` and ``7/2`` (whole number, then a proper fraction of whole numbers; ``3 5/4``, ``2.5
  1/2`` give no answer). A LaTeX fraction standing alone (``\frac{3}{4}``, ``-\dfrac{3}{4}``, ``\frac34``) is read
  in flexible mode (a strict marker needs a digit: ``#### \frac{3}{4}`` is no marker).
  What changes the value but cannot be read exactly gives no answer: a power (``2^10``, ``2^{10}``, ``2**10``,
  ``2³``, ``42²``, ``10⁻³``), a subscript (``2₁₀``, ``1_000``, ``x_{10}``), a root or pi (``3\sqrt{2}``, ``3√2``,
  ``\sqrt2``, ``2\pi``, ``5π``), another LaTeX value (``0.\overline{3}``, ``10 \over 3``), a chain (``12/25/2023``,
  ``1e3/4``, ``1.2.3``, ``5′3``), digit groups joined by a LaTeX or no-break space (``2{,}000``, ``2\,000``), a
  factorial in an expression (``5! = 120``, ``5!/3!``), a difference or range (``10-3``) and a number that is not
  finite (``1/0``, ``1e999``): in strict mode never the base or whole part ``2``/``3``/``7``, in flexible mode never
  the denominator, exponent, argument or power ``4``/``3``/``2``/``10``.
* What does not change the value is not part of the number: a unit or word (``42 km``, ``42 \text{km}``, ``30°``,
  ``42's``), a percent sign (``42%`` and ``42\%`` are 42), a ``!`` that ends a sentence (``42!``) and Markdown
  emphasis: ``**42**`` is 42 in both modes (``#### **42**`` too), ``**`` after a space is bold, not a power.
  A bold numbered line after the marker (``#### **1. Find the total cost**``, ``#### **2) Add**``, ``#### **3:
  Final Answer: 42**``: a label, then words) is no marker: a list label is never taken for the answer, so an answer
  written that way (``#### **42. That is the answer.**``) is not read either; ``#### **42.** Done`` is 42 and
  ``#### 1. Find`` (no emphasis) is still read as 1.
* An expression is no answer, with or without spaces around its operator: an operator (``+ - − – * × ÷ / : ^ **
  =``, ``\times``, ``\cdot``, ``\div``) followed by an operand (a number, optionally after ``(``, a sign or ``$``;
  a LaTeX fraction or root, ``√``, ``π``, ``½``), or a further digit group after a space (``1 000``). Strict mode
  never reads its first operand (``#### 10 - 3``, ``#### 48 + 24 = 72``, ``#### 6×7``, ``#### 12:30``, ``#### 2 **
  10`` give no answer); an operator with no operand after it is punctuation (``#### 42 - that is it`` is 42).
  Flexible mode never reads the last operand (``The answer is 10 - 3``, ``3 * 4``, ``1 000``: no answer), but a
  number after ``=`` is a result (``5 + 3 = 8`` is 8), ``Step 3: 42`` (a space after the colon) is a label, 42, and
  only a last number of 3 digits is a digit group (``42 42 42`` and ``1 2 3`` read the last number).

All scans are linear in the text length: markers are found with ``str.rfind``, numbers with regexes whose
repetitions are possessive or need a separator to go on, so there is no catastrophic backtracking, and what stands
before and after a number is matched at one position; flexible mode scans the reversed text once. A 1 MB response
scores in milliseconds. Answers are compared as exact decimals (``fractions.Fraction``), so ``42.0 == 42``.
"""
from __future__ import annotations

import re
import struct
from fractions import Fraction
from typing import Any

from rewards.gsm8k_number import MAX_NUMBER_CHARS, NUM, flexible_answer, plain_number, strict_answer

__all__ = ["extract_solution", "normalize_number", "numbers_equal", "judge", "compute_score", "TOOL_RESPONSE_END",
           "final_answer_text", "answer_markers"]

_MARKER = "####"
TOOL_RESPONSE_END = "</tool_response>"  # a tool answer's end in Hermes/Qwen templates: plain text, kept by decoding
# A marker, then optional spaces, Markdown emphasis (``#### **42**``), sign and currency in either order (``-$3``,
# ``$-3``), then the number. Every quantifier is possessive or separated by a required character, so a run of spaces
# or '#' is never re-scanned (linear time; needs Python >= 3.11 for possessive quantifiers).
_STRICT_RE = re.compile(
    r"(?<!#)#{4,}+"  # a run of 4+ '#', taken whole (possessive, no backtracking into the run)
    r"[ \t\u00a0\u202f]*+(?:(?P<em>\*{1,3}+|_{1,2}+)[ \t\u00a0\u202f]*+)?+"  # spaces: also no-break ones
    r"(?:(?P<sign1>[-+\u2212])[ \t\u00a0\u202f]*+)?(?:\$[ \t\u00a0\u202f]*+)?(?P<sign2>[-+\u2212])?"
    r"(?P<num>" + NUM + ")"
    # ``#### **1. Find the cost**`` is a bold numbered line, no marker: a label (``1.``, ``2)``, ``3:``) then words
    r"(?(em)(?![.):][ \t\u00a0\u202f]++[^\W\d_]))"
)
# How far back from the last marker we look for the start of its '#' run on the fast path.
_FAST_RUN_LOOKBACK = 64
# A number as normalize_number reads one side of a fraction: sign, digits with commas and a fraction, exponent.
_DECIMAL_RE = re.compile(r"(?P<sign>[-+]?)(?P<mantissa>[0-9][0-9,]*(?:\.[0-9]*)?|\.[0-9]+)(?P<exp>[eE][-+]?[0-9]+)?")


def extract_solution(text: str, method: str = "strict") -> str | None:
    """Extract the final numeric answer from a model response.

    Args:
        text: the decoded response (any length; non-str input gives None).
        method: ``"strict"`` (number after the last ``#### `` marker followed by a number) or ``"flexible"``
            (last number anywhere in the text).

    Returns:
        The answer as a plain decimal string without thousands separators or ``$`` (``"-3"``, ``"1000"``,
        ``"0.5"``), a fraction (``"3/4"``; a mixed number such as ``3 1/2`` as its improper fraction ``"7/2"``) or
        an exponent form (``"1.5e3"``); None when no answer is found, when the number is ambiguous (commas that are
        not thousands separators, a power, a root, a chain such as ``12/25/2023``) or when it is not a finite number
        (``1/0``).

    Raises:
        ValueError: if ``method`` is not ``"strict"`` or ``"flexible"``.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if not isinstance(text, str) or not text:
        return None
    answer = _extract_strict(text) if method == "strict" else flexible_answer(text)
    return answer if answer is not None and normalize_number(answer) is not None else None


def answer_markers(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` spans of every strict ``#### N`` marker of ``text`` (4+ ``#`` then a number: what the strict
    :func:`extract_solution` reads the last of); a ``####`` without a number (``#### Step 1``) is none."""
    return [m.span() for m in _STRICT_RE.finditer(text)]


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
            return strict_answer(text, m.group("sign1") or m.group("sign2"), m.group("num"), m.end())
    # General path (last marker not followed by a number, or a very long '#' run): one linear scan.
    last = None
    for m in _STRICT_RE.finditer(text):  # matches never overlap, so the last one belongs to the last marker
        last = m
    if last is None:
        return None
    return strict_answer(text, last.group("sign1") or last.group("sign2"), last.group("num"), last.end())


def normalize_number(value: Any) -> Fraction | None:
    """Parse a number written as GSM8K/SVAMP writes answers into an exact ``Fraction``.

    Accepts ints, floats (``12.0`` from SVAMP; via their shortest ``repr``; a value from a float32 column by the
    shortest decimal of its float32, so ``0.10000000149011612`` is 0.1), and strings such as
    ``"1,000"``, ``"-3"``, ``"$42."``, ``"42.0"``, ``"1.5e3"``, a fraction ``"3/4"`` (either side a decimal) or a full
    reference solution ending in ``#### N``. Commas only as thousands separators (``"1,2"`` is None).
    Returns None for anything else, for a zero denominator, a value above 1e30 in exponent form or a number longer
    than a response's answer is read (an int of over 200 digits: no response could match it). Never raises.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):  # as a response would write it: over 200 digits (or 4300, str's limit) is None
        value = str(int(value)) if int(value).bit_length() <= 4 * MAX_NUMBER_CHARS else ""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        value = _shortest_repr(float(value))  # a float subclass (numpy's float64) by its plain float repr
    if not isinstance(value, str):
        if getattr(getattr(value, "dtype", None), "kind", "") == "f" and value.dtype.itemsize < 8:
            return normalize_number(str(value))  # numpy's float32 / float16: the shortest decimal of that type
        try:  # numpy scalars and the like
            return normalize_number(value.item())
        except Exception:
            return None
    s = value.strip()
    if _MARKER in s:
        s = extract_solution(s, "strict") or ""
    s = s.replace("$", "").replace("\u2212", "-").strip().rstrip(".")
    if not s or len(s) > 2 * MAX_NUMBER_CHARS + 1:
        return None
    num, slash, den = s.partition("/")
    x = _parse_decimal(num.strip())
    if not slash or x is None:
        return x
    y = _parse_decimal(den.strip())
    return None if y is None or y == 0 else x / y


def _shortest_repr(value: float) -> str:
    """The decimal a ground truth was written as: ``repr`` of a float, except that a value a float32 holds
    exactly is read as the shortest decimal that float32 rounds to it. A float32 column (a parquet file written
    with that type) holds ``0.1`` as ``0.10000000149011612``; no float64 answer is written that way."""
    single = struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 3.4e38 else None
    if single != value:
        return repr(value)
    for digits in range(1, 10):  # 9 significant digits always round-trip a float32
        text = f"{value:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == value:
            return text
    return repr(value)


def _parse_decimal(s: str) -> Fraction | None:
    """A signed decimal (thousands separators allowed, :func:`rewards.gsm8k_number.plain_number`) or exponent form
    as a Fraction, else None."""
    m = _DECIMAL_RE.fullmatch(s)
    if m is None:
        return None
    mantissa = plain_number(m.group("mantissa"))
    if mantissa is None:
        return None
    sign = "-" if m.group("sign") == "-" else ""
    try:
        if m.group("exp"):  # scientific notation, e.g. "1e3"; bounded to avoid huge integers
            f = float(sign + mantissa + m.group("exp"))
            if f != f or abs(f) == float("inf") or abs(f) > 1e30:
                return None
            return Fraction(repr(f))
        return Fraction(sign + mantissa)
    except (ValueError, ZeroDivisionError, OverflowError):
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
    answered, correct = judge(solution_str, ground_truth, method=method, answer_after=answer_after)
    return float(score) if correct else float(format_score) if answered else 0.0


def judge(solution_str: str, ground_truth: Any, method: str = "strict",
          answer_after: str | None = None) -> tuple[bool, bool]:
    """``(answered, correct)`` for a GSM8K response: whether an answer was extracted (:func:`extract_solution`,
    after the last ``answer_after``, see :func:`final_answer_text`) and whether it equals ``ground_truth``
    (:func:`numbers_equal`). The rule every GSM8K score is built from (:func:`compute_score`, the registered
    scorers' ``acc``, the format scorer's ``format``).

    Raises:
        ValueError: for an unknown ``method``.
    """
    answer = extract_solution(final_answer_text(solution_str, answer_after)[0], method=method)
    return answer is not None, answer is not None and numbers_equal(answer, ground_truth)
