"""The packed ("remove padding") forward of a patched model, with Ulysses SP: pack, forward, gather.

A padded micro-batch ``(B, L)`` goes into the model as one packed row ``(1, S)`` (every row's valid tokens, positions
restarting at 0 per row, right-padded to a multiple of the SP size), of which each SP rank runs its contiguous
chunk ``(1, S/sp)``. Per-token results are computed on the local chunk (logits are never gathered) and gathered
back into the batch's padded layout::

    from patches import apply_ulysses_patch, pack_batch, sp_forward
    model = apply_ulysses_patch(model, mesh.sp)                      # once, before deepspeed.initialize
    batch = pack_batch(model, input_ids, attention_mask, position_ids, device="cuda")
    out = sp_forward(model, batch)                                   # out.logits: (1, S/sp, V), this rank's tokens
    lp_local = torch.log_softmax(out.logits[0].float(), -1).gather(-1, batch.labels[:, None])[:, 0]   # (S/sp,)
    lp = batch.gather(lp_local)                                      # (B, L): lp[b, t] = log p(token t+1 | ..t)

All SP peers must pass the same batch. Nothing here reads the batch's meaning (prompts, responses): that is the
caller's (e.g. taking the response columns of ``lp``).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from patches.host import host_op_threads, to_device
from patches.packing import (bucket_padding, cu_seqlens_from_position_ids, pack_tensor, position_ids_from_cu_seqlens,
                             unpack_tensor, unpad_input)
from patches.sequence_parallel import (UlyssesGroup, current_ulysses_group, gather_outputs_and_unpad, pad_and_slice,
                                       pad_and_slice_inputs)
from patches.ulysses import ULYSSES_ATTN_IMPL, host_packed_forward, slice_decoder_inputs, ulysses_patched

__all__ = ["PackedBatch", "check_batch", "resolve_sp_group", "pack_batch", "sp_forward"]


@dataclass
class PackedBatch:
    """One micro-batch packed for :func:`sp_forward`, made by :func:`pack_batch`.

    Attributes:
        sp: the SP group it was packed for (size 1: no SP).
        inputs: keyword arguments of the model's forward, on the model's device: ``input_ids`` (this rank's chunk
            ``(1, S/sp)`` int64, or the whole row ``(1, S)`` for a model whose embeddings are built over the whole
            row, see :func:`pack_batch`), ``position_ids``, ``attention_mask=None``, ``use_cache=False``, and where
            applicable the row's boundaries (``cu_seq_lens_q``, ...) and image inputs.
        labels: ``(S/sp,)`` int64, the next token of each of this rank's tokens in the whole packed row (taken
            before the SP slice, so rank ``r``'s last token gets rank ``r+1``'s first). Meaningless at the last
            token of each row and at padding; :meth:`gather` puts those where the caller masks them anyway.
        indices: ``(nnz,)`` int64 flat indices into ``B * L`` of the valid tokens (see
            :func:`patches.packing.unpad_input`), on the model's device.
        batch_size, seqlen: ``B`` and ``L`` of the padded batch.
        pad: tokens after the ``nnz`` real ones in the row (shape-bucket padding, then SP padding).
        bounds: ``(cu_seqlens (num_seqs + 1,) int32 on the model's device, max_seqlen int)`` of the WHOLE padded
            row, for a host-packed batch (:func:`sp_forward` primes the patch with them); else None.
        slice_decoder: the whole row is in ``inputs`` and the decoder takes this rank's slice
            (:func:`sp_forward` runs the model under :func:`patches.ulysses.slice_decoder_inputs`).
    """

    sp: UlyssesGroup
    inputs: dict
    labels: torch.Tensor
    indices: torch.Tensor
    batch_size: int
    seqlen: int
    pad: int
    bounds: tuple | None = field(default=None, repr=False)
    slice_decoder: bool = False

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The unshard step: this rank's per-token values back to the padded batch layout.

        Args:
            x: ``(S/sp, *rest)`` any dtype, one entry per local token (e.g. float32 log-probs or values).

        Returns:
            ``(B, L, *rest)``: all-gathered over the SP group in rank order, padding dropped, scattered to the valid
            positions (0 elsewhere). Differentiable; the backward keeps this rank's slice times ``sp.scale``
            (see :func:`patches.sequence_parallel.gather_outputs_and_unpad` for why).
        """
        x = gather_outputs_and_unpad(x, 0, self.pad, self.sp)
        return unpack_tensor(x, self.indices, self.batch_size, self.seqlen)


def check_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> None:
    """Check the shapes of a padded batch: ``input_ids`` and ``attention_mask`` ``(B, L)``, ``position_ids``
    ``(B, L)`` or rotary position rows ``(B, C, L)``.

    Raises:
        ValueError: naming the tensor whose shape (or type) is wrong and the shape expected.
    """
    for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask), ("position_ids", position_ids)):
        rows = name == "position_ids" and isinstance(t, torch.Tensor) and t.dim() == 3  # (B, C, L) M-RoPE rows
        if not isinstance(t, torch.Tensor) or (t.dim() != 2 and not rows):
            alt = " or (batch, rows, seqlen)" if name == "position_ids" else ""
            raise ValueError(f"{name} must be a (batch, seqlen) tensor{alt}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        shape = (t.shape[0], t.shape[2]) if rows else tuple(t.shape)
        if shape != tuple(input_ids.shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(input_ids.shape)} like input_ids")


def resolve_sp_group(model: torch.nn.Module, sp: UlyssesGroup | None = None) -> UlyssesGroup:
    """The SP group a forward of ``model`` runs with: ``sp`` if given, else the group bound at patch time, else the
    active one (:meth:`UlyssesGroup.activate`; size 1 if none).

    Raises:
        ValueError: ``sp`` is not the group ``model`` was patched with.
    """
    state = getattr(model, "_ulysses_state", None)
    bound = state.group if state is not None else None
    if sp is None:
        return bound if bound is not None else current_ulysses_group()
    if bound is not None and (bound.group is not sp.group or bound.size != sp.size):
        raise ValueError(f"sp group (size {sp.size}) differs from the group the model was patched with "
                         f"(size {bound.size})")
    return sp


def pack_batch(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               position_ids: torch.Tensor, sp: UlyssesGroup | None = None, device=None,
               multi_modal_inputs: dict | None = None) -> PackedBatch:
    """Pack a padded micro-batch into this SP rank's share of one row, for :func:`sp_forward` on ``model``.

    Args:
        model: a model patched by :func:`patches.ulysses.apply_ulysses_patch` (required for ``sp.size > 1``; with
            size 1 an unpatched model gets the packed row as it is, and transformers' own attention finds the
            sequences from the positions).
        input_ids: ``(B, L)`` int64, any padding. attention_mask: ``(B, L)`` 0/1, 1 at valid tokens.
        position_ids: ``(B, L)`` int64, 0 at the first valid token of every row (``clamp(cumsum(mask) - 1, 0)``);
            or rotary position rows ``(B, C, L)`` of a multimodal model (Qwen2-VL's M-RoPE: temporal, height,
            width), whose text positions are then ``clamp(cumsum(attention_mask) - 1, min=0)``.
        sp: the SP group (default: :func:`resolve_sp_group`).
        device: the model's device when the inputs stay on the CPU: packing, the SP slice and the whole row's
            sequence boundaries are computed on the host and copied through pinned memory, so the forward makes no
            host sync (the boundaries reach the attention primed, or as keyword arguments on a model patched for a
            fixed SP size; rows padded to shape buckets after :func:`patches.patch_info.set_static_shapes`).
            None: everything on the inputs' device, the attention all-gathers the positions.
        multi_modal_inputs: the processor's image inputs of these rows (``pixel_values`` ``(patches, D)``,
            ``image_grid_thw`` ``(images, 3)``, ...), concatenated in row order.

    With image inputs or position rows the WHOLE padded row goes to the model (it merges image features into the
    text embeddings over the whole row; every SP rank encodes every image) and its decoder keeps this rank's slice
    (:func:`patches.ulysses.slice_decoder_inputs`); ``position_ids`` then go in as ``(1 + C, 1, S)``, row 0 the
    text positions. Text-only rows are sliced before the model (embeddings are token-wise).

    Raises:
        ValueError: bad shapes (:func:`check_batch`), positions not 0 at a row's first valid token, an SP group
            other than the bound one, or ``sp.size > 1`` with an unpatched model.
    """
    check_batch(input_ids, attention_mask, position_ids)
    sp = resolve_sp_group(model, sp)
    if sp.size > 1 and not ulysses_patched(model):  # (a DeepSpeed engine's own .config is DeepSpeed's)
        inner = getattr(model, "module", model)
        raise ValueError(f"sp={sp.size} needs a model patched by patches.ulysses.apply_ulysses_patch "
                         f"(attn implementation {ULYSSES_ATTN_IMPL!r}), got "
                         f"{getattr(inner.config, '_attn_implementation', None)!r}")
    if multi_modal_inputs or position_ids.dim() == 3:
        return _pack_full_row(input_ids, attention_mask, position_ids, sp, dict(multi_modal_inputs or {}), device)
    return _pack_sliced(model, input_ids, attention_mask, position_ids, sp, device)


def _pack_sliced(model, input_ids, attention_mask, position_ids, sp: UlyssesGroup, device) -> PackedBatch:
    """:func:`pack_batch` of text rows: the model gets this rank's chunk of the row."""
    dev = input_ids.device if device is None else torch.device(device)
    state = getattr(model, "_ulysses_state", None)
    host = input_ids.device.type == "cpu" and device is not None
    with (host_op_threads() if host else contextlib.nullcontext()):
        ids, _, indices, cu_seqlens, _ = unpad_input(input_ids, attention_mask)
        pos = pack_tensor(position_ids, indices).unsqueeze(0)
        starts = cu_seqlens[:-1][cu_seqlens.diff() > 0].long()
        if starts.numel() and bool((pos[0, starts] != 0).any()):
            raise ValueError("position_ids must be 0 at the first valid token of every row (expected "
                             "clamp(cumsum(attention_mask) - 1, min=0)); packed sequences are split where positions "
                             "are 0")
        labels = torch.roll(ids, shifts=-1, dims=1)  # next token in the whole packed row, before SP slicing
        bucket = 0  # CUDA graphs: pad the row to a shape bucket with fake sequences
        if host and state is not None and state.static_token_multiple:
            # a multiple of the SP size too, so that the SP padding below adds nothing
            fake = bucket_padding(ids.shape[1], int(starts.numel()), math.lcm(state.static_token_multiple, sp.size))
            if fake:
                bucket = sum(fake)
                fake_cu = torch.nn.functional.pad(torch.tensor(fake).cumsum(0), (1, 0))
                ids, labels = (torch.cat([t, t.new_zeros(1, bucket)], dim=1) for t in (ids, labels))
                pos = torch.cat([pos, position_ids_from_cu_seqlens(fake_cu)[None].to(pos.dtype)], dim=1)
        ids_local, pos_local, sp_pad = pad_and_slice_inputs(ids, pos, sp.size, sp.rank)
        labels_local, _ = pad_and_slice(labels, sp.size, sp.rank)
        bounds = None
        if host:
            # the boundaries of the whole padded row (what the attention would all-gather and scan on the device)
            full = torch.cat([pos[0], torch.arange(sp_pad, dtype=pos.dtype)]) if sp_pad else pos[0]
            cu_full, max_full = cu_seqlens_from_position_ids(full)
            ids_local, pos_local, labels_local, indices, cu_full = (
                to_device(t, dev) for t in (ids_local, pos_local, labels_local, indices, cu_full))
            bounds = (cu_full, max_full)
    # the whole row's boundaries also go in as keyword arguments, which torch.compile traces (patches.ulysses), when
    # the model was patched for this SP group (or for no SP)
    kw = state.attention_kwargs(*bounds, sp=sp) if bounds is not None and state is not None else {}
    inputs = dict(input_ids=ids_local, position_ids=pos_local, attention_mask=None, use_cache=False, **kw)
    return PackedBatch(sp, inputs, labels_local[0], indices, *input_ids.shape, bucket + sp_pad, bounds=bounds)


def _pack_full_row(input_ids, attention_mask, position_ids, sp: UlyssesGroup, mm: dict, device) -> PackedBatch:
    """:func:`pack_batch` of rows whose embeddings are built over the whole packed row (``mm``: the rows' image
    inputs) or with position rows ``(B, C, L)``: the WHOLE padded row goes in, ``position_ids`` ``(1 + C, 1, S)``
    (row 0 the text positions; ``(1, S)`` without rows), and the decoder keeps this rank's slice."""
    dev = input_ids.device if device is None else torch.device(device)
    rows = None
    if position_ids.dim() == 3:
        rows, position_ids = position_ids, torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)
    ids, _, indices, _, _ = unpad_input(input_ids, attention_mask)
    pos = pack_tensor(position_ids, indices).unsqueeze(0)
    if rows is not None:
        pos = torch.cat([pos, pack_tensor(rows.transpose(1, 2), indices).T.to(pos.dtype)])  # (1 + C, nnz)
    labels = torch.roll(ids, shifts=-1, dims=1)
    n = ids.shape[1]
    pad = (-n) % sp.size if n else sp.size
    if pad:  # the SP padding: a fake sequence of its own (positions 0..pad-1 in every row)
        ids, labels = (torch.cat([t, t.new_zeros(1, pad)], dim=1) for t in (ids, labels))
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype).expand(pos.shape[0], pad)], dim=1)
    labels_local, _ = pad_and_slice(labels, sp.size, sp.rank)
    pos = pos.unsqueeze(1) if rows is not None else pos  # (1 + C, 1, S) or (1, S)
    ids, pos, labels_local, indices = (to_device(t, dev) for t in (ids, pos, labels_local, indices))
    mm = {k: to_device(v, dev) if isinstance(v, torch.Tensor) else v for k, v in mm.items()}
    inputs = dict(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False, **mm)
    return PackedBatch(sp, inputs, labels_local[0], indices, *input_ids.shape, pad, slice_decoder=True)


