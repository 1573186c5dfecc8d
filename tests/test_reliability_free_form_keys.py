"""Every free-form dict of the config (a ``{}`` default whose entries are arguments of a library call or of the
user's function) takes entries from the command line: ``+<dict>.<name>=<value>``. Found by trying it:
``reward_model.custom_reward_function.reward_kwargs`` (the README's key for the options of your own reward
function) and verl's ``custom_reward_function.reward_kwargs`` were both refused as unknown keys, so a custom reward
function's options could not be set from the command line at all."""
import os

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.config_checks import reward_options
from trainer.launch import resolve_config
from trainer.overrides import CONFIG_DIR, FREE_FORM, _compose, config_groups, prepare_overrides


def _empty_dicts(node, prefix=""):
    for k, v in node.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            yield from ([path] if not v else _empty_dicts(v, path))


def _free_form_defaults() -> list[str]:
    out = set()
    for group, options in config_groups(CONFIG_DIR).items():
        for option in options:
            cfg, _ = _compose(CONFIG_DIR, "ppo_trainer", [f"{group}={option}"])
            out |= set(_empty_dicts(cfg))
    return sorted(out)


def test_every_empty_dict_default_is_free_form():
    assert [k for k in _free_form_defaults() if k not in FREE_FORM] == []


@pytest.mark.parametrize("key", _free_form_defaults())
def test_an_entry_of_a_free_form_dict_passes_the_command_line_check(key):
    groups = ["algorithm=prime"] if key.startswith("reward_model.model.") else []
    prepared = prepare_overrides([*groups, f"+{key}.some_option=1"])
    assert prepared.errors == []


def _run_cfg(*args):
    from hydra import compose, initialize_config_dir

    prepared = prepare_overrides(list(args))
    assert prepared.errors == []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return resolve_config(compose(config_name="ppo_trainer", overrides=prepared.overrides))


@pytest.mark.parametrize("arg", ["+reward_model.custom_reward_function.reward_kwargs.bonus=0.5",
                                 "+custom_reward_function.reward_kwargs.bonus=0.5",   # verl's spelling
                                 "custom_reward_function.reward_kwargs.bonus=0.5",
                                 "+custom_reward_function.reward_kwargs={bonus:0.5}"])
def test_custom_reward_kwargs_reach_the_scorer_options(arg):
    cfg = _run_cfg("custom_reward_function.path=my.py", arg)
    assert reward_options(cfg) == {"bonus": 0.5}
    assert "custom_reward_function" not in cfg   # verl's top-level key was read as ours


def test_a_reward_kwarg_the_function_does_not_take_is_one_line(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                    "    return bonus\n")
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}",
                   "+custom_reward_function.reward_kwargs.bonsu=0.5", forked=True)
    assert_one_line_error(proc, "'bonsu'", "bonus")
