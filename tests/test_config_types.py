"""trainer.config_types: value types against the packaged defaults, before anything starts."""
from __future__ import annotations

import pytest

from trainer.config_checks import ConfigError, ConfigErrors
from trainer.config_types import check_types, type_errors

DEFAULTS = {"data": {"train_batch_size": 32, "max_rows": None, "name": "gsm8k"},
            "trainer": {"save_freq": -1, "val_before_train": True, "ray_timeout_s": 0.0},
            "actor_rollout_ref": {"rollout": {"n_gpus": 1, "temperature": 1.0}}}


@pytest.mark.parametrize("section,key,value,want", [
    ("data", "train_batch_size", "abc", "an integer"), ("data", "train_batch_size", 1.5, "an integer"),
    ("data", "train_batch_size", True, "an integer"), ("trainer", "save_freq", None, "an integer"),
    ("trainer", "val_before_train", "yes", "true or false"), ("trainer", "ray_timeout_s", "1m", "a number"),
])
def test_a_value_of_the_wrong_type_is_named_with_the_default(section, key, value, want):
    cfg = {section: {key: value}}
    assert type_errors(cfg, DEFAULTS) == [f"{section}.{key}={value!r}; expected {want} (default "
                                          f"{DEFAULTS[section][key]!r})"]


def test_values_of_the_right_type_and_unchecked_keys_pass():
    cfg = {"data": {"train_batch_size": 16, "max_rows": 100, "name": "svamp", "extra": "x"},
           "trainer": {"save_freq": 2.0, "val_before_train": False, "ray_timeout_s": 5},
           "actor_rollout_ref": {"rollout": {"n_gpus": 0.3, "temperature": 0}}, "new_section": {"a": 1}}
    check_types(cfg, DEFAULTS)


def test_every_wrong_value_is_reported_at_once():
    with pytest.raises(ConfigErrors) as info:
        check_types({"data": {"train_batch_size": "x"}, "trainer": {"save_freq": "y"}}, DEFAULTS)
    assert len(info.value.messages) == 2


@pytest.mark.parametrize("override,line", [
    ("trainer.save_freq=abc", "error: trainer.save_freq='abc'; expected an integer (default -1)"),
    ("data.train_batch_size=1.5", "error: data.train_batch_size=1.5; expected an integer (default 32)"),
])
def test_main_stops_in_one_line_before_anything_starts(override, line, tmp_path):
    from tests.e2e_shared import run_main_forked

    # trainer/main.py run as a command, forked from the session's pre-imported driver (4 s of imports less)
    proc = run_main_forked(str(tmp_path / "out"), override, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [line]


@pytest.mark.parametrize("override,line", [
    ("actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.temperature=-1; expected >= 0 (0: greedy)"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature=-0.5",
     "actor_rollout_ref.rollout.val_kwargs.temperature=-0.5; expected >= 0 (0: greedy)"),
    ("trainer.max_actor_ckpt_to_keep=abc", "trainer.max_actor_ckpt_to_keep='abc'; expected an integer"),
    ("trainer.max_critic_ckpt_to_keep=-2", "trainer.max_critic_ckpt_to_keep=-2; expected an integer >= 0"),
])
def test_values_read_only_after_start_up_are_checked_before_it(override, line):
    """A negative temperature, or a checkpoint retention that is no count, used to stop a run only after its
    workers had started (the temperature at the first generation, the retention after the first save)."""
    from hydra import compose, initialize_config_dir

    from trainer.config_validate import validate
    from trainer.launch import resolve_config
    from trainer.overrides import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=[override]))
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert str(info.value).splitlines()[0] == line


def test_the_checks_run_again_for_more_errors_without_logging_their_notes_again(caplog):
    """start_errors runs the launcher's checks again (one more round per error that names a key): the notes and
    warnings of those checks are logged by the first round only, and by none when the run logged them already."""
    import logging

    from omegaconf import OmegaConf

    from trainer.config_types import start_errors

    def prestart(cfg):
        logging.getLogger("trainer.launch").info("custom_reward_function.path=r.py: read as reward_model...")
        logging.getLogger("trainer.launch").warning("a setting with no effect")
        if cfg.data.train_batch_size != 32:
            raise ConfigError(f"data.train_batch_size={cfg.data.train_batch_size}; expected a multiple of 8")
        raise ConfigError("trainer.save_freq=-1; something else")

    cfg = OmegaConf.create({"data": {"train_batch_size": 12}, "trainer": {"save_freq": -1}})
    for logged, times in ((False, 1), (True, 0)):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            errors = start_errors(cfg, DEFAULTS, prestart, logged=logged)
        assert errors == ["data.train_batch_size=12; expected a multiple of 8", "trainer.save_freq=-1; something else"]
        assert [r.getMessage() for r in caplog.records].count("a setting with no effect") == times
        assert sum("read as" in r.getMessage() for r in caplog.records) == times
    assert logging.root.manager.disable == logging.NOTSET


def test_decode_compile_regions_null_is_its_default_off():
    """``rollout.decode_compile_regions=null`` means the default (off), as ``decode_loop=null`` means auto; a null
    for another key whose default is a boolean is still refused."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from trainer.config.rollout import RolloutConfig
    from trainer.config_validate import validate
    from trainer.overrides import CONFIG_DIR
    from trainer.unused_settings import decode_regions_warnings

    key = "actor_rollout_ref.rollout.decode_compile_regions"
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        defaults = OmegaConf.to_container(compose(config_name="ppo_trainer"), resolve=False)
        cfg = OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=[f"{key}=null"]), resolve=True)
    check_types(cfg, defaults)
    validate(cfg)
    rollout = RolloutConfig.from_dict(cfg["actor_rollout_ref"]["rollout"], "actor_rollout_ref.rollout")
    assert rollout.decode_compile_regions is None and decode_regions_warnings(cfg) == []
    cfg["trainer"]["val_before_train"] = None
    assert type_errors(cfg, defaults) == ["trainer.val_before_train=None; expected true or false (default False)"]
