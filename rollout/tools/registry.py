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

A tool that cannot be built or checked, whatever its module, constructor or ``check()`` raised (``SystemExit``
included), is reported by :func:`resolve_tools` as a :class:`ToolConfigError`: one line per tool, naming the key
that holds it (``<key>.tools`` or ``<key>.tool_config_path``) with its value as written, the tool, and the
exception's type and first line.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Iterable, Mapping

from rollout.tools.base import Tool

__all__ = ["BUILTIN_TOOLS", "MULTI_TURN_KEY", "ToolConfigError", "as_written", "error_text", "resolve_tools",
           "load_tool_config", "build_tool"]

#: the config key of the multi-turn section as error messages name it by default; a caller whose users write it
#: under a longer key (the trainer: ``actor_rollout_ref.rollout.multi_turn``) passes that key as ``key``
MULTI_TURN_KEY = "rollout.multi_turn"

BUILTIN_TOOLS = {"python": "rollout.tools.python_tool:PythonTool",
                 "calculator": "rollout.tools.calculator:CalculatorTool"}
_ENTRY_KEYS = {"class_name", "config", "tool_schema"}
_OFFERED = (f"this project's tools are the built-ins {sorted(BUILTIN_TOOLS)} or a rollout.tools.base.Tool subclass "
            "given as 'pkg.module:ClassName'")
#: the longest message of a tool's own exception shown in an error line
_MAX_TEXT = 400


class ToolConfigError(ValueError):
    """Tools of the multi-turn section that cannot be built or checked.

    Attributes:
        messages: one line per fault, each naming the config key that holds the tool and its value as written
            (``<key>.tools=[...]`` or ``<key>.tool_config_path='...'``), the tool, and what is wrong; ``str()``
            joins them with newlines.
    """

    def __init__(self, messages: list[str]):
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


def as_written(value: Any) -> str:
    """``value`` as a user writes it in the config: strings quoted with their characters as they are (a backslash
    stays one backslash), ``true``/``false``/``null``, and lists and mappings of those."""
    value = _plain(value)
    if isinstance(value, str):
        return f"'{value}'" if value.isprintable() else repr(value)
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(as_written, value)) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{as_written(k)}: {as_written(v)}" for k, v in value.items()) + "}"
    return repr(value)


