"""Advantage estimators (registered by name; ``algorithm.adv_estimator`` in configs).

Every estimator has the same keyword signature::

    fn(token_level_rewards, response_mask, index=None, values=None, gamma=1.0, lam=1.0, **kwargs)
        -> (advantages, returns)

* ``token_level_rewards``: ``(batch, response_len)`` float32, reward per response token (usually the scalar
  score on the last valid token, minus the in-reward KL penalty).
* ``response_mask``: ``(batch, response_len)``, 1 for tokens that are trained on.
* ``index``: ``(batch,)`` numpy array (or list) of prompt uids; rows with equal uid form a group. Groups are
  found by uid, never by row position.
* returns ``advantages`` and ``returns``, both ``(batch, response_len)`` with the dtype of the rewards, and
  exactly 0 at masked positions.

Group-based estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) share these rules:
a row whose ``response_mask`` is all zero neither contributes to nor receives group statistics (its advantage
is 0); a group with fewer than 2 valid members, or whose valid members all have the same score, gives
advantage exactly 0 (never NaN/inf). Group statistics are computed in float64.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .masked import as_bool_mask, masked_sum, masked_whiten
from .registry import AdvantageEstimator, get_adv_estimator_spec, register_adv_est

__all__ = ["compute_gae_advantage_return", "compute_grpo_outcome_advantage", "compute_dr_grpo_outcome_advantage",
           "compute_rloo_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
           "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_remax_outcome_advantage",
           "compute_advantage", "group_ids"]


def _check(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    if token_level_rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be (batch, response_len), got shape "
                         f"{tuple(token_level_rewards.shape)}")
    return as_bool_mask(response_mask, token_level_rewards)


def group_ids(index: Sequence | np.ndarray, batch_size: int) -> torch.Tensor:
    """Map uids to dense group ids ``(batch,)`` int64, in order of first appearance.

    Raises:
        ValueError: if ``index`` is None or its length differs from ``batch_size``.
    """
    if index is None:
        raise ValueError("this advantage estimator groups rows by uid: pass index=<array of uids, one per row>")
    if len(index) != batch_size:
        raise ValueError(f"index has {len(index)} uids but the batch has {batch_size} rows")
    ids: dict = {}
    return torch.tensor([ids.setdefault(u, len(ids)) for u in list(index)], dtype=torch.long)


def _group_advantage(scores: torch.Tensor, valid: torch.Tensor, index, mode: str, eps: float = 1e-6) -> torch.Tensor:
    """Per-row group-relative advantage ``(batch,)`` float64.

    ``mode``: ``"std"`` (s - mean)/(std_unbiased + eps); ``"center"`` s - mean; ``"loo"`` n/(n-1)(s - mean),
    i.e. s minus the mean of the others (RLOO).
    """
    dev_ = scores.device
    gid = group_ids(index, scores.shape[0]).to(dev_)
    num_groups = int(gid.max()) + 1 if gid.numel() else 0
    s = scores.detach().to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=dev_)
    n = zeros.index_add(0, gid, valid.to(torch.float64))
    total = zeros.index_add(0, gid, torch.where(valid, s, 0.0))
    mean = total / n.clamp(min=1)
    dev = torch.where(valid, s - mean[gid], 0.0)
    inf = float("inf")
    smax = torch.full_like(zeros, -inf).scatter_reduce(0, gid, torch.where(valid, s, -inf), "amax")
    smin = torch.full_like(zeros, inf).scatter_reduce(0, gid, torch.where(valid, s, inf), "amin")
    n_row = n[gid]
    informative = valid & (n_row >= 2) & (smax != smin)[gid]
    if mode == "std":
        std = (zeros.index_add(0, gid, dev ** 2) / (n - 1).clamp(min=1)).sqrt()
        adv = dev / (std[gid] + eps)
    elif mode == "center":
        adv = dev
    elif mode == "loo":
        adv = dev * n_row / (n_row - 1).clamp(min=1)
    else:  # pragma: no cover - internal
        raise ValueError(f"unknown group mode {mode!r}")
    return torch.where(informative, adv, 0.0)


def _broadcast(per_row: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(mask, per_row.to(dtype).unsqueeze(-1), torch.zeros((), dtype=dtype, device=mask.device))


@register_adv_est(AdvantageEstimator.GAE, needs_critic=True, inputs=("values",))
def compute_gae_advantage_return(token_level_rewards, response_mask, index=None, values=None, gamma=1.0,
                                 lam=1.0, **kwargs):
    """Generalised Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438), verl's multi-turn variant.

    Backwards over t: ``delta_t = r_t + gamma*V_next - V_t``, ``A_t = delta_t + gamma*lam*A_next``. At masked
    positions (padding, tool/observation tokens) ``V_next`` and ``A_next`` are carried through unchanged, so
    the values/rewards stored there never influence the result. ``returns = A + V`` (before whitening);
    ``advantages = masked_whiten(A)`` over all valid tokens of the batch.

    Args:
        values: ``(batch, response_len)`` critic values (required).
    Raises:
        ValueError: if ``values`` is missing or mis-shaped, or fewer than 2 tokens are valid (whitening).
    """
    m = _check(token_level_rewards, response_mask)
    if values is None or values.shape != token_level_rewards.shape:
        raise ValueError(f"gae needs values of shape {tuple(token_level_rewards.shape)}, got "
                         f"{None if values is None else tuple(values.shape)}")
    with torch.no_grad():
        r = token_level_rewards.float()
        v = values.float()
        B, R = r.shape
        next_v = torch.zeros(B, device=r.device)
        last_a = torch.zeros(B, device=r.device)
        adv = torch.zeros(B, R, device=r.device)
        for t in reversed(range(R)):
            delta = r[:, t] + gamma * next_v - v[:, t]
            a_t = delta + gamma * lam * last_a
            next_v = torch.where(m[:, t], v[:, t], next_v)
            last_a = torch.where(m[:, t], a_t, last_a)
            adv[:, t] = last_a
        returns = torch.where(m, adv + v, 0.0)
        adv = masked_whiten(adv, m)
    dt = token_level_rewards.dtype
    return adv.to(dt), returns.to(dt)


def _grpo(token_level_rewards, response_mask, index, norm_by_std: bool, epsilon: float):
    m = _check(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, m, dim=-1)
        adv = _group_advantage(scores, m.any(dim=-1), index, "std" if norm_by_std else "center", epsilon)
        adv = _broadcast(adv, m, token_level_rewards.dtype)
    return adv, adv.clone()


@register_adv_est(AdvantageEstimator.GRPO, group_based=True, config_kwargs=("norm_adv_by_std_in_grpo",))
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0,
                                   lam=1.0, norm_adv_by_std_in_grpo: bool = True, epsilon: float = 1e-6,
                                   **kwargs):
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    ``s_i = sum_t r_{i,t}`` over valid tokens; ``A_i = (s_i - mean_g) / (std_g + epsilon)`` with the
    *unbiased* (n-1) std of the uid group, or ``s_i - mean_g`` if ``norm_adv_by_std_in_grpo=False``.
    Broadcast over the valid tokens; ``returns = advantages``. See the module docstring for group rules.
    Example: scores [1,0,0,0] in one group -> [1.5,-0.5,-0.5,-0.5] (mean 0.25, std 0.5).
    """
    return _grpo(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo, epsilon)


