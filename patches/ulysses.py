"""Ulysses sequence parallelism (SP) for any Hugging Face decoder, by one registered attention function.

Idea (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509; verl PR #735): every op of a decoder layer except
attention is token-wise, so each of the ``sp`` ranks of an SP group can hold a contiguous ``1/sp`` slice of the
packed token stream. Attention is made global by, in every layer:

1. repeating KV heads *interleaved* ``sp // num_kv_heads`` times when ``num_kv_heads < sp`` (rank ``r`` then
   receives the KV head of its own query heads);
2. one all-to-all for q, k and v together that scatters heads and gathers the sequence:
   ``(S/sp, H, D) -> (S, H/sp, D)`` (:func:`traceable_qkv_seq_to_heads`);
3. an all-gather of ``position_ids`` so the varlen kernel sees every sequence boundary (positions restart at 0);
4. varlen causal attention (:mod:`patches.varlen`: flash-attn, PyTorch varlen, or an SDPA reference);
5. the inverse all-to-all ``(S, H/sp, D) -> (S/sp, H, D)``.

The patch is :func:`apply_ulysses_patch`: it registers :data:`ULYSSES_ATTN_IMPL` in transformers'
``AttentionInterface`` (one registration serves every model) and switches the model to it. With ``sp == 1`` the
same function is plain packed varlen attention (no communication), so packing works without SP. A padded batch
(2-D ``attention_mask``) falls back to transformers' SDPA path, so the patched model still runs padded input.

The model-agnostic parts (process groups, all-to-alls, slicing and gathering, and the gradient-scaling rule of the
gather) live in :mod:`patches.sequence_parallel`; their names are re-exported here.
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect

import torch

from patches.decoder_inputs import (boundary_positions, decoder_of, install_decoder_slicing,  # noqa: F401
                                    slice_decoder_inputs)
from patches.packing import cu_seqlens_from_position_ids
from patches.patch_info import UlyssesPatchInfo, mark_layers_compiled, patch_info, set_static_shapes  # noqa: F401
from patches.sequence_parallel import (  # noqa: F401 (re-exported)
    DpSpMesh, UlyssesGroup, _all_gather_nograd, all_to_all_heads_to_seq, all_to_all_seq_to_heads, build_dp_sp_groups,
    current_ulysses_group, dp_sp_rank_layout, gather_outputs_and_unpad, pad_and_slice, pad_and_slice_inputs,
    repeat_kv_interleaved, traceable_heads_to_seq, traceable_qkv_seq_to_heads, traceable_seq_to_heads,
    validate_ulysses_config)
from patches.varlen import KERNELS, available_kernels, varlen_attention

__all__ = [
    "ULYSSES_ATTN_IMPL", "UlyssesGroup", "current_ulysses_group", "DpSpMesh", "dp_sp_rank_layout",
    "build_dp_sp_groups", "validate_ulysses_config", "repeat_kv_interleaved", "all_to_all_seq_to_heads",
    "all_to_all_heads_to_seq", "pad_and_slice_inputs", "pad_and_slice", "gather_outputs_and_unpad",
    "apply_ulysses_patch", "ulysses_attention_forward", "slice_decoder_inputs", "boundary_positions", "decoder_of",
    "ulysses_patched", "sequence_boundaries", "forward_takes_var_kwargs", "bucket_max_seqlen", "host_packed_forward",
    "UlyssesPatchInfo", "patch_info", "mark_layers_compiled", "set_static_shapes",
]

ULYSSES_ATTN_IMPL = "ulysses_varlen"


# ---------------------------------------------------------------------------------------------- the patch
def forward_takes_var_kwargs(model) -> bool:
    """Whether the (DeepSpeed-wrapped: its ``.module``) model's ``forward`` takes ``**kwargs`` (transformers' models
    do, and hand them to the attention function; a remote-code model without them must not get the boundary
    keyword arguments, see :attr:`UlyssesPatchInfo.traceable`)."""
    inner = getattr(model, "module", model)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(inner.forward).parameters.values())


def bucket_max_seqlen(n: int, cap: int | None = None) -> int:
    """``n`` (tokens) rounded up to a power of two, at least 16: the ``max_seqlen`` handed to varlen attention
    kernels, for which any upper bound of the longest sequence is valid (it only sizes their launch grid).

    Cost: kernels that size buffers by it (older flash-attn 2 builds: softmax statistics of batch x heads x
    ``max_seqlen``) use up to twice the memory for those buffers.

    ``cap`` (a sliding window, tokens): when ``n <= cap`` the result is at most ``cap``, so that a window no shorter
    than every sequence is never taken for one that cuts (``patches.varlen`` refuses windows shorter than
    ``max_seqlen`` on torch builds whose ``varlen_attn`` has no ``window_size``)."""
    b = max(16, 1 << (max(int(n), 1) - 1).bit_length())
    return min(b, int(cap)) if isinstance(cap, int) and int(n) <= cap else b


def ulysses_patched(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the model inside a DeepSpeed engine) was patched by :func:`apply_ulysses_patch`: its
    decoder's attention is :data:`ULYSSES_ATTN_IMPL`."""
    cfg = getattr(decoder_of(model), "config", None)
    return getattr(cfg, "_attn_implementation", None) == ULYSSES_ATTN_IMPL


