"""The accuracy rule of a scored row: the scorer's ``acc`` when it returned one, else its score.

PRIME's accuracy-band filter, its PRM labels and dynamic sampling's ``acc`` metric read accuracy this way, from
a :class:`rewards.manager.RewardOutput` (:func:`accuracy_from_reward`, so that a batch is not scored twice) or
through :meth:`rewards.manager.RewardManager.verify`.
"""
from __future__ import annotations

from rewards.failures import finite_score

__all__ = ["as_accuracy", "accuracy_from_reward"]


def as_accuracy(value) -> float:
    """A scorer's ``acc`` value as a float: non-numbers and non-finite values give 0.0."""
    try:
        a = float(value)
    except (TypeError, ValueError):
        return 0.0
    return a if finite_score(a) else 0.0


def accuracy_from_reward(reward_extra_info: dict, batch_size: int) -> list[float]:
    """Per-row accuracy from a :class:`rewards.manager.RewardOutput`'s ``reward_extra_info``: the scorer's ``acc``
    when it returned one (:func:`as_accuracy`), else the score.

    Args:
        reward_extra_info: ``{"score": [B floats], "acc": [B values or None] (optional), ...}``.
        batch_size: B, the rows scored.

    Returns:
        B Python floats.

    Raises:
        ValueError: when ``score`` is missing or has the wrong length.
    """
    scores = reward_extra_info.get("score")
    if scores is None or len(scores) != batch_size:
        raise ValueError(f"reward_extra_info['score'] must hold {batch_size} values, got "
                         f"{None if scores is None else len(scores)}")
    accs = reward_extra_info.get("acc") or [None] * batch_size
    return [float(s) if a is None else as_accuracy(a) for s, a in zip(scores, accs)]
