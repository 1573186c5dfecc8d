"""Rule scorer for MATH-style answers written in ``\\boxed{...}`` (MATH, Hendrycks et al. 2021; MATH-500).

The model's final answer is the content of the LAST ``\\boxed{...}``, ``\\boxed x`` or ``\\fbox{...}`` in the
response (case P04: ``\\fbox`` is unwrapped too). Equivalence is decided by math-verify
(``math_verify.parse`` + ``math_verify.verify``; LaTeX is parsed by latex2sympy, an ANTLR grammar) when it is
importable, with a string-normalising fallback otherwise.

Safety: the model text never reaches ``eval``/``exec``/``sympy.sympify``. math-verify's plain-expression
extractor (``ExprExtractionConfig``) calls ``sympy.parse_expr``, which uses ``eval``; it is never used here:
only ``LatexExtractionConfig`` parses the prediction. (latex2sympy itself turns lexer NUMBER tokens into
``sympy.Number(text)``, which goes through ``parse_expr``: only numerals validated by the ANTLR lexer get
there; a test checks it.) math-verify builds expressions unevaluated, but
``verify`` then simplifies/evaluates them, which never finishes for ``\\boxed{9^{9^{9^{9}}}}`` (and cannot be
interrupted: big-integer arithmetic holds the GIL in C). So the parsed expressions pass a guard first
(:func:`is_tame`): bounded node count, exponents, result digits and factorial arguments; anything bigger
scores 0. Answers longer than ``MAX_ANSWER_CHARS`` are compared as normalised strings only.
math-verify's own ``signal.alarm`` timeouts are switched off (they only work in the main thread and would
cancel the caller's own timer); the :class:`rewards.manager.RewardManager` enforces the time limit.
"""
from __future__ import annotations

import logging
import math as _pymath
import re
from fractions import Fraction
from typing import Any

__all__ = ["last_boxed_only_string", "remove_boxed", "normalize_answer", "is_tame", "is_equiv",
           "compute_score", "MAX_ANSWER_CHARS"]

MAX_ANSWER_CHARS = 256  # longer boxed answers are compared as strings only (LaTeX parsing is ~1 ms/char)
_MAX_NODES = 1000  # sympy tree size
_MAX_EXPONENT = 10_000  # |exponent| of any power with a numeric exponent
_MAX_DIGITS = 10_000  # log10 |base ** exponent| for numeric bases
_MAX_FACTORIAL_ARG = 1000
_MAX_DIGIT_RUN = 200  # digits in one literal

