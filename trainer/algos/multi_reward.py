"""Advantage estimators over a reward split into named components: GDPO.

The components are the batch column ``reward_components`` ``(batch, K)`` float32: the values of the keys
``algorithm.gdpo_reward_keys`` in each response's scorer dict, in that order (the reward stage fills it; see
:class:`rewards.manager.RewardManager`'s ``component_keys``). Group rules as in :mod:`trainer.algos.advantages`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .advantages import _broadcast, _check, _group_advantage
from .masked import masked_whiten
from .registry import AdvantageEstimator, register_adv_est

__all__ = ["compute_gdpo_outcome_advantage"]


@register_adv_est(AdvantageEstimator.GDPO, group_based=True, inputs=("reward_components",),
                  config_kwargs=("norm_adv_by_std_in_grpo", "gdpo_reward_weights"))
def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index=None, values=None, gamma=1.0, lam=1.0,
                                   reward_components: torch.Tensor | None = None, norm_adv_by_std_in_grpo: bool = True,
                                   gdpo_reward_weights: Sequence[float] | None = None, epsilon: float = 1e-6,
                                   **kwargs):
    """GDPO, group reward-decoupled normalisation (Liu et al. 2026, arXiv:2601.05242; verl's ``gdpo``).

    Each component ``k`` is normalised within its prompt group on its own, as GRPO normalises the score:
    ``A_k,i = (r_k,i - mean_g r_k) / (std_g r_k + epsilon)`` (unbiased std; only ``r_k,i - mean_g r_k`` when
    ``norm_adv_by_std_in_grpo`` is false); then summed with the weights ``w_k`` (``gdpo_reward_weights``, 1 each by
    default), ``A_i = sum_k w_k A_k,i``, broadcast over the response's valid tokens, and normalised over the whole
    batch, ``masked_whiten`` over the valid tokens (verl's and the authors' batch normalisation, so a response
    weighs by its length there). ``returns = advantages``. The summed score ``token_level_rewards`` is not read.

    Group rules of GRPO (module :mod:`trainer.algos.advantages`): a component whose valid group members all hold the
    same value, or a group with fewer than 2 valid rows, contributes 0. Example: in a group of 2 rows the components
    ``[[1, 0], [0, 1]]`` sum to 0 for both rows (the decoupled terms ``+-0.707`` cancel), ``[[1, 1], [0, 0]]`` to
    ``+-1.414``, before the batch whitening.

    Args:
        reward_components: ``(batch, K)`` float, ``K >= 1`` (required).
        gdpo_reward_weights: ``K`` finite numbers, or None.

    Raises:
        ValueError: ``reward_components`` missing or not ``(batch, K >= 1)``; weights of another length; fewer than
            2 valid tokens (the batch whitening).
    """
    m = _check(token_level_rewards, response_mask)
    B = token_level_rewards.shape[0]
    if reward_components is None or reward_components.dim() != 2 or reward_components.shape[0] != B \
            or reward_components.shape[1] < 1:
        raise ValueError(f"gdpo needs reward_components of shape ({B}, K >= 1), got "
                         f"{None if reward_components is None else tuple(reward_components.shape)}")
    K = reward_components.shape[1]
    weights = [1.0] * K if gdpo_reward_weights is None else [float(w) for w in gdpo_reward_weights]
    if len(weights) != K:
        raise ValueError(f"gdpo_reward_weights has {len(weights)} weights for {K} reward components")
    with torch.no_grad():
        valid = m.any(dim=-1)
        comps = reward_components.to(device=m.device, dtype=torch.float64)
        mode = "std" if norm_adv_by_std_in_grpo else "center"
        total = sum(w * _group_advantage(comps[:, k], valid, index, mode, epsilon) for k, w in enumerate(weights))
        adv = masked_whiten(_broadcast(total, m, torch.float64), m).to(token_level_rewards.dtype)
    return adv, adv.clone()
