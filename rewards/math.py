"""Rule scorer for MATH-style answers written in ``\\boxed{...}`` (MATH, Hendrycks et al. 2021; MATH-500).

The model's final answer is the content of the LAST box in the response: ``\\boxed{...}``, ``\\fbox{...}``,
``\\boxed x`` or ``\\boxed5`` (:func:`last_boxed_only_string`: read as TeX reads the last box command's argument,
never an earlier box; a longer command such as ``\\fboxsep`` is no box). Equivalence is
decided by math-verify (``math_verify.parse`` + ``math_verify.verify``; LaTeX is parsed by latex2sympy, an ANTLR
grammar) when it is importable, with a string-normalising fallback otherwise; see :func:`is_equiv` for the order
of the checks. The answer's text (normalisation, the empty answer, equations and labels) is read by
:mod:`rewards.math_text`.

No answer: a box whose content typesets as nothing (``\\boxed{\\,}``, ``\\boxed{\\text{}}``, ``\\boxed{$ $}``,
``\\boxed{\\quad}``, ``\\boxed{{}}``; :func:`is_empty_answer`) scores 0 like a missing box, and an empty or None
ground truth never matches.

Equations (:func:`_equation`): a box ``label = answer`` is read as its answer only when the left side is a label, a
single variable name: one Latin letter or Greek letter command (not ``\\pi``), optionally under ``\\mathbf``/
``\\vec``/``\\hat``/``\\bar``/``\\overline``/``\\tilde``, with an optional subscript (``a_1``, ``a_{12}``) and primes,
optionally applied to such names (``f(x)``, ``g(x,y)``); a chain ``x = y = 5`` only when every left part is one.
``x=2`` matches ``2`` both ways and ``x=2``; two equations labelled differently (``x=2``, ``y=2``) are different
answers. Any other equation (``2+2=5``, ``3=5``, ``1=2=3=5``, ``x+y=5``, ``AB=5``) is not a plain answer: it is
compared whole, never reduced to its right-hand side (math-verify would take ``5`` from ``2+2=5``), so it never
matches a plain gold (``\\boxed{2+2=5}`` scores 0 against ``5``, ``\\boxed{0}`` 0 against ``5x-7y+11z+4=0``);
two equations in variables are compared as equations by math-verify (``-5x+7y-11z-4=0`` is ``5x-7y+11z+4=0``,
``y-2x-3=0`` is ``y=2x+3``); an equation without a variable (``2+2=5``) matches only the same text.

Correctness: math-verify rounds decimals to 6 places when it compares them (``0.333333`` == ``\\frac{1}{3}``); a
numeric answer it accepts is compared again exactly (:mod:`rewards.math_exact`), so rounding never makes unequal
values equal.

Time: the scorer bounds its own time (:mod:`rewards.math_guards`): redundant braces are removed, answers nested
too deep for the parser are refused before parsing, parsed expressions too big to evaluate
(``9^{9^{9^{9}}}``) are refused before sympy evaluates them, pairs whose ``simplify`` would expand too far
(``(x+1)^{100}(x+2)^{100}(x+3)^{100}`` against ``1``) are decided without it when both sides are rational functions
(:mod:`rewards.math_expand`), and
whatever is left runs under a hard limit (``timeout_seconds``, default ``TIMEOUT_SECONDS``); answers longer than
``MAX_ANSWER_CHARS`` are compared as normalised strings only. The :class:`rewards.manager.RewardManager` keeps its
own per-sample limit on top.

Safety: the model text never reaches ``eval``/``exec``/``sympy.sympify``. math-verify's plain-expression
extractor (``ExprExtractionConfig``) calls ``sympy.parse_expr``, which uses ``eval``; it is never used here:
only ``LatexExtractionConfig`` parses the prediction. (latex2sympy itself turns lexer NUMBER tokens into
``sympy.Number(text)``, which goes through ``parse_expr``: only numerals validated by the ANTLR lexer get
there; a test checks it.) math-verify's own ``signal.alarm`` timeouts are switched off (whole seconds only, and
they would cancel the caller's timer).
"""
from __future__ import annotations

import functools
import logging
import re
from fractions import Fraction
from typing import Annotated, Any

