"""Tool interface, registry, calculator, call parsers and the concurrent executor (no model involved)."""
from __future__ import annotations

import asyncio
import textwrap
import time

import pytest

from rollout.tools import Tool, ToolCall, ToolError, build_tool, resolve_tools, run_tool_calls, truncate_text
from rollout.tools.calculator import evaluate
from rollout.tools.parsers import get_parser, parse_hermes, parse_python_block


class Echo(Tool):
    name = "echo"
    description = "echo the text"
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    timeout_s = 2.0

    def __init__(self, prefix: str = "", **kw):
        super().__init__(**kw)
        self.prefix = prefix

    def call(self, args):
        return self.prefix + args["text"]


class Sleepy(Tool):
    name = "sleepy"
    parameters = {"type": "object", "properties": {"s": {"type": "number"}}}
    timeout_s = 0.3

    async def call(self, args):
        await asyncio.sleep(args.get("s", 10))
        return "woke"


class SyncHang(Tool):
    name = "hang"
    timeout_s = 0.3

    def call(self, args):
        time.sleep(2)
        return "late"


class Buggy(Tool):
    name = "buggy"

    def call(self, args):
        raise KeyError("oops")


# ---- calculator -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr,want", [("123456789 * 987654321", "121932631112635269"), ("0.1 + 0.2", "0.3"),
                                       ("2^10", "1024"), ("(3 + 4) * -2", "-14"), ("7 // 2 + 7 % 2", "4"),
                                       ("sqrt(144) + abs(-1)", "13"), ("10**3000 // 10**2999", "10"),
                                       ("round(2.675, 2)", "2.68"), ("max(1, 5, 3) - min(4, 2)", "3")])
def test_calculator_exact(expr, want):
    """Decimals are exact: 2.675 is rounded half-to-even as a decimal (2.68), not as the float 2.67499..."""
    assert evaluate(expr) == want


@pytest.mark.parametrize("expr,msg", [("__import__('os').system('id')", "unsupported syntax"),
                                      ("(1).__class__", "unsupported syntax"), ("x + 1", "unsupported syntax"),
                                      ("'a' * 3", "unsupported syntax"), ("[i for i in range(9)]", "unsupported"),
                                      ("9**9**9", "power too large"), ("10**5000", "more than 4000 digits"),
                                      ("1/0", "division by zero"), ("1 +", "cannot parse"), ("", "non-empty"),
                                      ("1" * 2001, "longer than"), ("-" * 1500 + "1", "nested too deeply")])
def test_calculator_refuses(expr, msg):
    t0 = time.process_time()  # CPU time: the calculator's own cost, whatever else shares the cores
    with pytest.raises(ToolError, match=msg):
        evaluate(expr)
    assert time.process_time() - t0 < 1.0


@pytest.mark.parametrize("limit", [1000, 100_000])
def test_calculator_nesting_limit_does_not_depend_on_the_recursion_limit(limit):
    """Libraries (and other tests) raise ``sys.setrecursionlimit``; the refusal must not move with it."""
    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        with pytest.raises(ToolError, match="nested too deeply"):
            evaluate("-" * 650 + "1")
        assert evaluate("-" * 550 + "1") == "1" and evaluate("+".join(["1"] * 500)) == "500"
    finally:
        sys.setrecursionlimit(old)


# ---- parsers -----------------------------------------------------------------------------------------------

def test_hermes_several_calls_and_malformed_ones():
    text = ('I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
            '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1"</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "calculator"')
    calls = parse_hermes(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("calculator", {"expression": "2*3"}),
                                                          ("python", {"code": "print(1)"})]
    assert [c.error is not None for c in calls] == [False, False, True, True, True, True]
    assert "not valid JSON" in calls[2].error and '"name"' in calls[3].error
    assert "must be a JSON object" in calls[4].error and "without a closing" in calls[5].error
    assert parse_hermes("no calls here") == []


def test_python_block_parser():
    text = "Let me check.\n```python\nprint(2 ** 64)\n```\nthen\n```py\nx = 1\nprint(x)\n```\n```bash\nls\n```\n"
    calls = parse_python_block(text)
    assert [c.arguments["code"] for c in calls] == ["print(2 ** 64)\n", "x = 1\nprint(x)\n"]
    assert all(c.name == "python" and c.error is None for c in calls)
    (bad,) = parse_python_block("```python\nprint(1)\n")
    assert bad.name == "python" and "without a closing" in bad.error
    with pytest.raises(ValueError, match=r"format='xml'; expected one of \['hermes', 'python_block'\]"):
        get_parser("xml")


# ---- registry ----------------------------------------------------------------------------------------------

