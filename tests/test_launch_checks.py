"""Config checks that stop a run before any worker starts: group estimators need n >= 2; vLLM needs CUDA + vllm."""
import importlib.util
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.e2e_utils import ROOT
from trainer.launch import ConfigError, validate


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "dr_grpo", "reinforce_plus_plus_baseline"])
def test_group_estimators_refuse_a_single_sample(algo):
    with pytest.raises(ConfigError, match="rollout.n=1"):
        validate(_cfg(f"algorithm={algo}", "actor_rollout_ref.rollout.n=1"))
    validate(_cfg("algorithm=gae", "actor_rollout_ref.rollout.n=1"))  # GAE has a critic baseline


def test_vllm_needs_cuda_and_the_package():
    with pytest.raises(ConfigError, match="trainer.device=cuda"):
        validate(_cfg("rollout=vllm"))
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match=r"pip install -e \.\[vllm\]"):
            validate(_cfg("rollout=vllm", "trainer.device=cuda"))


def test_resume_path_is_checked_before_start(tmp_path):
    from trainer.launch import preflight

    cfg = _cfg(f"trainer.resume_mode={tmp_path}/global_step_3")
    with pytest.raises(ConfigError, match="does not exist"):
        preflight(cfg)
    cfg = _cfg(f"trainer.resume_mode={tmp_path}")
    with pytest.raises(ConfigError, match="global_step"):
        preflight(cfg)
