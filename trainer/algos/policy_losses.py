"""More policy losses (``actor.policy_loss.loss_mode``, verl's names): CISPO, GMPO (``geo_mean``), Clip-Cov,
KL-Cov, SAPO and DPPO (``dppo_tv``, ``dppo_kl``). Same call signature and return as
:func:`trainer.algos.losses.compute_policy_loss_vanilla`; ``loss_mat`` inputs are ``(batch, response_len)``
float, masks ``(batch, response_len)``; every loss is aggregated with the configured ``loss_agg_mode`` through
:func:`trainer.algos.losses.agg_loss` (so it follows the global-count contract of the update loop), and every
metric is a mean over the call's valid tokens.
"""
from __future__ import annotations

import torch

from .losses import _agg_kwargs, _cfg, _check_is_weights, agg_loss
from .masked import as_bool_mask, masked_mean
from .registry import register_policy_loss

__all__ = ["compute_policy_loss_cispo", "compute_policy_loss_geo_mean", "compute_policy_loss_clip_cov",
           "compute_policy_loss_kl_cov", "compute_policy_loss_sapo", "compute_policy_loss_dppo_tv",
           "compute_policy_loss_dppo_kl"]


def _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights):
    """(mask, log-ratio clamped to [-20, 20] (0 at masked), advantages (0 at masked))."""
    _check_is_weights(rollout_is_weights, log_probs)
    m = as_bool_mask(response_mask, log_probs)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    log_ratio = torch.where(m, log_probs - old_log_probs, zero).clamp(-20.0, 20.0)
    return m, log_ratio, torch.where(m, advantages, zero)


def _clip_range(config) -> tuple[float, float]:
    clip = _cfg(config, "clip_ratio", 0.2)
    return _cfg(config, "clip_ratio_low", clip), _cfg(config, "clip_ratio_high", clip)


