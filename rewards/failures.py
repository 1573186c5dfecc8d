"""When a scorer's failures stop the run, and the one line that says so.

One response that fails to score (the scorer raised, returned NaN/inf, ran past ``timeout_s`` or ended its process)
scores 0 and training goes on. A scorer that fails on a whole batch is broken, not one odd response: it would train
on all-zero rewards to the end. So a batch stops the run (:class:`ScorerError`, one line, exit 2) when

* none of its responses got a usable score (:func:`check_not_all_failed`), or
* the scorer failed on every response it could judge, the non-empty ones, though the empty ones scored
  (:class:`FailureWatch`, which also ends the scoring of a batch early once :data:`EARLY_STOP_FAILURES` non-empty
  responses timed out or killed their process and none scored), or
* in a batch of several data sources, it failed on every non-empty response of one of them, to at least two
  different questions, while others scored (:func:`check_each_source`: a source its scorer does not handle, such
  as one verl's ``default_compute_score`` raises for, would train on zeros for that source).

:func:`scorer_label` names the scorer in those lines, and :func:`check_batch` applies both rules after a batch of
:class:`rewards.manager.RewardManager` and warns of the rows that scored 0.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

#: one scorer outcome: (status, payload, seconds) with status "ok" (payload: float or dict from
#: rewards.pool.to_plain_result), "error" (payload: message) or "timeout" (payload None)
Outcome = tuple[str, Any, float]

__all__ = ["ScorerError", "check_not_all_failed", "FailureWatch", "EARLY_STOP_FAILURES", "WORKER_DIED",
           "scorer_label", "check_batch", "check_each_source", "FLOAT32_MAX", "finite_score"]


class ScorerError(ValueError):
    """A scorer that failed on every response of a batch it could judge: broken, not one odd response (one line,
    exit 2)."""


_FIX = "fix the scorer (reward_model.custom_reward_function / reward_model.scorer)"


#: the largest finite float32: the reward tensors are float32, so a score beyond it (``1e39``) would become inf there
FLOAT32_MAX = 3.4028234663852886e38


def finite_score(value: float) -> bool:
    """Whether the score ``value`` stays finite in the float32 reward tensors: not NaN, not inf, and
    ``|value| <= FLOAT32_MAX`` (a larger Python float becomes inf there and every advantage of its group NaN)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _usable(outcome: Outcome) -> bool:
    """Whether a scorer outcome is a score finite in float32 (a float, or a dict's ``score``): :func:`finite_score`."""
    status, payload = outcome[0], outcome[1]
    return status == "ok" and finite_score(payload["score"] if isinstance(payload, dict) else payload)


def check_not_all_failed(errors: int, rows: int, first_error: str | None, nan: int = 0, timeouts: int = 0,
                         scorer: str = "the scorer") -> None:
    """Stop when none of ``rows`` (at least 2) responses of a batch got a usable score: the scorer raised
    (``errors``), returned NaN/inf (``nan``) or ran past its timeout (``timeouts``) on every one. One failing response
    scores 0 and training goes on; a scorer that fails on all of them (a bug in a ``custom_reward_function``, a
    missing dependency) would otherwise train on rewards that are all 0. ``scorer`` names it in the message.

    Raises:
        ScorerError: naming the scorer, the counts and the first error.
    """
    if rows < 2 or errors + nan + timeouts < rows:
        return
    if timeouts:
        raise ScorerError(f"reward: {scorer} gave no score for any of the {rows} responses of the batch "
                          f"({timeouts} ran past reward_model.timeout_s, {nan} NaN/inf, {errors} raised); " + _FIX
                          + " or raise reward_model.timeout_s")
    if nan == 0:
        raise ScorerError(f"reward: {scorer} raised on all {rows} responses of the batch (first: {first_error}); "
                          + _FIX)
    raised = f", {errors} raised (first: {first_error})" if errors else ""
    raise ScorerError(f"reward: {scorer} gave no finite score for any of the {rows} responses of the batch "
                      f"({nan} NaN/inf{raised}); " + _FIX)


#: non-empty responses that ran past ``timeout_s`` or ended their scoring process, none scored yet, after which the
#: scoring of a batch stops (:class:`FailureWatch`): each such failure costs ``timeout_s`` or a new process, and a
#: scorer that hangs or dies on every response would cost ``timeout_s`` x responses / workers before the batch ended.
#: A scorer that fails so on the first 16 it finishes but would score later ones is stopped too (too slow to train on)
EARLY_STOP_FAILURES = 16

