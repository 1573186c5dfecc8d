"""Scorer options: the keyword options a scorer takes, checked against its signature before training starts.

A scorer's options are its named keyword parameters other than the ones the reward manager passes itself
(``solution_str``, ``ground_truth``, ``extra_info``, ``data_source``). An option the scorer does not name is
refused (instead of being passed into a ``**kwargs`` that drops it, so that e.g. ``method=flexible`` would
change nothing); a scorer that declares ``**kwargs`` itself takes any option. Values are checked against the
parameter's annotation where it is one of ``Literal[...]``, ``float``, ``int``, ``bool``, ``str`` (or a union of
these, e.g. ``float | None``); other annotations are not checked. ``Annotated[<such a type>, ValueRule(...)]`` adds a
rule on the value beyond its type (:class:`ValueRule`: the MATH scorer's ``timeout_seconds`` is a finite number > 0
or None); a value of the right type that breaks the rule is refused naming the rule. A parameter without an annotation takes the type of
its default when that is a ``bool``, ``int``, ``float`` or ``str`` (``bonus=0.0``: a number; an int is accepted for a
float, a bool is not for an int or a float; None, the value Hydra gives for ``null``, is accepted too); a default of
another type, or None, gives no type. A float that is not finite (nan, inf) is refused for every option. A value of
the wrong type is refused before start-up
(:class:`OptionValueError`), instead of making the scorer raise on every response at the first step.
"""
from __future__ import annotations

import inspect
import math
import types
import typing
from typing import Any, Callable, Literal, Mapping

from rewards.option_rules import ValueRule
from rewards.registry import wants_data_source

__all__ = ["ValueRule", "PASSED_BY_MANAGER", "takes_extra_info", "answer_marker", "scorer_label", "scorer_options",
           "check_scorer_options", "OptionValueError"]

# parameters the reward manager fills itself; they are not options
PASSED_BY_MANAGER = ("solution_str", "ground_truth", "extra_info", "data_source")


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without a signature
        return None


def _has_var_keyword(sig: inspect.Signature) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def takes_extra_info(fn: Callable) -> bool:
    """True if ``fn`` can be called with ``extra_info=`` (a parameter of that name, ``**kwargs``, or no
    readable signature); the reward manager passes the row's ``extra_info`` only then."""
    sig = _signature(fn)
    if sig is None or _has_var_keyword(sig):
        return True
    p = sig.parameters.get("extra_info")
    return p is not None and p.kind is not p.POSITIONAL_ONLY


def answer_marker(fn: Callable, scorer_kwargs: Mapping[str, Any]) -> str | None:
    """The string after whose last occurrence ``fn`` reads the final answer: its ``answer_after`` option as the run
    sets it (``scorer_kwargs``), else the default of its ``answer_after`` parameter; None when it has no such
    parameter (it reads the whole text) or the value is None or empty (the run asked it to read everything)."""
    if "answer_after" in scorer_kwargs:
        value = scorer_kwargs["answer_after"]
    else:
        sig = _signature(fn)
        p = None if sig is None else sig.parameters.get("answer_after")
        value = None if p is None or p.default is p.empty else p.default
    return value if isinstance(value, str) and value else None


def scorer_label(fn: Callable, name: str | None = None) -> str:
    """How errors name a scorer: the registry name (or data_source value) and the function's qualified name; a
    ``custom_reward_function`` (a module loaded from its file) is named by its file: ``/path/my_reward.py:fn``."""
    import sys

    module = getattr(fn, "__module__", None) or "?"
    where = getattr(sys.modules.get(module), "__file__", None) if module.startswith("rewards_custom_") else None
    qual = f"{where}:" if where else f"{module}."
    qual += getattr(fn, "__qualname__", type(fn).__name__)
    return f"{name!r} ({qual})" if name else qual


def scorer_options(fn: Callable) -> tuple[list[str], bool]:
    """The option names ``fn`` takes (sorted) and whether it also takes any other option (``**kwargs``)."""
    sig = _signature(fn)
    if sig is None:
        return [], True
    names = sorted(p.name for p in sig.parameters.values()
                   if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in PASSED_BY_MANAGER)
    return names, _has_var_keyword(sig)


def _rules(hint: Any) -> tuple[Any, list[ValueRule]]:
    """The type of an annotation and its :class:`ValueRule` s (``Annotated[float, ValueRule(...)]``; none otherwise)."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        return base, [r for r in extras if isinstance(r, ValueRule)]
    return hint, []


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits the annotation ``hint``; None when the annotation is not one we check."""
    hint = _rules(hint)[0]
    origin = typing.get_origin(hint)
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, h) for h in typing.get_args(hint)]
        return None if None in results else any(results)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None


def _describe(hint: Any) -> str:
    hint = _rules(hint)[0]
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


