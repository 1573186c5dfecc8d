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
  around the slash) is the fraction 3/4, ``1.5e3`` is 1500 and ``1.5e-3`` 0.0015. A power (``2^10``, ``2^{10}``,
  ``2**10``), a chain (``12/25/2023``, ``1e3/4``, ``1.2.3``), a difference or range (``10-3``) and a number that is
  not finite (``1/0``, ``1e999``) give no answer: in strict mode never the base ``2``, in flexible mode never the
  denominator, exponent or power ``4``/``3``/``10``. ``**`` after a space is Markdown bold (``**42**`` is 42).
* An expression is no answer, with or without spaces around its operator: an operator (``+ - − – * × ÷ / : ^ **
  =``, ``\times``, ``\cdot``, ``\div``) followed by an operand (a number, optionally after ``(``, a sign or ``$``),
  or a further digit group after a space (``1 000``). Strict mode never reads its first operand (``#### 10 - 3``,
  ``#### 48 + 24 = 72``, ``#### 6×7``, ``#### 12:30``, ``#### 2 ** 10`` give no answer); an operator with no operand
  after it is punctuation (``#### 42 - that is it`` is 42). Flexible mode never reads the last operand (``The answer
  is 10 - 3``, ``3 * 4``, ``1 000``: no answer), but a number after ``=`` is a result (``5 + 3 = 8`` is 8), ``Step
  3: 42`` (a space after the colon) is a label, 42, and only a last number of 3 digits is a digit group (``42 42 42``
  and ``1 2 3`` read the last number).

All scans are linear in the text length: markers are found with ``str.rfind``, numbers with regexes whose
repetitions are possessive or need a separator to go on, so there is no catastrophic backtracking, and what stands
before and after a number is matched at one position; flexible mode scans the reversed text once. A 1 MB response
scores in milliseconds. Answers are compared as exact decimals (``fractions.Fraction``), so ``42.0 == 42``.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

__all__ = ["extract_solution", "normalize_number", "numbers_equal", "judge", "compute_score", "TOOL_RESPONSE_END",
           "final_answer_text", "answer_markers"]

_MARKER = "####"
TOOL_RESPONSE_END = "</tool_response>"  # a tool answer's end in Hermes/Qwen templates: plain text, kept by decoding
_MAX_NUMBER_CHARS = 200  # longest number accepted (commas included): longer runs are junk; int() refuses > 4300 digits

# A number's digits: digit runs joined by single commas, with an optional fraction (``1,234.5``), or a bare fraction
# (``.5``). A comma not followed by a digit (``42, so``) and a period with no digits after it (end of sentence,
# ``42.``) are punctuation, not part of the number. Whether the commas are thousands separators is checked after the
# match (:func:`_plain`). Every repetition is possessive and needs a comma or a period to go on: linear time.
_NUM = r"[0-9]++(?:,[0-9]++)*+(?:\.[0-9]++)?|\.[0-9]++"
# A marker, then optional spaces, sign and currency in either order (``-$3``, ``$-3``), then the number.
# Every quantifier is possessive or separated by a required character, so a run of spaces or '#' is never
# re-scanned (linear time; needs Python >= 3.11 for possessive quantifiers).
_STRICT_RE = re.compile(
    r"(?<!#)#{4,}+"  # a run of 4+ '#', taken whole (possessive, no backtracking into the run)
    r"[ \t]*+(?:(?P<sign1>[-+\u2212])[ \t]*+)?(?:\$[ \t]*+)?(?P<sign2>[-+\u2212])?"
    r"(?P<num>" + _NUM + ")"
)
# Commas as thousands separators: a first group of 1-3 digits (not starting with 0: ``0,5`` is a European decimal),
# then groups of exactly 3.
_THOUSANDS_RE = re.compile(r"[1-9][0-9]{0,2}(?:,[0-9]{3})++(?:\.[0-9]++)?")
# What may follow a number and changes its value: ``/d`` (the answer is the fraction ``3/4``, not ``3``; spaces
# allowed around the slash), an exponent (``1.5e3``, ``1.5e-3``); and what makes it no answer: a power (``2^10``,
# ``2 ^ 10``, ``2**10``, ``2 ** 10``; never its base), a slash before a signed, ``$`` or parenthesised denominator, a
# comma or period and digits after a complete number (``1.2.3``), an operator and an operand (:data:`_OPERATOR`,
# :data:`_OPERAND`: ``10-3``, ``10 - 3``, ``48 + 24 = 72``, ``6 * 7``, ``6×7``, ``12:30``, ``1.5 \times 10^3``; the
# expression, never its first operand) and a further digit group after a space (``1 000``). An operator that is not
# followed by an operand is punctuation (``42 - that is it``, ``42: done``). ``**`` right after a space opens Markdown
# bold (``42 **note**``, ``2 **10**``), so after a space it is a power only with a space after it too. A match
# without ``den`` or ``exp`` means no answer. Anchored at one position, each alternative scans at most the spaces
# there.
_OPERATOR = (r"(?:->|mod(?![A-Za-z])|[-+\u2212\u2013\u2014*\u00d7\u00f7:=xX\u00b7\u22c5%\u00b1\u2192<>\u2264\u2265]"
             r"|\\(?:times|cdot|div|pm)(?![A-Za-z]))")
# An operand after an operator: optional spaces and ``(``, an optional sign and ``$``, then a number.
_OPERAND = r"[ \t]*+\(?+[ \t]*+[-+\u2212]?+\$?+\.?+[0-9]"
_AFTER_RE = re.compile(
    r"(?P<exp>[eE][-+\u2212]?[0-9]++)"
    r"|\*\*[ \t]*+[-+\u2212({]?[0-9]|[,.'\u2019][0-9]|[\u00bc-\u00be\u2150-\u215e]"
    r"|[ \t]*+(?:/[ \t]*+(?:(?P<den>" + _NUM + r")|[-+\u2212$(])"
    r"|\^|" + _OPERATOR + _OPERAND + r"|(?<=[ \t])(?:\*\*[ \t]++" + _OPERAND + r"|[0-9]))"
)
# Any number in free text (flexible mode), matched on the REVERSED text, so that ``search`` finds the last number
# first (one left-to-right scan in C, no Python loop over all numbers). Reversed number: optional ``fraction.``,
# then digit runs joined by commas (checked by :func:`_plain`: ``1, 2, 3`` is three numbers, ``1,2`` none), then
# optional ``$`` and minus sign.
_REV_NUMBER_RE = re.compile(
    r"(?P<num>[0-9]++\.(?![0-9])"  # a bare fraction ``.5``
    r"|(?:[0-9]++\.(?=[0-9]))?+[0-9]++(?:,[0-9]++)*+)"  # ``1,234.5``
    r"(?P<cur>\$)?(?P<sign>[-\u2212])?"
)
# What may stand before a number (matched on the reversed text, right after a reversed number): the mirror of
# :data:`_AFTER_RE`. ``power``: ``^``, ``^{``, ``2**`` (``**`` after a space is Markdown bold); ``exp``: the number is
# the exponent of ``1.5e3``; ``den``: the denominator of ``3/4``; ``chain``: ``1.2.3``.
_REV_BEFORE_RE = re.compile(
    r"(?P<power>[{(]?+[ \t]*+\^|\*\*(?=[0-9A-Za-z)}\]]))"
    r"|(?P<plus>\+)?+(?:(?P<exp>[eE](?=[0-9]))|[ \t]*+(?P<den>/)[ \t]*+(?=[0-9]))"
    r"|(?P<chain>[.,'\u2019](?=[0-9]))"
    r"|(?P<frac>\{\}(?=[0-9]))|(?P<root>\{trqs\\)"  # ``\frac{3}{4}``, ``\sqrt{2}``
    # ``op``: the number is the second operand of an expression (``10 - 3``, ``3 * 4``, ``3×4``, ``(1+2) / 3``,
    # ``6 \times 7``, ``2 ** 10``, ``12:30``, ``5 * (3``): the operand before the operator ends in a digit or ``)``.
    # Not ``=`` (``5 + 3 = 8`` reads 8, the result), not ``: `` with a space after the colon (``Step 3: 42`` is a
    # label), not ``**`` right before the number after a space (``2 **10**`` is Markdown bold). ``group``: a space and
    # a digit before the number, a further digit group when the number has exactly 3 digits (``1 000``, never
    # ``000``; :func:`_attached_before`); ``42 42 42`` and ``1 2 3`` still read the last number.
    r"|(?P<op>[ \t]*+\(?+[ \t]*+(?:[-+\u2212\u2013\u2014\u00d7\u00f7/xX\u00b7\u22c5%\u00b1\u2192<>\u2264\u2265]|\*(?!\*)"
    r"|>-|dom(?![A-Za-z])|semit\\|todc\\|vid\\|mp\\)[ \t]*+(?=[0-9)])"
    r"|[ \t]++\*\*[ \t]*+(?=[0-9)])|:[ \t]*+(?=[0-9)]))"
    r"|(?P<group>[ \t]++(?=[0-9]))"  # a space, then a digit: a digit group when the number has 3 digits
)
# A sign read with the last number that is a minus between two operands (``10-3``, ``10 -3``, ``(2+3) -3``).
_REV_MINUS_RE = re.compile(r"[ \t]*+[0-9)]")
# Reversed ``-\frac{`` (``\dfrac``, ``\tfrac``): what must stand before the numerator of a LaTeX fraction.
_REV_FRAC_CMD_RE = re.compile(r"\{carf[dt]?\\(?P<sign>[-\u2212])?")
_DIGIT_RE = re.compile(r"[0-9]")  # a plain char class: ``search`` skips non-digits at C speed
# How far back from the last marker we look for the start of its '#' run on the fast path.
_FAST_RUN_LOOKBACK = 64
# A number as normalize_number reads one side of a fraction: sign, digits with commas and a fraction, exponent.
_DECIMAL_RE = re.compile(r"(?P<sign>[-+]?)(?P<mantissa>[0-9][0-9,]*(?:\.[0-9]*)?|\.[0-9]+)(?P<exp>[eE][-+]?[0-9]+)?")
_MAX_EXP_CHARS = 6  # ``e-1234``: normalize_number bounds the value (|x| <= 1e30) anyway


def _plain(num: str) -> str | None:
    """``num`` (digits, commas, one period) without its thousands separators; None when its commas are not
    thousands separators (``1,2``, ``5,00``, ``1234,567``: a list or a European decimal) or it is too long."""
    if len(num) > _MAX_NUMBER_CHARS:
        return None
    if "," in num:
        if _THOUSANDS_RE.fullmatch(num) is None:
            return None
        num = num.replace(",", "")
    return num


def _clean(sign: str | None, num: str) -> str | None:
    num = _plain(num)
    if not num:
        return None
    return "-" + num if sign in ("-", "\u2212") else num


def extract_solution(text: str, method: str = "strict") -> str | None:
    """Extract the final numeric answer from a model response.

    Args:
        text: the decoded response (any length; non-str input gives None).
        method: ``"strict"`` (number after the last ``#### `` marker followed by a number) or ``"flexible"``
            (last number anywhere in the text).

    Returns:
        The answer as a plain decimal string without thousands separators or ``$`` (``"-3"``, ``"1000"``,
        ``"0.5"``), a fraction (``"3/4"``) or an exponent form (``"1.5e3"``); None when no answer is found, when
        the number is ambiguous (commas that are not thousands separators, a power, a chain such as
        ``12/25/2023``) or when it is not a finite number (``1/0``).

    Raises:
        ValueError: if ``method`` is not ``"strict"`` or ``"flexible"``.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if not isinstance(text, str) or not text:
        return None
    answer = _extract_strict(text) if method == "strict" else _extract_flexible(text)
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
        den = _plain(after.group("den"))
        answer = None if den is None else f"{num}/{den}"
    elif after.group("exp") is not None:
        exp = after.group("exp").replace("\u2212", "-")
        answer = num + exp if len(exp) <= _MAX_EXP_CHARS else None
    else:
        return None
    if _AFTER_RE.match(text, after.end()) is not None:  # a chain: ``12/25/2023``, ``1e3/4``, ``3/4^2``
        return None
    return answer


def _extract_flexible(text: str) -> str | None:
    """The last number of ``text`` with what is attached to it, as the strict path reads it: the last number may
    be the denominator (``3/4``) or exponent (``1.5e-3``) of the answer; a power (``2^10``), a chain or an
    ambiguous number is no answer (never its last digits)."""
    rev = text[::-1]
    d = _DIGIT_RE.search(rev)
    if d is None:
        return None
    last = _REV_NUMBER_RE.match(rev, d.start())  # every digit starts a (reversed) number, so this matches
    if _AFTER_RE.match(text, len(text) - d.start()) is not None:  # only a power can follow the last number
        return None
    kind, before = _attached_before(rev, last)
    if kind is None:
        return _clean(last.group("sign"), last.group("num")[::-1])
    if kind == "frac":
        return _latex_fraction(text, rev, last, before)
    if kind not in ("den", "exp") or last.group("cur") or (kind == "den" and (last.group("sign") or before["plus"])):
        return None  # a power, a chain, an expression (``10-3``, ``10 - 3``, ``3 * 4``), ``3/-4``, ``3/$4``
    head = _REV_NUMBER_RE.match(rev, before.end())
    if _attached_before(rev, head)[0] is not None:  # ``12/25/2023``, ``2^3/4``, ``1e2e3``
        return None
    num = _clean(head.group("sign"), head.group("num")[::-1])
    tail = _clean(last.group("sign"), last.group("num")[::-1])
    if num is None or tail is None:
        return None
    if kind == "den":
        return f"{num}/{tail}"
    exp = before["exp"] + ("+" if before["plus"] else "") + tail  # as written, as the strict path keeps it
    return num + exp if tail.lstrip("-").isdigit() and len(exp) <= _MAX_EXP_CHARS else None


def _attached_before(rev: str, m: re.Match) -> tuple[str | None, re.Match | None]:
    """What stands before the number ``m`` (a match of :data:`_REV_NUMBER_RE` on the reversed text ``rev``):
    ``("power" | "exp" | "den" | "chain" | "frac" | "root" | "op" | "minus", match)``, or ``(None, None)`` when nothing
    is attached.
    ``minus``: the sign is an operator between numbers (``10-3``, ``10 -3``); ``op``: the number is the second
    operand of an expression or a further 3-digit group (``10 - 3``, ``3 * 4``, ``1 000``)."""
    end = m.end()
    if m.group("sign") and _REV_MINUS_RE.match(rev, end) is not None:
        return "minus", None
    before = _REV_BEFORE_RE.match(rev, end)
    if before is None:
        return None, None
    if before.group("group") is not None:  # ``1 000``: the number is a thousands group, not an answer
        plain = m.group("num")
        return ("op", before) if len(plain) == 3 and plain.isdigit() and not m.group("cur") else (None, None)
    kinds = ("power", "exp", "den", "chain", "frac", "root", "op")
    return next(k for k in kinds if before.group(k) is not None), before


def _latex_fraction(text: str, rev: str, last: re.Match, before: re.Match) -> str | None:
    """``\\frac{3}{4}`` (``-\\dfrac{3}{4}``, ``\\tfrac``) read from its denominator ``last`` (preceded by ``}{``):
    ``"3/4"``; another command's second argument (``\\binom{3}{4}``) or a denominator that is not a whole argument
    (``\\frac{3}{4x}``): None."""
    end = len(text) - last.start()
    if last.group("sign") or last.group("cur") or text[end:end + 1] != "}":
        return None
    head = _REV_NUMBER_RE.match(rev, before.end())
    cmd = _REV_FRAC_CMD_RE.match(rev, head.end())
    if cmd is None or head.group("cur"):
        return None
    num, den = _plain(head.group("num")[::-1]), _plain(last.group("num")[::-1])
    if not num or not den:
        return None
    negative = bool(head.group("sign")) != bool(cmd.group("sign"))
    return ("-" if negative else "") + f"{num}/{den}"


def normalize_number(value: Any) -> Fraction | None:
    """Parse a number written as GSM8K/SVAMP writes answers into an exact ``Fraction``.

    Accepts ints, floats (``12.0`` from SVAMP; via their shortest ``repr``), and strings such as
    ``"1,000"``, ``"-3"``, ``"$42."``, ``"42.0"``, ``"1.5e3"``, a fraction ``"3/4"`` (either side a decimal) or a full
    reference solution ending in ``#### N``. Commas only as thousands separators (``"1,2"`` is None).
    Returns None for anything else, for a zero denominator, a value above 1e30 in exponent form or a number longer
    than a response's answer is read (an int of over 200 digits: no response could match it). Never raises.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):  # as a response would write it: over 200 digits (or 4300, str's limit) is None
        value = str(int(value)) if int(value).bit_length() <= 4 * _MAX_NUMBER_CHARS else ""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        value = repr(float(value))  # a float subclass (numpy's float64) by its plain float repr
    if not isinstance(value, str):
        try:  # numpy scalars and the like
            return normalize_number(value.item())
        except Exception:
            return None
    s = value.strip()
    if _MARKER in s:
        s = extract_solution(s, "strict") or ""
    s = s.replace("$", "").replace("\u2212", "-").strip().rstrip(".")
    if not s or len(s) > 2 * _MAX_NUMBER_CHARS + 1:
        return None
    num, slash, den = s.partition("/")
    x = _parse_decimal(num.strip())
    if not slash or x is None:
        return x
    y = _parse_decimal(den.strip())
    return None if y is None or y == 0 else x / y


def _parse_decimal(s: str) -> Fraction | None:
    """A signed decimal (thousands separators allowed, :func:`_plain`) or exponent form as a Fraction, else None."""
    m = _DECIMAL_RE.fullmatch(s)
    if m is None:
        return None
    mantissa = _plain(m.group("mantissa"))
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
