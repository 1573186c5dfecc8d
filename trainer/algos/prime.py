"""PRIME (Cui et al. 2025, "Process Reinforcement through Implicit Rewards", arXiv:2502.01456): the training math.

* PRM loss: cross-entropy between ``sigmoid(beta * sum_t q_t)`` and the verified 0/1 accuracy;
* batch normalisation of the implicit rewards (``reward_model.prime_norm``);
* leave-one-out (RLOO) advantages per reward source (implicit and verifiable), combined with
  ``reward_dpo_coef`` / ``reward_gt_coef``, returns by reverse cumulative sum, then batch-global masked whitening;
* the accuracy-band filter of prompt groups and the downsampling to the training batch size;
* PRIME diagnostics (``reward_model/dpo_acc``, ...).

The implicit token reward itself is :func:`rewards.prime.implicit_token_rewards`. Groups are rows with the same
``uid`` (found by value, never by position). No function here touches a model. Reference behaviour: verl's
``recipe/prime`` with its known defects avoided: the last valid token gets its implicit reward, normalisation is
over the whole batch, and the implicit-source baseline is a true leave-one-out mean (see :func:`rloo_per_token`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from trainer.algos.masked import as_bool_mask, masked_whiten

__all__ = ["normalize_implicit_rewards", "prm_ce_loss", "rloo_per_token", "last_token_mask",
           "compute_prime_advantages", "band_filter_indices", "prime_metrics"]


def _check_2d(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"{name} must be a (batch, response_len) tensor, got "
                         f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if like is not None and t.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(like.shape)}")


def _groups(index: Sequence, batch: int) -> torch.Tensor:
    if index is None or len(index) != batch:
        raise ValueError(f"index must hold one uid per row ({batch} rows), got "
                         f"{None if index is None else len(index)}")
    ids: dict = {}
    return torch.tensor([ids.setdefault(u, len(ids)) for u in list(index)], dtype=torch.long)


def normalize_implicit_rewards(rm_scores: torch.Tensor, response_mask: torch.Tensor, mode: str = "batch_norm",
                               eps: float = 1e-6) -> torch.Tensor:
    """``prime_norm``: ``batch_norm`` divides every score by ``max_{i,t} |sum_{k>=t} r_{i,k}| + eps`` over the
    WHOLE batch (verl computes it per worker shard); ``none`` returns the scores unchanged.

    Args:
        rm_scores: (batch, response_len) float, already 0 at masked positions.

    Raises:
        ValueError: unknown ``mode``.
    """
    _check_2d("rm_scores", rm_scores)
    m = as_bool_mask(response_mask, rm_scores)
    if mode == "none":
        return rm_scores
    if mode != "batch_norm":
        raise ValueError(f"reward_model.prime_norm={mode!r}; expected batch_norm or none")
    r = torch.where(m, rm_scores, torch.zeros_like(rm_scores))
    suffix = torch.flip(torch.cumsum(torch.flip(r, [1]), 1), [1])
    scale = suffix.abs().max() if r.numel() else r.new_zeros(())
    return r / (scale + eps)


def prm_ce_loss(prm_log_probs: torch.Tensor, ref_log_probs: torch.Tensor, response_mask: torch.Tensor,
                acc: torch.Tensor, beta: float, reduction: str = "mean") -> torch.Tensor:
    """PRM cross-entropy (PRIME eq. 4): ``BCE(sigmoid(beta * sum_t q_t m_t), acc)`` per sequence.

    ``q_t = log pi_prm - log pi_ref``; the loss is ``softplus(-z)`` for acc 1 and ``softplus(z)`` for acc 0
    (``z = beta * sum q``), computed stably from the logit (``binary_cross_entropy_with_logits``). Gradients flow
    into ``prm_log_probs``; ``ref_log_probs`` is detached.

    Args:
        prm_log_probs, ref_log_probs: (batch, response_len) float.
        response_mask: (batch, response_len).
        acc: (batch,) float in [0, 1] (verified accuracy).
        beta: > 0.
        reduction: ``mean`` | ``sum`` | ``none`` over sequences.

    Returns:
        scalar (or (batch,) for ``none``) float32.

    Raises:
        ValueError: bad shapes, acc outside [0, 1], beta <= 0, unknown reduction.
    """
    _check_2d("prm_log_probs", prm_log_probs)
    _check_2d("ref_log_probs", ref_log_probs, prm_log_probs)
    m = as_bool_mask(response_mask, prm_log_probs)
    if acc.dim() != 1 or acc.shape[0] != prm_log_probs.shape[0]:
        raise ValueError(f"acc must be (batch,)=({prm_log_probs.shape[0]},), got {tuple(acc.shape)}")
    if bool(((acc < 0) | (acc > 1) | ~torch.isfinite(acc)).any()):
        raise ValueError(f"acc must lie in [0, 1], got {acc.tolist()}")
    if not beta > 0:
        raise ValueError(f"beta={beta}; expected > 0")
    q = prm_log_probs.float() - ref_log_probs.detach().float()
    z = beta * torch.where(m, q, torch.zeros((), dtype=q.dtype, device=q.device)).sum(-1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, acc.to(z), reduction="none")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise ValueError(f"reduction={reduction!r}; expected mean, sum or none")


def last_token_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """(batch, response_len) bool: True only at the last valid token of each row (none for empty rows)."""
    m = as_bool_mask(response_mask)
    pos = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=1).values
    return (pos == last.unsqueeze(1)) & (last.unsqueeze(1) >= 0)


def rloo_per_token(values: torch.Tensor, mask: torch.Tensor, index: Sequence) -> torch.Tensor:
    """Leave-one-out baseline per token: ``x_{i,t} - mean_{j != i} m_j`` with ``m_j`` = mean of row j over its mask.

    Members of a group are rows with equal uid whose mask is not empty; a group with fewer than 2 members (and
    every empty row) gives 0. For a source with one token per row (the verifiable reward on the last token) this
    equals verl's ``masked_rloo`` (``x n/(n-1) - sum_j m_j/(n-1)``); for the implicit per-token source verl's form
    adds ``(x_{i,t} - m_i)/(n-1)``, which makes the baseline depend on the row itself; we use the true
    leave-one-out baseline of the PRIME paper (eq. 5). Statistics in float64.

    Args:
        values: (batch, response_len) float. mask: (batch, response_len). index: (batch,) uids.

    Returns:
        (batch, response_len) dtype of ``values``, 0 at masked positions.
    """
    _check_2d("values", values)
    m = as_bool_mask(mask, values)
    gid = _groups(index, values.shape[0]).to(values.device)
    x = torch.where(m, values.double(), torch.zeros((), dtype=torch.float64, device=values.device))
    cnt = m.sum(-1)
    valid = cnt > 0
    row_mean = x.sum(-1) / cnt.clamp(min=1)
    g = int(gid.max()) + 1 if gid.numel() else 0
    gsum = torch.zeros(g, dtype=torch.float64, device=values.device).index_add_(0, gid, torch.where(valid, row_mean, 0.0))
    gcnt = torch.zeros(g, dtype=torch.float64, device=values.device).index_add_(0, gid, valid.double())
    others = gcnt[gid] - 1
    base = (gsum[gid] - row_mean) / others.clamp(min=1)
    ok = valid & (others >= 1)
    out = torch.where(m & ok.unsqueeze(1), x - base.unsqueeze(1), torch.zeros_like(x))
    return out.to(values.dtype)


def compute_prime_advantages(rm_scores: torch.Tensor | None, acc: torch.Tensor | None, response_mask: torch.Tensor,
                             index: Sequence, reward_dpo_coef: float = 5.0, reward_gt_coef: float = 5.0,
                             whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """PRIME advantages: RLOO per reward source, weighted sum, reverse cumulative sum (gamma 1), whitening.

    ``final = reward_dpo_coef * RLOO(rm_scores, response_mask) + reward_gt_coef * RLOO(acc at last token)``;
    ``returns_t = sum_{k >= t} final_k``; ``advantages = masked_whiten(returns, response_mask)`` over ALL valid
    tokens of the batch (unbiased variance, eps 1e-8). A source is skipped if its coefficient is 0 or it is None.

    Args:
        rm_scores: (batch, response_len) float implicit token rewards, or None.
        acc: (batch,) float verified accuracy, or None.
        response_mask: (batch, response_len). index: (batch,) uids.
        whiten: False returns the un-whitened returns as advantages (for tests and analysis).

    Returns:
        (advantages, returns), both (batch, response_len) float32, 0 at masked positions.

    Raises:
        ValueError: bad shapes, or no source enabled.
    """
    _check_2d("response_mask", response_mask)
    m = as_bool_mask(response_mask)
    final = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    used = 0
    if rm_scores is not None and reward_dpo_coef != 0:
        _check_2d("rm_scores", rm_scores, response_mask)
        final = final + float(reward_dpo_coef) * rloo_per_token(rm_scores.float(), m, index)
        used += 1
    if acc is not None and reward_gt_coef != 0:
        if acc.dim() != 1 or acc.shape[0] != m.shape[0]:
            raise ValueError(f"acc must be (batch,)=({m.shape[0]},), got {tuple(acc.shape)}")
        last = last_token_mask(m)
        x_gt = torch.where(last, acc.float().to(m.device).unsqueeze(1), torch.zeros((), device=m.device))
        final = final + float(reward_gt_coef) * rloo_per_token(x_gt, last, index)
        used += 1
    if not used:
        raise ValueError("PRIME advantages need at least one source: rm_scores with reward_dpo_coef != 0 or acc "
                         "with reward_gt_coef != 0")
    final = torch.where(m, final, torch.zeros_like(final))
    returns = torch.flip(torch.cumsum(torch.flip(final, [1]), 1), [1])
    returns = torch.where(m, returns, torch.zeros_like(returns))
    adv = masked_whiten(returns, m) if whiten else returns.clone()
    return adv, returns


def band_filter_indices(acc: Sequence[float] | torch.Tensor, index: Sequence, keep_groups: int,
                        truncated: Sequence[bool] | torch.Tensor | None = None, lower: float = 0.2,
                        upper: float = 0.8, filter_accuracy: bool = True,
                        filter_truncate: bool = True) -> tuple[np.ndarray, dict]:
    """Rows to keep after PRIME's accuracy-band filter, groups contiguous, passing groups first.

    A group (rows with equal uid) passes when (``filter_accuracy``) its mean accuracy lies in ``[lower, upper]``
    (inclusive) and (``filter_truncate``) none of its rows is truncated. Groups are ordered passing first, each
    part in order of first appearance; the first ``keep_groups`` groups are kept (failing groups fill the batch
    when too few pass, as in verl), every group's rows contiguous in their original order.

    Args:
        acc: (batch,) accuracies. index: (batch,) uids. truncated: (batch,) bool or None (= none truncated).
        keep_groups: groups to keep (``data.train_batch_size``).

    Returns:
        (row indices as an int64 numpy array, metrics ``prime/groups_passed``, ``prime/groups_total``,
        ``prime/pass_ratio``, ``prime/solve_none``, ``prime/solve_all``, ``prime/truncated_groups``).

    Raises:
        ValueError: lengths disagree, bounds out of order, or fewer than ``keep_groups`` groups exist.
    """
    acc_t = torch.as_tensor(acc, dtype=torch.float64).flatten()
    b = acc_t.shape[0]
    gid = _groups(index, b)
    if not 0.0 <= lower <= upper <= 1.0:
        raise ValueError(f"accuracy bounds [{lower}, {upper}] must satisfy 0 <= lower <= upper <= 1")
    trunc = torch.zeros(b, dtype=torch.bool) if truncated is None else torch.as_tensor(truncated, dtype=torch.bool)
    if trunc.shape != (b,):
        raise ValueError(f"truncated must have one flag per row ({b}), got shape {tuple(trunc.shape)}")
    g = int(gid.max()) + 1 if b else 0
    if keep_groups <= 0 or keep_groups > g:
        raise ValueError(f"cannot keep {keep_groups} groups: the batch holds {g} groups (uids)")
    gsum = torch.zeros(g, dtype=torch.float64).index_add_(0, gid, acc_t)
    gcnt = torch.zeros(g, dtype=torch.float64).index_add_(0, gid, torch.ones(b, dtype=torch.float64))
    gmean = gsum / gcnt
    gtrunc = torch.zeros(g, dtype=torch.float64).index_add_(0, gid, trunc.double()) > 0
    ok = torch.ones(g, dtype=torch.bool)
    if filter_accuracy:
        ok &= (gmean >= lower - 1e-12) & (gmean <= upper + 1e-12)
    if filter_truncate:
        ok &= ~gtrunc
    order = [int(x) for x in torch.nonzero(ok).flatten()] + [int(x) for x in torch.nonzero(~ok).flatten()]
    rows_of = [[] for _ in range(g)]
    for r, k in enumerate(gid.tolist()):
        rows_of[k].append(r)
    keep = np.asarray([r for k in order[:keep_groups] for r in rows_of[k]], dtype=np.int64)
    metrics = {"prime/groups_passed": float(ok.sum()), "prime/groups_total": float(g),
               "prime/pass_ratio": float(ok.double().mean()) if g else 0.0,
               "prime/solve_none": float((gmean == 0).double().mean()) if g else 0.0,
               "prime/solve_all": float((gmean == 1).double().mean()) if g else 0.0,
               "prime/truncated_groups": float(gtrunc.sum())}
    return keep, metrics


def prime_metrics(rm_scores: torch.Tensor, acc: torch.Tensor, response_mask: torch.Tensor, index: Sequence,
                  prefix: str = "reward_model") -> dict:
    """Diagnostics of the implicit PRM on a batch.

    * ``dpo_acc``: inside each group, pairwise agreement between the order of ``sum_t r`` and the order of
      ``acc``, weighted by ``|acc_i - acc_j|``; 0.5 for a group whose accuracies are all equal; mean over groups.
    * ``dpo_acc_abs``: ``mean(sign(sum_t r) == sign(2 acc - 1))``.
    * ``reward``: mean of ``sum_t r`` (sequence implicit reward); ``raw_reward``: mean of ``sum_t r / |y|``.

    Args:
        rm_scores: (batch, response_len) float. acc: (batch,). response_mask, index as above.

    Returns:
        ``{f"{prefix}/dpo_acc", f"{prefix}/dpo_acc_abs", f"{prefix}/reward", f"{prefix}/raw_reward"}`` floats.
    """
    _check_2d("rm_scores", rm_scores)
    m = as_bool_mask(response_mask, rm_scores)
    seq = torch.where(m, rm_scores.double(), torch.zeros((), dtype=torch.float64)).sum(-1)
    a = acc.double().flatten()
    gid = _groups(index, seq.shape[0])
    per_group = []
    for k in range(int(gid.max()) + 1 if gid.numel() else 0):
        rows = torch.nonzero(gid == k).flatten()
        da = a[rows].unsqueeze(0) - a[rows].unsqueeze(1)
        dr = seq[rows].unsqueeze(0) - seq[rows].unsqueeze(1)
        w = da.abs()
        if float(w.sum()) == 0.0:
            per_group.append(0.5)
            continue
        per_group.append(float((w * ((da * dr) > 0).double()).sum() / w.sum()))
    n_tok = m.sum(-1).clamp(min=1).double()
    return {f"{prefix}/dpo_acc": float(np.mean(per_group)) if per_group else 0.0,
            f"{prefix}/dpo_acc_abs": float((torch.sign(seq) == torch.sign(2 * a - 1)).double().mean()),
            f"{prefix}/reward": float(seq.mean()), f"{prefix}/raw_reward": float((seq / n_tok).mean())}
