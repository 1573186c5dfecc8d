"""Masked statistics over ``(batch, response_len)`` tensors.

Masking always goes through :func:`torch.where`, never a multiplication, so that NaN/inf values at masked
positions (e.g. log-probs of padding) cannot leak into a result: ``nan * 0 == nan`` but
``where(False, nan, 0) == 0``.
"""
from __future__ import annotations

import torch

__all__ = ["as_bool_mask", "masked_sum", "masked_mean", "masked_var", "masked_whiten"]


def as_bool_mask(mask: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """Return ``mask != 0`` as a bool tensor, checking that its shape matches ``like`` (if given).

    Raises:
        ValueError: if ``mask`` and ``like`` have different shapes.
    """
    if like is not None and mask.shape != like.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but the values have shape {tuple(like.shape)}; "
                         "expected the same shape")
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is nonzero (masked entries count as 0 even if they are NaN).

    Args:
        values: any shape, float.
        mask: same shape as ``values`` (bool, int or float 0/1).
        dim: dimension to reduce; ``None`` reduces everything to a scalar.
    """
    m = as_bool_mask(mask, values)
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return v.sum() if dim is None else v.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is nonzero; 0 where nothing is valid (never NaN).

    Args:
        values: any shape, float.
        mask: same shape as ``values``.
        dim: dimension to reduce; ``None`` gives a scalar.
    Returns:
        ``masked_sum / max(count, 1)`` with the reduced shape, dtype of ``values``.
    """
    m = as_bool_mask(mask, values)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(values, m, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all valid positions (scalar).

    Args:
        values, mask: same shape.
        unbiased: divide by ``n - 1`` (Bessel) instead of ``n``.
    Raises:
        ValueError: if the mask selects no element, or exactly one element with ``unbiased=True``.
    """
    m = as_bool_mask(mask, values)
    n = int(m.sum())
    if n == 0:
        raise ValueError("masked_var: the mask selects no element; expected at least one valid position")
    if unbiased and n == 1:
        raise ValueError("masked_var: the mask selects only 1 element; the unbiased variance needs at least 2")
    mean = masked_mean(values, m)
    sq = masked_sum((values - mean) ** 2, m)
    return sq / (n - 1 if unbiased else n)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Whiten over the valid positions: ``(x - mean_m) / sqrt(var_m + eps)`` (unbiased variance).

    With ``shift_mean=False`` the mean is added back (only the scale changes). Masked positions of the result
    are 0. Raises ``ValueError`` when fewer than 2 positions are valid (see :func:`masked_var`).
    """
    m = as_bool_mask(mask, values)
    mean = masked_mean(values, m)
    var = masked_var(values, m, unbiased=True)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
