"""Variable-length ("varlen") causal attention over a packed token stream, with three interchangeable kernels.

All kernels take the packed layout ``q (total, num_heads, head_dim)``, ``k, v (total, num_kv_heads, head_dim)``
and ``cu_seqlens (num_seqs + 1,) int32``; token ``i`` attends to token ``j`` iff both are in the same sequence,
``j <= i`` (when causal) and ``i - j < sliding_window`` (when a window is given; the Hugging Face convention,
see ``transformers.masking_utils.sliding_window_overlay``). GQA: ``num_heads % num_kv_heads == 0`` and query
head ``h`` uses kv head ``h // (num_heads // num_kv_heads)``.

Kernels (``kernel=``):

* ``"flash_attn"`` -- ``flash_attn.flash_attn_varlen_func`` (Dao-AILab flash-attention; CUDA, fp16/bf16).
* ``"torch_varlen"`` -- ``torch.nn.attention.varlen.varlen_attn`` (PyTorch's own flash kernel; CUDA, fp16/bf16).
  Causal is ``window_size=(-1, 0)`` on torch builds whose signature has ``window_size`` (read from
  ``inspect.signature`` at first use); older builds take ``is_causal=True``.
* ``"sdpa"`` -- reference: ``torch.nn.functional.scaled_dot_product_attention`` with a dense block-diagonal
  causal mask of shape ``(total, total)``. Exact, any device/dtype, O(total^2) memory: for tests and CPU.
* ``"auto"`` -- the first of the above that can run on the given tensors.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

__all__ = ["varlen_attention", "pick_kernel", "available_kernels", "KERNELS"]

KERNELS = ("auto", "flash_attn", "torch_varlen", "sdpa")


# resolved once, at first use (kept in a plain dict rather than functools.lru_cache so that torch.compile traces the
# lookups as constants; apply_ulysses_patch resolves both eagerly)
_RESOLVED: dict = {}


def _flash_attn_fn():
    """``flash_attn.flash_attn_varlen_func`` or None (not installed, or a broken CUDA build)."""
    if "flash_attn" not in _RESOLVED:
        try:
            from flash_attn import flash_attn_varlen_func  # type: ignore
        except Exception:  # ImportError, or a broken CUDA build
            flash_attn_varlen_func = None
        _RESOLVED["flash_attn"] = flash_attn_varlen_func
    return _RESOLVED["flash_attn"]


def _torch_varlen():
    """``(fn, parameter names)`` of ``torch.nn.attention.varlen.varlen_attn`` or ``(None, ())``."""
    if "torch_varlen" not in _RESOLVED:
        try:
            from torch.nn.attention.varlen import varlen_attn  # type: ignore
            _RESOLVED["torch_varlen"] = (varlen_attn, tuple(inspect.signature(varlen_attn).parameters))
        except Exception:
            _RESOLVED["torch_varlen"] = (None, ())
    return _RESOLVED["torch_varlen"]


def available_kernels() -> tuple[str, ...]:
    """The concrete kernels this process can import: ``"flash_attn"`` and ``"torch_varlen"`` when present (they
    also need CUDA fp16/bf16 tensors, see :func:`pick_kernel`), and always ``"sdpa"``. Resolves both imports now
    (``torch.compile`` then reads them as constants)."""
    found = (("flash_attn", _flash_attn_fn() is not None), ("torch_varlen", _torch_varlen()[0] is not None))
    return tuple(name for name, ok in found if ok) + ("sdpa",)


def _half(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float16, torch.bfloat16)


def pick_kernel(q: torch.Tensor, kernel: str = "auto") -> str:
    """Resolve ``kernel`` (one of :data:`KERNELS`) to a concrete kernel name for tensors like ``q``.

    Raises:
        ValueError: unknown kernel name, or an explicit kernel that cannot run here (not importable / not CUDA).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown varlen attention kernel {kernel!r}; expected one of {KERNELS}")
    gpu_ok = q.is_cuda and _half(q)
    if kernel == "auto":
        if gpu_ok and _flash_attn_fn() is not None:
            return "flash_attn"
        if gpu_ok and _torch_varlen()[0] is not None:
            return "torch_varlen"
        return "sdpa"
    if kernel == "flash_attn" and (_flash_attn_fn() is None or not gpu_ok):
        raise ValueError("kernel 'flash_attn' needs the flash_attn package and CUDA fp16/bf16 tensors")
    if kernel == "torch_varlen" and (_torch_varlen()[0] is None or not gpu_ok):
        raise ValueError("kernel 'torch_varlen' needs torch.nn.attention.varlen and CUDA fp16/bf16 tensors")
    return kernel


