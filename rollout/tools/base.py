"""The tool interface of multi-turn rollouts, the parsed call, and the outcome of running one.

A tool has a ``name``, a ``description``, JSON-schema ``parameters`` (an object schema, as in OpenAI/Hermes
function definitions) and a per-call ``timeout_s``; :meth:`Tool.call` takes the decoded arguments and returns
the text the model sees, either directly (a sync tool, run in a worker thread) or as a coroutine (an async tool).
A failure the model should read is raised as :class:`ToolError` (its message goes back as the tool's answer).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Awaitable

__all__ = ["Tool", "ToolError", "ToolTimeoutError", "ToolCall", "ToolOutcome", "OUTCOME_STATUSES"]

OUTCOME_STATUSES = ("ok", "error", "timeout")


class ToolError(Exception):
    """A failed tool call. The message is returned to the model as the tool's answer and counted as an error."""


class ToolTimeoutError(ToolError):
    """A tool call that ran out of time (counted as a timeout)."""


class Tool(abc.ABC):
    """A tool the policy can call during a rollout.

    Subclasses set the class attributes (or pass them to ``__init__``) and implement :meth:`call`.

    Attributes:
        name: the function name the model writes (``[A-Za-z0-9_.-]+``).
        description: one or two sentences for the model (rendered into the prompt by the chat template).
        parameters: JSON schema of the arguments, ``{"type": "object", "properties": {...}, "required": [...]}``.
            Arguments that do not validate against it are answered with an error, the tool is not called.
        timeout_s: seconds one call may take (> 0); a slower call is answered with a timeout error.
    """

    name: str = ""
    description: str = ""
    parameters: dict = {"type": "object", "properties": {}}
    timeout_s: float = 30.0

    def __init__(self, name: str | None = None, description: str | None = None, parameters: dict | None = None,
                 timeout_s: float | None = None) -> None:
        if name is not None:
            self.name = name
        if description is not None:
            self.description = description
        if parameters is not None:
            self.parameters = parameters
        if timeout_s is not None:
            self.timeout_s = float(timeout_s)
        self.check_definition()

    def check_definition(self) -> None:
        """Check the tool's definition as the model sees it (run at construction, and again by
        :func:`rollout.tools.registry.build_tool` after a schema from the tool config replaced it).

        Raises:
            ValueError: a name outside ``[A-Za-z0-9_.-]+``, ``parameters`` that are not a JSON schema of type
                ``object``, or a ``timeout_s`` that is not > 0.
            jsonschema.SchemaError: ``parameters`` is not a valid JSON schema.
        """
        import re

        from jsonschema import Draft202012Validator

        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name):
            raise ValueError(f"{type(self).__name__}: tool name {self.name!r} must match [A-Za-z0-9_.-]+")
        if not (isinstance(self.parameters, dict) and self.parameters.get("type") == "object"):
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema of type 'object', "
                             f"got {self.parameters!r}")
        Draft202012Validator.check_schema(self.parameters)
        if not float(self.timeout_s) > 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be > 0, got {self.timeout_s}")

    @abc.abstractmethod
    def call(self, args: dict[str, Any]) -> str | Awaitable[str]:
        """Run the tool on validated ``args``; return (or, for an async tool, resolve to) the answer text.

        Raises:
            ToolError: a failure whose message the model should see.
        """

    def schema(self) -> dict:
        """The OpenAI-style function definition ``{"type": "function", "function": {name, description,
        parameters}}`` that chat templates render into the prompt (``apply_chat_template(tools=[...])``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def validation_error(self, args: Any) -> str | None:
        """None when ``args`` validates against :attr:`parameters`, else a one-line reason."""
        from jsonschema import Draft202012Validator

        if not isinstance(args, dict):
            return f"arguments must be a JSON object, got {type(args).__name__}"
        err = next(iter(Draft202012Validator(self.parameters).iter_errors(args)), None)
        if err is None:
            return None
        where = "/".join(str(p) for p in err.absolute_path)
        return f"invalid arguments{' at ' + where if where else ''}: {err.message}"

    def check(self) -> None:
        """Start-up check, run once before the first rollout (the default does nothing).

        Raises:
            RuntimeError: the tool cannot work on this machine (the message says why and what to change).
        """

    def metrics(self) -> dict[str, float]:
        """Facts about the tool where it runs, for the metrics of each generation call, keyed
        ``tool/<name>/...`` (e.g. the sandbox's isolation level); default none. A call split over several workers
        logs each key's smallest value over the workers (:func:`trainer.protocol.join_tool_metrics`): for a level,
        the weakest in force. Counts and timings of the calls are no tool metrics: the multi-turn loop reports
        them from the rows (:mod:`rollout.multiturn.metrics`)."""
        return {}


@dataclass
class ToolCall:
    """One tool call parsed from a model turn.

    Attributes:
        name: the tool name the model wrote (None when the call could not be parsed).
        arguments: the decoded arguments (None when they could not be parsed).
        error: why the call is malformed (None for a well-formed call); returned to the model.
    """

    name: str | None
    arguments: dict | None
    error: str | None = None


@dataclass
class ToolOutcome:
    """The result of one call as the model will see it.

    Attributes:
        name: the called tool's name (or ``"<malformed>"``).
        text: the answer (an error message for failures), before the length cut of the rollout config.
        status: one of :data:`OUTCOME_STATUSES`.
        seconds: wall-clock seconds of the call (0 when it was never made).
        malformed: True when the call could not be parsed or named no registered tool.
    """

    name: str
    text: str
    status: str
    seconds: float = 0.0
    malformed: bool = False