from rewards.math_exact import answers_agree
from rewards.math_expand import fast_verdict
from rewards.math_guards import (TIME_LIMIT_RULE, ScorerTimeout, collapse_braces, is_tame, note_limit_hit,
                                  structure_ok, time_bound)
from rewards.math_tame import names_unevaluated, unevaluated
# the answer's text (normalisation, the empty answer, equations and labels): rewards.math_text, importable from here
from rewards.math_text import MAX_ANSWER_CHARS, _equation, _has_variable, _normalize, is_empty_answer, normalize_answer

__all__ = ["last_boxed_only_string", "last_box", "box_commands", "remove_boxed", "normalize_answer",
           "is_empty_answer", "is_tame", "is_equiv",
           "gold_answer", "compute_score", "load_math_verify", "warm_math_verify", "MAX_ANSWER_CHARS",
           "TIMEOUT_SECONDS", "TimeLimit"]

TIMEOUT_SECONDS = 1.0  # default hard limit of one comparison (parse + verify + cross-check), see time_bound
#: the type of ``timeout_seconds``: a finite number of seconds > 0, or None for no limit (checked before start-up as a
#: scorer option, and by :func:`compute_score` / :func:`is_equiv`, which raise ValueError for another value)
TimeLimit = Annotated[float | None, TIME_LIMIT_RULE]

_BOX_PREFIXES = ("\\boxed", "\\fbox")
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.S)  # an escaped char (``\{``) or a brace
# ``\boxed`` / ``\fbox`` as a whole command name: ``\fboxsep``, ``\fboxrule``, ``\boxedx`` are other commands
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_TOKEN_END = re.compile(r"[\s$]")


def _box_argument(text: str, m: re.Match) -> tuple[str, int, int]:
    """How the box command ``m`` takes its argument, as TeX does: ``("brace", i, -1)`` (``{`` at ``i``),
    ``("token", i, j)`` (the answer is ``text[i:j]``: whatever follows, up to the next whitespace or ``$``) or
    ``("cut", -1, -1)``: nothing but spaces follows (a response cut there), or no argument can follow (``$``, ``}``);
    no answer then, and never an earlier box."""
    i, n = m.end(), len(text)
    while i < n and text[i].isspace():  # TeX skips the spaces (and a line end) before an argument
        i += 1
    if i >= n or text[i] in "$}":
        return "cut", -1, -1
    if text[i] == "{":
        return "brace", i, -1
    end = _TOKEN_END.search(text, i)
    return "token", i, end.start() if end else n


def box_commands(text: str) -> list[re.Match]:
    """The ``\\boxed`` / ``\\fbox`` commands of ``text`` (whole command names: not ``\\fboxsep``), in order."""
    if not isinstance(text, str):
        return []
    return list(_BOX_COMMAND.finditer(text))


def last_box(text: str) -> tuple[int, int, str] | None:
    """``(start, end, box)`` of the last box of ``text`` (see :func:`last_boxed_only_string`, which returns
    ``box``): ``text[start:end]`` is the box as written. None when there is none or the last one is not closed."""
    commands = box_commands(text)
    if not commands:
        return None
    m = commands[-1]
    kind, i, j = _box_argument(text, m)
    if kind == "token":
        return m.start(), j, m.group(0) + " " + text[i:j]
    depth = 0
    for t in _BRACE_TOKENS.finditer(text, i) if kind == "brace" else ():
        depth += {"{": 1, "}": -1}.get(t.group(0), 0)
        if depth == 0:
            return m.start(), t.end(), text[m.start():t.end()]
    return None


