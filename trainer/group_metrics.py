"""Metrics of a batch's prompt groups (the ``rollout.n`` responses of one prompt share a ``uid``).

``critic/frac_reward_zero_std`` (TRL's ``frac_reward_zero_std``): the share of groups whose sequence scores are all
equal. Group-normalised estimators (GRPO, DAPO, RLOO, ...) give such a group zero advantage, so it sends no
policy gradient; at 1.0 the step trains only on the KL term. A value that stays at 1.0 usually means the policy
gives the same answer to each question on every sample (for instance one answer to all of them); a lower learning
rate, a higher sampling temperature or ``algorithm.filter_groups`` (dynamic sampling, which needs some groups that
differ) are the usual ways out. With ``algorithm.filter_groups`` the metric describes the trained batch, which holds
informative groups only (plus filler groups when ``max_num_gen_batches`` is reached), so it stays near 0 however
many generated groups were flat: ``dynamic_sampling/informative_ratio`` is the share of generated groups that
differ.

Groups are formed as the advantage estimators form them (:func:`trainer.algos.advantages.group_ids`: rows with
equal ``uid`` values, any hashable value), and like them the metric leaves out aborted rows (``response_mask`` all
zero).
"""
from __future__ import annotations

import torch

from trainer.algos.advantages import group_ids

__all__ = ["group_score_metrics"]


def group_score_metrics(batch) -> dict[str, float]:
    """``{"critic/frac_reward_zero_std": share}`` of a :class:`trainer.protocol.DataProto` with a ``uid`` column and
    ``token_level_scores`` (B, R) float: a group's scores are the per-row sums of its non-aborted rows, flat when
    equal within 1e-6 of each other (equal infinities included; a NaN score makes its group not flat).
    Groups of fewer than two non-aborted rows (``rollout.n = 1``) have no spread to measure and are not counted;
    ``{}`` when the batch has no ``uid`` column, no ``token_level_scores`` or no group of two or more such rows."""
    non_tensor = getattr(batch, "non_tensor", None) or {}
    if "uid" not in non_tensor or "token_level_scores" not in batch:
        return {}
    token_scores = batch["token_level_scores"]
    live = _live_rows(batch, token_scores.shape[-1]).cpu()
    group = group_ids(non_tensor["uid"], len(live))[live]
    scores = token_scores.detach().cpu().to(torch.float64).sum(-1)[live]
    num = int(group.max()) + 1 if group.numel() else 0
    count = torch.bincount(group, minlength=num)
    hi = torch.full((num,), float("-inf"), dtype=torch.float64).scatter_reduce(0, group, scores, "amax")
    lo = torch.full((num,), float("inf"), dtype=torch.float64).scatter_reduce(0, group, scores, "amin")
    has_nan = torch.bincount(group[scores.isnan()], minlength=num) > 0
    real = count >= 2
    if not bool(real.any()):
        return {}
    flat = ((hi == lo) | ((hi - lo).abs() <= 1e-6)) & ~has_nan
    return {"critic/frac_reward_zero_std": float(flat[real].double().mean())}


def _live_rows(batch, width: int) -> torch.Tensor:
    """(B,) bool: rows whose response is not empty (``response_mask``, else the response part of
    ``attention_mask``; every row when the batch has neither)."""
    if "response_mask" in batch:
        return (batch["response_mask"] != 0).any(-1)
    if "attention_mask" in batch:
        return (batch["attention_mask"][:, -width:] != 0).any(-1)
    return torch.ones(batch["token_level_scores"].shape[0], dtype=torch.bool)