def _finish(loss, m, loss_agg_mode, rollout_is_weights, agg_kwargs, log_ratio, clipfrac=0.0, clipfrac_lower=0.0):
    if rollout_is_weights is not None:
        loss = loss * rollout_is_weights.detach()
    pg_loss = agg_loss(loss, m, loss_agg_mode, **_agg_kwargs(agg_kwargs))
    with torch.no_grad():
        kl = masked_mean(-log_ratio.float(), m)
    return pg_loss, {"pg_clipfrac": clipfrac, "ppo_kl": kl, "pg_clipfrac_lower": clipfrac_lower}


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode: str = "token-mean",
                              config=None, rollout_is_weights=None, **agg_kwargs):
    """CISPO, clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585, eq. 4; verl's ``cispo``):
    ``L = -sg(clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * logp``. The clipped weight carries no
    gradient, so every token keeps its gradient (none is dropped as in PPO's clip).

    Returns ``(pg_loss, metrics)``: ``pg_clipfrac`` = share of valid tokens whose weight was clipped,
    ``ppo_kl`` = mean ``old - logp``, ``pg_clipfrac_lower`` 0.
    """
    m, log_ratio, adv = _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights)
    low, high = _clip_range(config)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high).detach()
    lp = torch.where(m, log_probs, torch.zeros((), dtype=log_probs.dtype, device=log_probs.device))
    loss = -weight * adv * lp
    with torch.no_grad():
        clipfrac = masked_mean((ratio.detach() != weight).float(), m)
    return _finish(loss, m, loss_agg_mode, rollout_is_weights, agg_kwargs, log_ratio, clipfrac)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_probs, log_probs, advantages, response_mask,
                                 loss_agg_mode: str = "seq-mean-token-mean", config=None, rollout_is_weights=None,
                                 **agg_kwargs):
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv:2507.20673; verl's ``geo_mean``).

    Per token ``x = logp - old`` (bounded to [-20, 20] first, as in every loss here, so that ``exp`` stays finite
    when ``A < 0`` keeps the unclipped side) is clipped in log space,
    ``x_c = clip(x, -clip_ratio_low, clip_ratio_high)``, keeping the pessimistic side:
    ``x' = sgn(A) * min(sgn(A) x, sgn(A) x_c)``. Per sequence
    ``ratio_i = exp(mean_t x'_it)`` (the geometric mean of the token ratios) and ``A_i = mean_t A_it``; the
    sequence loss ``-A_i * ratio_i`` is put on each of its valid tokens and aggregated with ``loss_agg_mode``:
    ``seq-mean-token-mean`` (the default) gives the paper's mean over sequences (verl always takes that mean and
    ignores ``loss_agg_mode``; we honour it). With ``rollout_is_weights`` the sequence loss is multiplied by
    their geometric mean over the sequence. The paper's range is 0.4 on each side (``clip_ratio=0.4``).

    Returns ``(pg_loss, metrics)``: ``pg_clipfrac`` / ``pg_clipfrac_lower`` = share of valid tokens whose log
    ratio was clipped with ``A > 0`` / ``A < 0``; ``ppo_kl`` = mean ``old - logp``.
    """
    m, x, adv = _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    low, high = _clip_range(config)
    sgn = torch.sign(adv)
    x_c = torch.clamp(x, -low, high)
    x_min = sgn * torch.minimum(sgn * x, sgn * x_c)
    n = m.sum(dim=-1).clamp(min=1).to(log_probs.dtype)
    ratio = torch.exp(torch.where(m, x_min, zero).sum(dim=-1) / n)
    seq_loss = -(adv.sum(dim=-1) / n) * ratio
    if rollout_is_weights is not None:
        log_w = torch.where(m, torch.log(rollout_is_weights.detach() + 1e-10), zero)
        seq_loss = seq_loss * torch.exp(log_w.sum(dim=-1) / n)
    loss = seq_loss.unsqueeze(-1).expand_as(x)
    pg_loss = agg_loss(loss, m, loss_agg_mode, **_agg_kwargs(agg_kwargs))
    with torch.no_grad():
        clipped = (x != x_c) & m
        metrics = {"pg_clipfrac": masked_mean((clipped & (adv > 0)).float(), m),
                   "ppo_kl": masked_mean(-x.float(), m),
                   "pg_clipfrac_lower": masked_mean((clipped & (adv < 0)).float(), m)}
    return pg_loss, metrics


def _covariance(adv: torch.Tensor, log_probs: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``(A - mean_m A) * (logp - mean_m logp)`` per token (detached), over the call's valid tokens."""
    lp = log_probs.detach()
    return (adv.detach() - masked_mean(adv.detach(), m)) * (lp - masked_mean(lp, m))


