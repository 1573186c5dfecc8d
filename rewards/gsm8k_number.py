r"""How the GSM8K scorer (:mod:`rewards.gsm8k`) reads one number: its digits, and what is attached to it.

What stands right after a number (both extraction methods) or right before the last number (flexible mode, matched
on the reversed text) and changes its value is read with it, or, where it cannot be read exactly, makes the answer
none; never is a part of the value read alone. The rules are listed in :mod:`rewards.gsm8k`'s docstring.

Read with the number: a fraction (``3/4``, ``1⁄2``, ``\frac{3}{4}``, ``\frac34``), an exponent (``1.5e3``) and a
mixed number (``3 1/2``, ``7\frac{1}{2}``, ``2\frac34``, ``3½``), which is returned as one improper fraction
(``"7/2"``, ``"15/2"``, ``"11/4"``), as :func:`rewards.gsm8k.normalize_number` reads fractions. No answer: a power
(``2^10``, ``2³``, ``10⁻³``), a subscript (``2₁₀``, ``1_000``), a root or pi (``3\sqrt{2}``, ``3√2``, ``2\pi``,
``2π``), a repeating decimal (``0.\overline{3}``), a factorial in an expression (``5! = 120``, ``5!/3!``), digit
groups LaTeX or Unicode spaces join (``2{,}000``, ``2\,000``, ``1 000`` with a no-break space) and everything
:mod:`rewards.gsm8k` lists (chains, expressions, ambiguous commas).

Every regex is anchored at one position and its repetitions are possessive or bounded: linear time.
"""
from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

__all__ = ["NUM", "MAX_NUMBER_CHARS", "plain_number", "signed_number", "mixed_number", "strict_answer",
           "flexible_answer"]

MAX_NUMBER_CHARS = 200  # longest number accepted (commas included): longer runs are junk; int() refuses > 4300 digits
_MAX_EXP_CHARS = 6  # ``e-1234``: normalize_number bounds the value (|x| <= 1e30) anyway

# A number's digits: digit runs joined by single commas, with an optional fraction (``1,234.5``), or a bare fraction
# (``.5``). A comma not followed by a digit (``42, so``) and a period with no digits after it (end of sentence,
# ``42.``) are punctuation, not part of the number. Whether the commas are thousands separators is checked after the
# match (:func:`plain_number`). Every repetition is possessive and needs a comma or a period to go on: linear time.
NUM = r"[0-9]++(?:,[0-9]++)*+(?:\.[0-9]++)?|\.[0-9]++"
# Commas as thousands separators: a first group of 1-3 digits (not starting with 0: ``0,5`` is a European decimal),
# then groups of exactly 3.
_THOUSANDS_RE = re.compile(r"[1-9][0-9]{0,2}(?:,[0-9]{3})++(?:\.[0-9]++)?")
# Unicode vulgar fractions (``½``, ``⅞``, ``⅒``) and their exact values.
_VULGAR_CHARS = "\u00bc-\u00be\u2150-\u215e"
_VULGAR_VALUES = {c: Fraction(unicodedata.numeric(c)).limit_denominator(10)
                  for c in "\u00bc\u00bd\u00be" + "".join(map(chr, range(0x2150, 0x215f)))}
_SP = r"[ \t\u00a0\u2009\u202f]"  # spaces between a number and what follows it (no-break and thin spaces too)
_SLASH = r"[/\u2044\u2215]"  # ``/``, the fraction slash ``⁄`` and the division slash ``∕``
# A LaTeX command that makes a value of the number next to it: a fraction, a root, pi, a repeating decimal, ...
_TEX_VALUE = r"\\(?:[dtc]?frac|sqrt|root|pi|overline|over|bar|dot|ddot|infty|choose|binom)(?![A-Za-z])"
# ``\frac{1}{2}``, ``\dfrac{1}{2}``, ``\frac12`` (one digit per argument without braces) after a whole number.
_TEX_FRAC = (r"\\[dtc]?frac[ \t]*+(?P<tn>\{[ \t]*+[0-9]++[ \t]*+\}|[0-9])[ \t]*+"
             r"(?P<td>\{[ \t]*+[0-9]++[ \t]*+\}|[0-9])(?![0-9])")
