"""Registries, masked helpers and advantage estimators (hand-computed values)."""
import math

import numpy as np
import pytest
import torch

from trainer import core_algos as ca


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def _rows(scores, width=3, mask=None):
    """Scores placed on the last token of rows of ``width`` tokens (all valid unless ``mask``)."""
    r = torch.zeros(len(scores), width)
    r[:, -1] = torch.tensor(scores, dtype=torch.float32)
    m = torch.ones(len(scores), width) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return r, m


# ---------------------------------------------------------------------------------------------- registries
def test_registry_lookup_and_errors():
    assert ca.get_adv_estimator_fn("grpo") is ca.compute_grpo_outcome_advantage
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GAE) is ca.compute_gae_advantage_return
    assert ca.get_policy_loss_fn("vanilla") is ca.compute_policy_loss_vanilla
    with pytest.raises(ValueError, match="known:.*grpo"):
        ca.get_adv_estimator_fn("nope")
    with pytest.raises(ValueError, match="known:.*vanilla"):
        ca.get_policy_loss_fn("nope")

    def other(*a, **k):
        return None
    with pytest.raises(ValueError, match="already registered"):
        ca.register_adv_est("grpo")(other)
    with pytest.raises(ValueError, match="already registered"):
        ca.register_policy_loss("vanilla")(other)
    # registering the same function again is fine
    ca.register_adv_est("grpo")(ca.compute_grpo_outcome_advantage)


def test_registering_a_new_estimator_is_one_decorator():
    @ca.register_adv_est("unit_test_zero")
    def zero_est(token_level_rewards, response_mask, index=None, values=None, gamma=1.0, lam=1.0, **kwargs):
        z = torch.zeros_like(token_level_rewards)
        return z, z

    try:
        fn = ca.get_adv_estimator_fn("unit_test_zero")
        adv, ret = fn(torch.ones(2, 2), torch.ones(2, 2), index=np.array(["a", "b"]))
        assert adv.abs().sum() == 0
    finally:  # unregistered again: the function and its registry entry
        ca.ADV_ESTIMATOR_REGISTRY.pop("unit_test_zero")
        ca.ADV_ESTIMATOR_SPECS.pop("unit_test_zero")


# ---------------------------------------------------------------------------------------------- masked helpers
def test_masked_helpers_ignore_nan_at_masked_positions():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 4.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert ca.masked_mean(x, m).item() == pytest.approx(2.5)
    assert ca.masked_mean(x, m, dim=-1).tolist() == pytest.approx([1.5, 3.5])
    assert ca.masked_var(x, m).item() == pytest.approx(5.0 / 3.0)  # devs -1.5,-.5,.5,1.5 -> 5/3 unbiased
    w = ca.masked_whiten(x, m)
    assert torch.isfinite(w).all()
    s = math.sqrt(5.0 / 3.0 + 1e-8)
    close(w, [[-1.5 / s, -0.5 / s, 0.0], [0.5 / s, 0.0, 1.5 / s]])
    assert ca.masked_mean(x, torch.zeros_like(m)).item() == 0.0
    with pytest.raises(ValueError, match="only 1 element"):
        ca.masked_var(x, torch.tensor([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="shape"):
        ca.masked_mean(x, torch.ones(3, 2))


# ---------------------------------------------------------------------------------------------- GAE
def test_gae_hand_values():
    # gamma=0.9, lam=0.8, r=[0,0,1], V=[1,2,3]:
    # t2: d=1-3=-2, A=-2 ; t1: d=0.9*3-2=0.7, A=0.7+0.72*(-2)=-0.74 ; t0: d=0.9*2-1=0.8, A=0.8+0.72*(-0.74)=0.2672
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[1.0, 2.0, 3.0]])
    adv, ret = ca.compute_gae_advantage_return(r, torch.ones(1, 3), values=v, gamma=0.9, lam=0.8)
    assert ret.tolist()[0] == pytest.approx([1.2672, 1.26, 1.0], abs=1e-6)
    raw = torch.tensor([0.2672, -0.74, -2.0])
    mean = raw.mean()
    std = math.sqrt(((raw - mean) ** 2).sum().item() / 2 + 1e-8)
    assert adv[0].tolist() == pytest.approx(((raw - mean) / std).tolist(), abs=1e-5)
    assert adv[0].tolist() == pytest.approx([0.96085, 0.07418, -1.03503], abs=1e-4)