@register_policy_loss("clip_cov", micro_batch_local=True)
def compute_policy_loss_clip_cov(old_log_probs, log_probs, advantages, response_mask,
                                 loss_agg_mode: str = "token-mean", config=None, rollout_is_weights=None,
                                 **agg_kwargs):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arXiv:2505.22617; verl's ``clip_cov``): the PPO clipped surrogate ``max(L1, L2)``, with the gradient cut
    (loss multiplied by 0) on a random ``max(1, int(clip_cov_ratio * N))`` of the tokens that PPO's clip left
    alone and whose covariance ``(A - mean A)(logp - mean logp)`` lies in ``(clip_cov_lb, clip_cov_ub)``.

    Config: ``clip_ratio(_low/_high)`` as for ``vanilla``; ``policy_loss.clip_cov_ratio`` (2e-4),
    ``policy_loss.clip_cov_lb`` (1.0), ``policy_loss.clip_cov_ub`` (5.0). The means and the token count are
    those of the call (one micro-batch), as in verl, so the loss depends on the micro-batch split; the draw uses
    torch's global generator. Returns ``(pg_loss, metrics)``; ``pg_clipfrac`` = share of valid tokens cut.

    Raises:
        ValueError: ``clip_cov_ratio <= 0``.
    """
    m, log_ratio, adv = _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights)
    pl = _cfg(config, "policy_loss", {})
    frac, lb, ub = _cfg(pl, "clip_cov_ratio", 2e-4), _cfg(pl, "clip_cov_lb", 1.0), _cfg(pl, "clip_cov_ub", 5.0)
    if not frac > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {frac}")
    low, high = _clip_range(config)
    ratio = torch.exp(log_ratio)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    with torch.no_grad():
        cov = _covariance(adv, log_probs, m)
        candidates = torch.nonzero(m & ~(l2 > l1) & (cov > lb) & (cov < ub))
        k = min(max(int(frac * int(m.sum())), 1), candidates.shape[0])
        chosen = candidates[torch.randperm(candidates.shape[0])[:k].to(candidates.device)]
        keep = torch.ones_like(l1)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
        clipfrac = masked_mean((keep == 0).float(), m)
    return _finish(torch.maximum(l1, l2) * keep, m, loss_agg_mode, rollout_is_weights, agg_kwargs, log_ratio,
                   clipfrac)


@register_policy_loss("kl_cov", micro_batch_local=True)
def compute_policy_loss_kl_cov(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode: str = "token-mean",
                               config=None, rollout_is_weights=None, **agg_kwargs):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617; verl's ``kl_cov``): the unclipped surrogate ``-A * ratio``,
    plus ``ppo_kl_coef * |logp - old|`` on the ``max(1, int(kl_cov_ratio * N))`` valid tokens of the largest
    covariance ``(A - mean A)(logp - mean logp)``.

    Config: ``policy_loss.kl_cov_ratio`` (2e-4), ``policy_loss.ppo_kl_coef`` (0.1, verl's config default). The
    selection is over the call's tokens (one micro-batch), as in verl. Returns ``(pg_loss, metrics)``;
    ``pg_clipfrac`` = share of valid tokens given the KL term.

    Raises:
        ValueError: ``kl_cov_ratio <= 0``.
    """
    m, log_ratio, adv = _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights)
    pl = _cfg(config, "policy_loss", {})
    frac, coef = _cfg(pl, "kl_cov_ratio", 2e-4), _cfg(pl, "ppo_kl_coef", 0.1)
    if not frac > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {frac}")
    loss = -adv * torch.exp(log_ratio)
    n_valid = int(m.sum())
    penalised = torch.zeros_like(m)
    if n_valid:
        with torch.no_grad():
            cov = _covariance(adv, log_probs, m).masked_fill(~m, float("-inf"))
            top = torch.topk(cov.flatten(), max(1, int(n_valid * frac))).indices
            penalised.view(-1)[top] = True
    loss = torch.where(penalised, loss + coef * log_ratio.abs(), loss)
    with torch.no_grad():
        share = masked_mean(penalised.float(), m)
    return _finish(loss, m, loss_agg_mode, rollout_is_weights, agg_kwargs, log_ratio, share)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(old_log_probs, log_probs, advantages, response_mask,
                             loss_agg_mode: str = "seq-mean-token-mean", config=None, rollout_is_weights=None,
                             **agg_kwargs):
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025, arXiv:2511.20347; verl's ``sapo``): a smooth
    gate instead of the hard clip, ``L = -f(ratio) * A`` with ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``,
    ``tau = tau_pos`` where ``A > 0`` else ``tau_neg`` (its gradient equals PPO's at ``r = 1``).

    Config: ``tau_pos`` (1.0), ``tau_neg`` (1.05) in the actor section (verl's keys). The paper aggregates
    ``seq-mean-token-mean``; verl forces that mode, we honour ``loss_agg_mode``. Returns ``(pg_loss, metrics)``;
    clip fractions 0.
    """
    m, log_ratio, adv = _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights)
    pos, neg = float(_cfg(config, "tau_pos", 1.0)), float(_cfg(config, "tau_neg", 1.05))
    tau = torch.where(adv > 0, log_probs.new_tensor(pos), log_probs.new_tensor(neg))
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    return _finish(-gate * adv, m, loss_agg_mode, rollout_is_weights, agg_kwargs, log_ratio)


def _dppo(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, agg_kwargs,
          outside):
    """DPPO's masked policy gradient; ``outside(logp, old, up, low, high) -> bool (B, R)`` (detached log-probs;
    ``up``: ``A > 0``): the token left its trust region in the direction its advantage pushes."""
    m, log_ratio, adv = _prep(old_log_probs, log_probs, advantages, response_mask, rollout_is_weights)
    low, high = _clip_range(config)
    c = float(_cfg(config, "clip_ratio_c", 3.0))
    if not c > 0:
        raise ValueError(f"clip_ratio_c (DPPO's importance-weight truncation) must be > 0, got {c}")
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        keep = m & ~outside(log_probs.detach(), old_log_probs.detach(), adv > 0, low, high)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    lp = torch.where(m, log_probs, zero)
    loss = torch.where(keep, -adv * torch.clamp(ratio, max=c).detach() * lp, zero)
    with torch.no_grad():
        masked = masked_mean((m & ~keep).float(), m)
        truncated = masked_mean((keep & (ratio > c)).float(), m)
    return _finish(loss, m, loss_agg_mode, rollout_is_weights, agg_kwargs, log_ratio, masked, truncated)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(old_log_probs, log_probs, advantages, response_mask,
                                loss_agg_mode: str = "token-mean", config=None, rollout_is_weights=None,
                                **agg_kwargs):
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv:2602.04879; verl's ``dppo_tv``): PPO's ratio clip replaced by a trust region on the total variation of
    the binary distribution (sampled token vs the rest), ``|p - p_old|`` with ``p = exp(logp)``.

    A token is masked (no gradient) when it left the region in the direction its advantage pushes:
    ``A > 0`` and ``p - p_old > clip_ratio_high``, or ``A <= 0`` and ``p - p_old < -clip_ratio_low``. Else
    ``L = -A * sg(min(ratio, clip_ratio_c)) * logp`` (the gradient of ``-A * ratio``, with the importance weight
    truncated at ``clip_ratio_c``, as verl does instead of the dual clip).

    Config: ``clip_ratio(_low/_high)`` are the TV thresholds here (verl's example: 0.15), ``clip_ratio_c`` the
    truncation (3.0 by default; the paper suggests a large one, e.g. 20). Returns ``(pg_loss, metrics)``:
    ``pg_clipfrac`` = share of valid tokens masked, ``pg_clipfrac_lower`` = share kept whose ratio was
    truncated, ``ppo_kl`` = mean ``old - logp``.

    Raises:
        ValueError: ``clip_ratio_c <= 0``; mis-shaped ``rollout_is_weights``.
    """
    def outside(logp, old, up, low, high):
        delta = torch.exp(logp) - torch.exp(old)
        return torch.where(up, delta > high, delta < -low)

    return _dppo(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                 agg_kwargs, outside)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(old_log_probs, log_probs, advantages, response_mask,
                                loss_agg_mode: str = "token-mean", config=None, rollout_is_weights=None,
                                **agg_kwargs):
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879; verl's ``dppo_kl``): as ``dppo_tv`` with the KL of the
    binary distributions, ``D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``.

    A token is masked when ``A > 0``, ``p > p_old`` and ``D > clip_ratio_high``, or ``A <= 0``, ``p < p_old`` and
    ``D > clip_ratio_low``; else ``L = -A * sg(min(ratio, clip_ratio_c)) * logp``. Config as ``dppo_tv`` with the
    KL thresholds in ``clip_ratio(_low/_high)`` (verl's example: 0.05). Metrics as ``dppo_tv``.

    Raises:
        ValueError: ``clip_ratio_c <= 0``; mis-shaped ``rollout_is_weights``.
    """
    def outside(logp, old, up, low, high):
        p, p_old = torch.exp(logp), torch.exp(old)
        d = p_old * (old - logp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        return torch.where(up, (d > high) & (p > p_old), (d > low) & (p < p_old))

    return _dppo(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                 agg_kwargs, outside)
