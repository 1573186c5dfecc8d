"""Reading the text of a MATH-style answer (a box's content) for :mod:`rewards.math`: presentation-only
normalisation (:func:`normalize_answer`), the answer that typesets as nothing (:func:`is_empty_answer`), and how a
box's content reads as an equation, a labelled answer (``x = 2``) or a plain one (:func:`_equation`,
:func:`_has_variable`). String work only (regular expressions; no parser, no sympy).

:mod:`rewards.math` re-exports these names; see its module docstring for how they decide equivalence.
"""
from __future__ import annotations

import re
from typing import Any

from rewards.math_guards import collapse_braces

__all__ = ["normalize_answer", "is_empty_answer", "MAX_ANSWER_CHARS"]

MAX_ANSWER_CHARS = 256  # longer boxed answers are compared as strings only (LaTeX parsing is ~1 ms/char)


# ---------------------------------------------------------------------------------------------------------
# string normalisation (fallback, and a cheap exact-match fast path before math-verify)

_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", "\\%", "%")
# Spacing and invisible material that typesets as nothing: ``\quad``, ``\ `` (a control space), ``~``, ``\hspace{1cm}``,
# ``\phantom{5}``. A line break ``\\`` is matched first so that its second backslash is never read as a command.
_SPACING_RE = re.compile(
    r"\\\\|\\(?:q?quad|enspace|enskip|thinspace|medspace|thickspace|negthinspace|negmedspace|negthickspace|hfill?"
    r"|vfill|nobreak|relax|textstyle)(?![a-zA-Z])|\\[hv]space\*?\{[^{}]*\}|\\[hv]?phantom\{[^{}]*\}|\\[ >]|~")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
# invisible format characters (soft hyphen, zero-width spaces and joiners, word joiner, byte-order mark): dropped
_INVISIBLE = r"[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]"
_INVISIBLE_RE = re.compile(_INVISIBLE)
# What :func:`is_empty_answer` deletes besides :func:`normalize_answer`: text-style wrapper names and braces (any
# nesting: ``\text{\mbox{ }}``), line breaks, whitespace, periods, ``$``, ``\left``/``\right``, spacing.
_NOTHING_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|textsf|texttt|mathrm|mbox|hbox|left|right|displaystyle)"
    r"(?![a-zA-Z])|\\[,;:!%]|\\\Z|\^\s*\\circ|\^\s*\{\s*\\circ\s*\}|[{}$%.\s]|" + _INVISIBLE)
# a degree sign, spaced or not: ``^\circ``, ``^ \circ``, ``^{ \circ }``
_DEGREES_RE = re.compile(r"\^\s*(?:\\circ(?![a-zA-Z])|\{\s*\\circ\s*\})")
_LABEL_RE = re.compile(r"^[xy]=")  # a leading ``x=`` / ``y=`` names the variable the answer is for


def _normalize(s: Any) -> str:
    """:func:`normalize_answer` without dropping a leading ``x=`` / ``y=``."""
    s = _INVISIBLE_RE.sub("", "" if s is None else str(s)).strip()
    if len(s) > 100 * MAX_ANSWER_CHARS:
        return s
    s = _SPACING_RE.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else "", s)
    for tok in _REMOVE:
        s = s.replace(tok, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES_RE.sub("", s)
    s = _TEXT_RE.sub(r"\1", s)
    s = "".join(s.split())
    s = re.sub(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))", "", s)
    s = s.rstrip(".")
    return collapse_braces(s)


def normalize_answer(s: Any) -> str:
    """Presentation-only normalisation of a LaTeX answer (in the spirit of Hendrycks et al.'s
    ``strip_string``): drops invisible characters, ``\\left``/``\\right``, spacing commands (``\\,``, ``\\quad``,
    ``\\ ``, ``~``, ``\\hspace{..}``, ``\\phantom{..}``), ``$``, ``\\text{}`` wrappers, degree signs, spaces, a
    trailing period and a leading ``x=``/``y=``; ``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``1,000`` -> ``1000``;
    braces that typeset as nothing (``{{x}}`` -> ``{x}``, braces around the whole answer). Two answers with equal
    normalised strings are equal, unless they name different variables (:func:`is_equiv`). Returns a str (``""``
    for None); never raises."""
    return _LABEL_RE.sub("", _normalize(s))


