"""Tools from config: ``rollout.multi_turn.tools`` entries and verl-style ``tool_config_path`` files.

An entry is one of

* a built-in name: ``python`` (:class:`rollout.tools.python_tool.PythonTool`) or ``calculator``
  (:class:`rollout.tools.calculator.CalculatorTool`);
* ``"pkg.module:ClassName"`` (or ``"pkg.module.ClassName"``): a :class:`rollout.tools.base.Tool` subclass (or a
  callable returning a ``Tool``) importable from ``PYTHONPATH``;
* a mapping ``{"class_name": <one of the above>, "config": {...}}``: ``config`` is passed as keyword arguments
  (verl's ``type: native`` is accepted and not passed on; ``type: mcp`` and other types are refused); an optional
  ``tool_schema: {function: {name, description, parameters}}`` (verl's layout) overrides the tool's own name,
  description and parameters.

``tool_config_path`` names a YAML file ``{"tools": [<entry>, ...]}`` (verl's file layout; the classes must be
this project's ``Tool`` subclasses; verl's own ``verl.tools.*`` classes are refused by name).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Iterable, Mapping

from rollout.tools.base import Tool

__all__ = ["BUILTIN_TOOLS", "MULTI_TURN_KEY", "resolve_tools", "load_tool_config", "build_tool"]

#: the config key of the multi-turn section as error messages name it by default; a caller whose users write it
#: under a longer key (the trainer: ``actor_rollout_ref.rollout.multi_turn``) passes that key as ``key``
MULTI_TURN_KEY = "rollout.multi_turn"

BUILTIN_TOOLS = {"python": "rollout.tools.python_tool:PythonTool",
                 "calculator": "rollout.tools.calculator:CalculatorTool"}
_ENTRY_KEYS = {"class_name", "config", "tool_schema"}
_OFFERED = (f"this project's tools are the built-ins {sorted(BUILTIN_TOOLS)} or a rollout.tools.base.Tool subclass "
            "given as 'pkg.module:ClassName'")


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain dicts/lists (other values unchanged)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _import_target(ref: str):
    target = BUILTIN_TOOLS.get(ref, ref)
    if target.startswith("verl."):
        raise ValueError(f"tool {ref!r}: verl's own tool classes are not part of this project; {_OFFERED}")
    if ":" in target:
        module_name, _, attr = target.partition(":")
    elif "." in target:
        module_name, _, attr = target.rpartition(".")
    else:
        raise ValueError(f"unknown tool {ref!r}; expected a built-in ({sorted(BUILTIN_TOOLS)}) or "
                         "'pkg.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"tool {ref!r}: cannot import module {module_name!r} ({exc})") from exc
    if not hasattr(module, attr):
        raise ValueError(f"tool {ref!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def _constructor_options(ref: str, target, config: Mapping) -> dict:
    """The keyword arguments ``target`` gets from an entry's ``config``: verl's ``type`` checked and removed, and
    every other option checked against ``target``'s signature (unless it takes ``**kwargs``).

    Raises:
        ValueError: ``type`` other than ``native`` (``mcp`` named), or an option ``target`` does not accept
            (naming the tool, the option and the options it accepts).
    """
    kwargs = dict(config)
    where = f"tool {ref!r} with config {dict(config)!r}"
    kind = kwargs.pop("type", "native")
    if kind == "mcp":
        raise ValueError(f"{where}: type='mcp': MCP tools are not supported; expected type: native")
    if kind != "native":
        raise ValueError(f"{where}: type={kind!r}; expected type: native (the only tool type supported)")
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): the call itself reports
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        name = getattr(target, "__name__", ref)
        raise ValueError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}; {name} accepts {accepted}")
    return kwargs


def build_tool(entry: Any) -> Tool:
    """One :class:`Tool` from a config entry (see the module docstring).

    Raises:
        ValueError: unknown name, unimportable module, missing class, one of verl's own classes, unknown entry keys,
            a ``config`` that is not a mapping, whose ``type`` is not ``native``, with an option the tool does not
            accept or a value its constructor refuses (naming the tool and its config), or a bad schema
            override; TypeError: the target does not produce a ``Tool``.
    """
    entry = _plain(entry)
    if isinstance(entry, str):
        ref, kwargs, schema = entry, {}, None
    elif isinstance(entry, Mapping):
        extra = set(entry) - _ENTRY_KEYS
        if extra or "class_name" not in entry:
            raise ValueError(f"tool entry {entry!r}: expected keys {sorted(_ENTRY_KEYS)} with class_name set")
        ref, kwargs, schema = str(entry["class_name"]), entry.get("config") or {}, entry.get("tool_schema")
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"tool entry {entry!r}: config={kwargs!r}; expected a mapping of the tool's options")
    else:
        raise ValueError(f"tool entry {entry!r}: expected a name, 'pkg.module:ClassName' or a mapping")
    target = _import_target(ref)
    options = _constructor_options(ref, target, kwargs)
    try:
        tool = target(**options)
    except (TypeError, ValueError) as exc:  # a bad option: name the tool and the options as written
        raise ValueError(f"tool {ref!r} with config {dict(kwargs)!r}: {exc}") from exc
    if not isinstance(tool, Tool):
        raise TypeError(f"tool {ref!r} produced a {type(tool).__name__}, expected a rollout.tools.base.Tool")
    if schema:
        fn = schema.get("function", schema) if isinstance(schema, Mapping) else None
        if not isinstance(fn, Mapping):
            raise ValueError(f"tool {ref!r}: tool_schema={schema!r}; expected a mapping "
                             "{type: function, function: {name, description, parameters}}")
        tool.name = fn.get("name", tool.name)
        tool.description = fn.get("description", tool.description)
        tool.parameters = fn.get("parameters", tool.parameters)
        tool.check_definition()
    return tool


def load_tool_config(path: str, key: str = MULTI_TURN_KEY) -> list:
    """The ``tools`` list of a YAML tool config file (``<key>.tool_config_path``: ``key`` is the multi-turn
    section's config key, named in the message for a missing file). Raises ValueError for a missing file or
    another layout."""
    import os

    import yaml

    if not os.path.isfile(path):
        raise ValueError(f"{path}: is not a file ({key}.tool_config_path)")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from exc
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list):
        got = f"'tools' is {type(tools).__name__}" if isinstance(data, dict) else \
            f"the file holds a {type(data).__name__}"
        raise ValueError(f"{path}: expected a mapping with a list of tool entries under 'tools', but {got}")
    return tools


def resolve_tools(entries: Iterable[Any] | None, tool_config_path: str | None = None,
                  key: str = MULTI_TURN_KEY) -> dict[str, Tool]:
    """Build the tools of ``entries`` plus those of ``tool_config_path``; returns ``{name: tool}``. ``key`` is the
    multi-turn section's config key, which the messages name (``<key>.tools``, ``<key>.tool_config_path``).

    Raises:
        ValueError: a bad entry (see :func:`build_tool`), two tools with the same name, or no tool at all.
    """
    items = [(entry, None) for entry in _plain(entries) or []]
    if tool_config_path:
        items += [(entry, tool_config_path) for entry in load_tool_config(tool_config_path, key)]
    tools: dict[str, Tool] = {}
    for entry, source in items:
        try:
            tool = build_tool(entry)
        except (ValueError, TypeError) as exc:
            if source is None:
                raise
            raise type(exc)(f"{source}: {exc}") from exc
        if tool.name in tools:
            raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
        tools[tool.name] = tool
    if not tools:
        raise ValueError(f"{key}.enable=True but no tool is configured; set {key}.tools (e.g. [python]) or "
                         f"{key}.tool_config_path")
    return tools
