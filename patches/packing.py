"""Sequence packing ("remove padding"): turn a padded ``(batch, seqlen)`` batch into one packed row and back.

Packed layout (the one flash-attention's varlen kernels and :mod:`patches.ulysses` expect):

* ``input_ids_rmpad``  ``(1, nnz)`` int64 -- the valid tokens of every row, concatenated row by row;
* ``position_ids_rmpad`` ``(1, nnz)`` int64 -- positions that restart at 0 at the first token of every row,
  so that the attention kernel can find every sequence boundary (``cu_seqlens``) from them alone;
* ``indices`` ``(nnz,)`` int64 -- flat indices into ``(batch * seqlen)`` of the valid tokens, used to unpack.

``nnz`` is the number of valid tokens (``attention_mask.sum()``). Works for left padding, right padding, both,
and rows with no valid token at all. Nothing here communicates; all functions are differentiable where they
move float tensors (``pack_tensor`` / ``unpack_tensor`` are index ops).
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "unpad_input", "pack_tensor", "unpack_tensor", "cu_seqlens_from_position_ids",
    "position_ids_from_cu_seqlens", "pack_loss_spans", "bucket_padding", "token_bucket",
    "BUCKETS_PER_DOUBLING",
]


def _check_2d(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a 2-D (batch, seqlen) tensor, got {shape}")


def unpad_input(input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Remove the padding of a batch and pack its rows into one row.

    Args:
        input_ids: ``(batch, seqlen)`` int64 token ids (left-, right- or both-padded).
        attention_mask: ``(batch, seqlen)`` 0/1 (any int/bool dtype); 1 marks a valid token.

    Returns:
        ``(input_ids_rmpad, position_ids_rmpad, indices, cu_seqlens, max_seqlen)`` with
        ``input_ids_rmpad`` ``(1, nnz)`` int64, ``position_ids_rmpad`` ``(1, nnz)`` int64 restarting at 0 per row,
        ``indices`` ``(nnz,)`` int64 flat indices into ``batch * seqlen``, ``cu_seqlens`` ``(batch + 1,)`` int32
        cumulative valid lengths (rows with no token give an empty segment), ``max_seqlen`` python int.

    Raises:
        ValueError: if the shapes are not 2-D or disagree.
    """
    _check_2d("input_ids", input_ids)
    _check_2d("attention_mask", attention_mask)
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                         "must have the same (batch, seqlen) shape")
    mask = attention_mask.bool()
    seqlens = mask.sum(dim=1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    ids = input_ids.flatten()[indices].unsqueeze(0)
    pos = position_ids_from_cu_seqlens(cu_seqlens, total=indices.numel()).unsqueeze(0)
    return ids, pos, indices, cu_seqlens, max_seqlen


#: token buckets per doubling of a packed row's length (:func:`token_bucket`): at most 1/8 of a bucket is padding
BUCKETS_PER_DOUBLING = 8


def token_bucket(nnz: int, multiple: int) -> int:
    """The smallest token bucket that holds ``nnz`` tokens: a multiple of ``multiple`` (at least ``multiple``) whose
    count of multiples ``u`` is below :data:`BUCKETS_PER_DOUBLING` or keeps only its top 4 bits (``8..15 << k``):
    8 buckets per doubling, so the padding is less than 1/8 of the bucket (or less than ``multiple`` tokens) and a
    run whose packed rows range over ``[L, 2L]`` tokens meets at most 9 shapes (linear buckets of ``multiple``
    tokens would give ``L / multiple + 1``). Each shape is one CUDA-graph recording (and one warm-up) per compiled
    layer, forward and backward.

    Args:
        nnz: tokens to hold (>= 0). multiple: the bucket unit in tokens (>= 1).

    Raises:
        ValueError: ``multiple < 1`` or ``nnz < 0``.
    """
    if int(multiple) < 1 or int(nnz) < 0:
        raise ValueError(f"token_bucket needs multiple >= 1 and nnz >= 0, got nnz={nnz}, multiple={multiple}")
    units = max(1, -(-int(nnz) // int(multiple)))
    shift = max(0, units.bit_length() - BUCKETS_PER_DOUBLING.bit_length())
    return (-(-units >> shift) << shift) * int(multiple)


def bucket_padding(nnz: int, num_seqs: int, multiple: int) -> list[int]:
    """Lengths (tokens) of the fake sequences that pad a packed row to a shape bucket: the padded row holds
    :func:`token_bucket` tokens (a multiple of ``multiple``, 8 buckets per doubling) and a power-of-two count of
    sequences (real + fake), so that a row's shapes (tokens, ``cu_seqlens``) take few distinct values (CUDA graphs
    record one graph per shape). Each fake sequence has at least one token and restarts its positions at 0, so it
    never attends to a real one.

    Args:
        nnz: real tokens in the row. num_seqs: real sequences in it. multiple: token bucket unit.

    Returns:
        ``[]`` when the row already fits a bucket, else the fake sequences' lengths. The padded row is the smallest
        bucket that holds ``nnz`` tokens plus one token for every fake sequence.

    Raises:
        ValueError: ``multiple < 1`` or negative counts.
    """
    if int(multiple) < 1 or nnz < 0 or num_seqs < 0:
        raise ValueError(f"bucket_padding needs multiple >= 1 and counts >= 0, got nnz={nnz}, num_seqs={num_seqs}, "
                         f"multiple={multiple}")
    nnz, num_seqs = int(nnz), int(num_seqs)
    total = token_bucket(nnz, multiple)
    if total == nnz and num_seqs & (num_seqs - 1) == 0:
        return []
    fake = (1 << num_seqs.bit_length()) - num_seqs  # next power of two above num_seqs, minus num_seqs
    if total - nnz < fake:
        total = token_bucket(nnz + fake, multiple)
    return [1] * (fake - 1) + [total - nnz - fake + 1]


def position_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """Positions ``(total,)`` int64 that count 0, 1, ... inside each segment ``[cu[i], cu[i+1])``.

    Raises:
        ValueError: if ``cu_seqlens`` is not 1-D, does not start at 0, or decreases.
    """
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens must be 1-D and start at 0, got {cu_seqlens.tolist()}")
    lens = cu_seqlens.diff().long()
    if (lens < 0).any():
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu_seqlens.tolist()}")
    total = int(cu_seqlens[-1]) if total is None else total
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lens, output_size=total)
    return torch.arange(total, device=cu_seqlens.device) - starts


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sequence boundaries of a packed row: a new sequence starts wherever ``position_ids == 0``.

    Args:
        position_ids: ``(total,)`` or ``(1, total)`` int; must start with 0 (the first token opens a sequence).

    Returns:
        ``(cu_seqlens (num_seqs + 1,) int32, max_seqlen int)``.

    Raises:
        ValueError: if the first position is not 0 or the tensor has more than one row.
    """
    if position_ids.dim() == 2:
        if position_ids.shape[0] != 1:
            raise ValueError(f"packed position_ids must have batch 1, got shape {tuple(position_ids.shape)}")
        position_ids = position_ids[0]
    if position_ids.numel() == 0:
        return torch.zeros(1, dtype=torch.int32, device=position_ids.device), 0
    starts = torch.nonzero(position_ids == 0, as_tuple=False).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("packed position_ids must start with 0 (each packed sequence restarts at 0); "
                         f"got first value {int(position_ids[0])}")
    total = torch.tensor([position_ids.numel()], device=position_ids.device)
    cu = torch.cat([starts, total]).to(torch.int32)
    return cu, int(cu.diff().max().item())


def pack_tensor(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Gather the valid positions of a padded tensor.

    Args:
        x: ``(batch, seqlen, *rest)`` any dtype.
        indices: ``(nnz,)`` from :func:`unpad_input`.

    Returns:
        ``(nnz, *rest)`` (differentiable w.r.t. ``x``).
    """
    if x.dim() < 2:
        raise ValueError(f"pack_tensor expects (batch, seqlen, ...), got shape {tuple(x.shape)}")
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])[indices]


