"""The packed (remove-padding, optionally Ulysses-SP) forward used by the actor, ref, critic and PRM workers.

Batch layout (see ``trainer/protocol.py``): ``input_ids = cat(prompts, responses)`` of shape ``(B, L)``, prompts
left-padded, responses right-padded, the response occupying the last ``R`` columns; ``position_ids =
clamp(cumsum(attention_mask) - 1, min=0)``. The log-prob of response token ``j`` (column ``L-R+j``) comes from the
logits at column ``L-R+j-1``, so results are the ``[:, -R-1:-1]`` columns of the per-position "next-token" values.

Packed path (``use_remove_padding=True``), per micro-batch (verl ``dp_actor._forward_micro_batch``):
unpad -> labels = packed ids rolled by -1 (taken on the WHOLE packed row, before SP slicing) -> pad to a multiple
of sp and slice this rank's chunk -> model forward on ``(1, L/sp)`` -> log-probs/entropy on the local chunk (logits
are never gathered) -> all-gather over the SP group (backward scales by sp, see ``patches.ulysses``) -> unpad to
``(B, L)`` -> response columns.

Value head (critic / PRM value): ``AutoModelForTokenClassification`` with ``num_labels=1`` (and
``classifier_dropout=0.0``): a stock transformers class (Llama/Qwen2/Qwen3/Mistral ``...ForTokenClassification``),
so ``save_pretrained`` / ``from_pretrained`` round-trip it and the ``score`` Linear(hidden, 1) is exported as is.
"""
from __future__ import annotations

import contextlib
import math

import torch

from patches.packing import (bucket_padding, cu_seqlens_from_position_ids, pack_tensor, position_ids_from_cu_seqlens,
                             unpack_tensor, unpad_input)
from patches.ulysses import (ULYSSES_ATTN_IMPL, UlyssesGroup, current_ulysses_group, gather_outputs_and_unpad,
                             host_packed_forward, pad_and_slice, pad_and_slice_inputs, slice_decoder_inputs,
                             ulysses_patched)

__all__ = ["forward_log_probs", "forward_values", "log_probs_from_logits", "use_compiled_log_probs", "to_device"]


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """Copy ``x`` to ``device`` without waiting for the GPU's queue.

    A host tensor goes through pinned memory with ``non_blocking=True`` (torch's plain ``.to("cuda")`` from pageable
    memory synchronises the stream, which stalls the GPU at every micro-batch); anything else is ``x.to(device)``.
    ``device=None`` returns ``x``.
    """
    if device is None:
        return x
    device = torch.device(device)
    if x.device.type == "cpu" and device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


