"""Named reward components: the values of chosen keys of the scorers' dicts, one column per key.

A scorer may return ``{"score": s, "<key>": v, ...}``; a multi-reward estimator (GDPO, ``algorithm.gdpo_reward_keys``)
reads some of those keys as separate rewards. :func:`component_matrix` collects them for a batch.
"""
from __future__ import annotations

from typing import Sequence

import torch

from rewards.failures import finite_score

__all__ = ["check_component_keys", "component_matrix"]


def check_component_keys(keys: Sequence[str] | None) -> tuple[str, ...]:
    """``keys`` as a tuple. Raises ``ValueError`` unless they are distinct non-empty strings."""
    keys = tuple(keys or ())
    if not all(isinstance(k, str) and k for k in keys) or len(set(keys)) != len(keys):
        raise ValueError(f"component_keys={list(keys)!r}; expected distinct non-empty strings")
    return keys


def component_matrix(dicts: Sequence[dict | None], ran: Sequence[bool],
                     keys: Sequence[str]) -> tuple[torch.Tensor, int]:
    """The components ``keys`` of every row's scorer result.

    Args:
        dicts: per row, the scorer's dict (None where it returned a number, failed or timed out).
        ran: per row, whether the scorer returned (no error, no timeout).
        keys: the component names, in column order.

    Returns:
        ``(components (B, K) float32, non-finite count)``: a row whose scorer did not return gets 0.0 (as its
        score); a non-finite value gives 0.0 and is counted.

    Raises:
        ValueError: a scorer that returned a number instead of a dict, a dict lacking a component, or a value that is
            not a number (naming the row, the key and the value).
    """
    out = torch.zeros(len(dicts), len(keys), dtype=torch.float32)
    nan = 0
    for i, (d, ok) in enumerate(zip(dicts, ran)):
        if not ok:
            continue
        if d is None:
            raise ValueError(f"reward components {list(keys)} are asked for, but the scorer returned a number for row "
                             f"{i}; it must return a dict with 'score' and those keys")
        for k, key in enumerate(keys):
            if key not in d:
                raise ValueError(f"row {i}: the scorer's dict lacks the reward component {key!r} (its keys: "
                                 f"{sorted(d)})")
            try:
                v = float(d[key])
            except (TypeError, ValueError):
                raise ValueError(f"row {i}: reward component {key!r} = {d[key]!r:.100}; expected a number") from None
            if finite_score(v):
                out[i, k] = v
            else:
                nan += 1
    return out, nan