#: the start of the error message of a response whose scoring process died (:meth:`rewards.pool.ScoringPool.run`)
WORKER_DIED = "scorer worker died"


class FailureWatch:
    """Judges a scorer by the responses it could judge: those whose text is not empty or whitespace (``blank[i]``
    False). A scorer may refuse an empty response, so empty responses that score 0 cleanly do not show that it
    works: one that fails on every non-empty response of a batch is broken even when the batch's empty responses
    scored (a ``custom_reward_function`` that raises on anything but ``""`` trained on all-zero rewards to the end).

    Feed it every outcome as it arrives (:meth:`see`, also the ``stop`` callback of
    :meth:`rewards.pool.ScoringPool.run`); it asks to stop the batch early once :data:`EARLY_STOP_FAILURES` non-empty
    responses timed out or killed their process and none scored, so that a hanging or dying scorer costs
    ``EARLY_STOP_FAILURES x timeout_s / workers`` rather than a whole batch. A healthy batch is scored to its end: one
    non-empty score ends the watch.

    Args:
        blank: per row, whether the response text is empty or whitespace.
        early_after: the failures above (>= 1).
    """

    def __init__(self, blank: Sequence[bool], early_after: int = EARLY_STOP_FAILURES):
        self.blank = list(blank)
        self.early_after = int(early_after)
        self.judged = sum(not b for b in self.blank)  # rows the scorer could judge
        self.scored = self.raised = self.nan = self.timeouts = self.died = 0  # over judged rows seen so far
        self.blank_scored = 0  # empty responses that scored
        self.first_error: str | None = None  # the first raised (a worker's death is counted apart)
        self.first_death: str | None = None
        self.stopped = False  # see() asked to stop the batch early

    def see(self, i: int, outcome: Outcome) -> bool:
        """Record row ``i``'s outcome; True when the batch should stop now (see the class doc), and from then on."""
        status, payload = outcome[0], outcome[1]
        finite = _usable(outcome)
        if self.blank[i]:
            self.blank_scored += finite
            return False
        if status == "timeout":
            self.timeouts += 1
        elif status == "error" and str(payload).startswith(WORKER_DIED):
            self.died += 1
            self.first_death = self.first_death or payload
        elif status == "error":
            self.raised += 1
            self.first_error = self.first_error or payload
        elif finite:
            self.scored += 1
        else:
            self.nan += 1
        self.stopped = self.stopped or (self.scored == 0 and self.timeouts + self.died >= self.early_after)
        return self.stopped

    def check(self, rows: int, timeout_s: float, scorer: str = "the scorer") -> None:
        """After the batch (or an early stop): raise when the scorer failed on every non-empty response of it (at
        least 2) or stopped early; a batch whose responses all failed is :func:`check_not_all_failed`'s.

        Raises:
            ScorerError: one line naming ``scorer``, the counts and the first error.
        """
        failed = self.raised + self.died + self.nan + self.timeouts
        if not self.stopped and (self.judged < 2 or self.scored or failed < self.judged):
            return
        kinds = []
        if self.raised:
            kinds.append(f"{self.raised} raised (first: {self.first_error})")
        if self.died:
            kinds.append(f"{self.died} ended their scoring process (first: {self.first_death})")
        if self.nan:
            kinds.append(f"{self.nan} NaN/inf")
        if self.timeouts:
            kinds.append(f"{self.timeouts} ran past reward_model.timeout_s={timeout_s:g} s")
        fix = _FIX + (" or raise reward_model.timeout_s" if self.timeouts else "")
        if self.stopped:
            raise ScorerError(f"reward: {scorer} gave no score for the first {failed} non-empty responses of the batch "
                              f"of {rows} that finished ({', '.join(kinds)}); the batch's other responses were not "
                              "scored; " + fix)
        raise ScorerError(f"reward: {scorer} failed on all {self.judged} non-empty responses of the batch of {rows} "
                          f"({', '.join(kinds)}); the {self.blank_scored} that scored were empty; " + fix)


