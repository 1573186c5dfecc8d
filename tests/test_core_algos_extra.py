"""Estimators and policy losses of verl's wider family: hand-computed values (one test per registry entry)."""
import math

import numpy as np
import pytest
import torch

from trainer import core_algos as ca


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def _last_token_rewards(scores, lengths, width):
    m = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    r = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        if n:
            r[i, n - 1] = s
    return r, m


# ---------------------------------------------------------------------------------------------- estimators
def test_opo_length_weighted_baseline():
    # group a: scores [1, 0], lengths [1, 3] -> b = (1*1 + 3*0) / 4 = 0.25; group b: one row -> 0; empty row -> 0
    r, m = _last_token_rewards([1, 0, 5, 1], [1, 3, 2, 0], 3)
    adv, ret = ca.get_adv_estimator_fn("opo")(r, m, index=np.array(["a", "a", "b", "a"]))
    close(adv, [[0.75, 0, 0], [-0.25, -0.25, -0.25], [0, 0, 0], [0, 0, 0]])
    assert torch.equal(adv, ret)


def test_grpo_passk_only_the_best_gets_the_gap():
    r, m = _last_token_rewards([0, 2, 1, 3, 3, 0], [2] * 6, 2)
    idx = np.array(["a", "a", "a", "b", "b", "b"])
    adv, _ = ca.get_adv_estimator_fn("grpo_passk")(r, m, index=idx, norm_adv_by_std_in_grpo=False)
    close(adv[:, 0], [0, 1, 0, 0, 0, 0])  # a: 2 - 1 on the best; b: a tie at the top -> 0
    adv, _ = ca.get_adv_estimator_fn("grpo_passk")(r, m, index=idx)
    close(adv[:, 0], [0, 1 / (1 + 1e-6), 0, 0, 0, 0])  # unbiased std of [0, 2, 1] is 1
    assert ca.get_adv_estimator_spec("grpo_passk").config_kwargs == ("norm_adv_by_std_in_grpo",)


