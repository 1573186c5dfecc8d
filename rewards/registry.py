"""Scorer registry: names (and ``data_source`` values) -> scorer functions, plus user scorers from a file.

A scorer is ``score(solution_str, ground_truth, extra_info=None, <options>) -> float | dict``; a dict must hold
``"score"`` (other keys, e.g. ``acc``/``format``, are reported by the reward manager). Its options are named
keyword parameters, set with ``reward_model.scorer_kwargs``; an option a scorer does not name is refused before
training starts (:func:`rewards.options.check_scorer_options`). Built-ins and their options:

* ``gsm8k`` (also ``gsm8k_strict``, ``openai/gsm8k``, ``svamp``): :mod:`rewards.gsm8k`; options
  ``method`` (``"strict"``: the last ``#### N``, default; ``"flexible"``: the last number), ``format_score``,
  ``score``, ``answer_after``. SVAMP ground truths are floats such as ``12.0``; the comparison is numeric.
* ``answer_after`` (the gsm8k, math and format scorers): the answer is read only after the LAST occurrence of
  this string, by default ``</tool_response>`` (the end of a tool answer in Hermes/Qwen chat templates), so that in
  a multi-turn tool rollout a tool output (a program printing ``#### 42`` or ``\\boxed{42}``) never counts as the
  model's answer; a response without it is read whole; ``null`` always reads the whole response. For a multi-turn
  row the reward manager places the string after the last tool turn itself, whatever the chat template renders,
  and its own ``</tool_response>`` is no boundary (:func:`rewards.response_text.solution_text`).
* ``gsm8k_flexible`` (also ``synthetic/digits``): the same with ``method="flexible"`` by default.
* ``math`` (also ``math500``, ``lighteval/MATH``, ``HuggingFaceH4/MATH-500``): :mod:`rewards.math` (last
  ``\\boxed{}``, math-verify); option ``timeout_seconds`` (hard limit of one comparison, default 1 s; a finite
  number > 0, or null for none).
* ``format_gsm8k`` / ``format_boxed``: :mod:`rewards.format_reward` (dict with ``score``, ``acc``, ``format``);
  options ``correct_score``, ``format_score``, ``strict_format`` (one answer, at most 64 characters after it;
  default false).

User scorers from a file follow verl's ``custom_reward_function.{path,name}``: :func:`load_custom_scorer`.
verl-style functions ``f(data_source, solution_str, ground_truth, extra_info=None)`` are adapted.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import numbers
import os
import sys
from typing import Any, Callable, Literal

from rewards import arith_tool, format_reward, gsm8k
from rewards import math as math_reward
from rewards.gsm8k import TOOL_RESPONSE_END

__all__ = ["Scorer", "register_scorer", "get_scorer", "list_scorers", "registry_version", "load_custom_scorer",
           "ImportEndedError", "wants_data_source", "DEFAULT_DATA_SOURCES", "ground_truth_problem"]

Scorer = Callable[..., Any]  # score(solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict

_REGISTRY: dict[str, Scorer] = {}
_VERSION = [0]  # bumped on every registration, so that process pools forked earlier can be refreshed


def registry_version() -> int:
    """A counter that changes whenever a scorer is registered (the reward manager re-forks its workers)."""
    return _VERSION[0]


def register_scorer(name: str, *aliases: str, overwrite: bool = False) -> Callable[[Scorer], Scorer]:
    """Decorator registering a scorer under ``name`` (and optional ``aliases``, e.g. data_source values).

    Example::

        @register_scorer("my_task", "my_org/my_dataset")
        def score(solution_str, ground_truth, extra_info=None, **kwargs):
            return float(solution_str.strip() == ground_truth)

    Raises:
        TypeError: if a name is not a non-empty str, or the decorated object is not callable.
        ValueError: if a name is already registered and ``overwrite`` is False.
    """
    names = (name, *aliases)
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"scorer names must be non-empty strings, got {n!r}")
        if n in _REGISTRY and not overwrite:
            raise ValueError(f"a scorer is already registered as {n!r}; pass overwrite=True to replace it")

    def deco(fn: Scorer) -> Scorer:
        if not callable(fn):
            raise TypeError(f"register_scorer({name!r}) expects a callable, got {type(fn).__name__}")
        for n in names:
            _REGISTRY[n] = fn
        _VERSION[0] += 1
        return fn

    return deco


def get_scorer(name: str) -> Scorer:
    """The scorer registered as ``name`` (a scorer name or a data_source value such as ``"openai/gsm8k"``).

    Raises:
        KeyError: naming the unknown value and listing the registered names.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"no reward scorer registered for {name!r}; registered: {sorted(_REGISTRY)}. "
                       "Register one with rewards.registry.register_scorer, pass reward_model.scorer=<name>, or "
                       "load one with custom_reward_function.path") from None