_BOX_PREFIXES = ("\\boxed", "\\fbox")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.S)  # an escaped char (``\{``) or a brace


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text``, including the command.

    Braces nest (``\\boxed{\\frac{1}{2}}`` is returned whole); escaped braces ``\\{ \\}`` do not count.
    The space form ``\\boxed 5`` ends at the next whitespace or ``$``. Linear time.

    Returns:
        e.g. ``"\\boxed{\\frac{1}{2}}"``; None when there is no box or the last box is not closed
        (``"\\boxed{3"``). Never raises (non-str input gives None).
    """
    if not isinstance(text, str):
        return None
    idx, prefix = max(((text.rfind(p), p) for p in _BOX_PREFIXES), key=lambda t: t[0])
    if idx < 0:
        return None
    i = idx + len(prefix)
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        if i == idx + len(prefix):  # ``\boxedx`` is another command, not a box
            return None
        j = i
        while j < n and not text[j].isspace() and text[j] != "$":
            j += 1
        return prefix + " " + text[i:j] if j > i else None
    depth = 0
    for m in _BRACE_TOKENS.finditer(text, i):
        tok = m.group(0)
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth == 0:
                return text[idx:m.end()]
    return None


def remove_boxed(s: str | None) -> str | None:
    """Unwrap ``\\boxed{x}``, ``\\fbox{x}`` or ``\\boxed x`` to ``x``; None for anything else. Never raises."""
    if not isinstance(s, str):
        return None
    s = s.strip()
    for prefix in _BOX_PREFIXES:
        if not s.startswith(prefix):
            continue
        rest = s[len(prefix):]
        stripped = rest.lstrip(" \t")
        if stripped.startswith("{"):
            return stripped[1:-1] if stripped.endswith("}") else None
        if stripped and stripped is not rest:  # the ``\boxed x`` form needs the space
            return stripped
        return None
    return None


# ---------------------------------------------------------------------------------------------------------
# string normalisation (fallback, and a cheap exact-match fast path before math-verify)

_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", "\\%", "%")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^(-?)\\frac\{(-?[0-9]{1,50})\}\{(-?[0-9]{1,50})\}$")
_SIMPLE_FRAC_RE = re.compile(r"^(-?[0-9]{1,50})/([0-9]{1,50})$")
_DEC_RE = re.compile(r"^-?(?:[0-9]{1,200}(?:\.[0-9]{0,200})?|\.[0-9]{1,200})$")


def normalize_answer(s: Any) -> str:
    """Presentation-only normalisation of a LaTeX answer (in the spirit of Hendrycks et al.'s
    ``strip_string``): drops ``\\left``/``\\right``, spacing commands, ``$``, ``\\text{}`` wrappers, degree
    signs, spaces and a trailing period; ``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``1,000`` -> ``1000``.
    Two answers with equal normalised strings are equal. Never raises."""
    s = "" if s is None else str(s)
    s = s.strip()
    if len(s) > 100 * MAX_ANSWER_CHARS:
        return s
    for tok in _REMOVE:
        s = s.replace(tok, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "")
    s = _TEXT_RE.sub(r"\1", s)
    s = "".join(s.split())
    s = re.sub(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))", "", s)
    s = s.rstrip(".")
    if s.startswith("x=") or s.startswith("y="):
        s = s[2:]
    return s


def _as_fraction(s: str) -> Fraction | None:
    try:
        if _DEC_RE.match(s):
            return Fraction(s)
        m = _FRAC_RE.match(s)
        if m:
            v = Fraction(int(m.group(2)), int(m.group(3)))
            return -v if m.group(1) else v
        m = _SIMPLE_FRAC_RE.match(s)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _string_equiv(pred: str, gold: str) -> bool:
    a, b = normalize_answer(pred), normalize_answer(gold)
    if a == b:
        return True
    fa, fb = _as_fraction(a), _as_fraction(b)
    return fa is not None and fb is not None and fa == fb


# ---------------------------------------------------------------------------------------------------------
# math-verify path

_MV = None  # (parse, verify, LatexExtractionConfig) once imported; False if unavailable


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _math_verify():
    """Import math-verify once (about 1 s, sympy); returns None when it is not installed."""
    global _MV
    if _MV is None:
        try:
            from math_verify import LatexExtractionConfig, parse, verify
            for name in ("math_verify.parser", "math_verify.grader"):
                logging.getLogger(name).addFilter(_DropTimeoutWarning())
            _MV = (parse, verify, LatexExtractionConfig)
        except Exception:  # ImportError, or a broken install
            _MV = False
    return _MV or None


def _abs_float(expr) -> float | None:
    """|expr| as a float (inf when too large); None if not a finite/infinite real-or-complex number."""
    try:
        v = expr.evalf(15)
        return float(abs(complex(v)))
    except OverflowError:
        return _pymath.inf
    except Exception:
        return None


def is_tame(expr) -> bool:
    """True when a parsed (unevaluated) sympy object is small enough to compare safely.

    Rejects: more than 1000 tree nodes; a power with a numeric exponent above 10^4 in size, or with a
    numeric base whose value would have more than 10^4 digits; factorial-like functions of a number above
    1000; non-sympy objects other than str. Each numeric sub-expression is evaluated (``evalf``, floats)
    only after all of its own sub-expressions passed, so the check itself stays cheap. Never raises.
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
            if count > _MAX_NODES:
                return False
            if getattr(node, "is_Integer", False) and node.p.bit_length() > 3.33 * _MAX_DIGIT_RUN:
                return False
            if getattr(node, "is_Pow", False):
                base, exp = node.args
                if exp.free_symbols:
                    continue
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
    except Exception:
        return False
    return True


def _parse_latex(s: str):
    parse, _, latex_cfg = _math_verify()
    return parse("\\boxed{" + s + "}", extraction_config=[latex_cfg(boxed_match_priority=0)],
                 parsing_timeout=None)


def is_equiv(pred: str, gold: str) -> bool:
    """True when two LaTeX answers (box contents) are mathematically equal.

    Uses math-verify when importable (``\\frac{1}{2}`` == ``0.5``, ``(1,2)`` == ``(1, 2)``), guarded by
    :func:`is_tame`; otherwise or on any error, normalised string / exact fraction equality. Never raises.
    """
    try:
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        if _string_equiv(pred, gold):
            return True
        if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
            return False
        if re.search(r"[0-9]{%d}" % (_MAX_DIGIT_RUN + 1), pred):
            return False
        mv = _math_verify()
        if mv is None:
            return False
        gold_parsed = [g for g in _parse_latex(gold) if is_tame(g)]
        pred_parsed = _parse_latex(pred)
        if not gold_parsed or not pred_parsed or not all(is_tame(p) for p in pred_parsed):
            return False
        return bool(mv[1](gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:
        return False


def _gold_answer(ground_truth: Any) -> str:
    gt = "" if ground_truth is None else str(ground_truth)
    if "\\boxed" in gt or "\\fbox" in gt:
        inner = remove_boxed(last_boxed_only_string(gt))
        if inner is not None:
            return inner
    return gt.strip()


def compute_score(solution_str: str, ground_truth: Any, **kwargs: Any) -> float:
    """1.0 if the last boxed answer in ``solution_str`` equals ``ground_truth``, else 0.0.

    Args:
        solution_str: the decoded model response (any length; only the last box's content is parsed).
        ground_truth: the reference answer as LaTeX (MATH-500 ``answer`` field, e.g. ``"\\frac{1}{2}"``), or a
            full solution containing ``\\boxed{...}``. Numbers are accepted too.
        **kwargs: ignored (so the registry can pass ``extra_info``-style extras).

    Returns:
        A Python float in {0.0, 1.0}. A response without a (closed) box scores 0.0. Never raises.
    """
    try:
        pred = remove_boxed(last_boxed_only_string(solution_str))
        if pred is None or not pred.strip():
            return 0.0
        return 1.0 if is_equiv(pred, _gold_answer(ground_truth)) else 0.0
    except Exception:
        return 0.0