class _PatchState:
    """Per-model patch state, shared by all its modules (``module._ulysses_state``)."""

    def __init__(self, group: UlyssesGroup | None, sp_size: int, kernel: str, sliding_window: int | None = None):
        self.group, self.sp_size, self.kernel, self.sliding_window = group, sp_size, kernel, sliding_window
        self.boundary_kwargs = False  # set by apply_ulysses_patch: see attention_kwargs
        self.static_token_multiple = 0  # > 0: pad host-packed rows to buckets (CUDA graphs; set_static_shapes)
        # layers under torch.compile (mark_layers_compiled): with SP, the traced path
        self.compiled = False
        self._cache: tuple | None = None  # (position_ids tensor, version, group, cu_seqlens, max_seqlen)

    @property
    def fixed_size(self) -> int:
        """The SP size fixed at patch time (a bound group's size, or the int given); 0 when it is taken from the
        active group at every forward."""
        return self.group.size if self.group is not None else self.sp_size

    def attention_kwargs(self, cu_seqlens: torch.Tensor, max_seqlen: int, sp: UlyssesGroup | None = None) -> dict:
        """The boundaries of a host-packed row (the WHOLE row, all SP ranks' slices) as transformers'
        flash-attention keyword arguments (``cu_seq_lens_q/k``, ``max_length_q/k``), which
        :func:`ulysses_attention_forward` traces without a graph break; the maximum is rounded up by
        :func:`bucket_max_seqlen` so that compiled layers see few distinct values. ``{}`` when the model cannot take
        them (SP size not fixed at patch time, or a forward without ``**kwargs``; decided at patch time) or when
        ``sp`` (the group the caller runs with; None = size 1) is not the group the model was patched for.

        With SP > 1 only for compiled layers (``compiled``): run eagerly, the primed path of
        :func:`_attention_eager` measured faster (Qwen2-1.5B config, SP=2 at 8k tokens on 2 x H200, 2026-11-30:
        19.6k tokens/s per GPU, against 14.5-14.9k through this path on two fresh machines; the cause was not
        isolated; docs/benchmarks.md, Ulysses), so eager SP keeps it."""
        if not self.boundary_kwargs:
            return {}
        size = 1 if sp is None else sp.size
        if size != self.fixed_size or (size > 1 and (sp.group is not self.group.group or not self.compiled)):
            return {}
        mx = bucket_max_seqlen(max_seqlen, cap=self.sliding_window)
        return dict(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=mx, max_length_k=mx)

    def resolve(self) -> UlyssesGroup:
        g = self.group if self.group is not None else current_ulysses_group()
        if self.sp_size and g.size != self.sp_size:
            raise ValueError(f"model was patched for ulysses sp={self.sp_size} but the active group has size "
                             f"{g.size}; activate a matching UlyssesGroup")
        return g

    def prime(self, pos_local: torch.Tensor, g: UlyssesGroup, cu_seqlens: torch.Tensor, max_seqlen: int) -> None:
        """Hand over the boundaries of the coming forward, computed by the caller without a device sync (e.g. on
        the CPU before copying the packed row): ``cu_seqlens`` ``(num_seqs + 1,)`` int32 on the model's device and
        ``max_seqlen`` of the WHOLE (all SP ranks', padded) row; valid while ``pos_local`` is the position tensor
        the layers receive. Every SP peer must prime alike (or none), since a miss all-gathers."""
        self._cache = (pos_local, pos_local._version, g, cu_seqlens, int(max_seqlen))

    def boundaries(self, pos_local: torch.Tensor, g: UlyssesGroup):
        """cu_seqlens of the gathered sequence, cached per forward (all layers get the same position_ids
        tensor; all SP ranks hit/miss the cache together, so the all-gather stays collective). ``pos_local`` is
        ``(1, S/sp)`` or has more rows (``(C, 1, S/sp)``): :func:`boundary_positions` picks the row gathered."""
        c = self._cache
        if c is not None and c[0] is pos_local and c[1] == pos_local._version and c[2] is g:
            return c[3], c[4]
        cu, mx = sequence_boundaries(pos_local, g)
        self._cache = (pos_local, pos_local._version, g, cu, mx)
        return cu, mx