def list_scorers() -> list[str]:
    """All registered names (scorer names and data_source aliases), sorted."""
    return sorted(_REGISTRY)


# ---- built-ins -------------------------------------------------------------------------------------------

DEFAULT_DATA_SOURCES = {
    "openai/gsm8k": "gsm8k", "svamp": "gsm8k",
    "math500": "math", "lighteval/MATH": "math", "HuggingFaceH4/MATH-500": "math",
    "synthetic/digits": "gsm8k_flexible",
}


def _aliases(scorer_name: str) -> tuple[str, ...]:
    return tuple(k for k, v in DEFAULT_DATA_SOURCES.items() if v == scorer_name)


_Method = Literal["strict", "flexible"]

#: the built-in scorers, each comparing the response's answer with ONE reference answer (a string or a number):
#: ``{scorer: (reads(truth) -> bool, what it reads)}``; see :func:`ground_truth_problem`
_ONE_ANSWER: dict = {}


def _reads_number(truth: Any) -> bool:
    """The gsm8k scorers read the reference answer as they read the model's (:func:`rewards.gsm8k.numbers_equal`)."""
    return gsm8k.normalize_number(truth) is not None


def _reads_whole_number(truth: Any) -> bool:
    """The tool-arithmetic scorer compares whole numbers only (:func:`rewards.arith_tool.compute_score`)."""
    value = gsm8k.normalize_number(truth)
    return value is not None and value.denominator == 1


def _reads_math(truth: Any) -> bool:
    """The MATH scorer compares with the reference's boxed content or text (:func:`rewards.math.gold_answer`); one
    that typesets as nothing (:func:`rewards.math.is_empty_answer`) never matches, nor does a solution whose last box
    is not closed (``"... \\boxed{6"``, a cut solution: its whole text would be the reference)."""
    text = "" if truth is None else str(truth)
    if ("\\boxed" in text or "\\fbox" in text) and math_reward.last_boxed_only_string(text) is None:
        return False
    return not math_reward.is_empty_answer(math_reward.gold_answer(truth))


_NUMBER = "one number (such as 42, -3, 1,234, 3.50, $5, 5/2 or a solution ending in '#### 42')"
_WHOLE_NUMBER = "one whole number (such as 42, -3 or 1,234)"
_MATH = "an answer that typesets as something (LaTeX such as \\frac{1}{2}, or a solution with \\boxed{...})"


def _one_answer(reads: Callable[[Any], bool], what: str) -> Callable[[Scorer], Scorer]:
    """Mark a built-in scorer as comparing one reference answer, read by ``reads`` (``what`` it reads, for errors)."""
    def mark(fn: Scorer) -> Scorer:
        _ONE_ANSWER[fn] = (reads, what)
        return fn

    return mark


def ground_truth_problem(fn: Scorer, truth: Any) -> str | None:
    """Why the scorer ``fn`` cannot compare the ground truth ``truth``, or None. The built-in scorers compare one
    reference answer, a string or a number (verl's ``gsm8k`` compares with ``==`` and scores a list 0, its MATH
    scorers compare its text ``"['6']"``), and read it as they read the model's answer: a list, a dict or another
    value, or a string or number they cannot read as an answer (``"six"`` or ``"1,2"`` for the gsm8k scorers, which
    read one number), would score 0 on every response. A custom scorer gets the value as it is (None here).
    Never raises."""
    if fn not in _ONE_ANSWER:
        return None
    name = getattr(fn, "__name__", fn)
    if not isinstance(truth, (str, numbers.Real)):
        return (f"the built-in scorer {name} compares the answer with one reference answer, a string or a number, "
                "so every response would score 0")
    reads, what = _ONE_ANSWER[fn]
    try:
        readable = reads(truth)
    except Exception:
        readable = False
    if readable:
        return None
    return f"the built-in scorer {name} reads {what} as the reference answer, so every response would score 0"