def is_empty_answer(s: Any) -> bool:
    """True when the answer ``s`` (a box's content, or a ground truth) typesets as nothing: None, or only spacing
    (``\\,``, ``\\quad``, ``~``), empty text wrappers (``\\text{}``, nested too), braces, ``$``, periods, a bare
    ``x=``, a lone backslash at the end (``"\\ "`` once stripped), invisible characters (zero-width space, soft
    hyphen, byte-order mark; :func:`normalize_answer` drops them too). Such an answer is no answer: it never matches,
    and earns no format reward. Linear time; never raises."""
    try:
        s = "" if s is None else str(s)
        return not normalize_answer(s) or not _NOTHING_RE.sub("", _SPACING_RE.sub("", s))
    except Exception:  # a value whose str() raises
        return True


# ---------------------------------------------------------------------------------------------------------
# equations and labels

# A label: the name of what the answer is for, a single variable: one Latin letter or one Greek letter command
# (``\pi`` is a number, not a name), optionally wrapped in ``\mathbf``/``\vec``/``\hat``/``\bar``/``\overline``/
# ``\tilde``, optionally with a subscript (``a_1``, ``a_{12}``, ``x_n``) and primes (``f'``), optionally applied
# to such names (``f(x)``, ``g(x,y)``, ``f'(t)``). Matched on the normalised text (no spaces).
_GREEK = (r"alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|"
          r"sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Upsilon|Phi|Psi|Omega")
_NAME = r"(?:[A-Za-z]|\\(?:" + _GREEK + r")(?![A-Za-z]))"
_VAR = (r"(?:\\(?:mathbf|vec|hat|bar|overline|tilde)\{" + _NAME + r"\}|" + _NAME + r")"
        r"(?:_(?:[A-Za-z0-9]|\{[A-Za-z0-9,]{1,8}\}))?'*")
_LABEL_NAME_RE = re.compile(_VAR + r"(?:\(" + _VAR + r"(?:," + _VAR + r")*\))?")
_MAX_LABELS = 8  # a longer chain ``a = b = ... = 5`` is not read as labels
# Tokens that open or close a group (``=`` inside one is not the equation's: ``\{x=1\}``, ``\text{a=b}``).
_GROUP_TOKENS = re.compile(r"\\[{}]|\\[A-Za-z]+|\\.|[{}()\[\]=]", re.S)


def _equation(s: str) -> tuple[str, tuple[str, ...] | None, str]:
    """How a box's content reads as an answer: ``(kind, labels, answer)``.

    * ``("plain", None, s)``: no top-level ``=``.
    * ``("labelled", labels, answer)``: ``label = answer`` or a chain ``x = y = answer`` whose every left part is a
      label (:data:`_LABEL_NAME_RE`: a single variable name such as ``x``, ``a_1``, ``f(x)``, ``\theta``); the
      answer is the last right-hand side, ``labels`` the normalised left parts.
    * ``("equation", None, s)``: any other equation (``2+2=5``, ``3=5``, ``1=2=3=5``, ``5x-7y+4=0``, ``x+y=5``,
      ``a<=b``): not a plain answer, compared whole.
    """
    parts, depth, start = [], 0, 0
    for m in _GROUP_TOKENS.finditer(s):
        tok = m.group(0)
        if tok in ("{", "(", "[", "\\{"):
            depth += 1
        elif tok in ("}", ")", "]", "\\}"):
            depth -= 1
        elif tok == "=" and depth == 0:
            parts.append(s[start:m.start()])
            start = m.end()
            if len(parts) > _MAX_LABELS:
                return "equation", None, s
    if not parts:
        return "plain", None, s
    labels = []
    for part in parts:
        label = _normalize(part)
        if _LABEL_NAME_RE.fullmatch(label) is None:
            return "equation", None, s
        labels.append(label)
    answer = s[start:].strip()
    return ("labelled", tuple(labels), answer) if answer else ("equation", None, s)


_COMMAND_RE = re.compile(r"\\[A-Za-z]+")


def _has_variable(s: str) -> bool:
    """Whether ``s`` names a variable: a Latin letter outside LaTeX command names (``\\frac``, ``\\pi``)."""
    return any(c.isascii() and c.isalpha() for c in _COMMAND_RE.sub("", _normalize(s)))