# An operator between two operands. ``%`` and ``mod`` with an operand after them; ``42%`` alone is the number 42.
_OPERATOR = (r"(?:->|mod(?![A-Za-z])|[-+\u2212\u2013\u2014*\u00d7\u00f7:=xX\u00b7\u22c5%\u00b1\u2192<>\u2264\u2265]"
             r"|\\(?:times|cdot|div|pm)(?![A-Za-z]))")
# An operand after an operator: optional spaces and ``(``, an optional sign and ``$``, then a number (digits, a LaTeX
# value such as ``\frac{1}{2}``, a root, pi or a vulgar fraction).
_OPERAND = (r"[ \t]*+\(?+[ \t]*+[-+\u2212]?+\$?+(?:\.?+[0-9]|" + _TEX_VALUE
            + r"|[\u221a-\u221c\u03c0" + _VULGAR_CHARS + r"])")
# What may follow a number, at one position. Read with it: ``exp`` (``1.5e3``), ``den`` (``3/4``, spaces allowed
# around the slash), ``mn``/``md`` (the mixed number ``3 1/2``), ``tn``/``td`` (``7\frac{1}{2}``), ``vulgar``
# (``3½``). Any other match means no answer (never the number alone): a power (``2^10``, ``2**10``, ``2³``, ``10⁻³``),
# a subscript or combining mark (``2₁₀``, ``1_000``, ``0.3̅``), a chain (``1.2.3``, ``1'000``, ``5′3``), LaTeX or
# Unicode digit-group spaces (``2{,}000``, ``2\,000``), a factorial in an expression (``5!/3!``, ``5! = 120``; the
# ``!`` that end a sentence, ``42!`` or ``42!!``, are punctuation), a LaTeX value, root or pi (``3\sqrt{2}``, ``3√2``, ``2\pi``,
# ``0.\overline{3}``), a slash before a signed, ``$`` or parenthesised denominator, an operator and an operand
# (``10-3``, ``6×7``, ``12:30``) and a further digit group after a space (``1 000``). An operator that is not followed
# by an operand is punctuation (``42 - that is it``, ``42: done``, ``42%``). ``**`` right after a space opens Markdown
# bold (``42 **note**``, ``2 **10**``), so after a space it is a power only with a space after it too.
_AFTER_RE = re.compile(
    r"(?P<exp>[eE][-+\u2212]?[0-9]++)"
    r"|\*\*[ \t]*+[-+\u2212({]?[0-9]|[,.'\u2019\u2032][0-9]|\{[,.]\}[0-9]|\\[,;:! ][ \t]*+[0-9]"
    r"|[\u00b2\u00b3\u00b9\u2070-\u209f\u0300-\u036f]|_[{0-9]"
    r"|!++(?:[/^0-9]|[ \t]*+(?:[/^]|" + _OPERATOR + _OPERAND + r"))"
    r"|" + _SP + r"*+(?:(?P<vulgar>[" + _VULGAR_CHARS + r"])|" + _TEX_FRAC + r"|" + _TEX_VALUE
    + r"|[\u221a-\u221c\u03c0]"
    r"|" + _SLASH + r"[ \t]*+(?:(?P<den>" + NUM + r")|[-+\u2212$(])"
    r"|\^|" + _OPERATOR + _OPERAND + r"|(?<=" + _SP + r")(?:(?P<mn>[0-9]++)[ \t]*+" + _SLASH
    + r"[ \t]*+(?P<md>[0-9]++)|\*\*[ \t]++" + _OPERAND + r"|[0-9]))"
    r"|\." + _TEX_VALUE
)


def plain_number(num: str) -> str | None:
    """``num`` (digits, commas, one period) without its thousands separators; None when its commas are not
    thousands separators (``1,2``, ``5,00``, ``1234,567``: a list or a European decimal) or it is too long."""
    if len(num) > MAX_NUMBER_CHARS:
        return None
    if "," in num:
        if _THOUSANDS_RE.fullmatch(num) is None:
            return None
        num = num.replace(",", "")
    return num