@contextlib.contextmanager
def host_op_threads(n: int = 1):
    """Run the block's CPU tensor ops on ``n`` intra-op threads, then restore the previous count.

    The host-side packing of a micro-batch (a few ops on ``(batch, seq_len)`` int64 tensors) gains nothing from
    intra-op parallelism, and with a large thread pool its ops wait for the pool: in a profiled actor update on one
    H200 machine (16 cores, CUDA graphs) the GPU's longest idle gaps were spent in such host ops (``aten::index``,
    ``repeat_interleave``, ``diff``); one thread raised the update's MFU from 38.0% to 42.2-42.8% there (16
    micro-batches of 4k tokens per step, same machine), and on a 2-core box the packing of a 4,096-token micro-batch
    took 24 ms on 2 threads and 0.2 ms on 1 (re-measured: 17.8 vs 0.65 ms with both cores busy with other
    processes, about 0.2 ms either way on an idle box; docs/benchmarks.md, session 8). Ray workers with the default
    ``trainer.cpus_per_worker=1`` already run one thread.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"host_op_threads needs n >= 1, got {n}")
    prev = torch.get_num_threads()
    if prev == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _lp_forward_chunk(x: torch.Tensor, labels: torch.Tensor, inv_t: float, want_entropy: bool):
    """Float32 ``(log_prob, entropy or empty, lse)`` of one ``(n, V)`` chunk (no autograd)."""
    z = x.float() * inv_t
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not want_entropy:
        return lp, lse.new_zeros(0), lse
    ent = lse - (torch.exp(z - lse.unsqueeze(-1)) * z).sum(-1)
    return lp, ent, lse


def _lp_backward_chunk(x: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor,
                       g_lp: torch.Tensor, g_ent: torch.Tensor, inv_t: float, want_entropy: bool) -> torch.Tensor:
    """Gradient w.r.t. one ``(n, V)`` chunk of logits, in the logits' dtype (no autograd).

    With ``z = x / T``, ``p = softmax(z)``, ``E = sum(p z) = lse - H``:
    ``d lp / d z = onehot(label) - p`` and ``d H / d z = p (E - z)``; ``d / d x = (d / d z) / T``.
    """
    z = x.float() * inv_t
    p = torch.exp(z - lse.unsqueeze(-1))
    grad = -p * g_lp.unsqueeze(-1)
    if want_entropy:
        e = (lse - ent).unsqueeze(-1)
        grad = grad + g_ent.unsqueeze(-1) * p * (e - z)
    grad = grad.scatter_add(-1, labels.unsqueeze(-1), g_lp.unsqueeze(-1))
    return (grad * inv_t).to(x.dtype)


_KERNELS = {"forward": _lp_forward_chunk, "backward": _lp_backward_chunk}


def use_compiled_log_probs(enable: bool = True) -> None:
    """Run the per-chunk log-prob math of :func:`log_probs_from_logits` through ``torch.compile`` (one fused kernel
    per pass instead of several elementwise passes over the ``(chunk, V)`` logits), or back to eager.

    Process-wide; the compiled functions have no autograd (the backward is written by hand), so compiling them is
    safe under DeepSpeed and Ulysses. Shapes are dynamic (``dynamic=True``) so every chunk length reuses one graph.
    """
    if enable:
        _KERNELS["forward"] = torch.compile(_lp_forward_chunk, dynamic=True)
        _KERNELS["backward"] = torch.compile(_lp_backward_chunk, dynamic=True)
    else:
        _KERNELS["forward"], _KERNELS["backward"] = _lp_forward_chunk, _lp_backward_chunk


class _ChunkedLogProbs(torch.autograd.Function):
    """Log-probs and entropy of ``(N, V)`` logits in float32 chunks, with a hand-written backward.

    Forward saves only the per-token ``logsumexp`` and entropy ``(N,)`` besides the logits the graph already holds;
    backward recomputes ``softmax`` chunk by chunk. No float32 copy of the whole ``(N, V)`` logits is ever alive,
    and each pass reads the logits once (verl's fused log-prob kernels follow the same idea).
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature: float, want_entropy: bool, chunk_size: int):
        inv_t = 1.0 / temperature
        lps, ents, lses = [], [], []
        for s in range(0, logits.shape[0], chunk_size):
            lp, ent, lse = _KERNELS["forward"](logits[s:s + chunk_size], labels[s:s + chunk_size], inv_t,
                                               want_entropy)
            lps.append(lp)
            ents.append(ent)
            lses.append(lse)
        lp, lse = torch.cat(lps), torch.cat(lses)
        ent = torch.cat(ents) if want_entropy else lp.new_zeros(0)
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.inv_t, ctx.want_entropy, ctx.chunk_size = inv_t, want_entropy, chunk_size
        ctx.mark_non_differentiable(lse)
        return lp, ent, lse

    @staticmethod
    def backward(ctx, g_lp, g_ent, _g_lse):
        logits, labels, lse, ent = ctx.saved_tensors
        n = logits.shape[0]
        g_lp = torch.zeros(n, device=logits.device) if g_lp is None else g_lp.float()
        want_ent = ctx.want_entropy and g_ent is not None
        g_ent = g_ent.float() if want_ent else g_lp
        grad = torch.empty_like(logits)
        c = ctx.chunk_size
        for s in range(0, n, c):
            grad[s:s + c] = _KERNELS["backward"](logits[s:s + c], labels[s:s + c], lse[s:s + c],
                                                 ent[s:s + c] if want_ent else lse[s:s + c], g_lp[s:s + c],
                                                 g_ent[s:s + c], ctx.inv_t, want_ent)
        return grad, None, None, None, None


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                          calculate_entropy: bool = False, chunk_size: int = 1024):
    """Per-token log-probs (and entropy) of ``labels`` under ``softmax(logits / temperature)``, memory-aware.

    ``log_prob = z[label] - logsumexp(z)`` and ``entropy = logsumexp(z) - sum(softmax(z) * z)`` with
    ``z = logits / temperature``, computed in float32 one chunk of ``chunk_size`` tokens at a time, forward and
    backward (a hand-written backward: ``d lp/dz = onehot - p``, ``d H/dz = p (E[z] - z)``), so no float32 copy
    of the ``(N, V)`` logits is kept. ``use_compiled_log_probs`` fuses each chunk's math with ``torch.compile``.

    Args:
        logits: ``(N, V)`` any float dtype. labels: ``(N,)`` int64 in ``[0, V)``.

    Returns:
        ``(log_probs (N,) float32, entropy (N,) float32 or None)``; differentiable w.r.t. ``logits``.

    Raises:
        ValueError: on shape mismatch or a non-positive temperature / chunk size.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"expected logits (N, V) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if temperature <= 0 or chunk_size <= 0:
        raise ValueError(f"temperature ({temperature}) and chunk_size ({chunk_size}) must be > 0")
    if logits.shape[0] == 0:
        empty = logits.new_zeros(0, dtype=torch.float32)
        return empty, (empty if calculate_entropy else None)
    lp, ent, _ = _ChunkedLogProbs.apply(logits, labels, float(temperature), bool(calculate_entropy), int(chunk_size))
    return lp, (ent if calculate_entropy else None)


def _check_batch(input_ids, attention_mask, position_ids, response_length):
    for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask), ("position_ids", position_ids)):
        rows = name == "position_ids" and isinstance(t, torch.Tensor) and t.dim() == 3  # (B, C, L) M-RoPE rows
        if not isinstance(t, torch.Tensor) or (t.dim() != 2 and not rows):
            raise ValueError(f"{name} must be a (batch, seqlen) tensor{' or (batch, rows, seqlen)' * (name == 'position_ids')}"
                             f", got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        shape = (t.shape[0], t.shape[2]) if rows else tuple(t.shape)
        if shape != tuple(input_ids.shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(input_ids.shape)} like input_ids")
    if not 0 < response_length < input_ids.shape[1]:
        raise ValueError(f"response_length must be in [1, seqlen={input_ids.shape[1]}), got {response_length}")


def _resolve_sp(model, sp: UlyssesGroup | None, use_remove_padding: bool) -> UlyssesGroup:
    state = getattr(model, "_ulysses_state", None)
    bound = state.group if state is not None else None
    if sp is None:
        sp = bound if bound is not None else current_ulysses_group()
    elif bound is not None and (bound.group is not sp.group or bound.size != sp.size):
        raise ValueError(f"sp group (size {sp.size}) differs from the group the model was patched with "
                         f"(size {bound.size})")
    if sp.size > 1:
        if not use_remove_padding:
            raise ValueError("ulysses sequence parallelism (sp > 1) needs use_remove_padding=True")
        if not ulysses_patched(model):  # (a DeepSpeed engine's own .config is DeepSpeed's; the decoder's is read)
            inner = getattr(model, "module", model)
            raise ValueError(f"sp={sp.size} needs a model patched by patches.ulysses.apply_ulysses_patch "
                             f"(attn implementation {ULYSSES_ATTN_IMPL!r}), got "
                             f"{getattr(inner.config, '_attn_implementation', None)!r}")
    return sp


def _packed_forward(model, input_ids, attention_mask, position_ids, sp: UlyssesGroup, device=None):
    """Model forward on this rank's slice of the packed batch.

    With ``device`` set and the inputs on the CPU, the packing (indices, the position check, labels, SP slicing and
    the sequence boundaries the patched attention needs) runs on the CPU and only the packed rows are copied, so the
    forward makes no host sync. Returns ``(output, labels_local (L/sp,), pad, indices (nnz,))`` on the model's
    device."""
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
        bucket = 0  # CUDA graphs (trainer.workers.kernels): pad the row to a shape bucket with fake sequences
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
        pad = bucket + sp_pad  # the row is [real tokens, bucket padding, SP padding]
        bounds = None
        if host:
            # the boundaries of the whole padded row (what the attention would all-gather and scan on the device)
            full = torch.cat([pos[0], torch.arange(sp_pad, dtype=pos.dtype)]) if sp_pad else pos[0]
            cu_full, max_full = cu_seqlens_from_position_ids(full)
            ids_local, pos_local, labels_local, indices, cu_full = (
                to_device(t, dev) for t in (ids_local, pos_local, labels_local, indices, cu_full))
            bounds = (cu_full, max_full)
    primed = bounds is not None and state is not None
    # the whole row's boundaries also go in as keyword arguments, which torch.compile traces (patches.ulysses), when
    # the model was patched for this SP group (or for no SP)
    kw = state.attention_kwargs(*bounds, sp=sp) if primed else {}
    with sp.activate(), (host_packed_forward() if primed else contextlib.nullcontext()):
        if primed:
            state.prime(pos_local, state.resolve(), *bounds)
        if state is not None and state.static_token_multiple:
            torch.compiler.cudagraph_mark_step_begin()  # the previous micro-batch's graph outputs are consumed
        out = model(input_ids=ids_local, position_ids=pos_local, attention_mask=None, use_cache=False, **kw)
    return out, labels_local[0], pad, indices


def _full_row_forward(model, input_ids, attention_mask, position_ids, sp: UlyssesGroup, mm: dict, device=None):
    """:func:`_packed_forward` for rows whose embeddings are built over the whole packed row (``mm``: the rows' image
    inputs, concatenated in row order) or with position rows ``(B, C, L)`` (M-RoPE). The WHOLE padded row goes into
    the model, ``position_ids`` ``(1 + C, 1, S)`` (row 0 the text positions; ``(1, S)`` without rows); its decoder
    keeps this SP rank's slice (``slice_decoder_inputs``); every SP rank encodes every image (vision tower replicated)."""
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
    with sp.activate(), slice_decoder_inputs(sp):
        out = model(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False, **mm)
    return out, labels_local[0], pad, indices


