"""A batch's scorer outcomes read as rewards, for :class:`rewards.manager.RewardManager`.

:func:`tally_outcomes` turns one :data:`rewards.failures.Outcome` per row into its score (0.0 for a row whose scorer
raised, timed out or gave a score not finite in float32), the dict a dict-returning scorer gave, whether the scorer
returned, and the counts of the ``reward/num_*`` metrics: ``errors``, ``nan``, ``timeouts``, ``scorer_timeouts``
(rows that scored though the scorer's own time limit cut a comparison short, :func:`rewards.math_guards.note_limit_hit`)
and ``dicts``. :func:`warn_scorer_limit` is the one warning the manager logs the first time a batch has any
``scorer_timeouts``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from rewards.failures import Outcome, finite_score

__all__ = ["OutcomeTally", "tally_outcomes", "warn_scorer_limit"]


@dataclass
class OutcomeTally:
    """What :func:`tally_outcomes` reads from a batch's outcomes.

    Attributes:
        scores: per row, its score as a float (0.0 where the scorer failed, timed out or the score is not finite).
        dicts: per row, the dict a dict-returning scorer gave, else None.
        ran: per row, whether the scorer returned (no error, no timeout).
        counts: ``errors``, ``nan``, ``timeouts``, ``scorer_timeouts``, ``dicts`` (in that order).
        first_error: the first error message; ``first_nan`` the first score not finite in float32.
        limits: the scorer's own limits (``timeout_seconds``) that cut a comparison short, over the batch.
    """

    scores: list[float] = field(default_factory=list)
    dicts: list[dict | None] = field(default_factory=list)
    ran: list[bool] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"errors": 0, "nan": 0, "timeouts": 0,
                                                            "scorer_timeouts": 0, "dicts": 0})
    first_error: str | None = None
    first_nan: float | None = None
    limits: list[float] = field(default_factory=list)


def tally_outcomes(outcomes: Sequence[Outcome], hits: Sequence[list[float]]) -> OutcomeTally:
    """Read one :data:`rewards.failures.Outcome` per row (``hits``: per row, the limits of the comparisons its
    scorer's own time bound cut short, :func:`rewards.math_guards.take_limit_hits`; may be shorter) into an
    :class:`OutcomeTally`; see the module docstring."""
    tally = OutcomeTally()
    counts = tally.counts
    for i, (status, payload, _) in enumerate(outcomes):
        d = None
        score = 0.0
        if status == "ok" and i < len(hits) and hits[i]:
            counts["scorer_timeouts"] += 1  # scored (0 as a rule) though its comparison was not finished
            tally.limits.extend(hits[i])
        if status == "timeout":
            counts["timeouts"] += 1
        elif status == "error":
            counts["errors"] += 1
            tally.first_error = tally.first_error or payload
        else:
            if isinstance(payload, dict):
                counts["dicts"] += 1
                d = payload
                score = payload["score"]
            else:
                score = payload
            if not finite_score(score):  # NaN, inf, or inf once cast to the float32 reward tensor
                counts["nan"] += 1
                tally.first_nan = score if tally.first_nan is None else tally.first_nan
                score = 0.0
        tally.scores.append(float(score))
        tally.dicts.append(d)
        tally.ran.append(status not in ("timeout", "error"))
    return tally


def warn_scorer_limit(log: logging.Logger, n: int, rows: int, limits: list[float], scorer: str,
                      timeout_s: float) -> None:
    """One warning on ``log``: ``n`` of ``rows`` responses scored 0 because ``scorer``'s own time limit (``limits``:
    the ``timeout_seconds`` that cut comparisons short) ended their comparison; ``timeout_s`` is the manager's
    per-response limit."""
    known = sorted({x for x in limits if x == x})  # NaN: a limit not recorded
    limit = "timeout_seconds=" + "/".join(f"{x:g}" for x in known[:3]) + " s" if known else "timeout_seconds"
    log.warning(
        "reward: %d of %d responses scored 0 because %s did not finish comparing the answer within its own time "
        "limit (%s), not because the answer was wrong (a correct answer may be among them); counted in "
        "reward/num_scorer_timeouts at every step; raise the limit with "
        "+reward_model.scorer_kwargs.timeout_seconds=<seconds> (null: no limit of its own; reward_model.timeout_s=%g "
        "still bounds each response). This warning is logged once", n, rows, scorer, limit, timeout_s)
