"""verl's batch reward manager (``reward_model.reward_manager=batch``): the custom reward function is called once
per batch, by keyword, as verl's ``BatchRewardManager`` calls it::

    compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...], **reward_kwargs)

and returns one score per response (a number, or a dict with ``score``, as a row scorer's). The call runs in this
process, bounded by ``reward_model.timeout_s`` per response; the rest (the overlong penalty, the metrics, the
reward components) is :class:`rewards.manager.RewardManager`'s.
"""
from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Mapping

from rewards.failures import FailureWatch, ScorerError
from rewards.manager import RewardManager
from rewards.options import PASSED_BY_MANAGER, _check_values, answer_marker, scorer_label
from rewards.pool import in_process, to_plain_result
from rewards.scorer_call import call_scorer

__all__ = ["BatchRewardManager", "BATCH_ARGS", "check_batch_scorer"]

#: the keyword arguments of verl's batch call, one list entry per response
BATCH_ARGS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
_KEY = "__batch_scorer__"


def check_batch_scorer(fn: Callable, options: Mapping[str, Any]) -> None:
    """``fn`` can be called as verl's batch reward function with the scorer options ``options``.

    Raises:
        TypeError: one line naming the function, the call and what does not fit.
        OptionValueError: an option value of the wrong type (:func:`rewards.options.check_scorer_options`).
    """
    label = scorer_label(fn)
    reserved = sorted(set(options) & (set(BATCH_ARGS) | set(PASSED_BY_MANAGER)))
    if reserved:
        raise TypeError(f"scorer option {reserved[0]!r} for {label} is passed by the reward manager itself; remove "
                        "it from the scorer options")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no readable signature: the first call tells
    try:
        sig.bind(**{name: [] for name in BATCH_ARGS}, **options)
    except TypeError as exc:
        raise TypeError(f"reward_model.reward_manager=batch calls {label} once per batch as fn(data_sources=[...], "
                        f"solution_strs=[...], ground_truths=[...], extra_infos=[...], **options) with options "
                        f"{sorted(options)} (verl's BatchRewardManager): {exc}; use reward_manager=naive for a "
                        "function of one response") from None
    _check_values(fn, options, label)  # a value of the wrong type for its annotation or default: OptionValueError


class _FirstRow:
    """The batch function called on a batch of one response, returning that response's result (the start-up
    probe, :func:`trainer.reward_probe.check_scorer_returns`, judges it as a row scorer's)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, **kwargs):
        out = self.fn(**kwargs)
        return out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out


class BatchRewardManager(RewardManager):
    """A :class:`rewards.manager.RewardManager` whose ``scorer`` (a callable, the custom reward function) scores
    the whole batch in one call (see the module docstring). The rows' ``reward_fn_key`` values are passed as
    ``data_sources`` (None where a row lacks it; a batch without the column is refused, as every data file without
    it is before start-up); rows are not routed by them.

    Raises:
        TypeError: ``scorer`` is not a callable, or does not take the batch call (:func:`check_batch_scorer`).
    """

    def __init__(self, tokenizer: Any, scorer: Callable, **kwargs):
        if not callable(scorer) or isinstance(scorer, str):
            raise TypeError(f"reward_model.reward_manager=batch needs a custom reward function, got {scorer!r}")
        super().__init__(tokenizer, scorer=scorer, **kwargs)

    def _check_options(self) -> None:
        check_batch_scorer(self.scorer, self.scorer_kwargs)

    @property
    def routes_by_key(self) -> bool:
        """False: one function scores every row."""
        return False

    @property
    def reads_key(self) -> bool:
        """True: the rows' ``reward_fn_key`` values are the call's ``data_sources``."""
        return True

    def _tasks(self, data, texts: list[str], splits: list | None = None) -> tuple[list[tuple], list[Callable]]:
        """One task: the batch call's keyword arguments (and the function, returning the first row's result). A
        function with an ``answer_after`` parameter gets that marker after each multi-turn row's last tool turn, as
        a row scorer does (:func:`rewards.response_text.solution_text`); others get the trajectories as decoded."""
        n = len(texts)
        marker = answer_marker(self.scorer, self.scorer_kwargs)
        texts = [self._solution(t, sp, marker) for t, sp in zip(texts, splits or [None] * n)]
        if "reward_model" not in data:
            raise KeyError(f"column 'reward_model' (dicts with 'ground_truth') is not in the batch; non-tensor "
                           f"columns: {sorted(data.non_tensor)}")
        rm = data["reward_model"]
        for i in range(n):
            if not isinstance(rm[i], dict) or "ground_truth" not in rm[i]:
                raise ValueError(f"row {i}: reward_model must be a dict with 'ground_truth', got {rm[i]!r:.200}")
        if self.reward_fn_key not in data:  # verl's batch manager raises the same KeyError
            raise KeyError(f"reward_fn_key column {self.reward_fn_key!r} is not in the batch (non-tensor columns: "
                           f"{sorted(data.non_tensor)}); the batch call's data_sources are read from it: set "
                           "data.reward_fn_key")
        sources = list(data[self.reward_fn_key])
        extras = list(data["extra_info"]) if "extra_info" in data else [None] * n
        kwargs = dict(self.scorer_kwargs, data_sources=sources, solution_strs=list(texts),
                      ground_truths=[r["ground_truth"] for r in rm], extra_infos=extras)
        return [(_KEY, (), kwargs)], [_FirstRow(self.scorer)]

    def _outcomes(self, tasks: list[tuple], fns: list[Callable], watch: FailureWatch, label: Callable,
                  hits: list | None = None) -> list:
        """One outcome per row from the one batch call: its error or timeout for every row, else each entry of the
        list it returned, normalised as a row scorer's result. ``hits`` is left empty: a batch function's own time
        limits are not attributed to rows.

        Raises:
            ScorerError: the call returned something other than a list of one result per response.
        """
        (_, _, kwargs), n = tasks[0], len(tasks[0][2]["solution_strs"])
        held: dict = {}

        def call(**kw):
            held["out"] = call_scorer(self.scorer, (), kw)
            return 0.0

        t0 = time.perf_counter()
        status, payload, _ = in_process(call, (), kwargs, self.timeout_s * max(1, n))
        each = (time.perf_counter() - t0) / max(1, n)
        if status != "ok":
            return [(status, payload, each)] * n
        out = held["out"]
        if not isinstance(out, (list, tuple)) or len(out) != n:
            got = f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (list, tuple)) else "")
            raise ScorerError(f"reward_model.reward_manager=batch: {label()} returned {got} for a batch of {n} "
                              "responses; expected a list of one score (a number or a dict with 'score') per "
                              "response")
        outcomes = []
        for value in out:
            try:
                outcomes.append(("ok", to_plain_result(value), each))
            except (TypeError, ValueError) as exc:
                outcomes.append(("error", f"{type(exc).__name__}: {exc}"[:500], each))
        return outcomes
