"""Balancing sequence lengths across data-parallel ranks and into token-budget micro-batches.

* :func:`get_seqlen_balanced_partitions` splits a batch over ``k`` DP ranks so that each rank gets about the same
  number of tokens (greedy "largest first" = LPT scheduling, Graham 1969: each sequence, longest first, goes to
  the partition with the fewest tokens that still has room). verl uses Karmarkar-Karp; LPT is within 4/3 of the
  optimum and simpler to read.
* :func:`rearrange_micro_batches` packs a rank's sequences into micro-batches of at most ``max_token_len`` tokens
  (first-fit decreasing); a longer sequence gets a micro-batch of its own (never dropped). With a ``dp_group``,
  all ranks agree on the same number of micro-batches (``all_reduce(MAX)``) so gradient accumulation steps match.

Pure Python on lists of ints, except the single ``all_reduce`` in :func:`rearrange_micro_batches`.
"""
from __future__ import annotations

import heapq
from typing import Sequence

__all__ = ["get_seqlen_balanced_partitions", "balance_batch", "rearrange_micro_batches", "get_reverse_idx",
           "log_seqlen_unbalance"]


def _check_seqlens(seqlens: Sequence[int]) -> list[int]:
    out = [int(s) for s in seqlens]
    bad = [s for s in out if s < 0]
    if bad:
        raise ValueError(f"sequence lengths must be >= 0, got {bad[:5]}")
    return out


def get_seqlen_balanced_partitions(seqlens: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """Partition indices ``0..len(seqlens)-1`` into ``k`` groups with balanced token sums.

    Args:
        seqlens: token count of each sequence (e.g. ``attention_mask.sum(-1).tolist()``).
        k: number of partitions (DP ranks).
        equal_size: if True every partition gets exactly ``len(seqlens) / k`` sequences.
    Returns:
        ``k`` lists of indices, each sorted ascending; every index appears exactly once; every partition is
        non-empty.
    Raises:
        ValueError: ``k < 1``; fewer sequences than ``k``; ``equal_size`` and ``len(seqlens) % k != 0``.
    """
    lens = _check_seqlens(seqlens)
    n = len(lens)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"cannot split {n} sequences into {k} non-empty partitions")
    if equal_size and n % k:
        raise ValueError(f"equal_size=True needs len(seqlens) divisible by k, got {n} sequences and k={k}")
    cap = n // k if equal_size else n
    order = sorted(range(n), key=lambda i: (-lens[i], i))
    parts: list[list[int]] = [[] for _ in range(k)]
    sums = [0] * k
    # the last k sequences (shortest) are placed so that no partition stays empty
    for pos, i in enumerate(order):
        remaining = n - pos
        empty = [p for p in range(k) if not parts[p]]
        candidates = empty if len(empty) >= remaining else [p for p in range(k) if len(parts[p]) < cap]
        p = min(candidates, key=lambda q: (sums[q], len(parts[q]), q))
        parts[p].append(i)
        sums[p] += lens[i]
    return [sorted(p) for p in parts]


def _split_in_two(items: list[int], lens: list[int]) -> tuple[list[int], list[int]]:
    a, b, sa, sb = [], [], 0, 0
    for i in sorted(items, key=lambda j: (-lens[j], j)):
        if sa <= sb:
            a.append(i)
            sa += lens[i]
        else:
            b.append(i)
            sb += lens[i]
    return a, b


