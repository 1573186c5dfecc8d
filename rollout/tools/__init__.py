"""Tools for multi-turn rollouts: the interface (:mod:`.base`), call parsers (:mod:`.parsers`), concurrent
execution (:mod:`.executor`), the registry that builds tools from config (:mod:`.registry`), and the built-ins
``calculator`` (:mod:`.calculator`) and ``python`` (:mod:`.python_tool` on :mod:`.sandbox`)."""
from rollout.tools.base import Tool, ToolCall, ToolError, ToolOutcome, ToolTimeoutError
from rollout.tools.executor import run_tool_calls, truncate_text
from rollout.tools.parsers import get_parser
from rollout.tools.registry import BUILTIN_TOOLS, build_tool, resolve_tools

__all__ = ["Tool", "ToolCall", "ToolError", "ToolOutcome", "ToolTimeoutError", "run_tool_calls", "truncate_text",
           "get_parser", "BUILTIN_TOOLS", "build_tool", "resolve_tools"]