def sequence_boundaries(position_ids: torch.Tensor, sp: UlyssesGroup) -> tuple[torch.Tensor, int]:
    """The sequence boundaries of the WHOLE packed row from this SP rank's slice of its positions (collective over
    ``sp``: every peer must call it): the text row (:func:`boundary_positions`) is all-gathered in rank order and
    a sequence starts wherever it is 0.

    Args:
        position_ids: this rank's ``(S/sp,)``, ``(1, S/sp)`` or multi-row ``(C, 1, S/sp)`` int64 positions.

    Returns:
        ``(cu_seqlens (num_seqs + 1,) int32, max_seqlen int)`` on ``position_ids``' device (one host sync).

    Raises:
        ValueError: the gathered row does not start with 0.
    """
    row = boundary_positions(position_ids)
    full = row if sp.size == 1 else _all_gather_nograd(row, sp, 0)
    return cu_seqlens_from_position_ids(full)


def ulysses_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              sliding_window: int | None = None, softcap: float | None = None,
                              is_causal: bool | None = None, **kwargs):
    """The attention function registered as :data:`ULYSSES_ATTN_IMPL` (transformers ``AttentionInterface``).

    Args:
        query: ``(1, Hq, S/sp, D)``; key/value ``(1, Hk, S/sp, D)``; ``kwargs["position_ids"]`` ``(1, S/sp)``.
        attention_mask: None for packed input. A mask (padded batch) or batch > 1 uses transformers' SDPA path
            (only without SP).

    Returns:
        ``(attn_output (1, S/sp, Hq, D), None)`` as transformers expects.

    Packed input whose boundaries the caller passes as ``cu_seq_lens_q`` / ``max_length_q`` keyword arguments (the
    names transformers' flash-attention path uses; :func:`patches.packed_forward.pack_batch` adds them for a row it
    packed on the host) on a model patched for a fixed SP size (1, or a bound :class:`UlyssesGroup`) takes a path
    that torch.compile traces without a graph break: no context variable, no Python-side cache; the varlen kernel
    (a custom op for PyTorch's kernel) and, with SP, torch's functional all-to-alls over the bound group
    (:func:`traceable_qkv_seq_to_heads`, :func:`traceable_heads_to_seq`). The boundaries are those of the WHOLE
    packed row (every SP rank's slice, SP padding included), as after the all-to-all each rank attends over the
    whole sequence for its heads. That path does not look up the active SP group: a caller passing these arguments
    itself must run with the group the model was patched for (``pack_batch`` adds them only then).
    Everything else runs eagerly (:func:`_attention_eager`; a graph break under torch.compile).

    Raises:
        ValueError: SP with a mask / batch > 1 / no position_ids, heads not divisible, softcap given.
    """
    state: _PatchState | None = getattr(module, "_ulysses_state", None)
    cu = kwargs.get("cu_seq_lens_q")
    if (cu is not None and state is not None and state.boundary_kwargs and attention_mask is None
            and query.shape[0] == 1 and softcap is None):
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        # the bound group (fixed at patch time); its all-to-alls are traced by torch.compile
        out = _sp_varlen(query, key, value, state.group.group if state.fixed_size > 1 else None, state.fixed_size,
                         cu, kwargs["max_length_q"], scale=scaling, causal=causal, sliding_window=sliding_window,
                         dropout=dropout, kernel=state.kernel)
        return out, None
    return _attention_eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            sliding_window=sliding_window, softcap=softcap, is_causal=is_causal, **kwargs)