@register_scorer("gsm8k", "gsm8k_strict", *_aliases("gsm8k"))
@_one_answer(_reads_number, _NUMBER)
def gsm8k_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None, method: _Method = "strict",
                format_score: float = 0.0, score: float = 1.0,
                answer_after: str | None = TOOL_RESPONSE_END) -> float | dict:
    """GSM8K: the number after the last ``#### `` marker (``method="strict"``) or the last number in the
    response (``method="flexible"``), after the last ``answer_after``; see :func:`rewards.gsm8k.compute_score`.
    Returns the score, or with a shaped ``score``/``format_score`` a dict with ``acc`` (see :func:`_gsm8k`)."""
    return _gsm8k(solution_str, ground_truth, method, format_score, score, answer_after)


def _gsm8k(solution_str: str, ground_truth: Any, method: _Method, format_score: float, score: float,
           answer_after: str | None) -> float | dict:
    """:func:`rewards.gsm8k.compute_score` from one :func:`rewards.gsm8k.judge`; when ``score``/``format_score``
    shape it (other than 1 and 0), a dict ``{"score": that, "acc": 1.0 if correct else 0.0}``, so that ``acc``
    (validation, dynamic sampling, PRIME's accuracy band) stays correctness rather than the shaped score (a wrong
    answer's ``format_score`` or a correct one's ``score`` above 1)."""
    answered, correct = gsm8k.judge(solution_str, ground_truth, method=method, answer_after=answer_after)
    value = float(score) if correct else float(format_score) if answered else 0.0
    if format_score == 0.0 and score == 1.0:
        return value
    return {"score": value, "acc": float(correct)}


@register_scorer("gsm8k_flexible", *_aliases("gsm8k_flexible"))
@_one_answer(_reads_number, _NUMBER)
def gsm8k_flexible(solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                   method: _Method = "flexible", format_score: float = 0.0, score: float = 1.0,
                   answer_after: str | None = TOOL_RESPONSE_END) -> float | dict:
    """GSM8K with flexible extraction by default: the last number in the response after the last
    ``answer_after`` (see :mod:`rewards.gsm8k`); returns as :func:`gsm8k_score`."""
    return _gsm8k(solution_str, ground_truth, method, format_score, score, answer_after)


@register_scorer("math", *_aliases("math"))
@_one_answer(_reads_math, _MATH)
def math_boxed(solution_str: str, ground_truth: Any, extra_info: dict | None = None,
               timeout_seconds: math_reward.TimeLimit = math_reward.TIMEOUT_SECONDS,
               answer_after: str | None = TOOL_RESPONSE_END) -> float:
    """MATH: the last ``\\boxed{}`` answer after the last ``answer_after`` (a tool's output is never the answer;
    see :mod:`rewards.gsm8k`), math-verify equivalence with an exact numeric cross-check, within
    ``timeout_seconds`` (see :mod:`rewards.math`)."""
    text = gsm8k.final_answer_text(solution_str, answer_after)[0]
    return math_reward.compute_score(text, ground_truth, timeout_seconds=timeout_seconds)


@register_scorer("format_gsm8k")
@_one_answer(_reads_number, _NUMBER)
def format_gsm8k(solution_str: str, ground_truth: Any, extra_info: dict | None = None, correct_score: float = 1.0,
                 format_score: float = 0.1, answer_after: str | None = TOOL_RESPONSE_END,
                 strict_format: bool = False) -> dict:
    """Shaped GSM8K reward, dict with score/acc/format, read after the last ``answer_after``
    (see :mod:`rewards.format_reward`)."""
    return format_reward.compute_score(solution_str, ground_truth, correct_score=correct_score,
                                       format_score=format_score, answer_format="gsm8k", answer_after=answer_after,
                                       strict_format=strict_format)