def error_text(exc: BaseException) -> str:
    """An exception raised by a tool's own code (importing, constructing or checking it) in one line: its type and
    the first line of its message (a syntax error with its file and line; a missing module named as written; a
    schema error with where in the schema)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        text = f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    elif isinstance(exc, ModuleNotFoundError) and exc.name and str(exc).startswith("No module named"):
        text = f"No module named {as_written(exc.name)}"
    else:
        text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    path = getattr(exc, "path", None)  # jsonschema's errors: where in the checked schema
    if type(exc).__module__.startswith("jsonschema") and path:
        text += f" (at {'/'.join(map(str, path))})"
    if len(text) > _MAX_TEXT:
        text = text[:_MAX_TEXT] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
    """The class (or factory) ``ref`` names. Any exception the module raises while it is imported (a syntax error,
    ``sys.exit``) is reported as a ValueError naming the tool and the module."""
    target = BUILTIN_TOOLS.get(ref, ref)
    if target.startswith("verl."):
        raise ValueError(f"tool {as_written(ref)}: verl's own tool classes are not part of this project; {_OFFERED}")
    if ":" in target:
        module_name, _, attr = target.partition(":")
    elif "." in target:
        module_name, _, attr = target.rpartition(".")
    else:
        raise ValueError(f"unknown tool {as_written(ref)}; expected a built-in ({sorted(BUILTIN_TOOLS)}) or "
                         "'pkg.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: whatever it raises is reported
        raise ValueError(f"tool {as_written(ref)}: cannot import module {as_written(module_name)} "
                         f"({error_text(exc)})") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"tool {as_written(ref)}: module {as_written(module_name)} has no attribute "
                         f"{as_written(attr)}") from None


def _constructor_options(ref: str, target, config: Mapping) -> dict:
    """The keyword arguments ``target`` gets from an entry's ``config``: verl's ``type`` checked and removed, and
    every other option checked against ``target``'s signature (unless it takes ``**kwargs``).

    Raises:
        ValueError: ``type`` other than ``native`` (``mcp`` named), or an option ``target`` does not accept
            (naming the tool, the option and the options it accepts).
    """
    kwargs = dict(config)
    where = _with_config(ref, config)
    kind = kwargs.pop("type", "native")
    if kind == "mcp":
        raise ValueError(f"{where}: type='mcp': MCP tools are not supported; expected type: native")
    if kind != "native":
        raise ValueError(f"{where}: type={as_written(kind)}; expected type: native (the only tool type supported)")
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
                         f"{', '.join(map(as_written, unknown))}; {name} accepts {accepted}")
    return kwargs


def _with_config(ref: str, config: Mapping) -> str:
    return f"tool {as_written(ref)} with config {as_written(dict(config))}"


def _refusal(exc: BaseException) -> str:
    """A tool's refusal in one line: a ValueError (the way tools refuse a bad option) by its message, anything
    else by its type and message (:func:`error_text`)."""
    text = error_text(exc)
    return (text.partition(": ")[2] or text) if type(exc) is ValueError else text


def _parse_entry(entry: Any) -> tuple[str, Mapping, Any]:
    """``(ref, config, tool_schema)`` of a config entry (see the module docstring)."""
    if isinstance(entry, str):
        return entry, {}, None
    if isinstance(entry, Mapping):
        extra = set(entry) - _ENTRY_KEYS
        if extra or "class_name" not in entry:
            raise ValueError(f"tool entry {as_written(entry)}: expected keys {sorted(_ENTRY_KEYS)} with class_name "
                             "set")
        kwargs = entry.get("config") or {}
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"tool entry {as_written(entry)}: config={as_written(kwargs)}; expected a mapping of "
                             "the tool's options")
        return str(entry["class_name"]), kwargs, entry.get("tool_schema")
    raise ValueError(f"tool entry {as_written(entry)}: expected a name, 'pkg.module:ClassName' or a mapping")


def _apply_schema(ref: str, tool: Tool, schema: Any) -> None:
    """Override the tool's name, description and parameters from an entry's ``tool_schema`` (verl's layout) and
    check the result."""
    fn = schema.get("function", schema) if isinstance(schema, Mapping) else None
    if not isinstance(fn, Mapping):
        raise ValueError(f"tool {as_written(ref)}: tool_schema={as_written(schema)}; expected a mapping "
                         "{type: function, function: {name, description, parameters}}")
    tool.name = fn.get("name", tool.name)
    tool.description = fn.get("description", tool.description)
    tool.parameters = fn.get("parameters", tool.parameters)
    try:
        tool.check_definition()
    except Exception as exc:  # noqa: BLE001 - a schema error of jsonschema's is no ValueError
        raise ValueError(f"tool {as_written(ref)}: tool_schema: {_refusal(exc)}") from exc


def build_tool(entry: Any, check: bool = False) -> Tool:
    """One :class:`Tool` from a config entry (see the module docstring); with ``check``, its :meth:`Tool.check`
    run too.

    Raises:
        ValueError: unknown name, a module that cannot be imported (whatever it raised, ``SystemExit`` included),
            missing class, one of verl's own classes, unknown entry keys, a ``config`` that is not a mapping, whose
            ``type`` is not ``native``, with an option the tool does not accept, a constructor or ``check()`` that
            raised (naming the tool, its config and the exception's type and first line), or a bad schema
            override; TypeError: the target does not produce a ``Tool``.
    """
    ref, kwargs, schema = _parse_entry(_plain(entry))
    target = _import_target(ref)
    options = _constructor_options(ref, target, kwargs)
    try:
        tool = target(**options)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's constructor: whatever it raises is reported
        raise ValueError(f"{_with_config(ref, kwargs)}: {_refusal(exc)}") from exc
    if not isinstance(tool, Tool):
        raise TypeError(f"tool {as_written(ref)} produced a {type(tool).__name__}, expected a "
                        "rollout.tools.base.Tool")
    if schema:
        _apply_schema(ref, tool, schema)
    if check:
        try:
            tool.check()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the tool's own start-up check
            raise ValueError(f"tool {as_written(ref)}: its start-up check failed: {error_text(exc)}") from exc
    return tool


def load_tool_config(path: str) -> list:
    """The ``tools`` list of a YAML tool config file (verl's layout). Raises ValueError for a missing file or
    another layout; the message does not repeat the path (the caller names the key and the path)."""
    import os

    import yaml

    if not os.path.isfile(path):
        raise ValueError("is not a file")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"not valid YAML ({' '.join(str(exc).split())})") from exc
    except OSError as exc:  # e.g. no permission to read it
        raise ValueError(f"cannot be read ({error_text(exc)})") from exc
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list):
        got = f"'tools' is {type(tools).__name__}" if isinstance(data, dict) else \
            f"the file holds a {type(data).__name__}"
        raise ValueError(f"expected a mapping with a list of tool entries under 'tools', but {got}")
    return tools


def resolve_tools(entries: Iterable[Any] | None, tool_config_path: str | None = None,
                  key: str = MULTI_TURN_KEY, check: bool = False) -> dict[str, Tool]:
    """Build the tools of ``entries`` plus those of ``tool_config_path``; returns ``{name: tool}``. ``key`` is the
    multi-turn section's config key, which the messages name (``<key>.tools``, ``<key>.tool_config_path``); with
    ``check``, each tool's :meth:`Tool.check` is run.

    Raises:
        ToolConfigError: one line per bad entry (see :func:`build_tool`; each names the key that holds it, as
            written), a tool config file that cannot be read, two tools with the same name, or no tool at all.
    """
    entries = _plain(entries) or []
    sources = [(f"{key}.tools={as_written(entries)}", list(entries))]
    errors: list[str] = []
    if tool_config_path:
        where = f"{key}.tool_config_path={as_written(tool_config_path)}"
        try:
            sources.append((where, load_tool_config(tool_config_path)))
        except ValueError as exc:
            errors.append(f"{where}: {exc}")
    tools: dict[str, Tool] = {}
    for where, items in sources:
        for entry in items:
            try:
                tool = build_tool(entry, check=check)
            except (ValueError, TypeError) as exc:
                errors.append(f"{where}: {exc}")
                continue
            if tool.name in tools:
                errors.append(f"{where}: two tools are named {as_written(tool.name)}; tool names must be unique")
            tools[tool.name] = tool
    if not tools and not errors:
        errors.append(f"{key}.enable=true but no tool is configured; set {key}.tools (e.g. [python]) or "
                      f"{key}.tool_config_path")
    if errors:
        raise ToolConfigError(errors)
    return tools