def last_boxed_only_string(text: str) -> str | None:
    """The last box in ``text``, including the command: ``\\boxed{...}``, ``\\fbox{...}``, or a token form.

    Braces nest (``\\boxed{\\frac{1}{2}}`` is returned whole); escaped braces ``\\{ \\}`` do not count.
    The last ``\\boxed`` / ``\\fbox`` command is the answer, read as TeX reads its argument: spaces and a line end
    before it are skipped (``\\boxed\\n{5}``); without a brace, whatever follows is the answer up to the next
    whitespace or ``$`` (``\\boxed 5``, ``\\boxed5``, ``\\boxed -5``, ``\\boxed (1,2)``, ``\\boxed\\pi``, ``\\boxed Yes``;
    TeX boxes the first token of it), returned as ``"\\boxed 5"``. It is never passed over for an earlier box: a
    command with nothing after it but spaces (a response cut there), or with ``$`` or ``}`` next, gives no answer. A
    longer command name (``\\fboxsep``, ``\\boxedx``) is no box command at all. Linear time.

    Returns:
        e.g. ``"\\boxed{\\frac{1}{2}}"``; None when there is no box, or the last box is not closed (``"\\boxed{3"``)
        or has no argument (a text ending in ``\\boxed``). Never raises (non-str input gives None).
    """
    found = last_box(text)
    return None if found is None else found[2]


def remove_boxed(s: str | None) -> str | None:
    """Unwrap ``\\boxed{x}``, ``\\fbox{x}``, ``\\boxed x``, ``\\boxed5``, ``\\boxed-5`` or ``\\boxed\\pi`` to ``x`` (spaces and
    line ends before the argument skipped); None for anything else. Never raises."""
    if not isinstance(s, str):
        return None
    s = s.strip()
    for prefix in _BOX_PREFIXES:
        if not s.startswith(prefix):
            continue
        rest = s[len(prefix):]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            return stripped[1:-1] if stripped.endswith("}") else None
        if stripped and stripped[0] not in "$}" and (stripped is not rest or not stripped[0].isalpha()):  # a letter
            # right after the name makes another command (``\boxedx``)
            return stripped
        return None
    return None


# ---------------------------------------------------------------------------------------------------------
# the plain verdict: equal normalised strings, or plain numbers compared exactly

_FRAC_RE = re.compile(r"^(-?)\\frac\{(-?[0-9]{1,50})\}\{(-?[0-9]{1,50})\}$")
_SIMPLE_FRAC_RE = re.compile(r"^(-?[0-9]{1,50})/([0-9]{1,50})$")
_DEC_RE = re.compile(r"^-?(?:[0-9]{1,200}(?:\.[0-9]{0,200})?|\.[0-9]{1,200})$")


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


def _plain_verdict(pred: str, gold: str) -> bool | None:
    """True when the normalised strings are equal; the exact comparison when both are plain numbers; else
    None (undecided). Labels are handled before (:func:`_equation`)."""
    a, b = _normalize(pred), _normalize(gold)
    if a == b:
        return True
    fa, fb = _as_fraction(a), _as_fraction(b)
    return None if fa is None or fb is None else fa == fb


# ---------------------------------------------------------------------------------------------------------
# math-verify path

_MV = None  # (parse, verify, LatexExtractionConfig) once imported; False if unavailable


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def load_math_verify():
    """Import math-verify once (about 1 s, sympy): ``(parse, verify, LatexExtractionConfig)``, or None when it is
    not installed (or fails to import). The reward manager calls it before forking its scoring workers."""
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


#: comparisons :func:`warm_math_verify` runs: a fraction (ANTLR's first full parse) and a polynomial identity (sympy
#: imports ``sympy.combinatorics`` / ``sympy.tensor`` lazily the first time it compares polynomials)
_WARM_UP = ((r"\frac{x}{2}", "x/2"), ("x^2+1", "1+x^2"))
_WARMED = False


def warm_math_verify() -> bool:
    """Run math-verify's first comparisons once in this process, without a time limit: its first parse and verify
    pay a cold start (the parser's and sympy's lazy imports and caches: about 0.3 s idle, more than the scorer's 1 s
    ``timeout_seconds`` on a loaded machine) that would otherwise fall inside the first scored comparison. The reward
    manager calls it before forking its scoring processes, which inherit the warmed state, and :func:`is_equiv`
    before its first timed comparison in a process (scoring in the manager's own process, a direct call). Returns
    True when math-verify is available and warmed (at most once per process); never raises."""
    global _WARMED
    if not _WARMED and load_math_verify() is not None:
        try:
            for pred, gold in _WARM_UP:
                _verify_exact(pred, gold)
        except Exception:  # a broken install: scoring falls back as before
            pass
        _WARMED = True
    return _WARMED and bool(_MV)


