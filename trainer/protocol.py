"""The batch container passed between the single controller and the workers.

``DataProto`` holds a dict of tensors that share a first (batch) dimension, a dict of non-tensor columns
(numpy object arrays, one entry per row) and a ``meta`` dict of scalars/config for the whole batch. It is
what verl users know as ``DataProto``; the tensors live in a :class:`tensordict.TensorDict` so that slicing,
concatenation and device moves are handled by a well-kept library.

Standard column names (shapes with ``B`` = rows, ``P`` = padded prompt width, ``R`` = padded response width):

===================== ============ =================================================================
name                  shape        meaning
===================== ============ =================================================================
``prompts``           (B, P) int64 left-padded prompt token ids
``responses``         (B, R) int64 right-padded response token ids
``input_ids``         (B, P+R)     ``cat(prompts, responses)``
``attention_mask``    (B, P+R)     1 for real tokens, 0 for padding (int64)
``position_ids``      (B, P+R)     ``clamp(cumsum(attention_mask) - 1, min=0)``
``response_mask``     (B, R)       1 for response tokens that are trained on (float32)
``rollout_log_probs`` (B, R) f32   log-probs reported by the rollout engine
``old_log_probs``     (B, R) f32   log-probs of the actor before the update (recomputed; absent when the update's
                                   forward gives them, ``meta["old_log_probs_from_update"]``: trainer/on_policy.py)
``ref_log_prob``      (B, R) f32   log-probs of the reference model
``values``            (B, R) f32   critic values
``sum_pi_squared``    (B, R) f32   ``sum_v pi_v^2`` of the actor per token (only for an estimator reading it)
``reward_components`` (B, K) f32   named reward components (``algorithm.gdpo_reward_keys``; GDPO only)
``token_level_scores`` (B, R) f32  rule/model reward placed on the last valid response token
``token_level_rewards`` (B, R) f32 scores minus the in-reward KL penalty (if any)
``advantages``        (B, R) f32
``returns``           (B, R) f32
===================== ============ =================================================================

Non-tensor columns: ``uid`` (prompt id, groups of ``n`` samples share one), ``data_source``,
``reward_model`` (dict with ``ground_truth``), ``extra_info`` (dict), ``raw_prompt``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from tensordict import TensorDict

#: ``meta`` keys holding the wall-clock seconds of one worker's generation call (multi-turn rollouts: the tool
#: phases and the engine's generation). :meth:`DataProto.concat` joins the workers' values by their maximum; the
#: generation batches of one step (dynamic sampling) add up (:func:`trainer.hooks.dynamic_sampling.
#: collect_informative_groups`).
CALL_SECONDS_META = ("multi_turn/tool_wall_s", "multi_turn/generate_s")
_MAX_META_PREFIXES = ("perf/max_", "perf/worker_s/", "perf/rollout_s/")  # joined by DataProto.concat's maximum
_MAX_META_KEYS = CALL_SECONDS_META + ("timing_gen_s",)
TOOL_META_PREFIX = "tool/"  # the tools' own metrics (rollout.tools.base.Tool.metrics), joined by join_tool_metrics


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def join_tool_metrics(metas: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The ``tool/*`` metrics (:meth:`rollout.tools.base.Tool.metrics`) of several calls (a call's workers, or a
    step's generation batches) joined into one set: each key's smallest value over the calls that report it.

    A tool's metrics are facts about the tool where it runs, the same in every call of one worker, such as
    ``tool/python/isolation_level`` (the one the built-in tools report), whose smallest value is the weakest
    sandbox any worker ran.

    Args:
        metas: the ``meta`` of each call (only its ``tool/*`` keys are read).

    Returns:
        ``{key: float}`` for every ``tool/*`` key of any call.
    """
    out: dict[str, float] = {}
    for meta in metas:
        for k, v in meta.items():
            if k.startswith(TOOL_META_PREFIX):
                out[k] = min(out.get(k, float(v)), float(v))
    return out


