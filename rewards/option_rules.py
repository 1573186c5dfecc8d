"""Rules on a scorer option's value beyond its type, written in the parameter's annotation and checked with the
other option values before start-up (:mod:`rewards.options`). A leaf module: scorers import it without importing
the option checks."""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["ValueRule"]


class ValueRule:
    """A rule on an option's value beyond its type, written in the parameter's annotation:
    ``timeout_seconds: Annotated[float | None, ValueRule(ok, "a finite number > 0 ...")] = 1.0``. ``accepts(value)``
    decides a value that has the annotated type (None passes when the type allows it); ``expected`` words it for the
    one-line error before start-up. Scorers may call :meth:`check` themselves to refuse such a value when called
    directly (ValueError)."""

    def __init__(self, accepts: Callable[[Any], bool], expected: str):
        self.accepts, self.expected = accepts, expected

    def __repr__(self) -> str:
        return f"ValueRule({self.expected!r})"

    def refuses(self, value: Any) -> bool:
        """Whether the rule refuses ``value`` (None is never refused: the annotation's type decides about it)."""
        return value is not None and not self.accepts(value)

    def check(self, option: str, value: Any) -> None:
        """Raise ValueError naming ``option``, ``value`` and what is expected when the rule refuses ``value``."""
        if self.refuses(value):
            raise ValueError(f"{option}={value!r}: expected {self.expected}")
