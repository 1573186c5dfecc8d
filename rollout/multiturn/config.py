"""``actor_rollout_ref.rollout.multi_turn``: the settings of tool-using rollouts (verl's key names).

verl's keys with the same meaning: ``enable``, ``max_assistant_turns``, ``max_user_turns`` (here: turns of tool
results), ``max_parallel_calls``, ``max_tool_response_length`` (characters), ``tool_response_truncate_side``,
``tool_config_path``, ``format``. Added: ``tools`` (a list of tool entries, see :mod:`rollout.tools.registry`).
"""
from __future__ import annotations

import numbers
from dataclasses import InitVar, dataclass, field, fields
from typing import Any, Mapping

from rollout.tools.executor import TRUNCATE_SIDES
from rollout.tools.parsers import PARSERS
from rollout.tools.registry import MULTI_TURN_KEY, as_written

__all__ = ["MultiTurnConfig", "config_problems"]

#: the integer limits of the section, each with whether null (no limit) is allowed
_LIMITS = {"max_assistant_turns": True, "max_user_turns": True, "max_parallel_calls": False,
           "max_tool_response_length": False}


def _problem(name: str, value: Any) -> str | None:
    """What ``value`` of setting ``name`` should be, or None when it is good."""
    if name in _LIMITS:
        good = (value is None and _LIMITS[name]) or (isinstance(value, numbers.Integral) and
                                                     not isinstance(value, bool) and value >= 1)
        return None if good else f"an integer >= 1{' or null' if _LIMITS[name] else ''}"
    choices = {"tool_response_truncate_side": list(TRUNCATE_SIDES), "format": sorted(PARSERS)}.get(name)
    if choices is not None:
        return None if isinstance(value, str) and value in choices else f"one of {choices}"
    if name == "enable":
        return None if isinstance(value, bool) else "true or false"
    if name == "tools":
        return None if isinstance(value or [], (list, tuple)) else "a list of tool entries"
    if name == "tool_config_path":
        return None if value is None or isinstance(value, str) else "the path of a YAML file, or null"
    return None


def config_problems(values: Mapping[str, Any], key: str = MULTI_TURN_KEY) -> list[str]:
    """Every bad value among the section's settings ``values`` (field name -> value; absent ones are not checked),
    one message each, in the section's order: ``<key>.<name>=<value as written>; expected ...``."""
    out = []
    for f in fields(MultiTurnConfig):
        expected = _problem(f.name, values[f.name]) if f.name in values else None
        if expected:
            out.append(f"{key}.{f.name}={as_written(values[f.name])}; expected {expected}")
    return out


@dataclass
class MultiTurnConfig:
    """Multi-turn settings.

    Attributes:
        enable: generate with tools (``rollout.multiturn.multi_turn_generate``) instead of one response.
        max_assistant_turns: most model turns per sample (None: bounded by the response length only).
        max_user_turns: most tool-result turns per sample (None: no limit).
        max_parallel_calls: most calls run per model turn; further calls in that turn are answered with an
            error and not run.
        max_tool_response_length: a tool answer longer than this many characters is cut.
        tool_response_truncate_side: ``left`` keeps the start, ``right`` the end, ``middle`` both ends.
        format: tool-call syntax, ``hermes`` or ``python_block`` (see :mod:`rollout.tools.parsers`).
        tools: tool entries (``python``, ``calculator``, ``pkg.module:ClassName`` or mappings).
        tool_config_path: YAML file with more tool entries under ``tools`` (verl's layout).

    Args:
        key: the section's config key as the user writes it (not a setting, not stored): the messages name keys
            under it, e.g. ``actor_rollout_ref.rollout.multi_turn.max_user_turns`` when the trainer passes
            ``actor_rollout_ref.rollout.multi_turn``; default ``rollout.multi_turn``.

    Raises:
        ValueError: a value of the wrong type, out of range or an unknown name (:func:`config_problems`: every
            bad value, one line each).
    """

    enable: bool = False
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    tools: list = field(default_factory=list)
    tool_config_path: str | None = None
    key: InitVar[str] = MULTI_TURN_KEY

    def __post_init__(self, key: str) -> None:
        problems = config_problems({f.name: getattr(self, f.name) for f in fields(self)}, key)
        if problems:
            raise ValueError("\n".join(problems))
        self.tools = list(self.tools or [])

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None, key: str = MULTI_TURN_KEY) -> "MultiTurnConfig":
        """Build from the ``multi_turn`` mapping (a dict or an OmegaConf node); missing keys take the defaults.
        ``key``: the section's config key, named in the messages.

        Raises:
            ValueError: a key this project does not read (e.g. verl's ``interaction_config_path``), or a bad value.
        """
        if cfg is None:
            return cls(key=key)
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            pass
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(f"{key} has unknown keys {unknown}; known keys: {sorted(known)}")
        return cls(**dict(cfg), key=key)