def _parse_latex(s: str):
    parse, _, latex_cfg = load_math_verify()
    return parse("\\boxed{" + s + "}", extraction_config=[latex_cfg(boxed_match_priority=0)],
                 parsing_timeout=None)


@functools.lru_cache(maxsize=1024)
def _parse_gold(s: str) -> tuple:
    """The tame parses of a reference answer (cached: every sample of a prompt has the same one)."""
    return tuple(g for g in _parse_latex(s) if is_tame(g))


def _verify_exact(pred: str, gold: str) -> bool:
    """math-verify's verdict for some pair of parses, confirmed by the exact numeric cross-check."""
    verify = load_math_verify()[1]
    gold_parsed = _parse_gold(gold)
    pred_parsed = _parse_latex(pred)
    if not gold_parsed or not pred_parsed or not all(is_tame(p) for p in pred_parsed):
        return False
    if any(unevaluated(x) for x in (*gold_parsed, *pred_parsed)):  # an integral, a limit, ...: not a final answer,
        return any(g == p for g in gold_parsed for p in pred_parsed  # equal only as the same expression, never done
                   if not isinstance(g, str) and not isinstance(p, str))
    return any(_equal(g, p, verify) and answers_agree(g, p) is not False for g in gold_parsed for p in pred_parsed)


def _equal(gold, pred, verify) -> bool:
    """:func:`rewards.math_expand.fast_verdict` where it decides (the same expression; a pair too slow to simplify:
    exact values of rational functions; a difference proven by values at random points), else math-verify's
    ``verify``."""
    verdict = fast_verdict(gold, pred)
    return verify([gold], [pred], timeout_seconds=None) if verdict is None else verdict


def is_equiv(pred: str, gold: str, timeout_seconds: TimeLimit = TIMEOUT_SECONDS) -> bool:
    """True when two LaTeX answers (box contents) are mathematically equal.

    Order: equations first (:func:`_equation`): a leading label is dropped (``x=2`` vs ``2``) unless both sides are
    labelled differently (``x=2`` vs ``y=2``: compared whole); an equation whose left side is not a label
    (``2+2=5``) against a plain answer, or without a variable, is equal only as the same normalised text; two
    equations in variables go on whole. Then: normalised strings equal -> True; both plain numbers (integers,
    decimals, ``a/b``, ``\\frac{a}{b}``) -> exact comparison; longer than ``MAX_ANSWER_CHARS`` or nested too deep
    (:func:`rewards.math_guards.structure_ok`) -> False; else math-verify (``\\frac{1}{2}`` == ``0.5``, ``(1,2)`` ==
    ``(1, 2)``) on :func:`is_tame` parses (unless :func:`rewards.math_expand.fast_verdict` decides first: rational
    functions too slow to simplify, exactly at random points; a pair proven different by its values), with numeric
    answers confirmed exactly (:func:`rewards.math_exact.answers_agree`: ``\\frac{1}{3}`` != ``0.333333``), all
    within ``timeout_seconds`` (None: no limit; see :func:`rewards.math_guards.time_bound`). An empty answer on
    either side (:func:`is_empty_answer`), no math-verify, any error or timeout: False. A comparison cut short by
    ``timeout_seconds`` is recorded (:func:`rewards.math_guards.note_limit_hit`), so that the reward manager counts
    it apart from a wrong answer (``reward/num_scorer_timeouts``) and warns.

    Not a final answer: a side whose parse holds an integral, a limit, a derivative, or a sum or product over an
    infinite or variable number of terms (:func:`rewards.math_tame.unevaluated`) is never carried out; it matches only
    the same normalised text or the same parsed expression (``\\int_0^1 x dx`` against ``\\frac{1}{2}``: False). Such
    a comparison takes under a millisecond after its shape's first parse, instead of up to the whole limit.

    Raises:
        ValueError: ``timeout_seconds`` is neither None nor a finite number > 0 (0, -1, nan, inf). Nothing else.
    """
    TIME_LIMIT_RULE.check("timeout_seconds", timeout_seconds)
    try:
        if not isinstance(pred, str) or not isinstance(gold, str) or is_empty_answer(pred) or is_empty_answer(gold):
            return False
        pred, gold = collapse_braces(pred.strip()), collapse_braces(gold.strip())
        (pkind, plabels, pans), (gkind, glabels, gans) = _equation(pred), _equation(gold)
        if pkind == "equation" or gkind == "equation":
            if pkind == "plain" or gkind == "plain" or not _has_variable(pred) or not _has_variable(gold):
                # an equation is never a plain answer (``2+2=5`` is not 5), and an equation without a variable
                # (``2+2=5``, ``3=4``) is a claim, true or false, never equal to another one: the text only
                return _normalize(pred) == _normalize(gold)
            # two equations in variables: compared whole (math-verify compares the equations, never one side with
            # an answer: ``5x-7y+11z+4=0`` is ``-5x+7y-11z-4=0``)
        elif not (plabels and glabels and plabels != glabels):  # ``x=2`` vs ``2``, ``x=2`` vs ``x=2``
            pred, gold = pans, gans
        # else different labels (``x=2`` vs ``y=2``): compared whole, different answers
        verdict = _plain_verdict(pred, gold)
        if verdict is not None:
            return verdict
        if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
            return False
        if names_unevaluated(pred) or names_unevaluated(gold):
            return False  # an integral or a limit is not a final answer: equal only as the same text (above)
        if not structure_ok(pred) or not structure_ok(gold) or not warm_math_verify():
            return False  # the first call in a process warms math-verify outside the limit (the manager's own too)
        with time_bound(timeout_seconds):
            return _verify_exact(pred, gold)
    except ScorerTimeout:  # not a verified wrong answer: recorded for the reward manager, still False
        note_limit_hit(timeout_seconds)
        return False
    except Exception:
        return False


