"""Case P22: every shipped example command composes against configs/ppo_trainer.yaml and passes validation.

The commands are collected from the README, docs/*.md and every shell script in the repository: each line (with
backslash continuations joined) that runs ``trainer/main.py``; its ``a.b=c`` / ``group=option`` arguments are
composed with ``hydra.compose``. An unknown key must fail with an error that names the key, both through
``hydra.compose`` and through the real entry point (``trainer/main.py`` exits 2 with one ``error:`` line).
"""
import glob
import os
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from trainer.launch import ConfigError, check_overrides, resolve_config, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, "configs")
SOURCES = ["README.md", "docs/*.md", "**/*.sh"]


def _shipped_files() -> list[str]:
    out = []
    for pattern in SOURCES:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
            rel = os.path.relpath(path, ROOT)
            if not rel.startswith(("tests", ".", "outputs", "data")):
                out.append(path)
    return out


def collect_commands() -> list[tuple[str, list[str]]]:
    """``(where, overrides)`` for every command line that runs trainer/main.py in a shipped file."""
    found = []
    for path in _shipped_files():
        with open(path, encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
        for lineno, line in enumerate(text.splitlines(), 1):
            if "trainer/main.py" not in line:
                continue
            cmd = line.split("trainer/main.py", 1)[1]
            cmd = re.split(r"`|\s&&\s|\s\|\s|;", cmd)[0]  # end of an inline code span or a shell list
            try:
                tokens = shlex.split(cmd, comments=True)
            except ValueError:
                tokens = cmd.split()
            overrides = [t for t in tokens if "=" in t and not t.startswith("-") and re.match(r"^[+~]?[\w.]+=", t)]
            found.append((f"{os.path.relpath(path, ROOT)}:{lineno}", overrides))
    return found


COMMANDS = collect_commands()


def _compose(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_p22_examples_were_found():
    # the README documents at least the default run, the GSM8K run and the two GPU entry points
    assert len(COMMANDS) >= 4, COMMANDS
    assert any(any(o.startswith("data=") for o in ovs) for _, ovs in COMMANDS)


@pytest.mark.parametrize("where,overrides", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_p22_example_composes_and_validates(where, overrides):
    cfg = _compose(overrides)                       # no ConfigCompositionException
    check_overrides(overrides, CONFIG_DIR)          # the entry point's own pre-check agrees
    validate(resolve_config(cfg))                   # batch arithmetic, SP, lengths, estimator names


@pytest.mark.parametrize("bad,key", [("trainer.save_frq=5", "save_frq"),
                                     ("actor_rollout_ref.actor.optim.learning_rate=1e-6", "learning_rate")])
def test_p22_unknown_key_names_the_key(bad, key):
    with pytest.raises(ConfigCompositionException) as exc:
        _compose([bad])
    assert key in str(exc.value) or key in str(exc.value.__cause__)
    with pytest.raises(ConfigError, match=re.escape(bad.split("=")[0])):
        check_overrides([bad], CONFIG_DIR)


def test_p22_removed_key_points_to_the_new_one():
    with pytest.raises(ConfigError, match="ppo_micro_batch_size_per_gpu"):
        check_overrides(["actor_rollout_ref.actor.ppo_micro_batch_size=4"], CONFIG_DIR)
    with pytest.raises(ConfigError, match="max_actor_ckpt_to_keep"):
        check_overrides(["trainer.remove_previous_ckpt_in_save=true"], CONFIG_DIR)


def test_p22_entry_point_rejects_unknown_key_in_one_line(tmp_path):
    from tests.e2e_shared import run_main_forked

    # trainer/main.py run as a command, forked from the session's pre-imported driver (4 s of imports less)
    proc = run_main_forked(str(tmp_path), "trainer.save_frq=5", timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    # no "'+key=...' adds a key" advice: an added key that nothing reads is refused too (a silent no-op otherwise)
    assert lines == ["error: unknown config key 'trainer.save_frq': it is not in configs/ppo_trainer.yaml or its "
                     "groups, nor one of verl's keys (check the spelling; did you mean 'trainer.save_freq'?)"], lines
    assert not os.path.exists(tmp_path / "data")    # nothing was prepared: no worker started