def test_gae_masked_tokens_carry_through_and_values_there_do_not_matter():
    # multi-turn: the middle token is an observation (mask 0); its reward/value must not matter.
    r = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 1.0]])
    m = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    v1 = torch.tensor([[1.0, float("nan"), 3.0], [0.5, 0.5, 0.5]])
    v2 = torch.tensor([[1.0, -7.0, 3.0], [0.5, 0.5, 0.5]])
    a1, r1 = ca.compute_gae_advantage_return(r, m, values=v1, gamma=0.9, lam=0.8)
    a2, r2 = ca.compute_gae_advantage_return(r, m, values=v2, gamma=0.9, lam=0.8)
    assert torch.isfinite(a1).all() and torch.isfinite(r1).all()
    assert torch.equal(a1, a2) and torch.equal(r1, r2)
    # row 0 equals the 2-token sequence r=[0,1], V=[1,3]: t1: A=-2 ; t0: d=0.9*3-1=1.7, A=1.7-1.44=0.26
    assert r1[0].tolist() == pytest.approx([1.26, 0.0, 1.0], abs=1e-6)
    assert a1[0, 1] == 0.0


def test_gae_requires_values():
    with pytest.raises(ValueError, match="values"):
        ca.compute_gae_advantage_return(torch.zeros(1, 2), torch.ones(1, 2))


# ---------------------------------------------------------------------------------------------- GRPO family
def test_grpo_groups_by_uid_not_position():
    # group a = rows 0,2 scores [1,0] -> mean .5, unbiased std sqrt(.5) -> +-0.70711 ; group b = rows 1,3,4,5
    # scores [1,0,0,0] -> [1.5,-.5,-.5,-.5] ; group c (row 6) singleton -> 0
    r, m = _rows([1, 1, 0, 0, 0, 0, 9])
    uid = np.array(["a", "b", "a", "b", "b", "b", "c"], dtype=object)
    adv, ret = ca.compute_grpo_outcome_advantage(r, m, index=uid)
    expect = [0.5 / math.sqrt(0.5), 1.5, -0.5 / math.sqrt(0.5), -0.5, -0.5, -0.5, 0.0]
    assert adv[:, 0].tolist() == pytest.approx(expect, abs=1e-5)
    assert torch.equal(adv, ret)
    assert (adv == adv[:, :1]).all()  # broadcast over valid tokens


def test_grpo_without_std_and_dr_grpo():
    r, m = _rows([1, 0, 0, 0])
    uid = np.array(["a"] * 4)
    a1, _ = ca.compute_grpo_outcome_advantage(r, m, index=uid, norm_adv_by_std_in_grpo=False)
    a2, _ = ca.get_adv_estimator_fn("dr_grpo")(r, m, index=uid)
    assert a1[:, 0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert torch.equal(a1, a2)


def test_p09_fully_masked_row_does_not_move_group_stats():
    r, m = _rows([5, 1, 1], mask=[[0, 0, 0], [1, 1, 1], [1, 1, 1]])
    uid = np.array(["a", "a", "a"])
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"):
        adv, ret = ca.get_adv_estimator_fn(name)(r, m, index=uid)
        assert torch.isfinite(adv).all(), name
        assert (adv == 0).all(), (name, adv)
    otb = ca.get_adv_estimator_fn("optimal_token_baseline")  # its epsilon once left 6.5e-9 here
    for scores, mask in (([5, 1, 1], [[0, 0, 0], [1, 1, 1], [1, 1, 1]]), ([1, 1, 1, 1], None), ([0.1] * 3, None)):
        r, m = _rows(scores, mask=mask)
        lp, sq = torch.linspace(-3, -0.1, r.numel()).view_as(r), torch.full_like(r, 0.3)
        adv, _ = otb(r, m, index=np.array(["a"] * len(scores)), old_log_probs=lp, sum_pi_squared=sq)
        assert (adv == 0).all(), (scores, adv)
    # edge cases of the spec: equal rewards -> 0; singleton -> 0; [1,0,0,0] -> [1.5,-.5,-.5,-.5] (unbiased, eps 1e-6)
    r, m = _rows([1, 1, 1, 1])
    assert (ca.compute_grpo_outcome_advantage(r, m, index=np.array(["a"] * 4))[0] == 0).all()
    r, m = _rows([0.1, 0.1, 0.1])  # mean is not exact in floating point; still exactly 0
    assert (ca.compute_grpo_outcome_advantage(r, m, index=np.array(["a"] * 3))[0] == 0).all()
    r, m = _rows([3.0])
    assert (ca.compute_grpo_outcome_advantage(r, m, index=np.array(["s"]))[0] == 0).all()
    r, m = _rows([1, 0, 0, 0])
    adv, _ = ca.compute_grpo_outcome_advantage(r, m, index=np.array(["a"] * 4), epsilon=1e-6)
    assert adv[:, 0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    # rows of the masked member are 0 at every position, the others are broadcast on valid tokens only
    r, m = _rows([5, 1, 0], mask=[[0, 0, 0], [1, 1, 0], [1, 1, 1]])
    adv, _ = ca.compute_grpo_outcome_advantage(r, m, index=np.array(["a"] * 3))
    s = 1 / math.sqrt(0.5)
    close(adv, [[0, 0, 0], [0, 0, 0], [0, 0, 0]])  # row1 score is 0 (its reward token is masked)
    r = torch.tensor([[0.0, 0, 5], [0, 1, 0], [0, 0, 0]])
    adv, _ = ca.compute_grpo_outcome_advantage(r, m, index=np.array(["a"] * 3))
    close(adv, [[0, 0, 0], [0.5 * s, 0.5 * s, 0], [-0.5 * s] * 3], atol=1e-5)


def test_rloo_hand_values():
    # group [1,0,0,0]: 1 - mean(0,0,0) = 1 ; 0 - mean(1,0,0) = -1/3 ; singleton -> 0
    r, m = _rows([1, 0, 0, 0, 7])
    adv, ret = ca.compute_rloo_outcome_advantage(r, m, index=np.array(["a", "a", "a", "a", "z"]))
    assert adv[:, 0].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0], abs=1e-6)
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_hand_values():
    # gamma=.5: row0 r=[0,0,1] -> G=[.25,.5,1]; row1 r=[0,1,pad] -> G=[.5,1,0]
    # valid G = [.25,.5,1,.5,1]: mean .65, unbiased var .45/4=.1125
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 3.0]])
    m = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]])
    sd = math.sqrt(0.1125 + 1e-8)
    close(adv, [[-0.4 / sd, -0.15 / sd, 0.35 / sd], [-0.15 / sd, 0.35 / sd, 0.0]], atol=1e-5)