def forward_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                      response_length: int, temperature: float = 1.0, calculate_entropy: bool = False,
                      use_remove_padding: bool = True, sp: UlyssesGroup | None = None, chunk_size: int = 1024,
                      device=None, multi_modal_inputs: dict | None = None):
    """Per-token log-probs (and entropy) of the response tokens under a causal LM (or a vision-language model).

    Args:
        model: a transformers causal LM (patched by ``patches.ulysses.apply_ulysses_patch`` for sp > 1).
        input_ids: ``(B, L)`` int64 ``cat(prompts, responses)``. attention_mask: ``(B, L)`` 0/1.
        position_ids: ``(B, L)`` int64, 0 at the first valid token of every row; or ``(B, C, L)`` rotary position
            rows of a multimodal model (Qwen2-VL's M-RoPE: temporal, height, width; verl's layout), whose text
            positions are then ``clamp(cumsum(attention_mask) - 1, min=0)``.
        response_length: ``R``, the response occupies the last R columns.
        temperature: logits are divided by it (as in the rollout sampler).
        calculate_entropy: also return the entropy of ``softmax(logits / temperature)``.
        use_remove_padding: packed forward (True) or plain padded forward (False, only without SP).
        sp: the SP group; default the group bound to the model or the active one (size 1 if none). All SP peers
            must pass the same batch.
        chunk_size: tokens per float32 log-softmax chunk.
        device: the model's device when the inputs stay on the CPU (the trainer's workers pass it): packing happens
            on the CPU and no host sync is made. None: the inputs' device.
        multi_modal_inputs: the processor's image inputs of these rows (``pixel_values`` ``(patches, D)``,
            ``image_grid_thw`` ``(images, 3)``, ...), concatenated in row order; passed to the model with the whole
            packed row (see :func:`_full_row_forward`). Needs ``use_remove_padding``.

    Returns:
        ``(log_probs (B, R) float32, entropy (B, R) float32 or None)`` on the model's device. Entries of padded
        response tokens are meaningless (mask them with ``response_mask``). Differentiable (use under grad in the
        actor update).

    Raises:
        ValueError: bad shapes, response_length out of range, position_ids not restarting at 0, or SP misuse.
    """
    _check_batch(input_ids, attention_mask, position_ids, response_length)
    sp = _resolve_sp(model, sp, use_remove_padding)
    B, L = input_ids.shape
    R = response_length
    if not use_remove_padding:
        if multi_modal_inputs:
            raise ValueError("multi_modal_inputs need use_remove_padding=True (the packed forward)")
        input_ids, attention_mask, position_ids = (to_device(t, device) for t in (input_ids, attention_mask,
                                                                                   position_ids))
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        logits = out.logits[:, -R - 1:-1]
        lp, ent = log_probs_from_logits(logits.reshape(B * R, -1), input_ids[:, -R:].reshape(-1), temperature,
                                        calculate_entropy, chunk_size)
        return lp.view(B, R), (ent.view(B, R) if ent is not None else None)
    if multi_modal_inputs or position_ids.dim() == 3:
        out, labels_local, pad, indices = _full_row_forward(model, input_ids, attention_mask, position_ids, sp,
                                                            dict(multi_modal_inputs or {}), device)
    else:
        out, labels_local, pad, indices = _packed_forward(model, input_ids, attention_mask, position_ids, sp, device)
    lp, ent = log_probs_from_logits(out.logits[0], labels_local, temperature, calculate_entropy, chunk_size)
    del out
    lp = gather_outputs_and_unpad(lp, 0, pad, sp)
    lp = unpack_tensor(lp, indices, B, L)[:, -R - 1:-1]
    if ent is not None:
        ent = unpack_tensor(gather_outputs_and_unpad(ent, 0, pad, sp), indices, B, L)[:, -R - 1:-1]
    return lp, ent