def signed_number(sign: str | None, num: str) -> str | None:
    """``num`` as :func:`plain_number` reads it, with a leading ``-`` for a minus sign (``-`` or ``−``)."""
    num = plain_number(num)
    if not num:
        return None
    return "-" + num if sign in ("-", "\u2212") else num


def mixed_number(whole: str | None, num: int | str, den: int | str) -> str | None:
    """The mixed number ``whole num/den`` as one improper fraction (``3 1/2`` -> ``"7/2"``, ``-3 1/2`` ->
    ``"-7/2"``); None unless ``whole`` is a (signed) whole number and ``num/den`` a proper fraction of whole
    numbers (``0 < num < den``): ``2.5 1/2`` or ``3 5/4`` is no mixed number."""
    if whole is None:
        return None
    sign, digits = ("-", whole[1:]) if whole.startswith("-") else ("", whole)
    num, den = str(num).strip("{} \t"), str(den).strip("{} \t")
    if not all(s.isascii() and s.isdigit() and len(s) <= MAX_NUMBER_CHARS for s in (digits, num, den)):
        return None
    n, d = int(num), int(den)
    if not 0 < n < d:
        return None
    return f"{sign}{int(digits) * d + n}/{d}"


def strict_answer(text: str, sign: str | None, num: str, end: int) -> str | None:
    """The strict answer: the number ``num`` (with ``sign``) that ends at ``end`` in ``text``, with what follows it
    and changes its value (:data:`_AFTER_RE`): ``3/4`` the fraction, ``1.5e3`` the exponent form, ``3 1/2`` and
    ``7\\frac{1}{2}`` the improper fraction; ``2^10``, ``2³`` or ``3\\sqrt{2}`` no answer (never the ``2`` or ``3``)."""
    value = signed_number(sign, num)
    after = _AFTER_RE.match(text, end)
    if value is None or after is None:
        return value
    answer = _attached_value(value, after)
    if answer is None or _AFTER_RE.match(text, after.end()) is not None:  # a chain: ``12/25/2023``, ``3/4^2``
        return None
    return answer


def _attached_value(value: str, after: re.Match) -> str | None:
    """``value`` with the attachment ``after`` (a match of :data:`_AFTER_RE`) read into it; None for an attachment
    that makes it no answer."""
    if after.group("den") is not None:
        den = plain_number(after.group("den"))
        return None if den is None else f"{value}/{den}"
    if after.group("exp") is not None:
        exp = after.group("exp").replace("\u2212", "-")
        return value + exp if len(exp) <= _MAX_EXP_CHARS else None
    if after.group("md") is not None:
        return mixed_number(value, after.group("mn"), after.group("md"))
    if after.group("td") is not None:
        return mixed_number(value, after.group("tn"), after.group("td"))
    if after.group("vulgar") is not None:
        frac = _VULGAR_VALUES[after.group("vulgar")]
        return mixed_number(value, frac.numerator, frac.denominator)
    return None


