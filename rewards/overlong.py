"""DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13; verl's ``reward_model.overlong_buffer``),
applied by :class:`rewards.manager.RewardManager` to the scores (never to the accuracy)."""
from __future__ import annotations

import torch

__all__ = ["overlong_penalty", "penalise_overlong"]


def overlong_penalty(lengths: torch.Tensor, max_response_length: int, buffer_len: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13) per response.

    Args:
        lengths: (B,) valid response lengths in tokens.
        max_response_length: ``L``, the response limit in tokens.
        buffer_len: ``B``, the punishment interval (``0 < B < L``).
        penalty_factor: the penalty at ``L`` tokens.

    Returns:
        (B,) float32: ``min(0, -(n - (L - B)) / B) * penalty_factor``; 0 for ``n <= L - B``.
    """
    exceed = lengths.float() - float(max_response_length - buffer_len)
    return torch.clamp(-exceed / float(buffer_len), max=0.0) * float(penalty_factor)


def penalise_overlong(scores: list[float], lengths: torch.Tensor, max_response_length: int, buffer_len: int,
                      penalty_factor: float, metrics: dict) -> tuple[list[float], list[float]]:
    """The per-row penalties (:func:`overlong_penalty`) and ``scores`` with them added; ``metrics`` gains
    ``reward/overlong_penalty_mean`` and ``reward/overlong_frac`` (the share of rows penalised).

    Args:
        scores: B Python floats; lengths: (B,) valid response lengths in tokens.
    """
    pens = overlong_penalty(lengths, max_response_length, buffer_len, penalty_factor).tolist()
    b = len(scores)
    metrics["reward/overlong_penalty_mean"] = float(sum(pens) / b) if b else 0.0
    metrics["reward/overlong_frac"] = float(sum(p < 0 for p in pens) / b) if b else 0.0
    return pens, [sc + pen for sc, pen in zip(scores, pens)]