def gold_answer(ground_truth: Any) -> str:
    """The reference answer :func:`compute_score` compares the model's answer with.

    Args:
        ground_truth: the reference answer (LaTeX such as ``"\\frac{1}{2}"``, or a number) or a full solution
            containing ``\\boxed{...}``; None counts as ``""``.

    Returns:
        The content of the LAST closed box (``\\boxed{...}``, ``\\fbox{...}``, ``\\boxed x``, ``\\boxed5``:
        :func:`last_boxed_only_string`) of ``str(ground_truth)`` when it has one (as written, not stripped:
        ``\\boxed{ 5 }`` gives ``" 5 "``), else the text stripped of surrounding whitespace.
    """
    gt = "" if ground_truth is None else str(ground_truth)
    if "\\boxed" in gt or "\\fbox" in gt:
        inner = remove_boxed(last_boxed_only_string(gt))
        if inner is not None:
            return inner
    return gt.strip()


def compute_score(solution_str: str, ground_truth: Any, timeout_seconds: TimeLimit = TIMEOUT_SECONDS) -> float:
    """1.0 if the last boxed answer in ``solution_str`` equals ``ground_truth``, else 0.0.

    Args:
        solution_str: the decoded model response (any length; only the last box's content is parsed).
        ground_truth: the reference answer as LaTeX (MATH-500 ``answer`` field, e.g. ``"\\frac{1}{2}"``), or a
            full solution containing ``\\boxed{...}``. Numbers are accepted too.
        timeout_seconds: hard limit in seconds of the comparison (see :func:`is_equiv`), a finite number > 0;
            None: no limit.

    Returns:
        A Python float in {0.0, 1.0}. A response without a (closed) box, or whose box is empty
        (:func:`is_empty_answer`), scores 0.0, as does any response against an empty or None ground truth.

    Raises:
        ValueError: ``timeout_seconds`` is neither None nor a finite number > 0; nothing else raises.
    """
    TIME_LIMIT_RULE.check("timeout_seconds", timeout_seconds)
    try:
        pred = remove_boxed(last_boxed_only_string(solution_str))
        if pred is None:  # an empty box is no answer too: is_equiv refuses it
            return 0.0
        return 1.0 if is_equiv(pred, gold_answer(ground_truth), timeout_seconds=timeout_seconds) else 0.0
    except Exception:
        return 0.0
