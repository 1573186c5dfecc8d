"""Mini-batch and micro-batch splitting shared by the actor, critic and PRM workers.

Batch-size rule (verl's, stated once here): ``ppo_mini_batch_size`` counts prompts over the whole
data-parallel world; one optimizer step consumes ``ppo_mini_batch_size * rollout.n`` rows, i.e.
``ppo_mini_batch_size * n / dp`` rows on each data-parallel rank. ``*_micro_batch_size_per_gpu`` counts rows
of one forward/backward on one worker. With ``use_dynamic_bsz`` micro-batches are formed by a token budget
(``max_token_len`` per worker, x ``sp`` because a sequence-parallel rank holds 1/sp of the tokens), balanced so
that every data-parallel rank runs the same number of micro-batches.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from trainer.protocol import DataProto


def mini_batch_rows(ppo_mini_batch_size: int, n: int, dp_size: int, local_rows: int,
                    key: str = "ppo_mini_batch_size") -> int:
    """Rows of one mini-batch on one data-parallel rank (``key``: the mini-batch's config key, for messages).

    Raises:
        ValueError: when the mini-batch does not divide over the data-parallel ranks or the local batch.
    """
    total = ppo_mini_batch_size * n
    if total % dp_size:
        raise ValueError(f"{key}*n = {ppo_mini_batch_size}*{n} = {total} rows is not divisible by "
                         f"the data-parallel size {dp_size}")
    rows = total // dp_size
    if rows <= 0 or local_rows % rows:
        raise ValueError(f"a data-parallel rank holds {local_rows} rows, not a multiple of its mini-batch of "
                         f"{rows} rows ({key}={ppo_mini_batch_size}, n={n}, dp={dp_size})")
    return rows


def micro_batches(data: DataProto, micro_batch_size: int, use_dynamic_bsz: bool = False,
                  max_token_len: int | None = None, dp_group=None) -> list[DataProto]:
    """Split a (mini-)batch into micro-batches by row count or, with ``use_dynamic_bsz``, by token budget.

    Token counts come from ``attention_mask`` (B, L). Every row lands in exactly one micro-batch.
    """
    if not use_dynamic_bsz:
        if micro_batch_size <= 0:
            raise ValueError(f"micro batch size {micro_batch_size} must be positive")
        return data.split(micro_batch_size)
    from trainer.seqlen_balancing import rearrange_micro_batches

    seqlens = data["attention_mask"].sum(-1).tolist()
    if dp_group is None and dist.is_available() and dist.is_initialized():
        dp_group = dist.group.WORLD  # every rank must run the same number of backward passes
    groups = rearrange_micro_batches(seqlens, max_token_len, dp_group=dp_group)
    return [data.index(idx) for idx in groups if len(idx)]


def global_count(value: float, device: torch.device, group=None) -> float:
    """Sum ``value`` over the ranks of ``group`` (all ranks when None); returns a Python float."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return float(t.item())


def global_max(value: float, device: torch.device, group=None) -> float:
    """The largest ``value`` over the ranks of ``group`` (all ranks when None); returns a Python float."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())