# Flexible mode matches on the REVERSED text, so that ``search`` finds the last number first (one left-to-right scan
# in C, no Python loop over all numbers). Reversed number: optional ``fraction.``, then digit runs joined by commas
# (checked by :func:`plain_number`: ``1, 2, 3`` is three numbers, ``1,2`` none), then optional ``$`` and minus sign.
_REV_NUMBER_RE = re.compile(
    r"(?P<num>[0-9]++\.(?![0-9])"  # a bare fraction ``.5``
    r"|(?:[0-9]++\.(?=[0-9]))?+[0-9]++(?:,[0-9]++)*+)"  # ``1,234.5``
    r"(?P<cur>\$)?(?P<sign>[-\u2212])?"
)
_REV_VULGAR_RE = re.compile(r"(?P<num>[" + _VULGAR_CHARS + r"])(?P<cur>\$)?(?P<sign>[-\u2212])?")
_LAST_RE = re.compile(r"[0-9" + _VULGAR_CHARS + r"]")  # a plain char class: ``search`` skips the rest at C speed
# What may stand before a number (matched on the reversed text, right after a reversed number): the mirror of
# :data:`_AFTER_RE`. ``power``: ``^``, ``^{``, ``2**`` (``**`` after a space is Markdown bold); ``exp``: the number is
# the exponent of ``1.5e3``; ``den``: the denominator of ``3/4``; ``chain``: ``1.2.3``, ``1'000``, ``3{4}``,
# ``1_000``, ``x_{10}``, ``2{,}000``, ``2\,000``; ``frac``: ``\frac{3}{4}``; ``fracs``: ``\frac34``, ``\frac 3 4``;
# ``root``: the number is the argument of a LaTeX value (``\sqrt{2}``, ``\sqrt[3]{8}``, ``√2``, ``0.\overline{3}``,
# ``10 \over 3``, ``3 \choose 2``).
_REV_BEFORE_RE = re.compile(
    r"(?P<power>[{(]?+[ \t]*+\^|\*\*(?=[0-9A-Za-z)}\]]))"
    r"|(?P<plus>\+)?+(?:(?P<exp>[eE](?=[0-9]))|[ \t]*+(?P<den>" + _SLASH + r")[ \t]*+(?=[0-9]))"
    r"|(?P<chain>(?:[.,'\u2019\u2032{}_]|\}[,.]\{|[,;:! ]\\)(?=[0-9])|\{_)"
    r"|(?P<frac>[ \t]*+\{[ \t]*+\}[ \t]*+(?=[0-9]))|(?P<fracs>[ \t]*+(?:(?P<fn>[0-9])[ \t]*+)?(?=carf[dtc]?\\))"
    r"|(?P<root>\{?+[ \t]*+(?:\][^\[\]]{0,16}+\[[ \t]*+)?+(?:trqs|toor|enilrevo|rab|todd?|revo|esoohc)\\"
    r"|[\u221a-\u221c])"
    # ``op``: the number is the second operand of an expression (``10 - 3``, ``3 * 4``, ``3×4``, ``(1+2) / 3``,
    # ``6 \times 7``, ``2 ** 10``, ``12:30``, ``5 * (3``, ``5!/3``): the operand before the operator ends in a digit,
    # ``)`` or a factorial. Not ``=`` (``5 + 3 = 8`` reads 8, the result), not ``: `` with a space after the colon
    # (``Step 3: 42`` is a label), not ``**`` right before the number after a space (``2 **10**`` is Markdown bold).
    # ``group``: a space and a digit before the number: a further digit group when the number has exactly 3 digits
    # (``1 000``, never ``000``), the fraction of a mixed number (``3 1/2``), else a list (``42 42 42``, ``1 2 3``
    # read the last number); see :func:`_attached_before`.
    r"|(?P<op>[ \t]*+\(?+[ \t]*+(?:[-+\u2212\u2013\u2014\u00d7\u00f7/xX\u00b7\u22c5%\u00b1\u2192<>\u2264\u2265]"
    r"|\*(?!\*)"
    r"|>-|dom(?![A-Za-z])|semit\\|todc\\|vid\\|mp\\)[ \t]*+(?=[0-9)]|!++[0-9)])"
    r"|[ \t]++\*\*[ \t]*+(?=[0-9)])|:[ \t]*+(?=[0-9)]))"
    r"|(?P<group>[ \t\u00a0\u2009\u202f]++(?=[0-9]))"
)
# A sign read with the last number that is a minus between two operands (``10-3``, ``10 -3``, ``(2+3) -3``).
_REV_MINUS_RE = re.compile(r"[ \t]*+[0-9)]")
# Reversed ``-\frac`` (``\dfrac``, ``\tfrac``, ``\cfrac``): the command before a LaTeX fraction's arguments.
_REV_FRAC_CMD_RE = re.compile(r"[ \t]*+\{[ \t]*+carf[dtc]?\\(?P<sign>[-\u2212])?")
_REV_SHORT_FRAC_CMD_RE = re.compile(r"carf[dtc]?\\(?P<sign>[-\u2212])?")
_CLOSE_RE = re.compile(r"[ \t]*+\}")  # the closing brace of a LaTeX fraction's denominator
_REV_SPACES_DIGIT_RE = re.compile(r"[ \t]*+(?=[0-9])")  # a whole number before a fraction: ``3 1/2``, ``3½``
_KINDS = ("power", "exp", "den", "chain", "frac", "fracs", "root", "op")


