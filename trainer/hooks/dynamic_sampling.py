"""DAPO's dynamic sampling (``algorithm.filter_groups``, verl's keys): keep only prompt groups whose responses do
not all get the same reward, and generate more batches until ``data.train_batch_size`` such groups are collected.

Source: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", section 3.2 (dynamic
sampling). With a group-normalised estimator (GRPO and relatives) a group whose ``n`` responses are all right or all
wrong has advantage 0 on every token, so it adds no policy gradient and only dilutes the batch; at low accuracy
(e.g. SmolLM2-135M on SVAMP, about 5% correct) most groups are such all-wrong groups.

Rules (verl's ``dapo_ray_trainer`` where it defines one):

* a group is the rows sharing a ``uid`` (one prompt's ``n`` responses, contiguous, prompt-major); it is
  *informative* when the metric values of its rows with a response token are not all equal (``std > 0``), or when
  it has a single row and that row has one; a row without response tokens counts in no group statistic, as in the
  group advantage estimators, so a group whose only spread comes from such a row would train with advantage 0;
* the metric is ``acc`` (the scorer's strict correctness, else the score: :func:`rewards.verify.accuracy_from_reward`)
  or ``score`` (the sequence's summed token-level score, shaping included);
* generation batches of ``train_batch_size`` prompts are drawn from the loader until enough informative groups
  exist; the first ``train_batch_size`` of them, in generation order, form the step's batch;
* ``max_num_gen_batches`` caps the batches per step. verl raises an error when the cap is hit; here the step goes
  on and fills the missing groups with uninformative ones (the first dropped groups, in order), so the batch keeps
  its shape. They add no policy gradient under GRPO; their count is logged. ``<= 0`` means no cap, as in verl,
  where a reward that never varies would loop forever: here the step then stops with an error after one epoch of
  batches (``no_cap_limit``). Every extra batch is logged (INFO) with the informative groups so far.

Metrics (``dynamic_sampling/*``): ``num_gen_batches``, ``informative_ratio`` (informative / generated groups),
``filled_groups``. Reward metrics (``reward/*``) are over ALL generated rows, not the filtered batch, so training
accuracy curves stay comparable with runs without the filter: rates are means over the batches, counts
(``reward/num_*``) and ``reward/time_s`` are sums. ``critic/score/*``, ``response_length/*`` and the throughput
metrics describe the trained batch; ``timing_s/gen`` is the time of every generation batch, and
``timing_per_token_ms/gen`` divides it by every generated response token (``meta['gen_response_tokens']``); the
``perf/max_*`` peaks are the maxima over every generation batch, and the tools' ``tool/*`` metrics are joined over
every generation batch (:func:`trainer.protocol.join_tool_metrics`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from trainer.hooks.base import StepContext, StepHook
from trainer.protocol import CALL_SECONDS_META, DataProto, join_tool_metrics

logger = logging.getLogger(__name__)

__all__ = ["METRICS", "FilterGroupsConfig", "DynamicSampling", "metric_values", "informative_rows",
           "left_pad_prompts", "concat_padded", "collect_informative_groups"]

METRICS = ("acc", "score")


@dataclass(frozen=True)
class FilterGroupsConfig:
    """``algorithm.filter_groups`` (verl's keys).

    Attributes:
        enable: dynamic sampling is on.
        metric: the per-row value whose spread makes a group informative: ``acc`` or ``score``
            (:func:`metric_values`).
        max_num_gen_batches: most generation batches per step; ``<= 0``: no cap.

    Raises:
        ValueError: a cap that is not an integer, or an unknown metric (naming the key and what is expected).
    """

    enable: bool = False
    metric: str = "acc"
    max_num_gen_batches: int = 10

    def __post_init__(self) -> None:
        cap = self.max_num_gen_batches
        if isinstance(cap, bool) or not isinstance(cap, int):
            raise ValueError(f"algorithm.filter_groups.max_num_gen_batches={cap!r}; expected an integer "
                             "(<= 0: no cap)")
        if self.metric not in METRICS:
            raise ValueError(f"algorithm.filter_groups.metric={self.metric!r}; expected one of {list(METRICS)}")

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> "FilterGroupsConfig":
        """Build from the config section (None or missing keys: the defaults above, those of the YAML)."""
        from trainer.config_reads import section_fields

        return cls(**section_fields(section, cls))


def metric_values(reward_output, metric: str, batch_size: int) -> list[float]:
    """Per-row values of ``metric`` from a :class:`rewards.manager.RewardOutput`: ``acc`` as
    :func:`rewards.verify.accuracy_from_reward`, ``score`` the row's summed ``token_level_scores`` (B,) f32.

    Raises:
        ValueError: unknown ``metric`` (the message lists the known ones), or values of the wrong length.
    """
    if metric == "acc":
        from rewards.verify import accuracy_from_reward

        return accuracy_from_reward(reward_output.reward_extra_info, batch_size)
    if metric == "score":
        scores = reward_output.token_level_scores.sum(-1)
        if len(scores) != batch_size:
            raise ValueError(f"token_level_scores has {len(scores)} rows, expected {batch_size}")
        return [float(s) for s in scores]
    raise ValueError(f"algorithm.filter_groups.metric={metric!r}; expected one of {list(METRICS)}")


def informative_rows(uids: Sequence, values: Sequence[float],
                     valid: Sequence[bool] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Split rows into those of informative groups and the rest, each in their original order.

    Args:
        uids: (B,) group id of each row (one prompt's ``n`` responses share one).
        values: (B,) the metric of each row.
        valid: (B,) bool, the rows with at least one response token (``response_mask.any(-1)``); None: all rows.
            A row without one (an aborted or emptied response) gets advantage 0 and moves no group statistic in
            the group estimators (:mod:`trainer.algos.advantages`), so its value is left out here too.

    Returns:
        ``(kept, dropped, groups)``: int64 row indices of informative groups, of the other groups, and the number
        of groups. A group is informative when the values of its valid rows are not all equal, or when it has one
        row (``rollout.n=1``) and that row is valid.

    Raises:
        ValueError: when ``uids``, ``values`` (or ``valid``) differ in length.
    """
    if len(uids) != len(values) or (valid is not None and len(valid) != len(uids)):
        extra = "" if valid is None else f" and {len(valid)} valid flags"
        raise ValueError(f"{len(uids)} uids but {len(values)} metric values{extra}")
    rows: dict = {}
    for i, u in enumerate(uids):
        rows.setdefault(u, []).append(i)
    vals = np.asarray(values, dtype=np.float64)
    ok = np.ones(len(vals), dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    keep = np.zeros(len(vals), dtype=bool)
    for idx in rows.values():
        v = vals[idx][ok[idx]]
        keep[idx] = len(v) > 0 and (len(idx) == 1 or bool(v.max() > v.min()))
    return np.nonzero(keep)[0], np.nonzero(~keep)[0], len(rows)


# (B, P) prompt columns and (B, P + R) whole-row columns: their prompt part is left-padded
_PROMPT_COLUMNS = {"prompts": None, "input_ids": None, "attention_mask": 0, "position_ids": 0}


def left_pad_prompts(rows: DataProto, width: int, pad_token_id: int) -> DataProto:
    """Left-pad the prompt part of ``rows`` to ``width`` tokens, so that batches generated from prompt batches of
    different widths can be concatenated. ``prompts`` (B, P) and ``input_ids`` get ``pad_token_id``;
    ``attention_mask`` and ``position_ids`` (B, P + R) get 0 (padding is masked out). Other columns are shared.

    Raises:
        ValueError: when ``width`` is smaller than the prompt width P.
    """
    p = rows["prompts"].shape[1]
    if width < p:
        raise ValueError(f"cannot left-pad prompts of width {p} to {width}")
    if width == p:
        return rows
    out = rows.index(slice(None))
    for key, fill in _PROMPT_COLUMNS.items():
        if key in out:
            t = out[key]
            pad = t.new_full((t.shape[0], width - p), pad_token_id if fill is None else fill)
            out[key] = torch.cat([pad, t], dim=1)
    return out


def concat_padded(parts: Sequence[DataProto], pad_token_id: int) -> DataProto:
    """Concatenate generated batches row-wise after left-padding each one's prompt part to the widest prompt
    (:func:`left_pad_prompts`); every join of batches from different prompt batches must go through here, since
    the loader pads each prompt batch only to its own longest prompt. Only the non-tensor columns that every part
    has are kept (the loader's own rule for a batch: ``trainer.dataset.collate_prompts`` keeps a key only when every
    row has it, so batches from train files with different columns differ).

    Raises:
        ValueError: when ``parts`` is empty.
    """
    if not parts:
        raise ValueError("concat_padded needs at least one batch")
    width = max(p["prompts"].shape[1] for p in parts)
    common = set.intersection(*(set(p.non_tensor) for p in parts))  # collate_prompts' rule: keys every row has
    padded = [left_pad_prompts(p, width, pad_token_id) for p in parts]
    return DataProto.concat([DataProto(batch=p.batch, non_tensor={k: v for k, v in p.non_tensor.items() if k in common},
                                       meta=p.meta) for p in padded])


def collect_informative_groups(first: DataProto, next_prompts: Callable[[], DataProto],
                               generate_and_score: Callable[[DataProto, int], tuple[DataProto, object]],
                               want_groups: int, n: int, metric: str, max_num_gen_batches: int, pad_token_id: int,
                               metrics: dict, no_cap_limit: int = 0) -> tuple[DataProto, list]:
    """Generate and score batches until ``want_groups`` informative groups are collected (or the cap is hit).

    Args:
        first: the step's first prompt batch.
        next_prompts: returns the next prompt batch from the loader.
        generate_and_score: ``(prompts, k) -> (rows, reward_output)`` for the ``k``-th batch of the step (1-based):
            ``rows`` holds ``len(prompts) * n`` prompt-major rows with ``uid`` and ``token_level_scores`` set.
        want_groups: groups in the step's batch (``data.train_batch_size``).
        n: responses per prompt (``rollout.n``).
        metric: ``acc`` or ``score`` (:func:`metric_values`).
        max_num_gen_batches: most batches generated for this step; ``<= 0`` means no cap.
        no_cap_limit: without a cap, the batches after which the step fails (one epoch of the loader; ``<= 0``:
            never, which can loop forever when the metric never varies).
        pad_token_id: filler of the prompt columns when batches of different prompt widths are joined.
        metrics: ``dynamic_sampling/*`` values are added here.

    Returns:
        ``(batch, reward_outputs)``: exactly ``want_groups * n`` rows (informative groups first, in generation
        order, then filler groups if the cap was hit), and the reward outputs of every generated batch.

    Raises:
        ValueError: unknown metric; a generated batch whose rows are not ``n`` per group.
        RuntimeError: no cap, and still short of ``want_groups`` after ``no_cap_limit`` batches (counts named).
    """
    kept, dropped, rewards = [], [], []
    gen_tokens, calls = 0.0, _CallMeta()
    informative = generated = batches = 0
    prompts = first
    while True:
        batches += 1
        rows, rew = generate_and_score(prompts, batches)
        valid = rows["response_mask"].any(dim=-1).tolist() if "response_mask" in rows else None
        keep, drop, groups = informative_rows(rows["uid"], metric_values(rew, metric, len(rows)), valid)
        if groups * n != len(rows):
            raise ValueError(f"generation batch {batches}: {len(rows)} rows in {groups} groups; expected {n} per group")
        kept.append(rows.index(keep))
        dropped.append(rows.index(drop))
        rewards.append(rew)
        gen_tokens += float(rows["response_mask"].sum()) if "response_mask" in rows else 0.0
        calls.add(rows)
        informative += len(keep) // n
        generated += groups
        if informative >= want_groups or (max_num_gen_batches > 0 and batches >= max_num_gen_batches):
            break
        if max_num_gen_batches <= 0 and 0 < no_cap_limit <= batches:
            raise _no_cap_error(informative, want_groups, batches, generated, max_num_gen_batches, metric)
        logger.info("dynamic sampling: %d of %d informative groups after %d generation batches; generating another",
                    informative, want_groups, batches)
        prompts = next_prompts()
    filled = max(0, want_groups - informative)
    batch = _join_kept(kept, dropped, want_groups * n, filled * n, pad_token_id)
    batch.meta.update(calls.joined(), gen_response_tokens=gen_tokens)
    metrics["dynamic_sampling/num_gen_batches"] = float(batches)
    metrics["dynamic_sampling/informative_ratio"] = informative / generated if generated else 0.0
    metrics["dynamic_sampling/filled_groups"] = float(filled)
    return batch, rewards


class _CallMeta:
    """The call metrics of the step's generation batches: their :data:`trainer.protocol.CALL_SECONDS_META` seconds
    add up (the step waits for each batch in turn) and their ``tool/*`` metrics are joined over the batches
    (:func:`trainer.protocol.join_tool_metrics`: each key's smallest value), whichever rows were kept."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.metas: list[Mapping] = []

    def add(self, rows: DataProto) -> None:
        """Record one generation batch's ``meta`` (``rows``: the batch it generated)."""
        for k in CALL_SECONDS_META:
            if k in rows.meta:
                self.seconds[k] = self.seconds.get(k, 0.0) + float(rows.meta[k])
        self.metas.append(dict(rows.meta))

    def joined(self) -> dict[str, float]:
        """The step's seconds and ``tool/*`` metrics, to replace those of the joined batch."""
        return {**self.seconds, **join_tool_metrics(self.metas)}


def _no_cap_error(informative: int, want_groups: int, batches: int, generated: int, cap: int,
                  metric: str) -> RuntimeError:
    return RuntimeError(
        f"dynamic sampling: {informative} of {want_groups} informative groups after {batches} generation "
        f"batches ({generated} groups, one epoch) with algorithm.filter_groups.max_num_gen_batches={cap} (no cap); "
        f"does the reward ({metric}) ever differ within a group? Set a cap to go on with filler groups")


def _join_kept(kept: list[DataProto], dropped: list[DataProto], rows: int, filler_rows: int,
               pad_token_id: int) -> DataProto:
    """The first ``rows`` rows of every batch's informative part, then (when the cap was hit) ``filler_rows`` rows
    of the first uninformative groups, which keep the batch's shape. Every batch's part takes part in the join,
    even an empty one, so that the result keeps every batch's ``perf/max_*`` peaks."""
    pool = list(kept)
    if filler_rows:
        pool.append(concat_padded([p for p in dropped if len(p)], pad_token_id).index(slice(0, filler_rows)))
    return concat_padded(pool, pad_token_id).index(slice(0, rows))


class DynamicSampling(StepHook):
    """DAPO's dynamic sampling as the step's generation (see the module docstring).

    Args:
        filter_groups: the ``algorithm.filter_groups`` section.
        want_groups: groups in the step's batch (``data.train_batch_size``).
        n: responses per prompt (``rollout.n``).
        pad_token_id: filler of the prompt columns when batches of different prompt widths are joined.
        no_cap_limit: without a cap, the generation batches after which a step fails (one epoch of the loader).
    """

    one_batch_per_step = False

    def __init__(self, filter_groups: FilterGroupsConfig, want_groups: int, n: int, pad_token_id: int,
                 no_cap_limit: int):
        self.metric, self.max_num_gen_batches = filter_groups.metric, filter_groups.max_num_gen_batches
        self.want_groups, self.n, self.pad_token_id = int(want_groups), int(n), int(pad_token_id)
        self.no_cap_limit = int(no_cap_limit)

    def generate(self, step: StepContext, prompts: DataProto) -> tuple[DataProto, list]:
        return collect_informative_groups(prompts, step.next_prompts, step.generate_and_score,
                                          want_groups=self.want_groups, n=self.n, metric=self.metric,
                                          max_num_gen_batches=self.max_num_gen_batches,
                                          pad_token_id=self.pad_token_id, metrics=step.metrics,
                                          no_cap_limit=self.no_cap_limit)
