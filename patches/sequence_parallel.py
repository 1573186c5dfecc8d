"""Ulysses sequence-parallel mechanics, independent of any model: the SP process groups (a data-parallel x
sequence-parallel mesh), the head/sequence all-to-alls, padding and slicing a packed row per SP rank, and gathering
per-token outputs back. :mod:`patches.ulysses` builds the transformers attention patch on top of them (and
re-exports every public name here).

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

__all__ = [
    "UlyssesGroup", "current_ulysses_group", "DpSpMesh", "dp_sp_rank_layout", "build_dp_sp_groups",
    "validate_ulysses_config", "repeat_kv_interleaved", "all_to_all_seq_to_heads", "all_to_all_heads_to_seq",
    "traceable_seq_to_heads", "traceable_qkv_seq_to_heads", "traceable_heads_to_seq",
    "pad_and_slice_inputs", "pad_and_slice", "gather_outputs_and_unpad",
]

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
            raise ValueError(f"UlyssesGroup needs size >= 1 and 0 <= rank < size, got size={self.size}, "
                             f"rank={self.rank}")
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
    sp = (UlyssesGroup(my_sp, sp_size, rank % sp_size, grad_scale) if sp_size > 1
          else UlyssesGroup(grad_scale=grad_scale))
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
    """Eager :func:`_all_to_all`: ``dist.all_to_all_single`` of a contiguous tensor; backward: the same exchange of
    the gradient (no scaling)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad.contiguous(), ctx.group), None


def _exchange(x, group):
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """The one all-to-all primitive: dim 0 of ``x`` split in as many equal chunks as the group has ranks (the
    caller checks divisibility), chunk j sent to rank j; chunk i of the result (same shape as ``x``) is the one
    rank i sent. Autograd-aware (its backward is the same exchange). Run eagerly, ``dist.all_to_all_single``
    (:class:`_AllToAll`); while ``torch.compile`` traces, torch's functional ``all_to_all_single_autograd`` (in the
    graph, no graph break; see :func:`traceable_seq_to_heads`). Copies ``x`` only when it is not contiguous."""
    x = x.contiguous()
    if not torch.compiler.is_compiling():
        return _AllToAll.apply(x, group)
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    return all_to_all_single_autograd(x, None, None, group)