def flexible_answer(text: str) -> str | None:
    """The flexible answer: the last number of ``text`` with what is attached to it, as the strict path reads it:
    the last number may be the denominator (``3/4``, ``3 1/2``, ``\\frac{3}{4}``) or exponent (``1.5e-3``) of the
    answer; a power (``2^10``, ``2³``), a chain, an expression or an ambiguous number is no answer (never its last
    digits)."""
    rev = text[::-1]
    d = _LAST_RE.search(rev)
    if d is None:
        return None
    if _AFTER_RE.match(text, len(text) - d.start()) is not None:  # ``2^10``, ``2³``, ``2\pi``, ``3√2``
        return None
    if d.group() in _VULGAR_VALUES:
        return _vulgar_answer(rev, d.start())
    last = _REV_NUMBER_RE.match(rev, d.start())  # every digit starts a (reversed) number, so this matches
    kind, before = _before(rev, last)
    if kind in (None, "list"):
        return signed_number(last.group("sign"), last.group("num")[::-1])
    if kind == "frac":
        return _latex_fraction(text, rev, last, before)
    if kind == "fracs":  # ``\frac34``, ``\frac 3 4``: one digit per argument
        digits = (before["fn"] or "") + last.group("num")[::-1]
        if len(digits) != 2 or last.group("sign") or last.group("cur"):
            return None
        return _tex_fraction(_REV_SHORT_FRAC_CMD_RE.match(rev, before.end()), rev, None, digits[0], digits[1])
    if kind not in ("den", "exp") or last.group("cur") or (kind == "den" and (last.group("sign") or before["plus"])):
        return None  # a power, a chain, an expression (``10-3``, ``10 - 3``, ``3 * 4``), ``3/-4``, ``3/$4``
    head = _REV_NUMBER_RE.match(rev, before.end())
    head_kind, head_before = _before(rev, head)
    tail = signed_number(last.group("sign"), last.group("num")[::-1])
    if kind == "den" and head_kind == "list" and not head.group("sign") and not head.group("cur"):
        return _whole_mixed(rev, head_before.end(), head.group("num")[::-1], tail)  # ``3 1/2``
    num = signed_number(head.group("sign"), head.group("num")[::-1])
    if head_kind not in (None, "list") or num is None or tail is None:  # ``12/25/2023``, ``2^3/4``, ``1e2e3``
        return None
    if kind == "den":
        return f"{num}/{tail}"
    exp = before["exp"] + ("+" if before["plus"] else "") + tail  # as written, as the strict path keeps it
    return num + exp if tail.lstrip("-").isdigit() and len(exp) <= _MAX_EXP_CHARS else None


def _before(rev: str, m: re.Match) -> tuple[str | None, re.Match | None]:
    """:func:`_attached_before` for ``m``, a match of :data:`_REV_NUMBER_RE` or :data:`_REV_VULGAR_RE`."""
    return _attached_before(rev, m.end(), m.group("sign"), "" if m.group("cur") else m.group("num"))


def _attached_before(rev: str, end: int, sign: str | None, digits: str) -> tuple[str | None, re.Match | None]:
    """What stands before a number that ends at ``end`` in the reversed text ``rev`` (its sign, if any, included;
    ``digits`` its reversed digits, empty after a ``$``): ``(kind, match)`` with kind one of :data:`_KINDS`,
    ``"minus"`` (the sign is an operator between numbers: ``10-3``, ``10 -3``) or ``"list"`` (a space and a number
    before it: ``42 42``, or the whole part of ``3 1/2``); ``(None, None)`` when nothing is attached. ``op`` covers a
    further 3-digit group too (``1 000``)."""
    if sign and _REV_MINUS_RE.match(rev, end) is not None:
        return "minus", None
    before = _REV_BEFORE_RE.match(rev, end)
    if before is None:
        return None, None
    if before.group("group") is not None:  # ``1 000``: the number is a thousands group, not an answer
        return ("op" if len(digits) == 3 and digits.isdigit() else "list"), before
    return next(k for k in _KINDS if before.group(k) is not None), before


