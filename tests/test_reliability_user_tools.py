"""A user's tool (``actor_rollout_ref.rollout.multi_turn.tools=[module.path:ClassName]`` or an entry of
``multi_turn.tool_config_path``) that fails while it is imported, constructed or checked stops the run before
start-up in one line per tool, naming the key, its value as written, the tool and the exception's type and first
line. Found by trying it: a module with a syntax error, a constructor raising KeyError and a ``tool_schema`` that is
not a JSON schema ended in a traceback; a module calling ``sys.exit(3)`` ended the run silently with exit status 3;
a RuntimeError of a constructor or ``check()`` did not say which tool raised it; of several bad values of the
section only the first was named; a tool config file named ``tool`` was blamed for an error of the ``tools`` list
(its message started with the file's name); and messages spelt values as Python does (``enable=True``,
backslashes doubled, the key named twice)."""
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.config_checks import ConfigError, ConfigErrors
from trainer.multi_turn import check_multi_turn, unused_multi_turn_warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "actor_rollout_ref.rollout.multi_turn"

GOOD = """
from rollout.tools.base import Tool

class Good(Tool):
    name = "good"
    description = "answers ok"

    def call(self, args):
        return "ok"
"""

#: name -> (module text, class, what the error line says about it)
MODULES = {
    "syntax": ("def f(:\n    pass\n", "X", ["cannot import module 'ut_syntax'", "(SyntaxError: invalid syntax (",
                                             "ut_syntax.py, line 1))"]),
    "exits": ("import sys\nsys.exit(3)\n", "X", ["cannot import module 'ut_exits' (SystemExit: 3)"]),
    "raises": ("raise KeyError('no_setting')\n", "X", ["cannot import module 'ut_raises' (KeyError: 'no_setting')"]),
    "ctor_keyerror": (GOOD + "\nclass Bad(Good):\n    def __init__(self):\n        raise KeyError('no_setting')\n",
                      "Bad", ["with config {}: KeyError: 'no_setting'"]),
    "ctor_runtime": (GOOD + "\nclass Bad(Good):\n    def __init__(self):\n        raise RuntimeError('boom in ctor')\n",
                     "Bad", ["with config {}: RuntimeError: boom in ctor"]),
    "ctor_exit": (GOOD + "\nclass Bad(Good):\n    def __init__(self):\n        raise SystemExit('no GPU')\n",
                  "Bad", ["with config {}: SystemExit: no GPU"]),
    "ctor_value": (GOOD + "\nclass Bad(Good):\n    def __init__(self):\n        raise ValueError('bad val\\nmore')\n",
                   "Bad", ["with config {}: bad val"]),
    "check_runtime": (GOOD + "\nclass Bad(Good):\n    def check(self):\n        raise RuntimeError('boom in check')\n",
                      "Bad", ["its start-up check failed: RuntimeError: boom in check"]),
    "check_exit": (GOOD + "\nclass Bad(Good):\n    def check(self):\n        raise SystemExit(4)\n",
                   "Bad", ["its start-up check failed: SystemExit: 4"]),
    "class_schema": (GOOD + "\nclass Bad(Good):\n    parameters = {'type': 'object', 'properties': {'x': {'type': 5}}}\n",
                     "Bad", ["with config {}: SchemaError: 5 is not valid under any of the given schemas "
                             "(at properties/x/type)"]),
}


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=["data=synthetic_tool", *overrides]),
                                      resolve=True)


def _modules(folder, names):
    for name in names:
        (folder / f"ut_{name}.py").write_text(MODULES[name][0])
    (folder / "ut_good.py").write_text(GOOD)


def _one_line(cfg) -> str:
    with pytest.raises(ConfigError) as info:
        check_multi_turn(cfg)
    message = str(info.value)
    assert not isinstance(info.value, ConfigErrors) and len(message.splitlines()) == 1, message
    return message


@pytest.mark.parametrize("name", sorted(MODULES))
def test_any_exception_of_a_user_tool_is_one_line_naming_the_key_and_the_tool(tmp_path, monkeypatch, name):
    """Faults 1 and 2: whatever a tool's module, constructor or check() raises (SystemExit included), the line
    names the key with its value, the tool (between two good ones) and the exception's type and first line."""
    _modules(tmp_path, [name])
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = f"ut_{name}:{MODULES[name][1]}"
    message = _one_line(_cfg(f"{KEY}.tools=[python,{ref},calculator]"))
    assert message.startswith(f"{KEY}.tools=['python', '{ref}', 'calculator']: tool '{ref}'"), message
    for needle in MODULES[name][2]:
        assert needle in message, (needle, message)


def test_a_tool_schema_that_is_not_a_json_schema_names_the_file_and_the_tool(tmp_path, monkeypatch):
    _modules(tmp_path, [])
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: ut_good:Good\n    tool_schema:\n      type: function\n      function:\n"
                    "        name: good\n        parameters: {type: object, properties: {x: {type: 5}}}\n")
    message = _one_line(_cfg(f"{KEY}.tool_config_path={path}"))
    assert message == (f"{KEY}.tool_config_path='{path}': tool 'ut_good:Good': tool_schema: SchemaError: 5 is not "
                       "valid under any of the given schemas (at properties/x/type)"), message


