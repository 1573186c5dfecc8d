"""PRIME's implicit process reward (Cui et al. 2025, "Process Reinforcement through Implicit Rewards",
arXiv:2502.01456): ``r_t = beta * (log pi_prm(y_t|.) - log pi_ref(y_t|.))`` at every valid response token.

The PRM that produces ``pi_prm`` is trained online (``trainer/workers/prm.py``); its loss, the per-source RLOO
advantages and the accuracy-band filter are training math in :mod:`trainer.algos.prime`.
"""
from __future__ import annotations

import torch

__all__ = ["implicit_token_rewards"]


def implicit_token_rewards(prm_log_probs: torch.Tensor, ref_log_probs: torch.Tensor, response_mask: torch.Tensor,
                           beta: float) -> torch.Tensor:
    """``r_t = beta * (log pi_prm - log pi_ref)`` at every valid response token, 0 elsewhere (PRIME eq. 3).

    Args:
        prm_log_probs, ref_log_probs: (batch, response_len) float, log-probs of the sampled tokens.
        response_mask: (batch, response_len), nonzero for valid tokens (padding may hold NaN log-probs: masked
            by ``torch.where``, never multiplied).
        beta: the implicit-reward scale (``reward_model.model.beta_train``), > 0.

    Returns:
        (batch, response_len) float32.

    Raises:
        ValueError: shape mismatch or ``beta <= 0``.
    """
    shape = tuple(prm_log_probs.shape) if isinstance(prm_log_probs, torch.Tensor) else None
    if shape is None or len(shape) != 2:
        raise ValueError(f"prm_log_probs must be a (batch, response_len) tensor, got "
                         f"{shape if shape is not None else type(prm_log_probs).__name__}")
    for name, t in (("ref_log_probs", ref_log_probs), ("response_mask", response_mask)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(getattr(t, 'shape', ()))}, expected {shape}")
    m = response_mask != 0
    if not beta > 0:
        raise ValueError(f"beta={beta}; expected > 0")
    q = prm_log_probs.float() - ref_log_probs.float()
    return torch.where(m, beta * q, torch.zeros((), dtype=q.dtype, device=q.device))