def forward_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                   response_length: int, use_remove_padding: bool = True, sp: UlyssesGroup | None = None,
                   device=None):
    """Critic values ``V(s_t)`` for the response tokens from a model with a scalar head per token.

    Args:
        model: ``AutoModelForTokenClassification`` with ``num_labels == 1`` (output ``logits (.., 1)``).
        input_ids, attention_mask, position_ids, response_length, use_remove_padding, sp, device: as
            :func:`forward_log_probs`.

    Returns:
        ``values (B, R)`` float32: the head output at the position *before* each response token
        (``[:, -R-1:-1]``, the state from which that token is generated; verl's convention). Differentiable.

    Raises:
        ValueError: bad shapes, a head with more than one output, or SP misuse.
    """
    _check_batch(input_ids, attention_mask, position_ids, response_length)
    sp = _resolve_sp(model, sp, use_remove_padding)
    B, L = input_ids.shape
    R = response_length
    if not use_remove_padding:
        input_ids, attention_mask, position_ids = (to_device(t, device) for t in (input_ids, attention_mask,
                                                                                   position_ids))
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        head = out.logits
    else:
        out, _, pad, indices = _packed_forward(model, input_ids, attention_mask, position_ids, sp, device)
        head = out.logits
    if head.shape[-1] != 1:
        raise ValueError(f"value model must have one output per token (num_labels=1), got {head.shape[-1]}")
    if not use_remove_padding:
        return head[:, -R - 1:-1, 0].float()
    v = gather_outputs_and_unpad(head[0, :, 0].float(), 0, pad, sp)
    return unpack_tensor(v, indices, B, L)[:, -R - 1:-1]
