"""Config checks of ``trainer.strategy=megatron`` (trainer/launch.py): refused before any worker starts, one line."""
import importlib.util
import json
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import ROOT
from trainer.launch import ConfigError, preflight, validate


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        c = OmegaConf.to_container(compose("ppo_trainer", overrides=["trainer.strategy=megatron", *overrides]),
                                   resolve=True)
    if c["critic"]["enable"] is None:
        c["critic"]["enable"] = c["algorithm"]["adv_estimator"] == "gae"
    return c


def _check(*overrides):
    cfg = _cfg(*overrides)
    validate(cfg)
    preflight(cfg)


def test_default_strategy_is_deepspeed_and_unknown_is_refused():
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        assert compose("ppo_trainer").trainer.strategy == "deepspeed"
    with pytest.raises(ConfigError, match="trainer.strategy='fsdp'; expected deepspeed or megatron"):
        validate(_cfg("trainer.strategy=fsdp"))


def test_missing_megatron_core_is_refused(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("megatron") else real(name, *a))
    with pytest.raises(ConfigError, match=r"megatron-core is not importable: pip install -e \.\[megatron\]"):
        validate(_cfg())


@pytest.mark.parametrize("overrides,match", [
    (["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"], "pipeline parallelism is not supported"),
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"], r"3\*1 must divide the 2 workers"),
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=0"], r"tensor_model_parallel_size=0; expected an integer >= 1"),
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=two"], r"tensor_model_parallel_size='two'; expected an integer"),
    (["actor_rollout_ref.actor.megatron.context_parallel_size=2"], "context_parallel_size=2"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], "DeepSpeed-path feature.*set it to 1"),
    (["algorithm=gae"], "no critic worker yet.*adv_estimator=gae"),
    (["algorithm=prime"], "algorithm=prime is not supported"),
    (["actor_rollout_ref.rollout.offload_optimizer_during_rollout=true"], "offload_optimizer_during_rollout"),
])
def test_unsupported_megatron_configs_are_refused(overrides, match):
    pytest.importorskip("megatron.core")
    with pytest.raises(ConfigError, match=match):
        _check(*overrides)


def test_tp_must_divide_the_head_counts():
    pytest.importorskip("megatron.core")
    _check("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")  # tiny: 4 heads, 2 KV heads
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2 does not divide the model's "
                                          "num_key_value_heads=1"):
        _check("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
               "actor_rollout_ref.model.tiny.num_key_value_heads=1")


def test_unsupported_architecture_is_refused(tmp_path):
    pytest.importorskip("megatron.core")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match="model_type='gpt2'"):
        _check(f"actor_rollout_ref.model.path={tmp_path}")


def test_entry_point_exits_2_with_one_line(tmp_path):
    # trainer/main.py run as a command, forked from the session's pre-imported driver (4 s of imports less)
    proc = run_main_forked(str(tmp_path / "out"), "trainer.strategy=megatron",
                           "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and ("pipeline" in last or "megatron-core" in last), last