@torch.compiler.disable
def _attention_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                     softcap=None, is_causal=None, **kwargs):
    """The general path of :func:`ulysses_attention_forward`: SP all-to-alls, boundaries from the primed or
    all-gathered ``position_ids``, or transformers' SDPA for a padded batch. Runs eagerly under torch.compile: its
    collectives, Python-side boundary cache and varlen kernels stay as they are, while the layer around it (norms,
    RoPE, MLP) can be compiled."""
    state: _PatchState | None = getattr(module, "_ulysses_state", None)
    g = state.resolve() if state is not None else current_ulysses_group()
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or query.shape[0] != 1 or position_ids is None:
        if g.size > 1:
            raise ValueError("ulysses SP needs packed input: batch 1, attention_mask=None and position_ids given; "
                             f"got batch {query.shape[0]}, mask {'set' if attention_mask is not None else 'None'}, "
                             f"position_ids {'None' if position_ids is None else 'set'}")
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, softcap=softcap, **kwargs)
    if softcap is not None:
        raise ValueError("ulysses varlen attention does not support attention logit softcapping")
    nq, nk = query.shape[1], key.shape[1]
    validate_ulysses_config(nq, nk, g.size)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    cu, max_len = (state.boundaries(position_ids, g) if state is not None
                   else _PatchState(None, 0, "auto").boundaries(position_ids, g))
    out = _sp_varlen(query, key, value, g.group, g.size, cu, max_len, scale=scaling, causal=causal,
                     sliding_window=sliding_window, dropout=dropout,
                     kernel=state.kernel if state is not None else "auto")
    return out, None


def _sp_varlen(query, key, value, group, size: int, cu_seqlens, max_seqlen: int, **varlen_kw) -> torch.Tensor:
    """Ulysses varlen attention of one packed row: ``(1, H, S/sp, D)`` q/k/v -> ``(1, S/sp, Hq, D)``. With
    ``size > 1``: KV heads repeated (interleaved) up to the SP size, ONE all-to-all of q, k and v to
    ``(S, H/sp, D)`` (:func:`traceable_qkv_seq_to_heads`: plain ``dist.all_to_all_single`` when run eagerly,
    functional collectives under torch.compile; q, k, v come back as strided views of one buffer, which every
    kernel of :mod:`patches.varlen` takes as they are), the varlen kernel over the whole row's ``cu_seqlens``, and
    the inverse all-to-all (:func:`traceable_heads_to_seq`). Queries, keys and values of different widths (latent
    attention) run at the larger width, the narrower ones padded with zero columns (the same scores and sums), and
    the output is cut back to the value width."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (1, H, S, D) -> (S, H, D)
    dq, dv = q.shape[-1], v.shape[-1]
    if dv != dq:  # latent attention (DeepSeek-V3): value width unlike the query/key width; zero columns are exact
        if varlen_kw.get("scale") is None:
            varlen_kw["scale"] = dq ** -0.5
        width = max(dq, dv)
        q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
    if size > 1:
        rep = max(size // k.shape[1], 1)
        k, v = repeat_kv_interleaved(k, rep), repeat_kv_interleaved(v, rep)
        q, k, v = traceable_qkv_seq_to_heads(q, k, v, group, size)
    out = varlen_attention(q, k, v, cu_seqlens, max_seqlen, **varlen_kw)
    if size > 1:
        out = traceable_heads_to_seq(out, group, size)
    return out[..., :dv].unsqueeze(0)


def _ulysses_mask(*args, attention_mask=None, **kwargs):
    """Mask function for :data:`ULYSSES_ATTN_IMPL`: None for packed input (boundaries come from position_ids),
    transformers' SDPA boolean mask for a padded batch."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


