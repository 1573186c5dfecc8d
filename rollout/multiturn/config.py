"""``actor_rollout_ref.rollout.multi_turn``: the settings of tool-using rollouts (verl's key names).

verl's keys with the same meaning: ``enable``, ``max_assistant_turns``, ``max_user_turns`` (here: turns of tool
results), ``max_parallel_calls``, ``max_tool_response_length`` (characters), ``tool_response_truncate_side``,
``tool_config_path``, ``format``. Added: ``tools`` (a list of tool entries, see :mod:`rollout.tools.registry`).
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field, fields
from typing import Any, Mapping

from rollout.tools.executor import TRUNCATE_SIDES
from rollout.tools.parsers import PARSERS
from rollout.tools.registry import MULTI_TURN_KEY

__all__ = ["MultiTurnConfig"]


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
        ValueError: a value out of range or an unknown name (named in the message).
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
        for name in ("max_assistant_turns", "max_user_turns"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise ValueError(f"{key}.{name} must be >= 1 or null, got {value}")
        for name in ("max_parallel_calls", "max_tool_response_length"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{key}.{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"{key}.tool_response_truncate_side={self.tool_response_truncate_side!r}; "
                             f"expected one of {list(TRUNCATE_SIDES)}")
        if self.format not in PARSERS:
            raise ValueError(f"{key}.format={self.format!r}; expected one of {sorted(PARSERS)}")
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
