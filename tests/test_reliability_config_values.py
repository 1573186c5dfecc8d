"""Values of the rollout, deepspeed, critic and tiny-model keys that the workers used to meet first: each stops the run
before any worker starts in one line naming the key, the value and what is expected. Before, a tri-state key read
``maybe`` as true (``bool(value)``), and the engine's sizes, ``sleep_level``, the tiny model's sizes and a
``ds_config`` that is no mapping failed in the workers or in Hydra with a traceback."""
import os

import pytest

from tests.e2e_utils import refused_in_one_line, resolved_config
from trainer.launch import ConfigError, resolve_config, validate
from trainer.override_checks import check_tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
R, T = "actor_rollout_ref.rollout", "actor_rollout_ref.model.tiny"


AUTO_BOOL = [
    (f"{R}.static_cache=maybe", f"{R}.static_cache='maybe'"),
    (f"{R}.static_cache=Auto", f"{R}.static_cache='Auto'"),
    ("deepspeed.bf16=maybe", "deepspeed.bf16='maybe'"),
    ("deepspeed.bf16=1", "deepspeed.bf16=1"),
]


@pytest.mark.parametrize("override,needle", AUTO_BOOL, ids=[a[0] for a in AUTO_BOOL])
def test_b08_a_tri_state_key_takes_only_auto_true_or_false(override, needle):
    refused_in_one_line(validate, resolved_config(override), needle, "expected auto, true or false")


def test_b08_megatron_bf16_and_critic_enable_take_only_their_values():
    cfg = resolved_config("trainer.strategy=megatron", "actor_rollout_ref.actor.megatron.bf16=maybe")
    refused_in_one_line(validate, cfg, "actor_rollout_ref.actor.megatron.bf16='maybe'", "expected auto, true or false")
    with pytest.raises(ConfigError, match=r"critic.enable='maybe'; expected null .*, true or false"):
        resolve_config(_compose("critic.enable=maybe"))


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


@pytest.mark.parametrize("override", [f"{R}.static_cache=auto", f"{R}.static_cache=false", "deepspeed.bf16=true",
                                      "deepspeed.bf16=auto", "critic.enable=true"])
def test_b08_auto_true_and_false_pass(override):
    validate(resolved_config(override))


ENGINE = [
    (f"{R}.prompt_length_bucket=0", "expected an integer >= 1"),
    (f"{R}.max_batch_size=0", "expected an integer >= 1"),
    (f"{R}.max_batch_size=-5", "expected an integer >= 1"),
    (f"{R}.update_weights_bucket_megabytes=0", "expected an integer >= 1"),
    (f"{R}.tensor_model_parallel_size=0", "expected an integer >= 1"),
    (f"{R}.log_prob_micro_batch_size_per_gpu=0", "expected an integer >= 1"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0", "expected an integer >= 1"),
    (f"{R}.sleep_level=5", "expected 1"),
    (f"{R}.sleep_level=0", "expected 1"),
    (f"{R}.gpu_memory_utilization=2", "<= 1"),
    (f"{R}.gpu_memory_utilization=0", "> 0"),
]


@pytest.mark.parametrize("override,expected", ENGINE, ids=[e[0] for e in ENGINE])
def test_c12_an_engine_size_out_of_range_is_one_line(override, expected):
    refused_in_one_line(validate, resolved_config(override), override, expected)


TINY = [
    (f"{T}.num_key_value_heads=3", f"{T}.num_key_value_heads=3", "divisor of num_attention_heads"),
    (f"{T}.num_attention_heads=3", f"{T}.hidden_size=64 with num_attention_heads=3", "multiple"),
    (f"{T}.hidden_size=0", f"{T}.hidden_size=0", ">= 1"),
    (f"{T}.num_hidden_layers=-1", f"{T}.num_hidden_layers=-1", ">= 1"),
    (f"+{T}.rope_theta=foo", f"{T}=", "cannot be built"),
]


@pytest.mark.parametrize("override,needle,expected", TINY, ids=[t[0] for t in TINY])
def test_c12_c14_tiny_model_sizes_that_do_not_build_are_one_line(override, needle, expected):
    refused_in_one_line(check_tiny_model, resolved_config(override), needle, expected)


def test_tiny_model_sizes_that_build_pass():
    check_tiny_model(resolved_config(f"{T}.hidden_size=128", f"{T}.num_key_value_heads=4"))


@pytest.mark.parametrize("override,needle", [("deepspeed.ds_config=foo", "deepspeed.ds_config='foo'; expected a "
                                                                          "mapping"),
                                             ("+deepspeed.ds_config.zero_optimization=foo", "deepspeed.ds_config")])
def test_c14_a_ds_config_that_is_no_mapping_is_one_line(override, needle):
    refused_in_one_line(validate, resolved_config(override), needle)


BATCHES = [
    (("algorithm=gae", "critic.ppo_mini_batch_size=3"), "critic.ppo_mini_batch_size=3 must divide"),
    (("algorithm=gae", "critic.ppo_micro_batch_size_per_gpu=3"), "critic.ppo_micro_batch_size_per_gpu=3"),
    (("algorithm=prime", "reward_model.mini_batch_size=3"), "reward_model.mini_batch_size=3 must divide"),
]


@pytest.mark.parametrize("overrides,needle", BATCHES, ids=[" ".join(b[0]) for b in BATCHES])
def test_c13_the_critic_and_prm_batches_are_checked_as_the_actors(overrides, needle):
    refused_in_one_line(validate, resolved_config(*overrides), needle)


PRIME = [
    (("data.accuracy_lower_bound=0.9", "data.accuracy_upper_bound=0.1"), "data.accuracy_lower_bound=0.9"),
    (("data.oversample_factor=0.5",), "data.oversample_factor=0.5"),
    (("reward_model.model.update=foo",), "reward_model.model.update='foo'"),
    (("reward_model.prime_granularity=foo",), "reward_model.prime_granularity='foo'"),
    (("reward_model.prime_norm=foo",), "reward_model.prime_norm='foo'"),
]


@pytest.mark.parametrize("overrides,needle", PRIME, ids=[" ".join(p[0]) for p in PRIME])
def test_c14_a_bad_prime_setting_is_one_line_before_start_up(overrides, needle):
    refused_in_one_line(validate, resolved_config("algorithm=prime", *overrides), needle)


def test_the_prime_and_critic_defaults_pass():
    validate(resolved_config("algorithm=prime"))
    validate(resolved_config("algorithm=gae"))
