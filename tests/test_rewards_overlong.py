"""DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13) in the reward manager and its config checks."""
import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rewards.manager import RewardManager, overlong_penalty
from tests.test_rewards_manager import make_batch, tok  # noqa: F401  (fixture)
from trainer.launch import ConfigError, overlong_kwargs, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_penalty_is_zero_then_linear_to_minus_factor():
    # L = 10, B = 4: no penalty up to 6 tokens, -(n-6)/4 after, -1 at 10
    got = overlong_penalty(torch.tensor([0, 6, 7, 8, 10]), 10, 4)
    assert torch.equal(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert torch.equal(overlong_penalty(torch.tensor([10, 8]), 10, 4, penalty_factor=2.0), torch.tensor([-2.0, -1.0]))


def _acc_scorer(solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": 1.0, "acc": 1.0}


def test_manager_adds_penalty_to_score_but_not_to_accuracy(tok):  # noqa: F811
    # valid lengths (words + EOS): 2, 6, 8 of a response limit of 8; buffer 4 -> penalties 0, -0.5, -1.0
    data = make_batch(["42", "the answer is 4 2", "the answer is the answer is 42"], response_len=8)
    with RewardManager(tok, scorer=_acc_scorer, num_workers=0, overlong_buffer_len=4, max_response_length=8) as rm:
        out = rm(data)
    assert out.reward_extra_info["overlong_reward"] == [0.0, -0.5, -1.0]
    assert out.reward_extra_info["acc"] == [1.0, 1.0, 1.0]
    assert out.token_level_scores.sum(-1).tolist() == [1.0, 0.5, 0.0]
    assert out.token_level_scores[1, 5] == 0.5                     # on the last valid token
    assert out.metrics["reward/overlong_frac"] == pytest.approx(2 / 3)
    assert out.metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.5)
    assert rm.verify(data) == [1.0, 1.0, 1.0]                      # PRIME's accuracy is not penalised
    with RewardManager(tok, scorer=_acc_scorer, num_workers=0) as off:   # default: off, no extra key
        res = off(data)
    assert "overlong_reward" not in res.reward_extra_info and res.token_level_scores.sum().item() == 3.0


def _plain_scorer(solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0 if solution_str.strip().endswith("42") else 0.0


def test_a_plain_number_scorers_accuracy_is_its_score_before_the_penalty(tok):  # noqa: F811
    """A scorer that returns a number has no "acc": the accuracy fell back to the penalised score (val acc of
    -0.86 with a short buffer, and dynamic sampling's ``metric=acc`` filtered on shaped rewards)."""
    from rewards.verify import accuracy_from_reward

    data = make_batch(["42", "the answer is 4 2", "the answer is the answer is 42"], response_len=8)
    with RewardManager(tok, scorer=_plain_scorer, num_workers=0, overlong_buffer_len=4, max_response_length=8) as rm:
        out = rm(data)
    assert out.token_level_scores.sum(-1).tolist() == [1.0, -0.5, 0.0]   # the reward is shaped
    assert accuracy_from_reward(out.reward_extra_info, 3) == [1.0, 0.0, 1.0]  # the accuracy is not
    assert rm.verify(data) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("kw", [dict(overlong_buffer_len=4), dict(overlong_buffer_len=8, max_response_length=8),
                                dict(overlong_buffer_len=-1, max_response_length=8),
                                dict(overlong_buffer_len=2, max_response_length=8, overlong_penalty_factor=-1)])
def test_bad_arguments_are_named(tok, kw):  # noqa: F811
    with pytest.raises(ValueError, match="overlong"):
        RewardManager(tok, scorer=_acc_scorer, num_workers=0, **kw)


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        c = OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)
    c["critic"]["enable"] = c["algorithm"]["adv_estimator"] == "gae"
    return c


def test_config_keys_follow_verl_and_are_checked_before_start():
    assert overlong_kwargs(_cfg()) == {}
    on = ["reward_model.overlong_buffer.enable=true", "data.max_response_length=32"]
    assert overlong_kwargs(_cfg(*on, "reward_model.overlong_buffer.len=8")) == dict(
        overlong_buffer_len=8, overlong_penalty_factor=1.0, max_response_length=32)
    assert overlong_kwargs(_cfg(*on, "reward=format", "reward_model.overlong_buffer.len=8"))["overlong_buffer_len"] == 8
    with pytest.raises(ConfigError, match=r"overlong_buffer.len=0; with enable=true expected 0 < len < "
                                          r"data.max_response_length=32"):
        validate(_cfg(*on))
    with pytest.raises(ConfigError, match="penalty_factor=-1.0"):
        validate(_cfg(*on, "reward_model.overlong_buffer.len=8", "reward_model.overlong_buffer.penalty_factor=-1"))
