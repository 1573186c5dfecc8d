"""No silent no-ops (issue #26): every key of the composed config, in every group option, is read by some code.

Two methods, with what each covers:

* Static, every group option (this file): each name on the path of every leaf key must appear in the code
  (trainer/, rollout/, rewards/, patches/) as a string that is read: a subscript ``x["name"]``, the key of
  ``.get/.pop/.setdefault("name")``, ``getattr(x, "name")`` (and the code's accessors), ``"name" in x``, a
  tuple/list of names the code loops over, or a field of a typed config section (a dataclass whose fields are read
  from the config by name through ``trainer.config_reads.section_fields``, or a ``trainer.config.section.Section``,
  each of whose fields tests/test_config_sections.py finds read as an attribute outside ``trainer/config/``). Keys
  inside a free-form dict (``trainer.overrides.FREE_FORM``) count through that dict. This finds a key that nothing reads
  anywhere (``trainer.total_epochs``, ``reward_model.reward_manager``, ``trainer.ray_timeout_s`` were such keys);
  it cannot tell a key from another of the same name (``enable``, ``path``).
* Dynamic, per verl script (tests/test_verl_scripts.py): the keys read through the config object during a real
  CPU step plus the pre-start checks, in the driver and every worker (trainer.config_reads); every leaf must be
  read, or be one of the keys that a setting of that run switches off (tests/verl_scripts.CONDITIONAL).
"""
import ast
import os
import pickle

import pytest

from tests.e2e_utils import ROOT
from trainer.config_reads import TrackedDict, plain, read_keys
from trainer.overrides import CONFIG_DIR, FREE_FORM, _compose, _leaf_keys, config_groups

CODE = ("trainer", "rollout", "rewards", "patches")
ACCESSORS = ("getattr", "_cfg", "_get")  # functions that read a key named by a string argument


def read_literals(root: str = ROOT) -> set[str]:
    """Strings the code reads as config keys (see the module docstring)."""
    out: set[str] = set()
    for folder in CODE:
        for base, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(base, name), encoding="utf-8") as f:
                        out |= _literals(ast.parse(f.read()))
    return out


def _literals(tree: ast.AST) -> set[str]:
    def const(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            out.add(const(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and \
                node.func.attr in ("get", "pop", "setdefault"):
            out.add(const(node.args[0]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS:
            out |= {const(a) for a in node.args}
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            out.add(const(node.left))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            out |= {const(e) for e in node.elts}
        elif isinstance(node, ast.ClassDef) and _reads_section_fields(node):
            out |= {a.target.id for a in node.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
    out.discard(None)
    return out


def _reads_section_fields(cls: ast.ClassDef) -> bool:
    """The class builds itself from a config section by its field names (``section_fields(section, cls)``, or a
    ``Section`` subclass: ``Section.from_dict``)."""
    return any(isinstance(b, ast.Name) and b.id == "Section" for b in cls.bases) or any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "section_fields"
        for n in ast.walk(cls))


def unread_by_name(keys, literals: set[str]) -> list[str]:
    """Keys with a name on their path that no code reads (the part inside a free-form dict excluded)."""
    out = []
    for key in keys:
        free = next((f for f in FREE_FORM if key == f or key.startswith(f + ".")), None)
        names = (free or key).split(".")
        if any(n not in literals for n in names):
            out.append(key)
    return out


def test_every_key_of_every_group_option_is_read_by_name():
    literals = read_literals()
    unread = {}
    for group, options in config_groups(CONFIG_DIR).items():
        for option in options:
            cfg, _ = _compose(CONFIG_DIR, "ppo_trainer", [f"{group}={option}"])
            missing = unread_by_name(_leaf_keys(cfg), literals)
            if missing:
                unread[f"{group}={option}"] = missing
    assert unread == {}


def test_the_static_scan_finds_a_key_nothing_reads():
    literals = read_literals()
    assert unread_by_name(["trainer.total_epochs", "trainer.no_such_key", "deepspeed.ds_config.x"], literals) == \
        ["trainer.no_such_key"]


def test_tracked_dict_records_reads_in_every_process_that_unpickles_it(tmp_path, monkeypatch):
    import trainer.config_reads as cr

    monkeypatch.setenv(cr.ENV, str(tmp_path))
    monkeypatch.setattr(cr, "_seen", set())
    cfg = TrackedDict({"a": {"b": 1, "c": {"d": 2}}, "e": [1, 2], "f": {"g": 3}})
    assert cfg["a"]["b"] == 1 and cfg.get("e") == [1, 2] and "zz" not in cfg
    assert plain(cfg) == {"a": {"b": 1, "c": {"d": 2}}, "e": [1, 2], "f": {"g": 3}}  # copies without recording
    back = pickle.loads(pickle.dumps(cfg))  # what a Ray worker receives
    assert isinstance(back["a"]["c"], TrackedDict)
    cr._seen.clear()  # as in a new process
    assert dict(back["f"]) == {"g": 3}  # a dict copied as a whole reads its keys
    assert read_keys(str(tmp_path)) == {"a", "a.b", "e", "a.c", "f", "f.g"}


def test_tracking_is_off_without_the_variable(monkeypatch):
    from trainer.config_reads import ENV, track_reads

    monkeypatch.delenv(ENV, raising=False)
    cfg = {"a": 1}
    assert track_reads(cfg) is cfg


@pytest.mark.parametrize("key", ["trainer.total_epochs", "reward_model.reward_manager", "trainer.ray_timeout_s",
                                 "actor_rollout_ref.rollout.free_cache_engine"])
def test_keys_that_were_read_by_nothing_are_read_now(key):
    assert unread_by_name([key], read_literals()) == []