def unpack_tensor(x: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int, fill: float = 0.0) -> torch.Tensor:
    """Inverse of :func:`pack_tensor`: scatter ``(nnz, *rest)`` back to ``(batch, seqlen, *rest)``.

    Padding positions get ``fill``. Differentiable w.r.t. ``x`` (``index_put`` on a fresh tensor).

    Raises:
        ValueError: if ``x.shape[0] != indices.numel()``.
    """
    if x.shape[0] != indices.numel():
        raise ValueError(f"unpack_tensor: x has {x.shape[0]} rows but indices has {indices.numel()} entries")
    out = torch.full((batch * seqlen, *x.shape[1:]), fill, dtype=x.dtype, device=x.device)
    out = out.index_put((indices,), x)
    return out.view(batch, seqlen, *x.shape[1:])


def _sample_spans(entry, i: int) -> list[tuple[int, int]]:
    """One sample's loss spans: a ``(start, end)`` pair, or a sequence of them (one per assistant turn)."""
    def is_pair(x) -> bool:
        return isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(v, int) for v in x)

    if is_pair(entry):
        return [tuple(entry)]
    if isinstance(entry, (tuple, list)) and all(is_pair(x) for x in entry):
        return [tuple(x) for x in entry]
    raise ValueError(f"spans of sample {i}: {entry!r}; expected (start, end) or a list of (start, end) pairs")


def pack_loss_spans(sample_lengths: Sequence[int], local_spans: Sequence,
                    device: torch.device | str = "cpu") -> tuple[list[tuple[int, int]], torch.Tensor]:
    """Offset per-sample loss spans into a packed stream, and build the packed loss mask.

    Sample ``i`` occupies ``[offset_i, offset_i + len_i)`` with ``offset_i = sum(len_0 .. len_{i-1})`` (the
    cumulative length of the preceding samples -- not the end of the previous sample's last span, a bug seen in
    other packers). A local span ``(start, end)`` is half-open, ``0 <= start <= end <= len_i``; a sample's entry is
    one span or a list of them (a multi-turn sample: one per assistant turn).

    Example: lengths ``[6, 5, 7]``, spans ``(3,5), [(0,1), (2,4)], (4,6)`` -> ``(3,5), (6,7), (8,10), (15,17)``,
    mask sum 7.

    Returns:
        ``(packed_spans, loss_mask)``: the spans in sample order, ``loss_mask`` ``(sum(lengths),)`` float32, 1
        inside the spans.

    Raises:
        ValueError: on a length/entry count mismatch, a negative length, an entry that is not a span or a list of
            spans, or a span outside its sample.
    """
    if len(sample_lengths) != len(local_spans):
        raise ValueError(f"got {len(sample_lengths)} sample lengths but spans for {len(local_spans)} samples")
    packed, offset = [], 0
    for i, (n, entry) in enumerate(zip(sample_lengths, local_spans)):
        if n < 0:
            raise ValueError(f"sample {i} has negative length {n}")
        for s, e in _sample_spans(entry, i):
            if not 0 <= s <= e <= n:
                raise ValueError(f"span {(s, e)} of sample {i} is outside [0, {n}] or reversed")
            packed.append((offset + s, offset + e))
        offset += n
    mask = torch.zeros(offset, dtype=torch.float32, device=device)
    for s, e in packed:
        mask[s:e] = 1.0
    return packed, mask