def test_reinforce_plus_plus_baseline_hand_values():
    # group a scores [1,0] -> centred [.5,-.5]; group b [2,2] -> [0,0]; tokens (2 per row) whitened over batch:
    # values [.5,.5,-.5,-.5,0,0,0,0], mean 0, unbiased var = 1/7
    r, m = _rows([1, 0, 2, 2], width=2)
    adv, ret = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, index=np.array(["a", "a", "b", "b"]))
    sd = math.sqrt(1 / 7 + 1e-8)
    assert adv[:, 0].tolist() == pytest.approx([0.5 / sd, -0.5 / sd, 0.0, 0.0], abs=1e-5)
    assert torch.equal(adv, ret)


def test_remax_hand_values():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    m = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    adv, ret = ca.compute_remax_outcome_advantage(r, m, reward_baselines=torch.tensor([0.4, 1.0]))
    close(ret, [[1, 1, 1], [2, 2, 0]])
    close(adv, [[0.6, 0.6, 0.6], [1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="reward_baselines"):
        ca.compute_remax_outcome_advantage(r, m)


def test_grpo_vectorised_equals_loop_on_random_groups():
    g = torch.Generator().manual_seed(0)
    B, R = 24, 5
    r = torch.randint(0, 3, (B, R), generator=g).float()
    m = (torch.rand(B, R, generator=g) > 0.3).float()
    m[3] = 0
    uid = np.array([f"u{int(i)}" for i in torch.randint(0, 5, (B,), generator=g)], dtype=object)
    adv, _ = ca.compute_grpo_outcome_advantage(r, m, index=uid)
    rl, _ = ca.compute_rloo_outcome_advantage(r, m, index=uid)
    s = (r * m).sum(-1)
    valid = m.sum(-1) > 0
    for i in range(B):
        peers = [j for j in range(B) if uid[j] == uid[i] and valid[j]]
        if not valid[i] or len(peers) < 2 or len({float(s[j]) for j in peers}) == 1:
            exp_g = exp_r = 0.0
        else:
            vals = torch.tensor([float(s[j]) for j in peers], dtype=torch.float64)
            exp_g = (float(s[i]) - vals.mean().item()) / (vals.std().item() + 1e-6)
            exp_r = float(s[i]) - (vals.sum().item() - float(s[i])) / (len(peers) - 1)
        got_g = adv[i][m[i] > 0]
        assert torch.allclose(got_g, torch.full_like(got_g, exp_g), atol=1e-5), i
        assert torch.allclose(rl[i][m[i] > 0], torch.full_like(got_g, exp_r), atol=1e-5), i
        assert (adv[i][m[i] == 0] == 0).all()


def test_index_length_is_checked():
    r, m = _rows([1, 0])
    with pytest.raises(ValueError, match="2 rows"):
        ca.compute_grpo_outcome_advantage(r, m, index=np.array(["a"]))
    with pytest.raises(ValueError, match="uid"):
        ca.compute_grpo_outcome_advantage(r, m)


def test_compute_advantage_on_dataproto():
    from trainer.protocol import DataProto
    r, m = _rows([1, 0, 0, 0])
    data = DataProto.from_dict({"token_level_rewards": r, "response_mask": m}, {"uid": ["a"] * 4})
    ca.compute_advantage(data, "grpo")
    assert data["advantages"][:, 0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert torch.equal(data["returns"], data["advantages"])