def rearrange_micro_batches(seqlens: Sequence[int], max_token_len: int, dp_group=None) -> list[list[int]]:
    """Group sequence indices into micro-batches of at most ``max_token_len`` tokens (dynamic batch size).

    First-fit decreasing: longest sequence first, into the first micro-batch with room. A sequence longer than
    ``max_token_len`` gets a micro-batch of its own. When ``dp_group`` (a ``torch.distributed`` process group,
    e.g. ``torch.distributed.group.WORLD``) is given, the number of micro-batches is ``all_reduce(MAX)``-ed over
    it and the fullest micro-batches are split until every rank has that many (all ranks then run the same
    number of forward/backward passes).

    Returns:
        list of micro-batches, each a sorted list of indices; every index appears exactly once; micro-batches
        are ordered by their smallest index. Use :func:`get_reverse_idx` on the concatenation to restore order.
    Raises:
        ValueError: ``max_token_len < 1``; the agreed number of micro-batches exceeds this rank's sequences.
    """
    lens = _check_seqlens(seqlens)
    if max_token_len < 1:
        raise ValueError(f"max_token_len must be >= 1, got {max_token_len}")
    bins: list[list[int]] = []
    totals: list[int] = []
    for i in sorted(range(len(lens)), key=lambda j: (-lens[j], j)):
        for b in range(len(bins)):
            if totals[b] + lens[i] <= max_token_len:
                bins[b].append(i)
                totals[b] += lens[i]
                break
        else:
            bins.append([i])
            totals.append(lens[i])
    target = len(bins)
    if dp_group is not None:
        import torch
        import torch.distributed as dist

        device = "cpu"
        if dist.get_backend(dp_group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        t = torch.tensor([target], dtype=torch.long, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=dp_group)
        target = int(t.item())
    if target > len(lens):
        raise ValueError(f"the data-parallel group needs {target} micro-batches but this rank has only "
                         f"{len(lens)} sequences; balance sequences across ranks first")
    # split the fullest multi-sequence micro-batch until we have `target` of them (splitting never exceeds the budget)
    heap = [(-totals[b], b) for b in range(len(bins)) if len(bins[b]) > 1]
    heapq.heapify(heap)
    while len(bins) < target:
        _, b = heapq.heappop(heap)
        first, second = _split_in_two(bins[b], lens)
        bins[b] = first
        bins.append(second)
        for idx in (b, len(bins) - 1):
            if len(bins[idx]) > 1:
                heapq.heappush(heap, (-sum(lens[i] for i in bins[idx]), idx))
    out = [sorted(b) for b in bins]
    return sorted(out, key=lambda b: b[0])


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: ``out[idx_map[i]] = i`` (restore the original order after reordering)."""
    out = [0] * len(idx_map)
    for pos, i in enumerate(idx_map):
        out[i] = pos
    return out


def log_seqlen_unbalance(seqlens: Sequence[int], partitions: list[list[int]], prefix: str = "global_seqlen"
                         ) -> dict[str, float]:
    """Token-balance metrics: ``{prefix}/min|max|minmax_diff`` for contiguous equal chunks (before balancing),
    ``{prefix}/balanced_min|balanced_max`` for ``partitions``, and ``{prefix}/mean`` (tokens per partition)."""
    lens = _check_seqlens(seqlens)
    k = len(partitions)
    size = len(lens) // k if k else 0
    before = [sum(lens[i * size:(i + 1) * size]) for i in range(k)]
    after = [sum(lens[i] for i in p) for p in partitions]
    return {f"{prefix}/min": float(min(before)), f"{prefix}/max": float(max(before)),
            f"{prefix}/minmax_diff": float(max(before) - min(before)),
            f"{prefix}/balanced_min": float(min(after)), f"{prefix}/balanced_max": float(max(after)),
            f"{prefix}/mean": float(sum(after) / k)}


def balance_batch(batch, dp: int):
    """``batch`` (a :class:`trainer.protocol.DataProto` with ``attention_mask`` (B, T)) with its rows reordered so
    that each of the ``dp`` equal, contiguous slices the data-parallel dispatch hands out holds about the same
    number of tokens (:func:`get_seqlen_balanced_partitions`, equal sizes); ``batch`` itself when ``dp`` is 1.

    Raises:
        ValueError: B is not a multiple of ``dp``.
    """
    import numpy as np

    if dp == 1:
        return batch
    parts = get_seqlen_balanced_partitions(batch["attention_mask"].sum(-1).tolist(), k=dp, equal_size=True)
    return batch.index(np.concatenate([np.asarray(sorted(p)) for p in parts]))