@register_scorer("format_boxed")
@_one_answer(_reads_math, _MATH)
def format_boxed(solution_str: str, ground_truth: Any, extra_info: dict | None = None, correct_score: float = 1.0,
                 format_score: float = 0.1, answer_after: str | None = TOOL_RESPONSE_END,
                 strict_format: bool = False) -> dict:
    """Shaped boxed-answer reward, dict with score/acc/format, read after the last ``answer_after``
    (see :mod:`rewards.format_reward`)."""
    return format_reward.compute_score(solution_str, ground_truth, correct_score=correct_score,
                                       format_score=format_score, answer_format="boxed", answer_after=answer_after,
                                       strict_format=strict_format)


# ---- user scorers from a file -----------------------------------------------------------------------------

def wants_data_source(fn: Scorer) -> bool:
    """True if ``fn`` is called by keyword as verl's naive manager calls it, ``fn(data_source=..., solution_str=...,
    ground_truth=..., extra_info=...)``: it takes a parameter named ``data_source`` (verl's custom reward
    signature), or takes ``**kwargs`` but not ``(solution_str, ground_truth)`` by position (e.g.
    ``compute_score(**kwargs)``). The reward manager then passes the row's ``reward_fn_key`` value as
    ``data_source=``."""
    if getattr(fn, "wants_data_source", False):
        return True
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    if "data_source" in sig.parameters:
        return True
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return False
    try:
        sig.bind("", "")
    except TypeError:
        return True  # keyword parameters only: verl's keywords
    return False


class ImportEndedError(ImportError):
    """A custom reward file whose import ended the process (``sys.exit``, ``exit()``, ``raise SystemExit``): ``how``
    says how, e.g. ``sys.exit(0)``."""

    def __init__(self, path: str, how: str):
        super().__init__(f"importing custom reward file {path!r} ended the process ({how})")
        self.path, self.how = path, how


def load_custom_scorer(path: str | os.PathLike, name: str = "compute_score") -> Scorer:
    """Load the function ``name`` from the Python file ``path`` (verl's ``custom_reward_function.path/name``).

    The file is imported as a fresh module (registered in ``sys.modules`` under a name derived from the
    absolute path, so loading the same file twice returns the same module). The function is called by the
    reward manager as ``fn(solution_str, ground_truth, extra_info=..., **reward_kwargs)``; if it has a
    ``data_source`` parameter (verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``)
    it is called with keywords only: ``fn(data_source=<row's reward_fn_key value>, solution_str=...,
    ground_truth=..., extra_info=..., **reward_kwargs)``.

    Raises:
        FileNotFoundError: if ``path`` is not a file.
        ImportError: if the file fails to import (the original error is chained); :class:`ImportEndedError` if
            its import raised ``SystemExit`` (``sys.exit()`` at the top of a script).
        KeyboardInterrupt: raised during the import (by a signal, or by the file itself: the caller tells them
            apart); the half-imported module is removed first.
        AttributeError: if the module has no attribute ``name``.
        TypeError: if that attribute is not callable.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward function file not found: {path!r}")
    mod_name = "rewards_custom_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    module = sys.modules.get(mod_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path!r} as a Python module (expected a .py file)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            sys.modules.pop(mod_name, None)  # a later load imports the file again
            if isinstance(e, SystemExit):
                how = "sys.exit()" if e.code is None else f"sys.exit({e.code!r})"
                raise ImportEndedError(path, how) from e
            if isinstance(e, Exception):
                raise ImportError(f"importing custom reward file {path!r} failed: {e!r}") from e
            raise
    if not hasattr(module, name):
        funcs = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"custom reward file {path!r} has no function {name!r}; it defines {funcs}")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{name!r} in {path!r} is a {type(fn).__name__}, expected a function")
    return fn


register_scorer("arith_tool", arith_tool.TASK_NAME)(
    _one_answer(_reads_whole_number, _WHOLE_NUMBER)(arith_tool.compute_score))