def sp_forward(model: torch.nn.Module, batch: PackedBatch) -> Any:
    """Run ``model`` on this SP rank's share of ``batch`` (from :func:`pack_batch` with the same model).

    Makes ``batch.sp`` the active group, primes the patch with the whole row's boundaries (host-packed batches:
    no all-gather of positions, transformers' packed-sequence detection skipped), marks a new CUDA-graph step on
    a model with shape buckets, and calls ``model(**batch.inputs)``.

    Returns:
        the model's output for this rank's ``S/sp`` tokens: ``logits`` ``(1, S/sp, V)`` for a causal LM,
        ``(1, S/sp, num_labels)`` for a token-classification (value) head. Turn per-token values computed from
        them into ``(B, L, ...)`` with :meth:`PackedBatch.gather`.
    """
    sp = batch.sp
    state = getattr(model, "_ulysses_state", None)
    primed = batch.bounds is not None and state is not None
    with sp.activate(), (host_packed_forward() if primed else contextlib.nullcontext()), \
            (slice_decoder_inputs(sp) if batch.slice_decoder else contextlib.nullcontext()):
        if primed:
            state.prime(batch.inputs["position_ids"], state.resolve(), *batch.bounds)
        if not batch.slice_decoder and state is not None and state.static_token_multiple:
            torch.compiler.cudagraph_mark_step_begin()  # the previous micro-batch's graph outputs are consumed
        return model(**batch.inputs)
