"""``actor_rollout_ref.rollout.response_length`` (how many tokens the rollout generates; it follows
``data.max_response_length`` unless set apart) against ``data.max_response_length``. Found by trying it: with the
two apart nothing was said, the context check counted ``data.max_response_length`` (a rollout past the model's
context started its workers and ran out of memory) and ``response_length/clip_ratio`` measured against the
other key (0.95 for responses capped at 4 tokens of 2)."""
import json
import os

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli

R = "actor_rollout_ref.rollout"


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.e2e_utils import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


def test_a_rollout_length_apart_from_data_max_response_length_is_warned():
    from trainer.unused_settings import unused_setting_warnings

    warned = unused_setting_warnings(_cfg(f"{R}.response_length=4", "data.max_response_length=2"))
    assert any(w.startswith(f"{R}.response_length=4 differs from data.max_response_length=2: responses are "
                            "generated up to") for w in warned), warned
    assert not any("response_length" in w for w in unused_setting_warnings(_cfg("data.max_response_length=3")))


def test_the_context_check_counts_the_length_the_rollout_generates():
    from trainer.config_checks import ConfigError
    from trainer.config_preflight import _check_context

    cfg = _cfg("data.max_prompt_length=16", "data.max_response_length=2", f"{R}.response_length=200")
    with pytest.raises(ConfigError, match=rf"^data.max_prompt_length\+{R}.response_length=216 exceeds the model's "
                                          r"context max_position_embeddings=128$"):
        _check_context(cfg, 128)
    with pytest.raises(ConfigError, match=r"^data.max_prompt_length\+data.max_response_length=216 exceeds"):
        _check_context(_cfg("data.max_prompt_length=16", "data.max_response_length=200"), 128)
    _check_context(_cfg("data.max_prompt_length=16", "data.max_response_length=200"), None)
    _check_context(cfg, 216)


@pytest.mark.slow
def test_the_entry_point_refuses_a_rollout_past_the_context_and_measures_clipping_by_the_rollout_length(tmp_path):
    proc = run_cli(str(tmp_path / "a"), "trainer.total_training_steps=1", f"{R}.response_length=200",
                   f"{R}.ignore_eos=true", forked=True)
    assert_one_line_error(proc, f"{R}.response_length=", "exceeds the model's context max_position_embeddings=")
    out = tmp_path / "b"
    proc = run_cli(str(out), "trainer.total_training_steps=1", f"{R}.response_length=3", "data.max_response_length=2",
                   f"{R}.ignore_eos=true", "trainer.save_freq=-1", "trainer.export_hf_on_end=false", forked=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"{R}.response_length=3 differs from data.max_response_length=2" in proc.stdout + proc.stderr
    with open(out / "metrics.jsonl") as f:
        step = [r for r in map(json.loads, f) if "response_length/clip_ratio" in r][-1]
    assert step["response_length/max"] == 3 and step["response_length/clip_ratio"] == 1.0



def test_p11_overlong_penalty_refuses_a_generation_cap_apart_from_its_length():
    """DAPO's penalty falls to -penalty_factor at data.max_response_length: responses generated past it were
    penalised beyond the factor (score -4.1 with factor 1), responses capped below it never reached it."""
    from trainer.config_checks import ConfigError
    from trainer.config_validate import overlong_kwargs

    on = ("reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=1",
          "data.max_response_length=2")
    for cap in (6, 1):
        with pytest.raises(ConfigError, match=rf"^{R}.response_length={cap} with reward_model.overlong_buffer.enable="
                                              "true: the overlong penalty counts up to data.max_response_length=2"):
            overlong_kwargs(_cfg(*on, f"{R}.response_length={cap}"))
    assert overlong_kwargs(_cfg(*on))["max_response_length"] == 2  # the cap follows data.max_response_length
    assert overlong_kwargs(_cfg(*on, f"{R}.response_length=2"))["max_response_length"] == 2
    assert overlong_kwargs(_cfg(f"{R}.response_length=6", "data.max_response_length=2")) == {}  # penalty off