def test_optimal_token_baseline_hand_values():
    # one group of 2 rows x 2 tokens; score 1 / 0 on the last token; w = 1 - 2 pi + sum pi^2
    r, m = _last_token_rewards([1, 0], [2, 2], 2)
    old = torch.log(torch.tensor([[0.5, 0.5], [1.0, 0.5]]))
    spp = torch.tensor([[0.5, 0.5], [1.0, 0.5]])  # w: row0 [0.5, 0.5] -> W [0.5, 1]; row1 [0, 0.5] -> W [0, 0.5]
    adv, ret = ca.get_adv_estimator_fn("optimal_token_baseline")(r, m, index=np.array(["a", "a"]),
                                                                 old_log_probs=old, sum_pi_squared=spp)
    # B_0 = (1*0.5 + 0*0) / 0.5 = 1; B_1 = (1*1 + 0*0.5) / 1.5 = 2/3
    close(adv, [[0.0, 1 / 3], [-1.0, -2 / 3]], atol=1e-6)
    close(ret, [[1.0, 1.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="sum_pi_squared"):
        ca.get_adv_estimator_fn("optimal_token_baseline")(r, m, index=np.array(["a", "a"]), old_log_probs=old)


def test_gdpo_normalises_each_component_in_its_group_then_whitens_the_weighted_sum():
    # group a (3 rows): components [[1, 0], [0, 1], [1, 1]]; group b: [[1, 0], [1, 0]] (constant: 0); an empty row.
    # a, component 1 [1, 0, 1]: mean 2/3, unbiased std 1/sqrt 3 -> [1, -2, 1] / sqrt 3; component 2 [0, 1, 1] ->
    # [-2, 1, 1] / sqrt 3. Weights [1, 2]: sums [-sqrt 3, 0, sqrt 3, 0, 0] over 5 one-token rows; the token
    # whitening (mean 0, unbiased var 6/4) gives [-sqrt 2, 0, sqrt 2, 0, 0].
    r, m = _last_token_rewards([9, 9, 9, 9, 9, 9], [1, 1, 1, 1, 1, 0], 2)  # the summed score is not read
    comps = torch.tensor([[1.0, 0], [0, 1], [1, 1], [1, 0], [1, 0], [5, 5]])
    idx = np.array(["a", "a", "a", "b", "b", "a"])
    gdpo = ca.get_adv_estimator_fn("gdpo")
    adv, ret = gdpo(r, m, index=idx, reward_components=comps, gdpo_reward_weights=[1.0, 2.0], epsilon=0.0)
    s2 = math.sqrt(2.0)
    close(adv, [[-s2, 0], [0, 0], [s2, 0], [0, 0], [0, 0], [0, 0]], atol=1e-5)
    assert torch.equal(adv, ret)
    # equal weights: [-1, -1, 2] / sqrt 3 -> whitened by sqrt(6 / 3 / 4): [-1, -1, 2] * sqrt(2 / 3)
    adv, _ = gdpo(r, m, index=idx, reward_components=comps, epsilon=0.0)
    k = math.sqrt(2 / 3)
    close(adv[:, 0], [-k, -k, 2 * k, 0, 0, 0], atol=1e-5)
    spec = ca.get_adv_estimator_spec("gdpo")
    assert spec.inputs == ("reward_components",) and spec.group_based
    assert spec.config_kwargs == ("norm_adv_by_std_in_grpo", "gdpo_reward_weights")
    with pytest.raises(ValueError, match=r"gdpo needs reward_components of shape \(6, K >= 1\), got None"):
        gdpo(r, m, index=idx)
    with pytest.raises(ValueError, match="gdpo_reward_weights has 1 weights for 2 reward components"):
        gdpo(r, m, index=idx, reward_components=comps, gdpo_reward_weights=[1.0])


# ---------------------------------------------------------------------------------------------- policy losses
def _call(name, old, logp, adv, mask=None, mode="token-mean", **cfg):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(old, dtype=torch.float64)
    adv = torch.tensor(adv, dtype=torch.float64)
    mask = torch.ones_like(adv) if mask is None else torch.tensor(mask, dtype=torch.float64)
    loss, metrics = ca.get_policy_loss_fn(name)(old, logp, adv, mask, loss_agg_mode=mode,
                                                config={"clip_ratio": 0.2, **cfg})
    loss.backward()
    return loss.item(), logp.grad, {k: float(v) for k, v in metrics.items()}


def test_cispo_clipped_weight_without_gradient():
    # token 0: ratio 1.5 -> weight 1.2 (clipped), A 2; token 1: ratio 1, A 1, logp 0
    loss, grad, m = _call("cispo", [[0.0, 0.0]], [[math.log(1.5), 0.0]], [[2.0, 1.0]])
    assert loss == pytest.approx(-1.2 * 2 * math.log(1.5) / 2)
    close(grad, [[-1.2 * 2 / 2, -1.0 / 2]])  # d/dlogp of -w*A*logp, token mean
    assert m["pg_clipfrac"] == pytest.approx(0.5)


def test_geo_mean_sequence_ratio_with_log_space_clip():
    # row 0 (A=+1): x = [0.1, 0.6] -> clipped [0.1, 0.4], ratio exp(0.25), loss -exp(0.25)
    # row 1 (A=-1): x = [0.1, -0.6] -> the pessimistic side max(x, clip) = [0.1, -0.4], loss +exp(-0.15)
    loss, grad, m = _call("geo_mean", [[0.0, 0.0], [0.0, 0.0]], [[0.1, 0.6], [0.1, -0.6]],
                          [[1.0, 1.0], [-1.0, -1.0]], mode="seq-mean-token-mean", clip_ratio=0.4)
    assert loss == pytest.approx((-math.exp(0.25) + math.exp(-0.15)) / 2)
    # d/dx_t of -A*exp(mean x') is -A*ratio/2 for an unclipped token, 0 for a clipped one; then / 2 sequences
    close(grad, [[-math.exp(0.25) / 4, 0.0], [math.exp(-0.15) / 4, 0.0]])
    assert (m["pg_clipfrac"], m["pg_clipfrac_lower"]) == (pytest.approx(0.25), pytest.approx(0.25))


def test_clip_cov_cuts_the_gradient_of_high_covariance_tokens():
    # ratio 1 everywhere; logp deviation [1, -1, 0, 0], A [2, -2, 0, 0]: covariance [2, 2, 0, 0]; both in (1, 5)
    args = ([[-1.0, -3, -2, -2]], [[-1.0, -3, -2, -2]], [[2.0, -2, 0, 0]])
    loss, grad, m = _call("clip_cov", *args, policy_loss={"clip_cov_ratio": 0.5, "clip_cov_lb": 1.0,
                                                          "clip_cov_ub": 5.0})
    assert loss == 0.0 and torch.equal(grad, torch.zeros(1, 4, dtype=torch.float64))
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    _, grad, _ = _call("clip_cov", *args, policy_loss={"clip_cov_ratio": 0.5, "clip_cov_lb": 3.0})
    close(grad, [[-2 / 4, 2 / 4, 0, 0]])  # nothing in (3, 5): the plain PPO gradient -A*ratio / 4
    with pytest.raises(ValueError, match="clip_cov_ratio must be > 0"):
        _call("clip_cov", *args, policy_loss={"clip_cov_ratio": 0.0})


def test_kl_cov_penalises_the_top_covariance_token():
    # A [3, -2, 0, 0] (mean 0.25), logp dev [1, -1, 0, 0]: covariance [2.75, 2.25, 0, 0] -> token 0 only
    loss, grad, m = _call("kl_cov", [[-1.2, -3, -2, -2]], [[-1.0, -3, -2, -2]], [[3.0, -2, 0, 0]],
                          policy_loss={"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.1})
    assert loss == pytest.approx((-3 * math.exp(0.2) + 0.1 * 0.2 + 2.0) / 4)
    close(grad, [[(-3 * math.exp(0.2) + 0.1) / 4, 2 / 4, 0, 0]])
    assert m["pg_clipfrac"] == pytest.approx(0.25)


def test_sapo_soft_gate():
    # A = +1 at ratio 1: gate sigmoid(0) * 4 / tau_pos = 2, gradient -1 (PPO's at r = 1)
    # A = -1 at ratio e^0.1: gate sigmoid(1.05 (e^0.1 - 1)) * 4 / 1.05
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    z = 1.05 * (math.exp(0.1) - 1)
    loss, grad, _ = _call("sapo", [[0.0, 0.0]], [[0.0, 0.1]], [[1.0, -1.0]], tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx((-2.0 + sig(z) * 4 / 1.05) / 2)
    close(grad, [[-1.0 / 2, sig(z) * (1 - sig(z)) * 4 * math.exp(0.1) / 2]])


def test_micro_batch_local_trait():
    assert {k for k, s in ca.POLICY_LOSS_SPECS.items() if s.micro_batch_local} == {"clip_cov", "kl_cov"}


def test_dppo_tv_masks_tokens_that_left_the_tv_region_in_their_advantage_direction():
    # p_old 0.5 everywhere; p [0.6, 0.7, 0.3, 0.7], A [+1, +1, -1, -1], TV threshold 0.15:
    # +0.1 kept; +0.2 with A>0 masked; -0.2 with A<0 masked; +0.2 with A<0 kept (it moves against its push)
    lg = math.log
    old, logp, adv = [[lg(0.5)] * 4], [[lg(0.6), lg(0.7), lg(0.3), lg(0.7)]], [[1.0, 1.0, -1.0, -1.0]]
    loss, grad, m = _call("dppo_tv", old, logp, adv, clip_ratio=0.15, clip_ratio_c=3.0)
    assert loss == pytest.approx((-1.2 * lg(0.6) + 1.4 * lg(0.7)) / 4)  # -A * sg(ratio) * logp, token mean
    close(grad, [[-1.2 / 4, 0.0, 0.0, 1.4 / 4]])
    assert (m["pg_clipfrac"], m["pg_clipfrac_lower"]) == (pytest.approx(0.5), 0.0)
    _, grad, m = _call("dppo_tv", old, logp, adv, clip_ratio=0.15, clip_ratio_c=1.1)  # the weight truncated
    close(grad, [[-1.1 / 4, 0.0, 0.0, 1.1 / 4]])
    assert m["pg_clipfrac_lower"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _call("dppo_tv", old, logp, adv, clip_ratio_c=0.0)


def test_dppo_kl_masks_by_the_binary_kl_in_the_advantage_direction():
    lg = math.log
    kl = lambda q, p: q * lg(q / p) + (1 - q) * lg((1 - q) / (1 - p))  # noqa: E731  binary KL(old || new)
    assert kl(0.5, 0.6) == pytest.approx(0.0204, abs=1e-4) and kl(0.5, 0.8) == pytest.approx(0.2231, abs=1e-4)
    # threshold 0.05: A>0 up by KL 0.02 kept; A>0 up by 0.22 masked; A>0 down (p 0.2) kept; A<0 down by 0.22 masked
    old, logp = [[lg(0.5)] * 4], [[lg(0.6), lg(0.8), lg(0.2), lg(0.2)]]
    loss, grad, m = _call("dppo_kl", old, logp, [[1.0, 1.0, 1.0, -1.0]], clip_ratio=0.05, clip_ratio_c=3.0)
    assert loss == pytest.approx((-1.2 * lg(0.6) - 0.4 * lg(0.2)) / 4)
    close(grad, [[-1.2 / 4, 0.0, -0.4 / 4, 0.0]])
    assert m["pg_clipfrac"] == pytest.approx(0.5)
