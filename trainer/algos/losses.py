"""Loss aggregation, PPO-family policy losses, the clipped value loss and entropy.

All functions are pure tensor functions; ``loss_mat``-style inputs are ``(batch, response_len)`` float and masks
are ``(batch, response_len)`` (bool or 0/1). Masking uses ``torch.where`` (NaN-safe).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .masked import as_bool_mask, masked_mean
from .registry import register_policy_loss

__all__ = ["LOSS_AGG_MODES", "agg_loss", "compute_policy_loss_vanilla", "compute_policy_loss_gspo",
           "compute_policy_loss_gpg", "compute_value_loss", "entropy_from_logits"]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean",
             global_num_tokens: int | float | torch.Tensor | None = None,
             global_num_seqs: int | float | torch.Tensor | None = None, dp_size: int = 1,
             loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss matrix ``(batch, response_len)`` into a scalar.

    Modes, as the value of ONE mini-batch (one optimizer step) with ``L`` = ``loss_mat`` with masked entries set
    to 0, ``m`` = mask, ``N_tok`` = valid tokens, ``N_seq`` = sequences with at least one valid token:

    * ``token-mean`` (DAPO, arXiv:2503.14476): ``sum_it L_it / N_tok``;
    * ``token-sum``: ``sum_it L_it`` (no normaliser: loss and gradient grow with the number of tokens);
    * ``seq-mean-token-sum``: ``sum_i (sum_t L_it) / N_seq``;
    * ``seq-mean-token-mean`` (GRPO, arXiv:2402.03300): ``sum_i (sum_t L_it / |m_i|) / N_seq``;
    * ``seq-mean-token-sum-norm`` (Dr.GRPO, arXiv:2503.20783 eq. 3): ``sum_i (sum_t L_it) / loss_scale_factor /
      N_seq``: the per-response ``1/|o_i|`` is replaced by a constant, the ``1/G`` mean over responses stays.
      ``loss_scale_factor`` defaults to the padded width ``response_len``; the trainer passes a constant
      (``actor.loss_scale_factor``, else ``rollout.response_length``) so that every micro-batch, step and
      dynamic batch uses the same one.

    Gradient-accumulation / data-parallel contract: the trainer calls this once per micro-batch with
    ``global_num_tokens`` / ``global_num_seqs`` = the counts of the WHOLE mini-batch (over all its micro-batches
    and all data-parallel ranks) and ``dp_size`` = number of data-parallel ranks; every mode then returns
    ``(this micro-batch's part of the numerator) / (global denominator) * dp_size``. DeepSpeed AVERAGES
    gradients over the ``dp_size`` ranks, hence the factor. With that contract the sum of the returned losses
    over the micro-batches of one rank, averaged over ranks, equals the single-batch value of the whole
    mini-batch, in value and gradient (so do NOT also scale by 1/grad_accum). Without the globals the function
    normalises locally (a single batch is the whole mini-batch) and ``dp_size`` must be 1 for the modes that
    need a count.

    Returns:
        scalar tensor (dtype of ``loss_mat``); 0 (with a graph) when nothing is valid.
    Raises:
        ValueError: unknown mode; ``dp_size > 1`` without the global count the mode needs; non-positive
        ``dp_size`` or ``loss_scale_factor``.
    """
    m = as_bool_mask(loss_mask, loss_mat)
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")
    L = torch.where(m, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if loss_agg_mode == "token-sum":
        return L.sum() * dp_size
    if loss_agg_mode == "token-mean":
        n_tok = _count(global_num_tokens, m.sum(), dp_size, loss_agg_mode, "global_num_tokens", "valid tokens")
        return L.sum() / _denominator(n_tok, L) * dp_size
    seq = L.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq = seq / m.sum(dim=-1).clamp(min=1).to(L.dtype)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            loss_scale_factor = loss_mat.shape[-1]
        if not 0 < loss_scale_factor < float("inf"):
            raise ValueError(f"loss_scale_factor must be a finite number > 0, got {loss_scale_factor}")
        seq = seq / loss_scale_factor
    n_seq = _count(global_num_seqs, m.any(dim=-1).sum(), dp_size, loss_agg_mode, "global_num_seqs",
                   "sequences with a valid token")
    return seq.sum() / _denominator(n_seq, L) * dp_size


def _count(global_value, local_value, dp_size: int, mode: str, name: str, what: str):
    if global_value is not None:
        return global_value
    if dp_size != 1:
        raise ValueError(f"agg_loss {mode}: dp_size > 1 needs {name} ({what} in the mini-batch over all "
                         "micro-batches and ranks)")
    return local_value


def _denominator(n, like: torch.Tensor) -> torch.Tensor:
    # An empty batch gives 0 / 1 = 0 instead of NaN.
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


def _cfg(config: Any, key: str, default=None):
    if config is None:
        return default
    if isinstance(config, Mapping) or hasattr(config, "get"):
        val = config.get(key, default)
    else:
        val = getattr(config, key, default)
    return default if val is None else val


def _agg_kwargs(kwargs: dict) -> dict:
    keys = ("global_num_tokens", "global_num_seqs", "dp_size", "loss_scale_factor")
    unknown = set(kwargs) - set(keys)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}; agg_loss accepts {list(keys)}")
    return kwargs