class OptionValueError(ValueError):
    """A scorer option's value of the wrong type for the scorer's parameter (its annotation, or the type of its
    default). ``option``, ``value``, ``expected`` (words) and ``scorer`` (its label) say which;
    :meth:`naming` words it with the config key that holds the option."""

    def __init__(self, option: str, value: Any, expected: str, scorer: str):
        self.option, self.value, self.expected, self.scorer = option, value, expected, scorer
        super().__init__(f"scorer option {option}={value!r} for scorer {scorer}: expected {expected}")

    def naming(self, key: str) -> str:
        """The message with the option named by ``key``, the dotted config key of the options that hold it
        (``reward_model.custom_reward_function.reward_kwargs``): ``<key>.<option>=<value>: expected ... (scorer
        ...)``."""
        return f"{key}.{self.option}={self.value!r}: expected {self.expected} (a parameter of scorer {self.scorer})"


#: the default's types that give an unannotated parameter its type
_DEFAULT_TYPES = (bool, int, float, str)


def _expected_from_default(param: inspect.Parameter) -> tuple[Any, str] | None:
    """(the type hint, its words) that an unannotated parameter's default gives, or None (no default, a default of
    another type, an annotation)."""
    if param.annotation is not param.empty or param.default is param.empty:
        return None
    default = param.default
    kind = type(default)
    if kind not in _DEFAULT_TYPES:  # None, a list, a subclass: no type
        return None
    words = {bool: "a bool (true or false)", int: "an int", float: "a number (float or int)", str: "a string"}[kind]
    return kind | None, f"{words}, the type of its default {default!r}"


def _check_values(fn: Callable, options: Mapping[str, Any], label: str) -> None:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable annotations: the annotated values are not checked
        hints = {}
    sig = _signature(fn)
    params = sig.parameters if sig is not None else {}
    for key, value in options.items():
        if key in hints:
            if _matches(value, hints[key]) is False:
                raise OptionValueError(key, value, _describe(hints[key]), label)
            broken = [r for r in _rules(hints[key])[1] if r.refuses(value)]
            if broken:
                raise OptionValueError(key, value, broken[0].expected, label)
        else:
            implied = _expected_from_default(params[key]) if key in params else None
            if implied is not None and _matches(value, implied[0]) is False:
                raise OptionValueError(key, value, implied[1], label)
        if isinstance(value, float) and not math.isfinite(value):  # a reward, a weight or a bound: never nan or inf
            raise OptionValueError(key, value, "a finite number (nan and inf are no score, weight or bound)", label)


def check_scorer_options(fn: Callable, options: Mapping[str, Any], name: str | None = None) -> None:
    """Check that the reward manager's call ``fn(solution_str, ground_truth, [extra_info=...], **options)`` (or,
    for verl's signature with ``data_source``, the same by keyword) fits ``fn``'s signature.

    Args:
        fn: the scorer.
        options: the scorer options (``reward_model.scorer_kwargs`` and
            ``reward_model.custom_reward_function.reward_kwargs``).
        name: the registry name or data_source value the scorer was found under, for the message.

    Raises:
        TypeError: an option the scorer does not take (naming the option, the scorer and the options it
            takes), an option that the reward manager passes itself, or a scorer whose required parameters
            the call leaves unfilled.
        OptionValueError: (a ValueError) an option value outside the parameter's annotation (e.g.
            ``method='fuzzy'`` for ``Literal["strict", "flexible"]``), or, for a parameter without one, of another
            type than its default (``bonus='abc'`` for ``bonus=0.0``), or one its annotation's :class:`ValueRule`
            refuses (``timeout_seconds=-1``: a finite number > 0, or null for no limit).
    """
    label = scorer_label(fn, name)
    reserved = sorted(set(options) & set(PASSED_BY_MANAGER))
    if reserved:
        raise TypeError(f"scorer option {reserved[0]!r} for scorer {label} is passed by the reward manager "
                        "itself; remove it from the scorer options")
    sig = _signature(fn)
    if sig is None:
        return
    takes, any_option = scorer_options(fn)
    unknown = [] if any_option else sorted(set(options) - set(takes))
    if unknown:
        raise TypeError(f"scorer option {unknown[0]!r} is not taken by scorer {label}; it takes "
                        f"{takes or 'no options'}")
    extra = {"extra_info": None} if takes_extra_info(fn) else {}
    try:
        if wants_data_source(fn):
            sig.bind(data_source="", solution_str="", ground_truth="", **extra, **options)
        else:
            sig.bind("", "", **extra, **options)
    except TypeError as exc:
        raise TypeError(f"scorer {label} cannot be called as fn(solution_str, ground_truth, "
                        f"extra_info=..., **options) with options {sorted(options)}: {exc}") from None
    _check_values(fn, options, label)