def _window(causal: bool, sliding_window: int | None) -> tuple[int, int]:
    left = -1 if sliding_window is None else sliding_window - 1
    return (left, 0 if causal else -1)


def _sdpa_reference(q, k, v, cu_seqlens, scale, causal, sliding_window, dropout):
    total = q.shape[0]
    seg = torch.repeat_interleave(torch.arange(cu_seqlens.numel() - 1, device=q.device),
                                  cu_seqlens.diff().long(), output_size=total)
    idx = torch.arange(total, device=q.device)
    diff = idx[:, None] - idx[None, :]  # i - j
    mask = seg[:, None] == seg[None, :]
    if causal:
        mask &= diff >= 0
    if sliding_window is not None:
        mask &= diff < sliding_window if causal else diff.abs() < sliding_window
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, dropout_p=dropout, scale=scale)
    return out.transpose(0, 1).contiguous()  # (total, H, D) row-major, like the CUDA kernels' output


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     scale: float | None = None, causal: bool = True, sliding_window: int | None = None,
                     dropout: float = 0.0, kernel: str = "auto") -> torch.Tensor:
    """Attention within each packed sequence.

    Args:
        q: ``(total, num_heads, head_dim)``.
        k, v: ``(total, num_kv_heads, head_dim)``; ``num_heads % num_kv_heads == 0``.
        cu_seqlens: ``(num_seqs + 1,)`` int32 cumulative sequence lengths, ``cu_seqlens[-1] == total``.
        max_seqlen: longest sequence (python int).
        scale: softmax scale (default ``head_dim ** -0.5``).
        causal: causal masking inside each sequence.
        sliding_window: attend to at most this many tokens back (including self), or None.
        dropout: attention-probability dropout (training only; 0 for log-prob computation).
        kernel: see module docstring.

    Returns:
        ``(total, num_heads, head_dim)`` in ``q``'s dtype.

    Raises:
        ValueError: on inconsistent shapes or an unusable kernel.
    """
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[0] != k.shape[0]:
        raise ValueError(f"varlen_attention expects q (T,H,D), k/v (T,Hk,D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"num_heads {q.shape[1]} is not a multiple of num_kv_heads {k.shape[1]}")
    # checked for host tensors only (reading a device tensor's last entry would be a host sync in every layer) and
    # not while torch.compile traces (a data-dependent branch there is a graph break)
    if (cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling()
            and int(cu_seqlens[-1]) != q.shape[0]):
        raise ValueError(f"cu_seqlens ends at {int(cu_seqlens[-1])} but there are {q.shape[0]} tokens")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    name = pick_kernel(q, kernel)
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    if name == "flash_attn":
        return _flash_attn_fn()(q, k, v, cu, cu, max_seqlen, max_seqlen, dropout_p=dropout, softmax_scale=scale,
                                causal=causal, window_size=_window(causal, sliding_window))
    if name == "torch_varlen":
        fn, params = _torch_varlen()
        if dropout:
            raise ValueError("torch varlen_attn has no dropout; use dropout=0 or another kernel")
        kw = {"scale": scale}
        if "window_size" in params:
            kw["window_size"] = _window(causal, sliding_window)
        else:
            if sliding_window is not None and sliding_window < max_seqlen:
                raise ValueError("this torch build's varlen_attn has no window_size; sliding window unsupported")
            kw["is_causal"] = causal
        if k.shape[1] != q.shape[1]:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return fn(q, k, v, cu, cu, max_seqlen, max_seqlen, **kw)
    return _sdpa_reference(q, k, v, cu, scale, causal, sliding_window, dropout)
