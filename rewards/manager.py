"""Reward manager: decode responses, score each one with a rule scorer, place the score on the last token.

Contract (the trainer calls it once per step, PRIME also calls :meth:`RewardManager.verify`):

* inputs read from the :class:`trainer.protocol.DataProto`: ``responses`` (B, R) int64, ``response_mask``
  (B, R) (any dtype; > 0 means a token the model wrote), optionally ``attention_mask`` (B, P+R) (the response is
  decoded under its last R columns, i.e. the whole trajectory with a multi-turn rollout's tool answers; without
  it, under ``response_mask``; a scorer that reads its answer after ``answer_after`` gets that marker placed after
  the last tool turn of a multi-turn row, found from the masks, so that it never reads a tool's output whatever the
  chat template, see :func:`rewards.response_text.solution_text`), the non-tensor column named by ``reward_fn_key`` (any name,
  not only ``data_source``), ``reward_model`` (dicts with ``"ground_truth"``) and optionally
  ``extra_info`` (passed to the scorer as ``extra_info=`` when it takes that parameter).
* output :class:`RewardOutput`: ``token_level_scores`` (B, R) float32, the score at the LAST valid response
  token (verl's convention; rows with no valid token get nothing and are counted), ``reward_extra_info``
  (``"score"`` plus every key that dict-returning scorers gave, one entry per row), ``metrics``, and with
  ``component_keys`` the named reward components ``reward_components`` (B, K) float32 (multi-reward estimators
  such as GDPO normalise each on its own).

Soft overlong punishment (DAPO, Yu et al. 2025, arXiv:2503.14476, eq. 13; verl's ``reward_model.overlong_buffer``):
with ``overlong_buffer_len = B > 0`` and ``max_response_length = L``, a response of ``n`` valid tokens gets
``min(0, -(n - (L - B)) / B) * overlong_penalty_factor`` added to its score: 0 up to ``L - B`` tokens, falling
linearly to ``-overlong_penalty_factor`` at ``L``. Strict accuracy (a scorer's ``acc``) is not changed.

Robustness: a scorer that raises, returns NaN/inf (or a number beyond float32's range, inf in the reward tensor) or a
value of the wrong type, or runs past ``timeout_s`` gives 0.0 for that row and is counted in ``reward/num_errors``,
``reward/num_nan``, ``reward/num_timeouts``; one that fails on every response of a batch stops the run
(:func:`rewards.failures.check_not_all_failed`), and so does one that fails on every non-empty response while the
empty ones score (:class:`rewards.failures.FailureWatch`, which also ends the
scoring of a batch early once 16 non-empty responses timed out or killed their process and none scored). With
``num_workers >= 1`` the scorers run in a pool of forked processes (:class:`rewards.pool.ScoringPool`) that kills a
hung one; with ``num_workers=0`` in this process under a ``SIGALRM`` timer (main thread only; it cannot interrupt C
code such as huge integer arithmetic).

A scorer's own time limit (the MATH scorer's ``timeout_seconds``, :func:`rewards.math_guards.time_bound`) is another
matter: a comparison it cuts short scores 0 like a wrong answer (as in verl), and the scorer returns normally; such
responses are counted in ``reward/num_scorer_timeouts`` (:func:`rewards.math_guards.note_limit_hit`, carried back
from the scoring processes with each outcome) and the first batch that has any logs one warning naming the scorer, the
limit and how to raise it (the outcomes are read and counted by :mod:`rewards.outcomes`). Before forking its scoring
processes the manager warms math-verify (:func:`rewards.math.warm_math_verify`), so that no worker pays its cold start
inside the first comparison's limit.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import torch

from rewards.components import check_component_keys, component_matrix
from rewards.failures import FailureWatch, check_batch, check_each_source, scorer_label
from rewards.math_guards import take_limit_hits
from rewards.options import answer_marker, check_scorer_options, takes_extra_info
from rewards.outcomes import tally_outcomes, warn_scorer_limit
from rewards.overlong import overlong_penalty, penalise_overlong  # noqa: F401  (re-exported)
from rewards.pool import Outcome, ScoringPool, in_process as _in_process  # noqa: F401  (re-exported)
from rewards.registry import get_scorer, registry_version, wants_data_source
from rewards.response_text import decode_responses, solution_text
from rewards.verify import as_accuracy

__all__ = ["RewardOutput", "RewardManager"]

logger = logging.getLogger(__name__)

_CALLABLE_KEY = "__scorer__"


@dataclass
class RewardOutput:
    """What :meth:`RewardManager.__call__` returns.

    Attributes:
        token_level_scores: (batch, response_len) float32 on the device of ``responses``; row i holds its
            score at its last valid response token and 0 elsewhere.
        reward_extra_info: ``{"score": [B floats], <key>: [B values]}`` for every key returned by a
            dict-returning scorer (e.g. ``acc``, ``format``); None where a row's result lacks that key
            (float result, error, timeout).
        metrics: ``reward/num_errors``, ``reward/num_nan``, ``reward/num_timeouts``, ``reward/num_scorer_timeouts``
            (responses scored 0 because the scorer's own time limit cut a comparison short), ``reward/num_dicts``,
            ``reward/num_empty_responses`` (counts), ``reward/score_mean``, ``reward/time_s`` (seconds).
        reward_components: (batch, K) float32 on the device of ``responses``, column k the value of the manager's
            ``component_keys[k]`` in each row's scorer dict (0.0 where the scorer failed or timed out, or the value
            is not finite); None without ``component_keys``.
    """

    token_level_scores: torch.Tensor
    reward_extra_info: dict[str, list] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    reward_components: torch.Tensor | None = None


class RewardManager:
    """Rule-reward manager (verl's naive/PRIME reward managers in one).

    Args:
        tokenizer: anything with ``batch_decode(list[list[int]], skip_special_tokens=True) -> list[str]``
            (a Hugging Face tokenizer).
        reward_fn_key: the non-tensor column that selects the scorer per row (``data_source`` by default; verl's
            ``data.reward_fn_key``). Only read when ``scorer`` is None or the scorer has a ``data_source``
            parameter.
        scorer: None (look up each row's ``reward_fn_key`` value in :mod:`rewards.registry`), a registry name
            (``"gsm8k_strict"``, ``"format_boxed"``, ...) or a callable
            ``score(solution_str, ground_truth, extra_info=None, <options>) -> float | dict``.
        scorer_kwargs: the scorer options, keyword arguments of every scorer call (verl's ``reward_kwargs``);
            checked against a fixed scorer's signature here, and against each routed scorer's by
            :meth:`check_data_sources` (:func:`rewards.options.check_scorer_options`).
        timeout_s: per-sample time limit in seconds.
        num_workers: scorer processes; 0 scores in this process (no hard limit, see module doc); None picks
            ``min(4, os.cpu_count())``.
        start_method: multiprocessing start method of the pool (``"fork"`` lets any callable be used).
        overlong_buffer_len: DAPO's soft overlong punishment buffer in tokens (0: off); see the module doc.
        overlong_penalty_factor: the penalty at ``max_response_length`` tokens (>= 0).
        max_response_length: the rollout's response limit in tokens; required when ``overlong_buffer_len > 0``.
        component_keys: names of reward components to return as ``RewardOutput.reward_components`` (verl's
            ``algorithm.gdpo_reward_keys``): each row's scorer must return a dict holding them (besides ``score``).

    Raises:
        KeyError: if ``scorer`` is a name that is not registered.
        TypeError: if ``scorer`` is neither None, a str nor callable, or a fixed scorer does not take one of
            ``scorer_kwargs`` (naming the option and the scorer).
        ValueError: a ``scorer_kwargs`` value outside the fixed scorer's annotation; for a non-positive ``timeout_s``, a negative ``num_workers``, or an overlong buffer that is
            negative, not smaller than ``max_response_length``, or given without it, or a negative penalty factor;
            ``component_keys`` that are not distinct non-empty strings.
    """

    def __init__(self, tokenizer: Any, reward_fn_key: str = "data_source", scorer: str | Callable | None = None,
                 scorer_kwargs: dict | None = None, timeout_s: float = 10.0, num_workers: int | None = None,
                 start_method: str = "fork", overlong_buffer_len: int = 0, overlong_penalty_factor: float = 1.0,
                 max_response_length: int | None = None, component_keys: Sequence[str] = ()):
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if num_workers is None:
            num_workers = min(4, os.cpu_count() or 1)
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if scorer is not None and not isinstance(scorer, str) and not callable(scorer):
            raise TypeError(f"scorer must be None, a registered name or a callable, got {type(scorer).__name__}")
        buf = int(overlong_buffer_len)
        if buf < 0 or (buf > 0 and (max_response_length is None or not 0 < buf < int(max_response_length))):
            raise ValueError(f"overlong_buffer_len={overlong_buffer_len!r} with max_response_length="
                             f"{max_response_length!r}; expected 0 (off) or 0 < len < max_response_length")
        if not float(overlong_penalty_factor) >= 0:
            raise ValueError(f"overlong_penalty_factor={overlong_penalty_factor!r}; expected >= 0")
        self.component_keys = check_component_keys(component_keys)
        self.overlong_buffer_len, self.overlong_penalty_factor = buf, float(overlong_penalty_factor)
        self.max_response_length = None if max_response_length is None else int(max_response_length)
        self.tokenizer = tokenizer
        self.reward_fn_key = reward_fn_key
        self.scorer_name = scorer if isinstance(scorer, str) else None
        self.scorer = get_scorer(scorer) if isinstance(scorer, str) else scorer
        self.scorer_kwargs = dict(scorer_kwargs or {})
        if self.scorer is not None:
            self._check_options()
        self.timeout_s = float(timeout_s)
        self.num_workers = num_workers
        self.start_method = start_method
        self._pool: ScoringPool | None = None
        self._pool_version = -1
        self._warned_scorer_limit = False  # the scorer's own time limit warning is logged once

    def _check_options(self) -> None:
        """The fixed scorer takes the manager's call (:func:`rewards.options.check_scorer_options`)."""
        check_scorer_options(self.scorer, self.scorer_kwargs, self.scorer_name)

    @property
    def routes_by_key(self) -> bool:
        """True when rows are scored by their ``reward_fn_key`` value: no fixed scorer, or one that takes
        ``data_source`` (verl's custom signature)."""
        return self.scorer is None or wants_data_source(self.scorer)

    @property
    def reads_key(self) -> bool:
        """True when the scorer is given each row's ``reward_fn_key`` value (routed by it, or passed it), so every
        data file must have that column."""
        return self.routes_by_key

    def check_data_sources(self, values) -> None:
        """Check, before training, every scorer that routing reaches: each distinct ``reward_fn_key`` value in
        ``values`` must have a registered scorer that takes ``scorer_kwargs``. With a fixed scorer the values
        are not used (its options were checked in ``__init__``).

        Raises:
            KeyError: a value without a registered scorer (naming it and the registered names).
            TypeError, ValueError: as :func:`rewards.options.check_scorer_options`, naming the option, the
                scorer and the data source.
        """
        if self.scorer is not None:
            return
        for value in sorted(set(values), key=repr):
            check_scorer_options(get_scorer(value), self.scorer_kwargs, value)

    # ---- pool ------------------------------------------------------------------------------------------
    def _get_pool(self) -> ScoringPool:
        if self._pool is not None and self._pool_version != registry_version():
            self._pool.close()  # a scorer was registered after the fork: the workers do not know it
            self._pool = None
        if self._pool is None:
            from rewards import math as math_reward
            # import and run a first comparison here, so that forked workers inherit math-verify warmed: its import
            # (~1 s) and its first parse and verify (~0.3 s idle, over 1 s on a loaded machine) would otherwise fall in
            # each worker's first comparison, inside the scorer's own timeout_seconds (a correct answer scored 0)
            math_reward.warm_math_verify()
            table = {_CALLABLE_KEY: self.scorer} if self.scorer is not None else {}
            self._pool = ScoringPool(self.num_workers, table=table, resolve=get_scorer,
                                     start_method=self.start_method)
            self._pool_version = registry_version()
        return self._pool

    def close(self) -> None:
        """Stop the worker processes (they also stop when this process exits)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "RewardManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- inputs ----------------------------------------------------------------------------------------
    def _decode(self, data) -> tuple[list[str], torch.Tensor, torch.Tensor, list[tuple[str, str] | None]]:
        """:func:`rewards.response_text.decode_responses` with this manager's tokenizer."""
        return decode_responses(self.tokenizer, data)

    _solution = staticmethod(solution_text)

    def _tasks(self, data, texts: list[str], splits: list[tuple[str, str] | None] | None = None
               ) -> tuple[list[tuple], list[Callable]]:
        n = len(texts)
        splits = splits or [None] * n
        keys = None
        if self.routes_by_key:
            if self.reward_fn_key not in data:
                raise KeyError(f"reward_fn_key column {self.reward_fn_key!r} is not in the batch (non-tensor "
                               f"columns: {sorted(data.non_tensor)}); set data.reward_fn_key or pass a scorer")
            keys = data[self.reward_fn_key]
        if "reward_model" not in data:
            raise KeyError(f"column 'reward_model' (dicts with 'ground_truth') is not in the batch; non-tensor "
                           f"columns: {sorted(data.non_tensor)}")
        rm = data["reward_model"]
        extra = data["extra_info"] if "extra_info" in data else [None] * n
        tasks, fns = [], []
        wants: dict[int, tuple[bool, bool, str | None]] = {}
        for i in range(n):
            if not isinstance(rm[i], dict) or "ground_truth" not in rm[i]:
                raise ValueError(f"row {i}: reward_model must be a dict with 'ground_truth', got {rm[i]!r:.200}")
            if self.scorer is not None:
                key, fn = _CALLABLE_KEY, self.scorer
            else:
                key = keys[i]
                if key is None:  # a row without the column (a JSON-lines row lacking it, a parquet null)
                    raise KeyError(f"data.reward_fn_key={self.reward_fn_key!r}: row {i} of the batch has no "
                                   f"{self.reward_fn_key!r} value; add the column to every row of the data, set "
                                   "data.reward_fn_key, or force one scorer with reward_model.scorer=<name>")
                fn = get_scorer(key)  # KeyError naming the unknown value: a config error, raised here
            if id(fn) not in wants:
                wants[id(fn)] = (wants_data_source(fn), takes_extra_info(fn), answer_marker(fn, self.scorer_kwargs))
            by_name, with_extra, marker = wants[id(fn)]
            text = self._solution(texts[i], splits[i], marker)
            kwargs = dict(self.scorer_kwargs)
            if with_extra:
                kwargs["extra_info"] = extra[i]
            if by_name:  # verl's signature f(data_source, solution_str, ground_truth, extra_info): by name
                kwargs.update(data_source=None if keys is None else keys[i], solution_str=text,
                              ground_truth=rm[i]["ground_truth"])
                tasks.append((key, (), kwargs))
            else:
                tasks.append((key, (text, rm[i]["ground_truth"]), kwargs))
            fns.append(fn)
        return tasks, fns

    # ---- scoring ---------------------------------------------------------------------------------------
    def _score(self, data) -> tuple[list[float], list[dict | None], dict[str, float], torch.Tensor, torch.Tensor,
                                    list[bool]]:
        t0 = time.perf_counter()
        texts, valid, seen, splits = self._decode(data)
        tasks, fns = self._tasks(data, texts, splits)
        watch = FailureWatch([not t.strip() for t in texts])
        label = partial(scorer_label, self.scorer, self.scorer_name, self.reward_fn_key, tasks, watch.blank)
        hits: list[list[float]] = []
        outcomes = self._outcomes(tasks, fns, watch, label, hits)
        tally = tally_outcomes(outcomes, hits)  # scores, dicts, whether each ran, counts
        counts = tally.counts
        check_batch(watch, counts, tally.first_error, len(outcomes), self.timeout_s, label, logger,
                    tally.first_nan)  # or warn
        if counts["scorer_timeouts"] and not self._warned_scorer_limit:
            self._warned_scorer_limit = True
            warn_scorer_limit(logger, counts["scorer_timeouts"], len(outcomes), tally.limits, label(), self.timeout_s)
        if self.routes_by_key:  # one data source the scorer fails on, among others it scores
            check_each_source(data[self.reward_fn_key], [r.get("ground_truth") for r in data["reward_model"]],
                              outcomes, watch.blank, self.reward_fn_key, self.timeout_s)
        metrics = {f"reward/num_{k}": float(v) for k, v in counts.items()}
        metrics["reward/time_s"] = time.perf_counter() - t0
        return tally.scores, tally.dicts, metrics, valid, seen, tally.ran

    def _outcomes(self, tasks: list[tuple], fns: list[Callable], watch: FailureWatch, label: Callable,
                  hits: list | None = None) -> list:
        """One :data:`rewards.pool.Outcome` per row: the tasks run in this process (``num_workers=0``) or the pool.
        ``hits``, when given, is filled with one list per row: the limits of the comparisons its scorer's own time
        bound cut short (:func:`rewards.math_guards.take_limit_hits`)."""
        hits = [] if hits is None else hits
        if self.num_workers == 0:
            outcomes = []
            take_limit_hits()  # earlier ones of this process are not this batch's
            for i, (fn, (_, args, kw)) in enumerate(zip(fns, tasks)):
                outcomes.append(_in_process(fn, args, kw, self.timeout_s))
                hits.append(take_limit_hits())
                if watch.see(i, outcomes[-1]):
                    break
        else:
            outcomes = self._get_pool().run(tasks, self.timeout_s, stop=watch.see, limit_hits=hits)
        if watch.stopped:
            watch.check(len(tasks), self.timeout_s, label())
        return outcomes

    def __call__(self, data) -> RewardOutput:
        """Score a batch; see the module docstring for the columns read.

        Returns:
            :class:`RewardOutput` with ``token_level_scores`` (batch, response_len) float32.

        Raises:
            KeyError: a needed column is missing, or a ``reward_fn_key`` value has no registered scorer.
            ValueError: ``responses``/``response_mask`` shapes disagree, or a ``reward_model`` entry has no
                ``ground_truth``.
        """
        scores, dicts, metrics, valid, seen, ran = self._score(data)
        responses = data["responses"]
        b, r = responses.shape
        overlong, unpenalised = None, list(scores)
        if self.overlong_buffer_len:
            overlong, scores = penalise_overlong(scores, seen.sum(-1), self.max_response_length,
                                                 self.overlong_buffer_len, self.overlong_penalty_factor, metrics)
        out = torch.zeros(b, r, dtype=torch.float32)
        positions = torch.arange(r).expand(b, r)
        last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=1).values  # (B,)
        has_token = last >= 0
        rows = torch.nonzero(has_token).flatten()
        if b:
            out[rows, last[rows]] = torch.tensor(scores, dtype=torch.float32)[rows]
        metrics["reward/num_empty_responses"] = float((~has_token).sum().item())
        metrics["reward/score_mean"] = float(sum(scores) / len(scores)) if scores else 0.0
        extra: dict[str, list] = {"score": list(scores)}
        for d in dicts:
            for k in d or ():
                extra.setdefault(k, [None] * b)
        for i, d in enumerate(dicts):
            for k, v in (d or {}).items():
                if k != "score":
                    extra[k][i] = v
        if overlong is not None:
            extra["overlong_reward"] = overlong
            # accuracy is the verifier's verdict, not the shaped reward: a plain-number score's accuracy is the score
            # before the penalty (rewards.verify.accuracy_from_reward falls back to "acc", then to the score)
            acc = extra.setdefault("acc", [None] * b)
            extra["acc"] = [u if a is None else a for a, u in zip(acc, unpenalised)]
        comps = None
        if self.component_keys:
            comps, nan = component_matrix(dicts, ran, self.component_keys)
            metrics["reward/num_nan_components"] = float(nan)
        return RewardOutput(token_level_scores=out.to(responses.device), reward_extra_info=extra, metrics=metrics,
                            reward_components=None if comps is None else comps.to(responses.device))

    def verify(self, data) -> list[float]:
        """Per-row accuracy (PRIME's ``verify``): the ``"acc"`` of a dict result, else the score; 0.0 for rows
        whose scorer failed, timed out or gave a non-finite value.

        Returns:
            list of B Python floats.

        Raises:
            Same as :meth:`__call__`.
        """
        scores, dicts, *_ = self._score(data)
        return [as_accuracy(d["acc"]) if d is not None and "acc" in d else s for s, d in zip(scores, dicts)]