@register_adv_est(AdvantageEstimator.DR_GRPO, group_based=True)
def compute_dr_grpo_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0,
                                      lam=1.0, **kwargs):
    """Dr.GRPO advantage (Liu et al. 2025, arXiv:2503.20783): ``A_i = s_i - mean_g`` (no std division).

    verl's Dr.GRPO is GRPO with ``norm_adv_by_std_in_grpo=False``; pair it with
    ``loss_agg_mode="seq-mean-token-sum-norm"`` in the actor.
    """
    return _grpo(token_level_rewards, response_mask, index, False, 0.0)


@register_adv_est(AdvantageEstimator.RLOO, group_based=True)
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0,
                                   lam=1.0, **kwargs):
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): ``A_i = s_i - mean_{j != i} s_j = n/(n-1)(s_i - mean_g)``.

    Only valid rows count in ``n``; a group with < 2 valid rows gives 0 (no baseline exists; verl would keep the
    raw score, we prefer no update to an unbaselined one). ``returns = advantages``.
    """
    m = _check(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, m, dim=-1)
        adv = _broadcast(_group_advantage(scores, m.any(dim=-1), index, "loo"), m, token_level_rewards.dtype)
    return adv, adv.clone()


def _discounted_returns(r: torch.Tensor, m: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma*G_{t+1}`` over valid tokens; masked tokens carry G through and hold 0."""
    B, R = r.shape
    running = torch.zeros(B, dtype=r.dtype, device=r.device)
    out = torch.zeros_like(r)
    for t in reversed(range(R)):
        running = torch.where(m[:, t], r[:, t] + gamma * running, running)
        out[:, t] = torch.where(m[:, t], running, 0.0)
    return out


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, index=None, values=None,
                                                  gamma=1.0, lam=1.0, **kwargs):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return ``G_t = r_t + gamma*G_{t+1}`` per token,
    ``advantages = masked_whiten(G)`` over the batch, ``returns = G``.

    Rewards at masked positions are ignored (masked tokens carry the running return through, which equals verl's
    reset-after-EOS for right padding). Raises ``ValueError`` if fewer than 2 tokens are valid.
    """
    m = _check(token_level_rewards, response_mask)
    with torch.no_grad():
        G = _discounted_returns(token_level_rewards.float(), m, gamma)
        adv = masked_whiten(G, m)
    dt = token_level_rewards.dtype
    return adv.to(dt), G.to(dt)


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, group_based=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index=None,
                                                           values=None, gamma=1.0, lam=1.0, **kwargs):
    """REINFORCE++-baseline (Hu 2025): ``s_i - mean_g`` broadcast over valid tokens, then ``masked_whiten``
    over the whole batch. ``returns = advantages``. Raises ``ValueError`` if fewer than 2 tokens are valid.
    """
    m = _check(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, m, dim=-1)
        centered = _broadcast(_group_advantage(scores, m.any(dim=-1), index, "center"), m, torch.float32)
        adv = masked_whiten(centered, m).to(token_level_rewards.dtype)
    return adv, adv.clone()


@register_adv_est(AdvantageEstimator.REMAX, inputs=("reward_baselines",))
def compute_remax_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0,
                                    lam=1.0, reward_baselines: torch.Tensor | None = None, **kwargs):
    """ReMax (Li et al. 2023, arXiv:2310.10505): ``returns_t = sum_{t' >= t} r_t'`` (valid tokens),
    ``advantages = returns - b_i`` on valid tokens, ``b_i`` = reward of the greedy response of the prompt.

    Args:
        reward_baselines: ``(batch,)`` float (required).
    Raises:
        ValueError: if ``reward_baselines`` is missing or not ``(batch,)``.
    """
    m = _check(token_level_rewards, response_mask)
    if reward_baselines is None or tuple(reward_baselines.shape) != (token_level_rewards.shape[0],):
        raise ValueError(f"remax needs reward_baselines of shape ({token_level_rewards.shape[0]},), got "
                         f"{None if reward_baselines is None else tuple(reward_baselines.shape)}")
    with torch.no_grad():
        returns = _discounted_returns(token_level_rewards, m, 1.0)
        adv = torch.where(m, returns - reward_baselines.to(returns.dtype).unsqueeze(-1), 0.0)
    return adv, returns


def compute_advantage(data, adv_estimator: str | AdvantageEstimator, gamma: float = 1.0, lam: float = 1.0,
                      **kwargs):
    """Fill ``data["advantages"]`` and ``data["returns"]`` of a :class:`trainer.protocol.DataProto` in place.

    Reads ``token_level_rewards``, ``response_mask``, ``uid`` (non-tensor, if present) and the columns the
    estimator's registry entry declares (``EstimatorSpec.inputs``, passed as keyword arguments of the same
    name). Extra ``kwargs`` (e.g. ``norm_adv_by_std_in_grpo``) go to the estimator. Returns ``data``.

    Raises:
        ValueError: an unknown estimator name, or a declared input missing from ``data`` (named).
    """
    spec = get_adv_estimator_spec(adv_estimator)
    missing = [k for k in spec.inputs if k not in data]
    if missing:
        raise ValueError(f"advantage estimator {spec.name!r} needs the batch column(s) {missing}, which the batch "
                         f"lacks (it has {sorted(data.tensor_keys())})")
    index = data["uid"] if "uid" in data else None
    adv, ret = spec.fn(data["token_level_rewards"], data["response_mask"], index=index, gamma=gamma, lam=lam,
                       **{k: data[k] for k in spec.inputs}, **kwargs)
    data["advantages"] = adv
    data["returns"] = ret
    return data
