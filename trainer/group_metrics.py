"""Metrics of a batch's prompt groups (the ``rollout.n`` responses of one prompt share a ``uid``).

``critic/frac_reward_zero_std`` (TRL's ``frac_reward_zero_std``): the share of groups whose sequence scores are all
equal. Group-normalised estimators (GRPO, DAPO, RLOO, ...) give such a group zero advantage, so it sends no
policy gradient; at 1.0 the step trains only on the KL term. A value that stays at 1.0 usually means the policy
gives the same answer to each question on every sample (for instance one answer to all of them); a lower learning
rate, a higher sampling temperature or ``algorithm.filter_groups`` (dynamic sampling, which needs some groups that
differ) are the usual ways out.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["group_score_metrics"]


def group_score_metrics(batch) -> dict[str, float]:
    """``{"critic/frac_reward_zero_std": share}`` of a :class:`trainer.protocol.DataProto` with a ``uid`` column and
    ``token_level_scores`` (B, R) float: a group's scores are the per-row sums, equal within 1e-6 of each other.
    Groups of one row (``rollout.n = 1``) have no spread to measure and are not counted; ``{}`` when the batch has
    no ``uid`` column, no ``token_level_scores`` or no group of two or more rows."""
    non_tensor = getattr(batch, "non_tensor", None) or {}
    if "uid" not in non_tensor or "token_level_scores" not in batch:
        return {}
    scores = batch["token_level_scores"].float().sum(-1)
    uids = np.asarray(non_tensor["uid"])
    _, group = np.unique(uids.astype(str), return_inverse=True)
    group = torch.as_tensor(group.reshape(-1), dtype=torch.long)
    count = torch.bincount(group).float()
    hi = torch.full_like(count, float("-inf")).scatter_reduce(0, group, scores, "amax")
    lo = torch.full_like(count, float("inf")).scatter_reduce(0, group, scores, "amin")
    real = count >= 2
    if not bool(real.any()):
        return {}
    flat = (hi - lo).abs() <= 1e-6
    return {"critic/frac_reward_zero_std": float(flat[real].float().mean())}