@dataclass
class DataProto:
    """A batch of rows: ``batch`` (tensors), ``non_tensor`` (object arrays) and ``meta`` (batch-level info).

    Raises:
        ValueError: when columns disagree on the number of rows.
    """

    batch: TensorDict | None = None
    non_tensor: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor = {k: v if isinstance(v, np.ndarray) else _as_object_array(v) for k, v in self.non_tensor.items()}
        n = len(self)
        for k, v in self.non_tensor.items():
            if len(v) != n:
                raise ValueError(f"non-tensor column {k!r} has {len(v)} rows, expected {n} (the tensor batch size)")

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, tensors: dict[str, torch.Tensor] | None = None, non_tensors: dict[str, Sequence] | None = None,
                  meta: dict[str, Any] | None = None) -> "DataProto":
        """Build from plain dicts; every tensor must have the same first dimension."""
        tensors = tensors or {}
        td = None
        if tensors:
            sizes = {k: v.shape[0] for k, v in tensors.items()}
            if len(set(sizes.values())) != 1:
                raise ValueError(f"tensors disagree on the batch size: {sizes}")
            td = TensorDict(dict(tensors), batch_size=[next(iter(sizes.values()))])
        return cls(batch=td, non_tensor={k: _as_object_array(v) for k, v in (non_tensors or {}).items()},
                   meta=dict(meta or {}))

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for v in self.non_tensor.values():
            return len(v)
        return 0

    def __getitem__(self, key: str):
        if self.batch is not None and key in self.batch.keys():
            return self.batch[key]
        if key in self.non_tensor:
            return self.non_tensor[key]
        raise KeyError(f"column {key!r} not in batch; have tensors {self.tensor_keys()} and "
                       f"non-tensors {sorted(self.non_tensor)}")

    def __contains__(self, key: str) -> bool:
        return (self.batch is not None and key in self.batch.keys()) or key in self.non_tensor

    def tensor_keys(self) -> list[str]:
        return sorted(self.batch.keys()) if self.batch is not None else []

    def __setitem__(self, key: str, value) -> None:
        if isinstance(value, torch.Tensor):
            if self.batch is None:
                self.batch = TensorDict({}, batch_size=[value.shape[0]])
            self.batch[key] = value
        else:
            arr = value if isinstance(value, np.ndarray) else _as_object_array(value)
            if len(arr) != len(self):
                raise ValueError(f"column {key!r} has {len(arr)} rows, expected {len(self)}")
            self.non_tensor[key] = arr

    # ---- selection ----------------------------------------------------------------------------------------
    def index(self, idx: Sequence[int] | torch.Tensor | np.ndarray | slice) -> "DataProto":
        """Rows ``idx`` (a slice, a list of ints or an int/bool tensor) as a new DataProto."""
        if isinstance(idx, slice):
            np_idx = np.arange(len(self))[idx]
        else:
            np_idx = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx)
            if np_idx.dtype == bool:
                np_idx = np.nonzero(np_idx)[0]
        t_idx = torch.as_tensor(np_idx, dtype=torch.long)
        batch = self.batch[t_idx] if self.batch is not None else None
        return DataProto(batch=batch, non_tensor={k: v[np_idx] for k, v in self.non_tensor.items()},
                         meta=dict(self.meta))

    def select(self, tensor_keys: Iterable[str] = (), non_tensor_keys: Iterable[str] = ()) -> "DataProto":
        """A view with only the named columns (the tensors are shared, not copied)."""
        tensor_keys = list(tensor_keys)
        batch = self.batch.select(*tensor_keys) if (self.batch is not None and tensor_keys) else None
        if batch is None and self.batch is not None:
            batch = TensorDict({}, batch_size=self.batch.batch_size)
        return DataProto(batch=batch, non_tensor={k: self.non_tensor[k] for k in non_tensor_keys},
                         meta=dict(self.meta))

    def chunk(self, n: int) -> list["DataProto"]:
        """Split into ``n`` contiguous parts of equal size.

        Raises:
            ValueError: if ``len(self)`` is not divisible by ``n``.
        """
        if n <= 0 or len(self) % n:
            raise ValueError(f"cannot split a batch of {len(self)} rows into {n} equal chunks")
        size = len(self) // n
        return [self.index(slice(i * size, (i + 1) * size)) for i in range(n)]

    def split(self, size: int) -> list["DataProto"]:
        """Contiguous parts of ``size`` rows (the last one may be shorter)."""
        return [self.index(slice(i, min(i + size, len(self)))) for i in range(0, len(self), size)]

    def repeat(self, n: int, interleave: bool = True) -> "DataProto":
        """Repeat every row ``n`` times; ``interleave`` keeps copies of one row contiguous (a GRPO group)."""
        idx = np.repeat(np.arange(len(self)), n) if interleave else np.tile(np.arange(len(self)), n)
        return self.index(idx)

    def union(self, other: "DataProto") -> "DataProto":
        """Add the columns of ``other`` (same rows) to this batch, in place; returns ``self``."""
        if len(other) != len(self):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        if other.batch is not None:
            for k in other.batch.keys():
                self[k] = other.batch[k]
        for k, v in other.non_tensor.items():
            self.non_tensor[k] = v
        self.meta.update(other.meta)
        return self

    def to(self, device: str | torch.device) -> "DataProto":
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    @staticmethod
    def concat(parts: Sequence["DataProto"]) -> "DataProto":
        """Concatenate batches row-wise; meta comes from the first part, except: keys starting with ``perf/max_``
        (per-rank peaks such as GPU memory), ``perf/worker_s/`` or ``perf/rollout_s/`` and the keys ``timing_gen_s``
        and :data:`CALL_SECONDS_META` (wall-clock seconds of one worker's call: a call over several workers lasts as
        long as its slowest) take the maximum over the parts that hold them, and ``rollout_gen_window`` (a worker's
        generation ``(start, end)``, seconds since the epoch) spans the earliest start to the latest end. The
        ``tool/*`` metrics are the first part's too: :meth:`concat_workers` joins them over several workers' results.

        Raises:
            ValueError: no parts, or parts whose non-tensor columns differ (the columns of both are named).
        """
        parts = [p for p in parts if p is not None]
        if not parts:
            raise ValueError("concat needs at least one batch")
        for i, p in enumerate(parts[1:], 1):
            if set(p.non_tensor) != set(parts[0].non_tensor):
                raise ValueError(f"concat: part {i} has non-tensor columns {sorted(p.non_tensor)}, part 0 has "
                                 f"{sorted(parts[0].non_tensor)}; join only batches with the same columns")
        batch = None
        if parts[0].batch is not None:
            batch = torch.cat([p.batch for p in parts], dim=0)
        non_tensor = {k: np.concatenate([p.non_tensor[k] for p in parts]) for k in parts[0].non_tensor}
        meta = dict(parts[0].meta)
        for k in {k for p in parts for k in p.meta if k.startswith(_MAX_META_PREFIXES) or k in _MAX_META_KEYS}:
            meta[k] = max(p.meta[k] for p in parts if k in p.meta)
        windows = [p.meta["rollout_gen_window"] for p in parts if "rollout_gen_window" in p.meta]
        if windows:
            meta["rollout_gen_window"] = (min(w[0] for w in windows), max(w[1] for w in windows))
        return DataProto(batch=batch, non_tensor=non_tensor, meta=meta)

    @staticmethod
    def concat_workers(parts: Sequence["DataProto"]) -> "DataProto":
        """Join the results of one call split over several workers (each part one worker's rows with that worker's
        ``meta``): :meth:`concat`, and the ``tool/*`` metrics joined over the workers (:func:`join_tool_metrics`:
        each key's smallest value, e.g. the weakest sandbox) instead of the first worker's.

        Raises:
            ValueError: as :meth:`concat`.
        """
        out = DataProto.concat(parts)
        out.meta.update(join_tool_metrics([p.meta for p in parts if p is not None]))
        return out