def scorer_label(scorer: Callable | None, scorer_name: str | None, reward_fn_key: str, tasks: Sequence[tuple],
                 blank: Sequence[bool]) -> str:
    """The scorer(s) of the batch's non-empty responses, for an error message: ``the scorer <function> of
    <file>``, ``the scorer '<registered name>' (...)``, or ``the scorer of data_source 'x'`` when routed.

    Args:
        scorer: the manager's fixed scorer, registered as ``scorer_name`` (else None); None when rows are routed
            by their ``reward_fn_key`` value.
        tasks: the batch's scoring tasks, each ``(scorer key, args, kwargs)``; ``blank`` per row, whether the
            response is empty or whitespace.
    """
    if scorer is not None:
        code = getattr(scorer, "__code__", None)
        name = f"{getattr(scorer, '__name__', scorer)}" + (f" of {code.co_filename}" if code else "")
        return f"the scorer {scorer_name!r} ({name})" if scorer_name else f"the scorer {name}"
    keys = sorted({repr(t[0]) for t, b in zip(tasks, blank) if not b} or {repr(t[0]) for t in tasks})
    shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    return f"the scorer{'s' if len(keys) > 1 else ''} of {reward_fn_key} {shown}"


def check_batch(watch: FailureWatch, counts: dict[str, int], first_error: str | None, rows: int, timeout_s: float,
                label: Callable[[], str], log: logging.Logger, first_nan: float | None = None) -> None:
    """After a batch of ``rows`` responses is scored: stop the run when the scorer failed on all of them
    (:func:`check_not_all_failed`) or on every non-empty one (:meth:`FailureWatch.check`), naming it by ``label()``
    unless a non-empty response scored; else warn on ``log`` of the rows that scored 0 (``counts``: ``errors``,
    ``nan``, ``timeouts``; ``first_error`` the first raised; ``first_nan`` the first score not finite in float32,
    named with the scorer).

    Raises:
        ScorerError: as those two checks.
    """
    name = "the scorer" if watch.scored else label()  # named when it stops
    check_not_all_failed(counts["errors"], rows, first_error, counts["nan"], counts["timeouts"], name)
    watch.check(rows, timeout_s, name)
    if counts["nan"]:
        log.warning("reward: %d NaN/inf score(s) in a batch of %d scored 0 (first: %r from %s; a score beyond "
                    "float32's range, |score| > %.4g, counts as inf)", counts["nan"], rows, first_nan, label(),
                    FLOAT32_MAX)
    if first_error is not None:
        log.warning("reward: %d scorer error(s) in a batch of %d; first: %s", counts["errors"], rows, first_error)
    if counts["timeouts"]:
        log.warning("reward: %d sample(s) ran past timeout_s=%.1f s and scored 0", counts["timeouts"], timeout_s)


def check_each_source(sources: Sequence, questions: Sequence, outcomes: Sequence[Outcome], blank: Sequence[bool],
                      reward_fn_key: str, timeout_s: float) -> None:
    """Stop when, in a batch of several data sources, the scorer gave no usable score for any non-empty response
    of one source (raised, NaN/inf, timed out or ended its process) though those responses answer at least two
    different questions (``questions``: per row, e.g. its ground truth; one question's responses all failing is
    more likely that row's problem than the scorer's) and another source scored. One source in the batch is the
    batch rules' (:func:`check_batch`).

    Args:
        sources: per row, its ``reward_fn_key`` value; ``outcomes``: per row, the scorer's :data:`Outcome`;
        blank: per row, whether the response is empty or whitespace.

    Raises:
        ScorerError: one line naming the source, the counts and the first error.
    """
    if len(outcomes) < len(sources) or len({str(s) for s in sources}) < 2:
        return
    rows: dict[str, list[int]] = {}
    for i, src in enumerate(sources):
        if not blank[i]:
            rows.setdefault(repr(str(src)), []).append(i)  # numpy strings too

    if not any(_usable(outcomes[i]) for idx in rows.values() for i in idx):
        return  # nothing scored anywhere: the batch rules name it
    for src, idx in rows.items():
        if any(_usable(outcomes[i]) for i in idx) or len({str(questions[i]) for i in idx}) < 2:
            continue
        status = [outcomes[i][0] for i in idx]
        errors = [str(outcomes[i][1]) for i in idx if outcomes[i][0] == "error"]
        kinds = [f"{len(errors)} raised (first: {errors[0]})"] if errors else []
        kinds += [f"{status.count('ok')} NaN/inf"] if "ok" in status else []
        if "timeout" in status:
            kinds.append(f"{status.count('timeout')} ran past reward_model.timeout_s={timeout_s:g} s")
        raise ScorerError(f"reward: the scorer of {reward_fn_key} {src} failed on all {len(idx)} non-empty responses "
                          f"of that source in the batch of {len(sources)} ({', '.join(kinds)}), while the other "
                          f"sources scored; " + _FIX + f", or leave {reward_fn_key} {src} out of the data")
