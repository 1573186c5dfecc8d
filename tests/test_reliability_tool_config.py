"""A bad tool config file (``actor_rollout_ref.rollout.multi_turn.tool_config_path``, verl's layout) stops the run
before start-up in one line that names the FILE and what is wrong in it. Found by trying it: a file that is not valid
YAML raised yaml's ParserError with a traceback; a bad entry or option in the file was reported under
``multi_turn.tools=['python']`` (the command line's list, which was fine); a ``tool_schema`` that is not a mapping
raised AttributeError."""
import os

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.config_checks import ConfigError
from trainer.launch import resolve_config
from trainer.multi_turn import check_multi_turn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "actor_rollout_ref.rollout.multi_turn"

FILES = {
    "not_yaml": ("tools: [ {class_name: python\n", ["not valid YAML"]),
    "not_a_list": ("tools: python\n", ["'tools' is str"]),
    "a_list_at_the_top": ("- class_name: python\n", ["holds a list"]),
    "bad_option": ("tools:\n  - class_name: python\n    config: {timeout_s: -3}\n", ["timeout_s must be > 0"]),
    "unknown_option": ("tools:\n  - class_name: python\n    config: {timeout: 5}\n", ["'timeout'"]),
    "unknown_class": ("tools:\n  - class_name: nonexistent.module:Tool\n", ["cannot import module"]),
    "schema_not_a_mapping": ("tools:\n  - class_name: calculator\n    tool_schema: 5\n", ["tool_schema=5"]),
    "not_utf8": (b"tools:\n  - class_name: \xff\xfe\n", ["not valid YAML"]),
}


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return resolve_config(compose(config_name="ppo_trainer", overrides=["data=synthetic_tool", *overrides]))


def _write(tmp_path, content):
    path = tmp_path / "tools.yaml"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_bad_tool_config_file_is_named_in_one_line(tmp_path, name):
    content, needles = FILES[name]
    path = _write(tmp_path, content)
    with pytest.raises(ConfigError) as info:
        check_multi_turn(_cfg(f"{KEY}.tool_config_path={path}"))
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{KEY}.tool_config_path={path!r}: "), message
    for n in needles:
        assert n in message, (n, message)


def test_a_bad_entry_on_the_command_line_still_names_the_list():
    with pytest.raises(ConfigError, match=r"multi_turn.tools=\['nosuchtool'\]: unknown tool"):
        check_multi_turn(_cfg(f"{KEY}.tools=[nosuchtool]"))


def test_a_good_tool_config_file_adds_its_tools(tmp_path):
    path = _write(tmp_path, "tools:\n  - class_name: calculator\n    config: {timeout_s: 5}\n")
    check_multi_turn(_cfg(f"{KEY}.tool_config_path={path}"))


def test_cli_stops_before_workers(tmp_path):
    path = _write(tmp_path, FILES["not_yaml"][0])
    proc = run_cli(str(tmp_path / "out"), "data=synthetic_tool", f"{KEY}.tool_config_path={path}", forked=True)
    assert_one_line_error(proc, f"tool_config_path={path!r}", "not valid YAML")


@pytest.mark.parametrize("tool_type,needle", [("mcp", "type='mcp': MCP tools are not supported; expected type: native"),
                                              ("sse", "type='sse'; expected type: native")])
def test_verl_tool_config_type_native_is_accepted_and_mcp_refused_by_name(tmp_path, tool_type, needle):
    good = _write(tmp_path, "tools:\n  - class_name: calculator\n    config: {type: native, timeout_s: 5}\n")
    check_multi_turn(_cfg(f"{KEY}.tool_config_path={good}"))
    bad = _write(tmp_path, f"tools:\n  - class_name: calculator\n    config: {{type: {tool_type}}}\n")
    with pytest.raises(ConfigError) as info:
        check_multi_turn(_cfg(f"{KEY}.tool_config_path={bad}"))
    message = str(info.value)
    assert len(message.splitlines()) == 1 and needle in message, message


@pytest.mark.parametrize("tool,accepts", [("python", "PythonTool accepts ['timeout_s', 'cpu_s'"),
                                          ("calculator", "CalculatorTool accepts ['name', 'description'")])
def test_an_unknown_tool_option_names_the_option_and_the_options_the_tool_accepts(tmp_path, tool, accepts):
    path = _write(tmp_path, f"tools:\n  - class_name: {tool}\n    config: {{type: native, timeout: 5}}\n")
    with pytest.raises(ConfigError) as info:
        check_multi_turn(_cfg(f"{KEY}.tool_config_path={path}"))
    message = str(info.value)
    assert f"tool '{tool}' with config" in message and "unknown option 'timeout'; " in message, message
    assert accepts in message and "unexpected keyword" not in message, message


@pytest.mark.parametrize("class_name", ["verl.tools.gsm8k_tool.Gsm8kTool",
                                        "verl.tools.sandbox_fusion_tools.SandboxFusionTool"])
def test_a_verl_tool_class_is_refused_naming_what_this_project_offers(tmp_path, class_name):
    path = _write(tmp_path, f"tools:\n  - class_name: {class_name}\n    config: {{type: native}}\n")
    with pytest.raises(ConfigError) as info:
        check_multi_turn(_cfg(f"{KEY}.tool_config_path={path}"))
    message = str(info.value)
    assert len(message.splitlines()) == 1 and f"tool '{class_name}'" in message, message
    assert "verl's own tool classes are not part of this project" in message and "'calculator', 'python'" in message


@pytest.mark.parametrize("name,needle", [("not_yaml", "not valid YAML"), ("bad_option", "timeout_s must be > 0"),
                                         ("unknown_option", "unknown option 'timeout'"),
                                         ("unknown_class", "cannot import module")])
def test_a_tool_config_error_is_reported_once(tmp_path, name, needle):
    """With no ``tools`` on the command line, the error report's second round (the file's key put back to its
    default) must not add a 'no tool is configured' line that only follows from the first."""
    path = _write(tmp_path, FILES[name][0])
    proc = run_cli(str(tmp_path / "out"), f"{KEY}.enable=true", f"{KEY}.tool_config_path={path}", forked=True)
    assert_one_line_error(proc, f"tool_config_path={path!r}", needle)