def _whole_mixed(rev: str, pos: int, num: str | int | None, den: str | int | None) -> str | None:
    """The mixed number whose whole part is the number at ``pos`` of ``rev`` and whose fraction is ``num/den``, as
    :func:`mixed_number` writes it; None when something is attached before the whole part (``10 - 3 1/2``)."""
    whole = _REV_NUMBER_RE.match(rev, pos)
    if num is None or den is None or _before(rev, whole)[0] not in (None, "list"):
        return None
    return mixed_number(signed_number(whole.group("sign"), whole.group("num")[::-1]), num, den)


def _vulgar_answer(rev: str, pos: int) -> str | None:
    """The last number when it is a vulgar fraction at ``pos`` of ``rev``: ``½`` is ``"1/2"``, ``3½`` and ``3 ½``
    ``"7/2"``; None when it is an operand (``10 - ½``)."""
    m = _REV_VULGAR_RE.match(rev, pos)
    frac = _VULGAR_VALUES[m.group("num")]
    if not m.group("sign") and not m.group("cur"):
        whole = _REV_SPACES_DIGIT_RE.match(rev, pos + 1)
        if whole is not None:
            return _whole_mixed(rev, whole.end(), frac.numerator, frac.denominator)
    if _before(rev, m)[0] is not None:
        return None
    return ("-" if m.group("sign") else "") + f"{frac.numerator}/{frac.denominator}"


def _latex_fraction(text: str, rev: str, last: re.Match, before: re.Match) -> str | None:
    r"""``\frac{3}{4}`` (``-\dfrac{3}{4}``, ``\tfrac``, ``7\frac{1}{2}``) read from its denominator ``last`` (preceded
    by ``}{``): ``"3/4"``, ``"15/2"``; another command's second argument (``\binom{3}{4}``) or a denominator that is not
    a whole argument (``\frac{3}{4x}``): None."""
    close = _CLOSE_RE.match(text, len(text) - last.start())
    if last.group("sign") or last.group("cur") or close is None or _AFTER_RE.match(text, close.end()) is not None:
        return None  # ``\frac{3}{-4}``, ``\frac{3}{4x}``, ``\frac{1}{2}^2``, ``\frac{1}{2}\pi``
    head = _REV_NUMBER_RE.match(rev, before.end())
    if head.group("cur"):
        return None
    cmd = _REV_FRAC_CMD_RE.match(rev, head.end())
    return _tex_fraction(cmd, rev, head.group("sign"), head.group("num")[::-1], last.group("num")[::-1])


def _tex_fraction(cmd: re.Match | None, rev: str, num_sign: str | None, num: str, den: str) -> str | None:
    r"""The fraction ``num/den`` after the ``\frac`` command ``cmd`` (a match on the reversed text ``rev``, with the
    sign before it): ``"3/4"``, ``"-3/4"`` for ``-\frac{3}{4}``, the improper fraction of a mixed number
    ``7\frac{1}{2}``; None when there is no ``\frac`` command (``\binom{3}{4}``) or the fraction is an operand
    (``10 - \frac{1}{2}``, ``2^\frac{1}{2}``)."""
    if cmd is None:
        return None
    sign = cmd.group("sign")
    if not sign and not num_sign:
        whole = _REV_SPACES_DIGIT_RE.match(rev, cmd.end())
        if whole is not None:
            return _whole_mixed(rev, whole.end(), num, den)
    if _attached_before(rev, cmd.end(), sign, "")[0] is not None:
        return None
    num, den = plain_number(num), plain_number(den)
    if not num or not den:
        return None
    return ("-" if bool(num_sign) != bool(sign) else "") + f"{num}/{den}"