def _check_is_weights(weights, like: torch.Tensor):
    if weights is not None and weights.shape != like.shape:
        raise ValueError(f"rollout_is_weights has shape {tuple(weights.shape)}, expected {tuple(like.shape)}")


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_probs: torch.Tensor, log_probs: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                                rollout_is_weights: torch.Tensor | None = None, **agg_kwargs):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with dual clip (Ye et al. 2020,
    arXiv:1912.09729) and asymmetric clip (DAPO clip-higher, arXiv:2503.14476).

    ``ratio = exp(clamp(logp - old, -20, 20))``; ``L1 = -A*ratio``; ``L2 = -A*clip(ratio, 1-eps_low, 1+eps_high)``;
    ``Lc = max(L1, L2)``; for ``A < 0``: ``L = min(Lc, -A*c)``, else ``L = Lc``. Optional truncated-IS weights
    ``rollout_is_weights`` (batch, response_len) (detached) multiply ``L``. ``L`` is aggregated by :func:`agg_loss`.

    Args:
        config: mapping/object with ``clip_ratio`` (0.2), ``clip_ratio_low`` / ``clip_ratio_high`` (default
            ``clip_ratio``), ``clip_ratio_c`` (3.0; must be > 1).
        **agg_kwargs: ``global_num_tokens``, ``global_num_seqs``, ``dp_size``, ``loss_scale_factor`` for agg_loss.
    Returns:
        ``(pg_loss scalar, metrics)``, metrics = ``pg_clipfrac`` (fraction of valid tokens where the clipped term
        binds, i.e. ``L2 > L1``: it depends on the sign of A), ``ppo_kl`` (mean ``old - logp``),
        ``pg_clipfrac_lower`` (fraction where the dual clip binds, ``A < 0`` and ``Lc > -A*c``): detached 0-d float32 tensors
        (no host sync inside the micro-batch loop; the update loop reads them once per mini-batch).
    Raises:
        ValueError: ``clip_ratio_c <= 1``; mis-shaped ``rollout_is_weights``.
    """
    clip = _cfg(config, "clip_ratio", 0.2)
    low = _cfg(config, "clip_ratio_low", clip)
    high = _cfg(config, "clip_ratio_high", clip)
    c = _cfg(config, "clip_ratio_c", 3.0)
    if c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for the dual clip, got {c}")
    _check_is_weights(rollout_is_weights, log_probs)
    m = as_bool_mask(response_mask, log_probs)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    log_ratio = torch.where(m, log_probs - old_log_probs, zero).clamp(-20.0, 20.0)
    adv = torch.where(m, advantages, zero)
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    lc = torch.maximum(l1, l2)
    l3 = -adv * c
    loss = torch.where(adv < 0, torch.minimum(lc, l3), lc)
    if rollout_is_weights is not None:
        loss = loss * rollout_is_weights.detach()
    pg_loss = agg_loss(loss, m, loss_agg_mode, **_agg_kwargs(agg_kwargs))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((l2 > l1).float(), m),
            "ppo_kl": masked_mean(-log_ratio.float(), m),
            "pg_clipfrac_lower": masked_mean(((lc > l3) & (adv < 0)).float(), m),
        }
    return pg_loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_probs, log_probs, advantages, response_mask,
                             loss_agg_mode: str = "seq-mean-token-mean", config=None, rollout_is_weights=None,
                             **agg_kwargs):
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): sequence-level importance ratio.

    ``log s_i = mean_t(logp - old)`` over valid tokens; token ratio ``s_it = exp(sg[log s_i] + logp_t - sg[logp_t])``
    (value ``s_i``, gradient of each token, clamped at ``exp(10)``); ``L = max(-A*s, -A*clip(s, 1-low, 1+high))``.
    ``loss_agg_mode`` applies to the per-token losses ``L_it`` (all tokens of a sequence share its ratio): the
    paper's objective is ``seq-mean-token-mean`` (this function's default); verl's ``gspo`` always uses that mode
    and ignores ``loss_agg_mode``, we honour the configured one (``token-mean`` weights sequences by their
    length). Config keys as for ``vanilla``
    (GSPO uses small ranges, e.g. low 3e-4, high 4e-4). Returns ``(pg_loss, metrics)`` like ``vanilla``.
    """
    clip = _cfg(config, "clip_ratio", 0.2)
    low = _cfg(config, "clip_ratio_low", clip)
    high = _cfg(config, "clip_ratio_high", clip)
    _check_is_weights(rollout_is_weights, log_probs)
    m = as_bool_mask(response_mask, log_probs)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    neg_kl = torch.where(m, log_probs - old_log_probs, zero)
    seq_log_ratio = masked_mean(neg_kl, m, dim=-1)
    lp = torch.where(m, log_probs, zero)
    log_s = seq_log_ratio.detach().unsqueeze(-1) + lp - lp.detach()
    ratio = torch.exp(torch.clamp(log_s, max=10.0))
    adv = torch.where(m, advantages, zero)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    loss = torch.maximum(l1, l2)
    if rollout_is_weights is not None:
        loss = loss * rollout_is_weights.detach()
    pg_loss = agg_loss(loss, m, loss_agg_mode, **_agg_kwargs(agg_kwargs))
    with torch.no_grad():
        metrics = {"pg_clipfrac": masked_mean((l2 > l1).float(), m),
                   "ppo_kl": masked_mean(-neg_kl.float(), m), "pg_clipfrac_lower": 0.0}
    return pg_loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode: str = "token-mean",
                            config=None, rollout_is_weights=None, **agg_kwargs):
    """GPG (Chu et al. 2025, arXiv:2504.02546): plain policy gradient ``L = -logp * A`` (no ratio, no clip).

    Returns ``(pg_loss, metrics)``; clip fractions are 0, ``ppo_kl`` as for ``vanilla``.
    """
    _check_is_weights(rollout_is_weights, log_probs)
    m = as_bool_mask(response_mask, log_probs)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    loss = -torch.where(m, log_probs, zero) * torch.where(m, advantages, zero)
    if rollout_is_weights is not None:
        loss = loss * rollout_is_weights.detach()
    pg_loss = agg_loss(loss, m, loss_agg_mode, **_agg_kwargs(agg_kwargs))
    with torch.no_grad():
        kl = masked_mean(torch.where(m, old_log_probs - log_probs, zero).float(), m)
    return pg_loss, {"pg_clipfrac": 0.0, "ppo_kl": kl, "pg_clipfrac_lower": 0.0}


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float = 0.5, loss_agg_mode: str = "token-mean",
                       **agg_kwargs) -> tuple[torch.Tensor, float]:
    """Clipped value loss (PPO; as in verl/OpenAI baselines).

    ``v_clip = clamp(vpreds, values - eps_v, values + eps_v)``;
    ``vf_loss = 0.5 * agg_loss(max((vpreds - R)^2, (v_clip - R)^2))``;
    ``vf_clipfrac = mean_m[(v_clip - R)^2 > (vpreds - R)^2]``. All tensors ``(batch, response_len)``.

    Returns:
        ``(vf_loss scalar, vf_clipfrac detached 0-d float32 tensor)``.
    Raises:
        ValueError: ``cliprange_value < 0``.
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value}")
    m = as_bool_mask(response_mask, vpreds)
    zero = torch.zeros((), dtype=vpreds.dtype, device=vpreds.device)
    R = torch.where(m, returns, zero)
    v_old = torch.where(m, values, zero)
    v = torch.where(m, vpreds, zero)
    v_clip = torch.maximum(torch.minimum(v, v_old + cliprange_value), v_old - cliprange_value)
    l1 = (v - R).square()
    l2 = (v_clip - R).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(l1, l2), m, loss_agg_mode, **_agg_kwargs(agg_kwargs))
    with torch.no_grad():
        clipfrac = masked_mean((l2 > l1).float(), m)
    return vf_loss, clipfrac


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` along the last dim: ``logsumexp(z) - sum softmax(z) * z``.

    Args:
        logits: ``(..., vocab)`` float (apply the sampling temperature before calling).
        chunk_size: if given, process the flattened leading rows in chunks of this many rows to bound the
            peak memory of the ``softmax`` temporary (useful under ``torch.no_grad``).
    Returns:
        ``(...)`` float32 entropies in nats.
    """
    def _ent(z: torch.Tensor) -> torch.Tensor:
        z = z.float()
        return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)

    if chunk_size is None:
        return _ent(logits)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.cat([_ent(part) for part in flat.split(chunk_size, dim=0)]) if flat.shape[0] else flat.new_zeros(0)
    return out.reshape(logits.shape[:-1])
