"""Ulysses sequence parallelism (SP) for any Hugging Face decoder, by one registered attention function.

Idea (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509; verl PR #735): every op of a decoder layer except
attention is token-wise, so each of the ``sp`` ranks of an SP group can hold a contiguous ``1/sp`` slice of the
packed token stream. Attention is made global by, in every layer:

1. repeating KV heads *interleaved* ``sp // num_kv_heads`` times when ``num_kv_heads < sp`` (rank ``r`` then
   receives the KV head of its own query heads);
2. an all-to-all that scatters heads and gathers the sequence: ``(S/sp, H, D) -> (S, H/sp, D)``;
3. an all-gather of ``position_ids`` so the varlen kernel sees every sequence boundary (positions restart at 0);
4. varlen causal attention (:mod:`patches.varlen`: flash-attn, PyTorch varlen, or an SDPA reference);
5. the inverse all-to-all ``(S, H/sp, D) -> (S/sp, H, D)``.

The patch is :func:`apply_ulysses_patch`: it registers :data:`ULYSSES_ATTN_IMPL` in transformers'
``AttentionInterface`` (one registration serves every model) and switches the model to it. With ``sp == 1`` the
same function is plain packed varlen attention (no communication), so packing works without SP. A padded batch
(2-D ``attention_mask``) falls back to transformers' SDPA path, so the patched model still runs padded input.

Gradient-scaling rule (see :func:`gather_outputs_and_unpad`): every SP rank computes the same loss on the same
gathered tensors, and the backward of the gather keeps only this rank's slice. The true gradient of one DP
replica is the SUM of its ``sp`` ranks' gradients. Our DeepSpeed engine averages over the WHOLE world
(``dp * sp`` ranks, no SP-aware ``mpu``), so the gather's backward multiplies by ``sp`` (default
``UlyssesGroup.grad_scale``). If DeepSpeed is given an SP-aware ``mpu`` (``get_sequence_parallel_world_size``
etc.; ZeRO then divides by ``world / sp``), use ``grad_scale=1``.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from patches.packing import cu_seqlens_from_position_ids
from patches.varlen import KERNELS, varlen_attention

__all__ = [
    "ULYSSES_ATTN_IMPL", "UlyssesGroup", "current_ulysses_group", "DpSpMesh", "dp_sp_rank_layout",
    "build_dp_sp_groups", "validate_ulysses_config", "repeat_kv_interleaved", "all_to_all_seq_to_heads",
    "all_to_all_heads_to_seq", "pad_and_slice_inputs", "pad_and_slice", "gather_outputs_and_unpad",
    "apply_ulysses_patch", "ulysses_attention_forward",
]

ULYSSES_ATTN_IMPL = "ulysses_varlen"


# ---------------------------------------------------------------------------------------------- groups
@dataclass(frozen=True)
class UlyssesGroup:
    """The SP process group of this rank. ``group=None`` with ``size=1`` is "no SP".

    Attributes:
        group: ``torch.distributed`` process group of the ``size`` SP peers (contiguous global ranks).
        size: SP degree (>= 1). rank: this rank's index inside the group (0 <= rank < size).
        grad_scale: factor applied by the backward of :func:`gather_outputs_and_unpad`; None means ``size``
            (right when the optimizer's gradient average runs over all dp*sp ranks, see the module docstring).
    """

    group: Any = None
    size: int = 1
    rank: int = 0
    grad_scale: float | None = None

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"UlyssesGroup needs size >= 1 and 0 <= rank < size, got size={self.size}, rank={self.rank}")
        if self.size > 1 and self.group is None:
            raise ValueError(f"UlyssesGroup of size {self.size} needs a process group, got None")

    @classmethod
    def from_group(cls, group, grad_scale: float | None = None) -> "UlyssesGroup":
        """Wrap an existing process group (``None`` -> trivial group)."""
        if group is None:
            return cls()
        return cls(group, dist.get_world_size(group), dist.get_rank(group), grad_scale)

    @property
    def scale(self) -> float:
        return float(self.size if self.grad_scale is None else self.grad_scale)

    @contextlib.contextmanager
    def activate(self):
        """Make this group current (see :func:`current_ulysses_group`) for the forward of models patched with
        ``sp_group=None`` or an int size. Keep it open across ``backward`` when gradient checkpointing is on
        (recomputed layers look the group up again)."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


_TRIVIAL = UlyssesGroup()
_CURRENT: contextvars.ContextVar[UlyssesGroup | None] = contextvars.ContextVar("ulysses_group", default=None)


def current_ulysses_group() -> UlyssesGroup:
    """The group made current by :meth:`UlyssesGroup.activate`, or the trivial (size 1) group."""
    return _CURRENT.get() or _TRIVIAL


@dataclass(frozen=True)
class DpSpMesh:
    """This rank's place in the data-parallel x sequence-parallel mesh built by :func:`build_dp_sp_groups`."""

    sp: UlyssesGroup
    dp_group: Any
    dp_rank: int
    dp_size: int


def dp_sp_rank_layout(world_size: int, sp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """Global ranks of every SP group (contiguous: rank r is in SP group r // sp) and every DP group (strided).

    Example: world 4, sp 2 -> SP ``[[0, 1], [2, 3]]``, DP ``[[0, 2], [1, 3]]``.

    Raises:
        ValueError: if ``sp_size < 1`` or ``world_size`` is not a positive multiple of ``sp_size``.
    """
    if sp_size < 1 or world_size < 1 or world_size % sp_size:
        raise ValueError(f"world_size ({world_size}) must be a positive multiple of sp_size ({sp_size})")
    dp = world_size // sp_size
    sp_groups = [list(range(d * sp_size, (d + 1) * sp_size)) for d in range(dp)]
    dp_groups = [list(range(r, world_size, sp_size)) for r in range(sp_size)]
    return sp_groups, dp_groups


def build_dp_sp_groups(world_size: int, sp_size: int, rank: int, grad_scale: float | None = None) -> DpSpMesh:
    """Create the SP and DP process groups (collective: every rank of the default group must call it).

    Returns:
        :class:`DpSpMesh` with this rank's :class:`UlyssesGroup` (``sp.size == sp_size``) and DP group
        (``dp_size = world_size // sp_size``; SP peers share a DP rank and receive the same data).

    Raises:
        ValueError: bad sizes (see :func:`dp_sp_rank_layout`) or ``rank`` outside ``[0, world_size)``.
        RuntimeError: if ``torch.distributed`` is not initialised with ``world_size`` ranks.
    """
    sp_groups, dp_groups = dp_sp_rank_layout(world_size, sp_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    if not dist.is_initialized() or dist.get_world_size() != world_size:
        raise RuntimeError(f"torch.distributed must be initialised with world_size={world_size} first")
    my_sp = my_dp = None
    for ranks in sp_groups:  # new_group is collective: create every group on every rank, in the same order
        g = dist.new_group(ranks)
        if rank in ranks:
            my_sp = g
    for ranks in dp_groups:
        g = dist.new_group(ranks)
        if rank in ranks:
            my_dp = g
    sp = UlyssesGroup(my_sp, sp_size, rank % sp_size, grad_scale) if sp_size > 1 else UlyssesGroup(grad_scale=grad_scale)
    return DpSpMesh(sp=sp, dp_group=my_dp, dp_rank=rank // sp_size, dp_size=world_size // sp_size)


def validate_ulysses_config(num_heads: int, num_kv_heads: int, sp: int) -> None:
    """Check that attention heads can be split over ``sp`` ranks (usable before any worker starts).

    Rule: ``num_heads % sp == 0`` and (``num_kv_heads % sp == 0`` or ``sp % num_kv_heads == 0``).
    (e.g. 28 heads / sp 8 fails; 32 heads, 4 kv heads, sp 8 is fine: kv heads are repeated twice.)

    Raises:
        ValueError: naming the offending numbers; violating the rule would otherwise hang inside all-to-all.
    """
    if sp < 1:
        raise ValueError(f"ulysses sequence parallel size must be >= 1, got {sp}")
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_attention_heads ({num_heads}) must be a positive multiple of num_key_value_heads "
                         f"({num_kv_heads})")
    if num_heads % sp:
        raise ValueError(f"num_attention_heads ({num_heads}) is not divisible by the ulysses sequence parallel "
                         f"size ({sp}); choose sp among the divisors of {num_heads}")
    if num_kv_heads % sp and sp % num_kv_heads:
        raise ValueError(f"num_key_value_heads ({num_kv_heads}) and the ulysses sequence parallel size ({sp}) "
                         "must divide one another (nk % sp == 0 or sp % nk == 0)")


# ---------------------------------------------------------------------------------------------- comm
def repeat_kv_interleaved(x: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """Repeat every KV head ``n`` times consecutively (``[a, b] -> [a, a, b, b]``), not tiled (``[a, b, a, b]``).

    Interleaving keeps query head ``h``'s kv head inside the same rank after the head split. Differentiable
    (backward sums the copies).
    """
    return x if n == 1 else x.repeat_interleave(n, dim=dim)


class _AllToAll(torch.autograd.Function):
    """``x`` split in ``size`` chunks along ``scatter_dim``; chunk j goes to rank j; received chunks are
    concatenated along ``gather_dim`` in rank order. Backward: the same with the dims swapped (no scaling)."""

    @staticmethod
    def forward(ctx, x, group, size, scatter_dim, gather_dim):
        ctx.args = (group, size, gather_dim, scatter_dim)
        return _all_to_all(x, group, size, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        group, size, scatter_dim, gather_dim = ctx.args
        return _all_to_all(grad, group, size, scatter_dim, gather_dim), None, None, None, None


def _all_to_all(x, group, size, scatter_dim, gather_dim):
    if x.shape[scatter_dim] % size:
        raise ValueError(f"all-to-all: dim {scatter_dim} of size {x.shape[scatter_dim]} is not divisible by {size}")
    send = torch.stack(torch.tensor_split(x, size, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


def all_to_all_seq_to_heads(x: torch.Tensor, sp: UlyssesGroup) -> torch.Tensor:
    """``(S/sp, H, D) -> (S, H/sp, D)``: scatter heads, gather the sequence (autograd-aware)."""
    return x if sp.size == 1 else _AllToAll.apply(x, sp.group, sp.size, 1, 0)


def all_to_all_heads_to_seq(x: torch.Tensor, sp: UlyssesGroup) -> torch.Tensor:
    """``(S, H/sp, D) -> (S/sp, H, D)``: scatter the sequence, gather heads (inverse of the above)."""
    return x if sp.size == 1 else _AllToAll.apply(x, sp.group, sp.size, 0, 1)


def _all_gather_nograd(x: torch.Tensor, sp: UlyssesGroup, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(sp.size)]
    dist.all_gather(parts, x.contiguous(), group=sp.group)
    return torch.cat(parts, dim=dim)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sp, dim, scale):
        ctx.sp, ctx.dim, ctx.scale, ctx.local = sp, dim, scale, x.shape[dim]
        return _all_gather_nograd(x, sp, dim)

    @staticmethod
    def backward(ctx, grad):
        g = grad.narrow(ctx.dim, ctx.sp.rank * ctx.local, ctx.local)
        return (g * ctx.scale if ctx.scale != 1 else g.contiguous()), None, None, None


# ---------------------------------------------------------------------------------------------- inputs/outputs
def pad_and_slice(x: torch.Tensor, sp_size: int, sp_rank: int, pad_value: int | float = 0, dim: int = -1):
    """Right-pad ``x`` along ``dim`` to a multiple of ``sp_size`` (at least ``sp_size`` if empty) and return
    ``(slice for sp_rank, pad_size)``; rank r gets the contiguous chunk ``[r*L/sp, (r+1)*L/sp)``."""
    n = x.shape[dim]
    pad = (-n) % sp_size if n else sp_size
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_full(shape, pad_value)], dim=dim)
    chunk = x.shape[dim] // sp_size
    return x.narrow(dim, sp_rank * chunk, chunk), pad


def pad_and_slice_inputs(input_ids: torch.Tensor, position_ids: torch.Tensor, sp_size: int, sp_rank: int,
                         pad_token_id: int = 0):
    """Pad a packed row to a multiple of ``sp_size`` and take this rank's slice.

    Args:
        input_ids: ``(1, nnz)`` int64 packed ids. position_ids: ``(1, nnz)`` int64, restarting at 0 per sequence.

    Returns:
        ``(input_ids_local (1, L/sp), position_ids_local (1, L/sp), pad_size)`` with ``L = nnz + pad_size``. The
        pad tokens get positions ``arange(pad_size)``: their own fake sequence, never attending to or attended by
        real tokens. An empty row is padded to ``sp_size`` tokens.

    Raises:
        ValueError: on shape mismatch or a bad sp rank.
    """
    if input_ids.shape != position_ids.shape or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"expected packed (1, nnz) input_ids/position_ids, got {tuple(input_ids.shape)} and "
                         f"{tuple(position_ids.shape)}")
    if not 0 <= sp_rank < sp_size:
        raise ValueError(f"sp_rank {sp_rank} outside [0, {sp_size})")
    ids, pad = pad_and_slice(input_ids, sp_size, sp_rank, pad_token_id)
    if pad:
        position_ids = torch.cat([position_ids, torch.arange(pad, device=position_ids.device,
                                                             dtype=position_ids.dtype)[None]], dim=1)
    chunk = position_ids.shape[1] // sp_size
    return ids, position_ids[:, sp_rank * chunk:(sp_rank + 1) * chunk], pad


def gather_outputs_and_unpad(x: torch.Tensor, dim: int, pad_size: int, group: UlyssesGroup | None,
                             grad_scale: float | None = None) -> torch.Tensor:
    """All-gather per-token outputs of the SP group along ``dim`` (rank order) and drop the last ``pad_size``.

    Args:
        x: local tensor, e.g. log-probs ``(L/sp,)`` float32. group: the SP group (None/size 1: only unpads).
        grad_scale: backward multiplier (default ``group.scale`` = sp). Backward keeps this rank's slice of the
            gradient times ``grad_scale``: with the optimizer averaging gradients over all dp*sp ranks, ``sp``
            turns the average over SP peers back into the sum that the unsharded model would get.

    Returns:
        ``x`` gathered: ``L - pad_size`` long along ``dim``.
    """
    if group is not None and group.size > 1:
        x = _GatherSeq.apply(x, group, dim % x.dim(), group.scale if grad_scale is None else float(grad_scale))
    return x.narrow(dim, 0, x.shape[dim] - pad_size) if pad_size else x


# ---------------------------------------------------------------------------------------------- the patch
class _PatchState:
    """Per-model patch state, shared by all its modules (``module._ulysses_state``)."""

    def __init__(self, group: UlyssesGroup | None, sp_size: int, kernel: str):
        self.group, self.sp_size, self.kernel = group, sp_size, kernel
        self._cache: tuple | None = None  # (position_ids tensor, version, group, cu_seqlens, max_seqlen)

    @property
    def fixed_size(self) -> int:
        """The SP size fixed at patch time (a bound group's size, or the int given); 0 when it is taken from the
        active group at every forward."""
        return self.group.size if self.group is not None else self.sp_size

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
        tensor; all SP ranks hit/miss the cache together, so the all-gather stays collective)."""
        c = self._cache
        if c is not None and c[0] is pos_local and c[1] == pos_local._version and c[2] is g:
            return c[3], c[4]
        full = pos_local.reshape(-1) if g.size == 1 else _all_gather_nograd(pos_local.reshape(-1), g, 0)
        cu, mx = cu_seqlens_from_position_ids(full)
        self._cache = (pos_local, pos_local._version, g, cu, mx)
        return cu, mx


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
    names transformers' flash-attention path uses; :func:`trainer.forward.forward_log_probs` passes them for a row it
    packed on the host) on a model patched for a fixed SP size of 1 takes a path that torch.compile traces without a
    graph break: no process group, no Python-side cache, only the varlen kernel (a custom op for PyTorch's kernel).
    That path does not look up the active SP group (a context variable would break the graph): a caller passing
    these arguments itself must not have a group of size > 1 active (``forward_log_probs`` checks this).
    Everything else runs eagerly (:func:`_attention_eager`; a graph break under torch.compile).

    Raises:
        ValueError: SP with a mask / batch > 1 / no position_ids, heads not divisible, softcap given.
    """
    state: _PatchState | None = getattr(module, "_ulysses_state", None)
    cu = kwargs.get("cu_seq_lens_q")
    if (cu is not None and state is not None and state.fixed_size == 1 and attention_mask is None
            and query.shape[0] == 1 and softcap is None):
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (1, H, S, D) -> (S, H, D)
        out = varlen_attention(q, k, v, cu, kwargs["max_length_q"], scale=scaling, causal=causal,
                               sliding_window=sliding_window, dropout=dropout, kernel=state.kernel)
        return out.unsqueeze(0), None
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
    # (1, H, S_local, D) -> (S_local, H, D)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if g.size > 1:
        rep = max(g.size // nk, 1)
        k, v = repeat_kv_interleaved(k, rep), repeat_kv_interleaved(v, rep)
        q, k, v = (all_to_all_seq_to_heads(t, g) for t in (q, k, v))
    cu, max_len = (state.boundaries(position_ids, g) if state is not None
                   else _PatchState(None, 0, "auto").boundaries(position_ids, g))
    out = varlen_attention(q, k, v, cu, max_len, scale=scaling, causal=causal, sliding_window=sliding_window,
                           dropout=dropout, kernel=state.kernel if state is not None else "auto")
    out = all_to_all_heads_to_seq(out, g)
    return out.unsqueeze(0), None


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
        the same model (patched in place: ``config._attn_implementation == ULYSSES_ATTN_IMPL``).

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
    from patches.varlen import _flash_attn_fn, _torch_varlen

    _flash_attn_fn(), _torch_varlen()  # resolve the kernels eagerly (torch.compile then reads them as constants)
    state = _PatchState(group, sp_size, kernel)
    for m in model.modules():
        m._ulysses_state = state  # plain attribute: not a parameter/buffer, not in state_dict
    model.set_attn_implementation(ULYSSES_ATTN_IMPL)
    return model