def test_registry_builtins_module_class_and_mapping(tmp_path, monkeypatch):
    mod = tmp_path / "my_tools_mod.py"
    mod.write_text(textwrap.dedent("""
        from rollout.tools.base import Tool
        class Upper(Tool):
            name = "upper"
            parameters = {"type": "object", "properties": {"text": {"type": "string"}}}
            def call(self, args):
                return args["text"].upper()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = resolve_tools(["calculator", "my_tools_mod:Upper",
                           {"class_name": "python", "config": {"timeout_s": 3, "min_isolation": "process"}}])
    assert sorted(tools) == ["calculator", "python", "upper"]
    assert tools["python"].limits.wall_s == 3 and tools["python"].timeout_s == 8
    cfg = tmp_path / "tools.yaml"
    cfg.write_text("tools:\n  - class_name: my_tools_mod.Upper\n    tool_schema:\n      type: function\n"
                   "      function: {name: shout, description: loud}\n")
    tools = resolve_tools([], tool_config_path=str(cfg))
    assert list(tools) == ["shout"] and tools["shout"].description == "loud"
    assert tools["shout"].schema()["function"]["parameters"]["properties"] == {"text": {"type": "string"}}


@pytest.mark.parametrize("entry,msg", [("calculater", r"unknown tool 'calculater'; expected a built-in"),
                                       ("no_such_mod_xyz:Tool", "cannot import module 'no_such_mod_xyz'"),
                                       ("rollout.tools.calculator:Nope", "has no attribute 'Nope'"),
                                       ({"class_name": "python", "cfg": {}}, "expected keys"),
                                       ("collections:OrderedDict", "expected a rollout.tools.base.Tool")])
def test_registry_bad_entries(entry, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        build_tool(entry)


@pytest.mark.parametrize("config,msg", [
    ({"timeout_s": -1}, "tool 'python' with config {'timeout_s': -1}: timeout_s must be > 0, got -1"),
    ({"timeout_s": "abc"}, "tool 'python' with config {'timeout_s': 'abc'}: could not convert string to float"),
    ({"timeout": 10}, "tool 'python' with config {'timeout': 10}: unknown option 'timeout'; PythonTool accepts "
                      r"\['timeout_s', "),
    ({"memory_mb": 0}, "tool 'python' with config {'memory_mb': 0}: .*memory_mb must be >= 1, got 0"),
    ([1], r"config=\[1\]; expected a mapping of the tool's options"),
])
def test_a_bad_tool_option_names_the_tool_and_its_config(config, msg):
    with pytest.raises(ValueError, match=msg):
        build_tool({"class_name": "python", "config": config})
    if isinstance(config, dict):
        with pytest.raises(ValueError, match="tool 'calculator' with config"):
            build_tool({"class_name": "calculator", "config": config})


def test_registry_duplicates_and_empty():
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        resolve_tools(["calculator", "calculator"])
    with pytest.raises(ValueError, match="no tool is configured"):
        resolve_tools([])
    with pytest.raises(ValueError, match="is not a file"):
        resolve_tools([], tool_config_path="/nonexistent/tools.yaml")


def test_tool_definition_checked():
    with pytest.raises(ValueError, match="must match"):
        Echo(name="bad name")
    with pytest.raises(ValueError, match="type 'object'"):
        Echo(parameters={"type": "string"})
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        Echo(timeout_s=0)


# ---- executor ----------------------------------------------------------------------------------------------

def test_executor_outcomes_and_concurrency():
    tools = {t.name: t for t in (Echo(prefix=">"), Sleepy(), SyncHang(), Buggy())}
    calls = [ToolCall("echo", {"text": "hi"}), ToolCall("sleepy", {}), ToolCall("hang", {}), ToolCall("buggy", {}),
             ToolCall("echo", {"text": 3}), ToolCall("nope", {}), ToolCall(None, None, "bad JSON"),
             ToolCall("sleepy", {"s": 0.01})]
    t0 = time.perf_counter()
    outs = run_tool_calls(calls, tools)
    assert time.perf_counter() - t0 < 1.5  # the two 0.3 s timeouts ran at the same time, the hang was not awaited
    assert [o.status for o in outs] == ["ok", "timeout", "timeout", "error", "error", "error", "error", "ok"]
    assert outs[0].text == ">hi" and outs[7].text == "woke"
    assert "timed out after 0.3 s" in outs[1].text and "KeyError" in outs[3].text
    assert "is not of type 'string'" in outs[4].text and outs[4].malformed
    assert "unknown tool 'nope'" in outs[5].text and outs[5].malformed and outs[6].malformed
    assert all(o.text.startswith("Error:") for o in outs[1:7])


def test_executor_inside_a_running_event_loop():
    async def main():
        return run_tool_calls([ToolCall("echo", {"text": "a"})], {"echo": Echo()})

    assert asyncio.run(main())[0].text == "a"


@pytest.mark.parametrize("side,want", [("left", "abcd...(truncated)"), ("right", "(truncated)...ghij"),
                                       ("middle", "ab...(truncated)...ij")])
def test_truncate_sides(side, want):
    assert truncate_text("abcdefghij", 4, side) == want
    assert truncate_text("abc", 4, side) == "abc"
    with pytest.raises(ValueError, match="tool_response_truncate_side='up'"):
        truncate_text("abc", 1, "up")


def test_turn_calls_say_where_the_turn_ends():
    from rollout.tools.parsers import turn_calls
    from tests.multiturn_utils import hermes

    text = "Plan:\n```python\nprint(1)\n```\nIt prints 1.\n```python\nprint(2)\n```\n#### 1"
    calls, end = turn_calls("python_block", text)
    assert [c.arguments for c in calls] == [{"code": "print(1)\n"}] and text[:end].endswith("```\n")
    h = hermes("a") + " and " + hermes("b") + " so the answer is 3 <tool_call>{\"name\": "
    calls, end = turn_calls("hermes", h)
    assert [c.name for c in calls] == ["a", "b"] and h[:end].endswith("</tool_call>") and h[end:].startswith(" so")
    assert turn_calls("python_block", "```python\nx = 1") == ([parse_python_block("```python\nx = 1")[0]], None)
    assert turn_calls("hermes", "no call") == ([], None)
    with pytest.raises(ValueError, match="expected one of"):
        turn_calls("xml", "")