def _seq_to_heads(tensors, group, size: int) -> tuple[torch.Tensor, ...]:
    """Shared body of the seq->heads all-to-alls: every ``(S/sp, H_i, ...)`` tensor in ONE exchange. Send buffer
    ``(sp, S/sp, sum_i H_i/sp, ...)``: each tensor viewed as ``(S/sp, sp, H_i/sp, ...)``, dims 0 and 1 swapped,
    concatenated along heads (the only copy). Chunk i received is rank i's sequence part, so the result reshapes
    to ``(S, sum_i H_i/sp, ...)`` with no copy and splits along heads into views ``(S, H_i/sp, ...)``, each of
    stride ``sum_i H_i/sp * prod(...)`` along the sequence (contiguous rows of the last dim, as every varlen kernel
    of :mod:`patches.varlen` accepts)."""
    shapes = [tuple(t.shape) for t in tensors]
    if any(len(s) < 2 or s[0] != shapes[0][0] or s[2:] != shapes[0][2:] for s in shapes):
        raise ValueError(f"seq->heads all-to-all: tensors must be (S/sp, H, ...) with equal S/sp and trailing dims, "
                         f"got shapes {shapes}")
    heads = [s[1] for s in shapes]
    if any(h % size for h in heads):
        raise ValueError(f"seq->heads all-to-all: head counts {heads} (dim 1 of shapes {shapes}) must all be "
                         f"divisible by the SP size {size}")
    send = torch.cat([t.unflatten(1, (size, t.shape[1] // size)).transpose(0, 1) for t in tensors], dim=2)
    recv = _all_to_all(send, group).flatten(0, 1)
    return recv.split([h // size for h in heads], dim=1)


def all_to_all_seq_to_heads(x: torch.Tensor, sp: UlyssesGroup) -> torch.Tensor:
    """``(S/sp, H, D) -> (S, H/sp, D)``: scatter heads, gather the sequence (autograd-aware; rank r gets heads
    ``[r*H/sp, (r+1)*H/sp)``, the sequence in rank order). Returns ``x`` itself when ``sp.size == 1``.

    Raises:
        ValueError: ``H`` not divisible by ``sp.size``.
    """
    return x if sp.size == 1 else traceable_seq_to_heads(x, sp.group, sp.size)


def all_to_all_heads_to_seq(x: torch.Tensor, sp: UlyssesGroup) -> torch.Tensor:
    """``(S, H/sp, D) -> (S/sp, H, D)``: scatter the sequence, gather heads (inverse of the above). Returns ``x``
    itself when ``sp.size == 1``.

    Raises:
        ValueError: ``S`` not divisible by ``sp.size``.
    """
    return x if sp.size == 1 else traceable_heads_to_seq(x, sp.group, sp.size)


def traceable_seq_to_heads(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """:func:`all_to_all_seq_to_heads` that ``torch.compile`` can trace: while compiling, through torch's functional
    collectives (``all_to_all_single_autograd``), which land in the layer's graph (no graph break; under
    ``mode="reduce-overhead"`` the NCCL all-to-all is recorded in the layer's CUDA graph); run eagerly, through the
    plain ``dist.all_to_all_single`` autograd function (functional collectives return wrapper tensors and do more
    host work per call, https://github.com/pytorch/pytorch/issues/138773). ``(S/sp, H, D) -> (S, H/sp, D)``;
    ``group`` is the process group itself, ``size`` its size (> 1). Same result and gradient either way. One copy
    (the send buffer); the result is contiguous. For q, k and v together use :func:`traceable_qkv_seq_to_heads`.

    Raises:
        ValueError: ``H`` not divisible by ``size``.
    """
    return _seq_to_heads((x,), group, size)[0]


def traceable_qkv_seq_to_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group,
                               size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`traceable_seq_to_heads` of q, k and v in ONE all-to-all (same results and gradients as three calls).

    Args:
        q: ``(S/sp, Hq, D)``; k, v: ``(S/sp, Hk, D)`` (KV heads already repeated so that ``Hk % size == 0``).
        group: the process group; size: its size (> 1).

    Returns:
        ``(q (S, Hq/sp, D), k (S, Hk/sp, D), v (S, Hk/sp, D))``: views into one received buffer
        ``(S, (Hq + 2 Hk)/sp, D)`` (not contiguous: rows of ``(Hq + 2 Hk)/sp * D`` elements; the last dim is).
        Built with one copy (the send buffer); the backward concatenates the three gradients (one copy), exchanges
        them and reorders each (one copy).

    Raises:
        ValueError: ``Hq`` or ``Hk`` not divisible by ``size`` (naming them), or q, k, v of mismatched shapes.
    """
    return _seq_to_heads((q, k, v), group, size)


def traceable_heads_to_seq(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """Inverse of :func:`traceable_seq_to_heads`: ``(S, H/sp, D) -> (S/sp, H, D)`` (traced the same way). ``x`` is
    sent as it is (copied only if not contiguous: chunk j of the sequence goes to rank j); the received
    ``(sp, S/sp, H/sp, D)`` is reordered to ``(S/sp, sp, H/sp, D)`` into the contiguous result (one copy).

    Raises:
        ValueError: ``S`` not divisible by ``size``.
    """
    n = x.shape[0]
    if n % size:
        raise ValueError(f"heads->seq all-to-all: sequence length {n} (dim 0 of shape {tuple(x.shape)}) is not "
                         f"divisible by the SP size {size}")
    recv = _all_to_all(x, group).unflatten(0, (size, n // size))
    return recv.transpose(0, 1).flatten(1, 2)


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
