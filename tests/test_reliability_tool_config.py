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
