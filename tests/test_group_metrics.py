"""critic/frac_reward_zero_std: the share of prompt groups whose scores are all equal (no policy gradient)."""
import torch

from trainer.group_metrics import group_score_metrics
from trainer.metric_utils import compute_data_metrics
from trainer.protocol import DataProto


def _batch(scores, uids=None):
    """One response token per row holding its score (B, 1), prompts of one token."""
    B = len(scores)
    t = {"prompts": torch.ones(B, 1, dtype=torch.long), "responses": torch.ones(B, 1, dtype=torch.long),
         "attention_mask": torch.ones(B, 2, dtype=torch.long), "response_mask": torch.ones(B, 1),
         "token_level_scores": torch.tensor(scores, dtype=torch.float32).view(B, 1)}
    for k in ("token_level_rewards", "advantages", "returns"):
        t[k] = torch.zeros(B, 1)
    return DataProto.from_dict(t, {"uid": uids} if uids is not None else None)


def test_share_of_groups_whose_scores_are_all_equal():
    # groups a (0.1, 0.1: flat), b (1.0, 0.1), c (0.0, 0.0, 0.0: flat), d (1.0, 1.0 + 1e-9: flat within 1e-6)
    b = _batch([0.1, 0.1, 1.0, 0.1, 0.0, 0.0, 0.0, 1.0, 1.0 + 1e-9],
               ["a", "a", "b", "b", "c", "c", "c", "d", "d"])
    assert group_score_metrics(b) == {"critic/frac_reward_zero_std": 0.75}
    m = compute_data_metrics(b, use_critic=False, max_response_length=1, max_prompt_length=1)
    assert m["critic/frac_reward_zero_std"] == 0.75


def test_rows_of_one_group_interleaved_and_non_string_uids():
    b = _batch([1.0, 0.0, 1.0, 1.0], [7, 8, 7, 8])  # 7: 1, 1 (flat); 8: 0, 1
    assert group_score_metrics(b) == {"critic/frac_reward_zero_std": 0.5}


def test_no_metric_without_groups_to_measure():
    assert group_score_metrics(_batch([1.0, 0.0], ["a", "b"])) == {}  # rollout.n = 1: every group is one row
    assert group_score_metrics(_batch([1.0, 0.0])) == {}  # no uid column
    b = _batch([1.0, 0.0], ["a", "b"])
    assert "critic/frac_reward_zero_std" not in compute_data_metrics(b, use_critic=False, max_response_length=1,
                                                                     max_prompt_length=1)


def test_one_answer_policy_reads_one():
    # the collapse seen in practice: every sample of every question gets the same score (0.1 or 1.0 per question)
    scores = [0.1] * 8 + [1.0] * 8 + [0.1] * 8
    uids = [u for u in "xyz" for _ in range(8)]
    assert group_score_metrics(_batch(scores, uids)) == {"critic/frac_reward_zero_std": 1.0}


def test_uids_group_as_the_advantage_estimator_groups_them():
    # tuples are valid uids for the estimators (any hashable value); 1 and "1" are two prompts, not one
    b = _batch([1.0, 1.0, 0.0, 1.0], [(1, 2), (1, 2), (1, 3), (1, 3)])
    assert group_score_metrics(b) == {"critic/frac_reward_zero_std": 0.5}
    assert group_score_metrics(_batch([1.0, 0.0], [1, "1"])) == {}


def test_aborted_responses_are_left_out_of_their_group():
    # a: 1, 1 and an aborted row scored 0 (flat: the estimator ignores the aborted row); b: one live row (not
    # counted); c: 0, 1 (not flat)
    b = _batch([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0], ["a", "a", "a", "b", "b", "c", "c"])
    live = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]).view(-1, 1)
    b["response_mask"] = live
    b["attention_mask"] = torch.cat([torch.ones(7, 1, dtype=torch.long), live.long()], dim=1)
    assert group_score_metrics(b) == {"critic/frac_reward_zero_std": 0.5}
    m = compute_data_metrics(b, use_critic=False, max_response_length=1, max_prompt_length=1)
    assert m["critic/frac_reward_zero_std"] == 0.5


def test_equal_infinite_scores_are_flat_and_a_nan_score_is_not():
    b = _batch([float("inf"), float("inf"), float("nan"), 1.0, float("nan"), float("nan")],
               ["a", "a", "b", "b", "c", "c"])
    assert group_score_metrics(b) == {"critic/frac_reward_zero_std": 1 / 3}