@pytest.mark.parametrize("values", [
    {"max_tool_response_length": 0, "tool_response_truncate_side": "up"},
    {"max_assistant_turns": 0, "max_user_turns": 0},
    {"enable": "yes", "max_parallel_calls": "abc", "format": "xml", "tool_config_path": 5},
])
def test_several_bad_multi_turn_values_are_all_named(values):
    """Fault 3: every bad value of the section is named, one line each, in the form of the other sections
    (``<key>=<value>; expected ...``)."""
    from trainer.launch import validate

    overrides = [f"{KEY}.{k}={v}" for k, v in values.items()]
    with pytest.raises(ConfigErrors) as info:
        validate(_cfg(*overrides))
    lines = str(info.value).splitlines()
    assert len(lines) == len(values), lines  # in the section's order
    for (k, v), line in zip(values.items(), lines):
        shown = f"'{v}'" if isinstance(v, str) and not v.isdigit() else str(v)
        assert line.startswith(f"{KEY}.{k}={shown}; expected "), (k, line)


def test_an_error_of_the_tools_list_is_never_blamed_on_a_tool_config_file_named_alike(tmp_path, monkeypatch):
    """Fault 4: with ``tool_config_path=tool`` (a good file) an error of ``tools=[...]`` starts with 'tool', and was
    reported as the file's; each line now names the key the tool came from."""
    _modules(tmp_path, [])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tool").write_text("tools:\n  - class_name: ut_good:Good\n")
    message = _one_line(_cfg(f"{KEY}.tool_config_path=tool", f"{KEY}.tools=[ut_good:BadName]"))
    assert message == (f"{KEY}.tools=['ut_good:BadName']: tool 'ut_good:BadName': module 'ut_good' has no "
                       "attribute 'BadName'"), message
    (tmp_path / "tool").write_text("tools:\n  - class_name: ut_good:Missing\n")
    message = _one_line(_cfg(f"{KEY}.tool_config_path=tool", f"{KEY}.tools=[ut_good:Good]"))
    assert message.startswith(f"{KEY}.tool_config_path='tool': tool 'ut_good:Missing': "), message


def test_messages_spell_values_as_the_user_wrote_them(tmp_path):
    """Fault 5: ``true`` not ``True``, one backslash where the user wrote one, and the key named once."""
    cfg = _cfg(f"{KEY}.tools=[]")
    assert _one_line(cfg).startswith(f"{KEY}.enable=true but no tool is configured; ")
    cfg["actor_rollout_ref"]["rollout"]["multi_turn"]["tools"] = ["my\\mod:X"]
    assert _one_line(cfg) == (f"{KEY}.tools=['my\\mod:X']: tool 'my\\mod:X': cannot import module 'my\\mod' "
                              "(ModuleNotFoundError: No module named 'my\\mod')")
    path = str(tmp_path / "dir\\tools.yaml")
    message = _one_line(_cfg(f"{KEY}.tool_config_path={tmp_path}/x.yaml"))
    assert message == f"{KEY}.tool_config_path='{tmp_path}/x.yaml': is not a file", message
    cfg["actor_rollout_ref"]["rollout"]["multi_turn"].update(tool_config_path=path, tools=[])
    assert _one_line(cfg) == f"{KEY}.tool_config_path='{path}': is not a file"
    cfg["actor_rollout_ref"]["rollout"]["multi_turn"].update(enable=False, tools=["my\\mod:X"])
    warnings = unused_multi_turn_warnings(cfg["actor_rollout_ref"]["rollout"])
    assert any(w.startswith(f"{KEY}.tools=['my\\mod:X']: ignored") for w in warnings), warnings


def test_cli_names_every_bad_tool_and_value_before_start(tmp_path):
    """The entry point: a syntax error, a module calling sys.exit(3) (it ended the run silently with exit status 3)
    and a missing class, beside two bad limits and a good tool config file named ``tool``: exit 2, one line each,
    none blaming the file, no traceback."""
    _modules(tmp_path, ["syntax", "exits"])
    (tmp_path / "tool").write_text("tools:\n  - class_name: ut_good:Good\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"trainer.output_dir={tmp_path / 'out'}",
         "data=synthetic_tool", f"{KEY}.tool_config_path=tool", f"{KEY}.tools=[ut_syntax:X,ut_exits:X,ut_good:BadName]",
         f"{KEY}.max_tool_response_length=0", f"{KEY}.tool_response_truncate_side=up"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in out, out[-3000:]
    listed = f"error: {KEY}.tools=['ut_syntax:X', 'ut_exits:X', 'ut_good:BadName']: "
    assert errors == [f"error: {KEY}.max_tool_response_length=0; expected an integer >= 1",
                      f"error: {KEY}.tool_response_truncate_side='up'; expected one of ['left', 'right', 'middle']",
                      f"{listed}tool 'ut_syntax:X': cannot import module 'ut_syntax' (SyntaxError: invalid syntax "
                      f"({tmp_path / 'ut_syntax.py'}, line 1))",
                      f"{listed}tool 'ut_exits:X': cannot import module 'ut_exits' (SystemExit: 3)",
                      f"{listed}tool 'ut_good:BadName': module 'ut_good' has no attribute 'BadName'"], errors
