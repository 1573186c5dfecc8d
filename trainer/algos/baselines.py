"""Advantage estimators with other group baselines: OPO, GRPO pass@k, the optimal token baseline.

Same signature and group rules as :mod:`trainer.algos.advantages` (rows grouped by uid; a row with no valid
token neither contributes to nor receives group statistics; a group with fewer than 2 valid rows gives
advantage 0). Group statistics in float64; results have the rewards' dtype and are 0 at masked positions.
"""
from __future__ import annotations

import torch

from .advantages import _broadcast, _check, _discounted_returns, group_ids
from .masked import masked_sum
from .registry import AdvantageEstimator, register_adv_est

__all__ = ["compute_opo_outcome_advantage", "compute_grpo_passk_outcome_advantage",
           "compute_optimal_token_baseline_advantage"]


def _groups(index, valid: torch.Tensor) -> list[torch.Tensor]:
    """Row indices (int64) of the valid members of each uid group, in order of first appearance."""
    gid = group_ids(index, valid.shape[0]).to(valid.device)
    num = int(gid.max()) + 1 if gid.numel() else 0
    return [torch.nonzero((gid == g) & valid).flatten() for g in range(num)]


@register_adv_est(AdvantageEstimator.OPO, group_based=True)
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0, lam=1.0,
                                  **kwargs):
    """OPO, the optimal reward baseline (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline",
    arXiv:2505.23585; verl's ``opo``): ``A_i = s_i - b_g`` with the length-weighted group mean
    ``b_g = sum_j |o_j| s_j / sum_j |o_j|`` (``|o_j|`` = valid tokens of row j, ``s_j`` = its summed reward),
    no std division, broadcast over the valid tokens; ``returns = advantages``.

    A group with fewer than 2 valid rows gives 0 (verl keeps the raw score there). Example: scores [1, 0] with
    lengths [1, 3]: ``b = 1/4``, advantages [0.75, -0.25].
    """
    m = _check(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, m, dim=-1).to(torch.float64)
        lengths = m.sum(dim=-1).to(torch.float64)
        adv = torch.zeros_like(scores)
        for rows in _groups(index, m.any(dim=-1)):
            if rows.numel() >= 2:
                baseline = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
                adv[rows] = scores[rows] - baseline
        adv = _broadcast(adv, m, token_level_rewards.dtype)
    return adv, adv.clone()


@register_adv_est(AdvantageEstimator.GRPO_PASSK, group_based=True, config_kwargs=("norm_adv_by_std_in_grpo",))
def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0,
                                         lam=1.0, norm_adv_by_std_in_grpo: bool = True, epsilon: float = 1e-6,
                                         **kwargs):
    """GRPO pass@k (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation",
    arXiv:2503.19595; verl's ``grpo_passk``): in each group only the best response gets a non-zero advantage,
    ``r_max - r_second_max``, divided by ``std_g + epsilon`` (unbiased std of the group's scores) when
    ``norm_adv_by_std_in_grpo``; every other row gets 0. ``returns = advantages``.

    The best is the first row holding the maximum; a tie at the top gives 0. Example: scores [0, 2, 1] ->
    [0, 1, 0] without the std division.
    """
    m = _check(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, m, dim=-1).to(torch.float64)
        adv = torch.zeros_like(scores)
        for rows in _groups(index, m.any(dim=-1)):
            if rows.numel() < 2:
                continue
            top, pos = torch.topk(scores[rows], 2)  # first occurrence of the maximum comes first
            gap = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                gap = gap / (scores[rows].std() + epsilon)
            adv[rows[pos[0]]] = gap
        adv = _broadcast(adv, m, token_level_rewards.dtype)
    return adv, adv.clone()


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, group_based=True,
                  inputs=("old_log_probs", "sum_pi_squared"))
def compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index=None, values=None,
                                             gamma=1.0, lam=1.0, old_log_probs=None, sum_pi_squared=None,
                                             rollout_is_weights=None, epsilon: float = 1e-8, **kwargs):
    """Optimal token baseline (verl's ``optimal_token_baseline``, its docs/algo/otb.md): a baseline per time
    step, ``B_t = sum_j G_jt W_jt / (sum_j W_jt + epsilon)`` over the valid rows j of the group that are valid at
    t (computed as ``c_t + sum_j (G_jt - c_t) W_jt / (sum_j W_jt + epsilon)`` with ``c_t`` the first such row's
    ``G_jt``: the same up to epsilon's share, and exactly ``G`` when the group's returns are equal), with ``G_t = sum_{t' >= t} r_t'`` (reward to go) and the path-variance proxy ``W_t = sum_{s <= t} w_s``,
    ``w_s = 1 - 2 pi_s + sum_v pi_v^2`` (``pi_s = exp(old_log_probs)``, times ``rollout_is_weights^2`` when
    given). ``advantages = G - B`` on valid tokens, ``returns = G``.

    Args:
        old_log_probs, sum_pi_squared: ``(batch, response_len)`` float (required; ``sum_pi_squared`` is
            ``sum_v softmax(z)_v^2`` of the sampling policy at each token).
    Raises:
        ValueError: if an input is missing or mis-shaped.
    """
    m = _check(token_level_rewards, response_mask)
    for name, t in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared)):
        if t is None or t.shape != token_level_rewards.shape:
            raise ValueError(f"optimal_token_baseline needs {name} of shape {tuple(token_level_rewards.shape)}, "
                             f"got {None if t is None else tuple(t.shape)}")
    with torch.no_grad():
        G = _discounted_returns(token_level_rewards.to(torch.float64), m, 1.0)
        w = 1.0 - 2.0 * torch.exp(old_log_probs.to(torch.float64)) + sum_pi_squared.to(torch.float64)
        if rollout_is_weights is not None:
            w = w * rollout_is_weights.to(torch.float64) ** 2
        W = torch.where(m, w, 0.0).cumsum(dim=-1)
        baseline = torch.zeros_like(G)
        for rows in _groups(index, m.any(dim=-1)):
            if rows.numel() < 2:  # no baseline exists: advantage 0, as for the other group estimators
                baseline[rows] = G[rows]
                continue
            mg = m[rows].to(torch.float64)
            # centred on one valid row's G (the first at each step): equal scores give a baseline of exactly that
            # G (advantage 0, as the group rules ask); otherwise the same weighted mean up to epsilon's share
            ref = G[rows].gather(0, mg.argmax(dim=0, keepdim=True))
            num = ((G[rows] - ref) * W[rows] * mg).sum(dim=0, keepdim=True)
            baseline[rows] = ref + num / ((W[rows] * mg).sum(dim=0, keepdim=True) + epsilon)
        dt = token_level_rewards.dtype
        adv = torch.where(m, G - baseline, 0.0).to(dt)
    return adv, G.to(dt)