_HOST_PACKED: contextvars.ContextVar[bool] = contextvars.ContextVar("ulysses_host_packed", default=False)


@contextlib.contextmanager
def host_packed_forward():
    """Mark the enclosed model forward as packed by the caller, with its boundaries primed
    (:meth:`_PatchState.prime`): transformers' packed-sequence detection in ``masking_utils`` (a Python ``bool`` of a
    device tensor, i.e. a host sync per forward) is skipped; its result is not used by this attention anyway."""
    token = _HOST_PACKED.set(True)
    try:
        yield
    finally:
        _HOST_PACKED.reset(token)


def _wrap_packed_detection() -> None:
    import transformers.masking_utils as mu

    fn = getattr(mu, "find_packed_sequence_indices", None)
    if fn is None or getattr(fn, "_ulysses_wrapped", False):
        return

    def find_packed_sequence_indices(position_ids):
        return None if _HOST_PACKED.get() else fn(position_ids)

    find_packed_sequence_indices._ulysses_wrapped = True
    mu.find_packed_sequence_indices = find_packed_sequence_indices


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(ULYSSES_ATTN_IMPL, ulysses_attention_forward)
    AttentionMaskInterface.register(ULYSSES_ATTN_IMPL, _ulysses_mask)
    _wrap_packed_detection()


def apply_ulysses_patch(model: torch.nn.Module, sp_group: UlyssesGroup | int | None = None,
                        kernel: str = "auto") -> torch.nn.Module:
    """Switch ``model`` (a transformers ``PreTrainedModel``) to packed varlen attention with Ulysses SP.

    Call after ``from_pretrained`` and before ``deepspeed.initialize``.

    Args:
        sp_group: a :class:`UlyssesGroup` to bind to the model; an int SP size (the group is then taken from
            :meth:`UlyssesGroup.activate` at each forward and must have that size); or None (size 1 unless a
            group is active).
        kernel: one of ``patches.varlen.KERNELS``.

    Returns:
        the same model, patched in place: its decoder (:func:`decoder_of`; the whole model for a causal LM) has
        ``config._attn_implementation == ULYSSES_ATTN_IMPL`` and slices its inputs inside
        :func:`slice_decoder_inputs`; other sub-models (a vision tower) keep their attention.

    Raises:
        ValueError: heads not divisible by the SP size (:func:`validate_ulysses_config`), unknown kernel, or a
            model without ``num_attention_heads`` in its (text) config.
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
    group = sp_group if isinstance(sp_group, UlyssesGroup) else None
    sp_size = group.size if group is not None else int(sp_group or 0)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    nq = getattr(cfg, "num_attention_heads", None)
    if nq is None:
        raise ValueError(f"{type(model).__name__}'s config has no num_attention_heads; cannot apply ulysses patch")
    nk = getattr(cfg, "num_key_value_heads", None) or nq
    validate_ulysses_config(nq, nk, max(sp_size, 1))
    _register()
    available_kernels()  # resolve the kernels eagerly (torch.compile then reads them as constants)
    window = getattr(cfg, "sliding_window", None)
    state = _PatchState(group, sp_size, kernel, sliding_window=window if isinstance(window, int) else None)
    # boundaries as keyword arguments (the traced path) need an SP size fixed now: 1, or a bound group
    state.boundary_kwargs = (state.fixed_size == 1 or group is not None) and forward_takes_var_kwargs(model)
    for m in model.modules():
        m._ulysses_state = state  # plain attribute: not a parameter/buffer, not in state_dict
    # only the decoder attends over the packed (SP-sliced) text stream; encoders such as a vision tower keep their
    # own attention (non-causal, per image)
    decoder = decoder_of(model)
    (decoder if hasattr(decoder, "set_attn_implementation") else model).set_attn_implementation(ULYSSES_ATTN_IMPL)
    install_decoder_slicing(decoder)
    return model
