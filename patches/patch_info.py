"""Reading and adjusting the settings :func:`patches.ulysses.apply_ulysses_patch` gave a model, for code that
compiles the model's layers or records CUDA graphs around the packed forward (nothing here changes numerics).

The settings live on every module of the patched model (one shared object), so a DeepSpeed engine, whose attribute
lookup falls through to ``.module``, answers for the model inside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["UlyssesPatchInfo", "patch_info", "mark_layers_compiled", "set_static_shapes"]


@dataclass(frozen=True)
class UlyssesPatchInfo:
    """What :func:`apply_ulysses_patch` fixed for a model, and what compile integration set later (read it with
    :func:`patch_info`; set it with :func:`mark_layers_compiled` and :func:`set_static_shapes`).

    Attributes:
        sp_size: the SP size fixed at patch time (a bound group's size, or the int given); 0 when it is taken from
            the active group at every forward.
        traceable: host-packed forwards hand the row's boundaries to the attention as keyword arguments (SP size
            fixed at patch time and a forward taking ``**kwargs``): the path ``torch.compile`` traces whole.
        compiled: the decoder layers run under ``torch.compile`` (with SP, host-packed forwards then use the traced
            all-to-alls).
        static_token_multiple: > 0: host-packed rows are padded to shape buckets of this many tokens (CUDA graphs).
        kernel: the varlen kernel asked for (one of ``patches.varlen.KERNELS``).
    """

    sp_size: int
    traceable: bool
    compiled: bool
    static_token_multiple: int
    kernel: str


def _state_of(model):
    state = getattr(model, "_ulysses_state", None)
    if state is None:
        raise ValueError(f"{type(model).__name__} is not patched by patches.ulysses.apply_ulysses_patch")
    return state


def patch_info(model: torch.nn.Module) -> UlyssesPatchInfo | None:
    """The patch's settings of ``model`` (or of the model inside a DeepSpeed engine); None when not patched."""
    state = getattr(model, "_ulysses_state", None)
    if state is None:
        return None
    return UlyssesPatchInfo(state.fixed_size, state.boundary_kwargs, state.compiled, state.static_token_multiple,
                            state.kernel)


def mark_layers_compiled(model: torch.nn.Module) -> None:
    """Record that ``model``'s decoder layers are compiled: with SP > 1, host-packed forwards then pass the
    boundary keyword arguments, so the attention takes the traced all-to-alls (left out eagerly: the primed path
    was measured faster there; see ``attention_kwargs`` in :mod:`patches.ulysses`).

    Raises:
        ValueError: ``model`` is not patched.
    """
    _state_of(model).compiled = True


def set_static_shapes(model: torch.nn.Module, token_multiple: int) -> None:
    """Make :func:`patches.packed_forward.pack_batch` pad ``model``'s host-packed rows to shape buckets (a multiple
    of ``token_multiple`` and of the SP size, 8 sizes per doubling, in a power-of-two count of sequences; see
    :func:`patches.packing.bucket_padding`), and :func:`patches.packed_forward.sp_forward` mark a new CUDA-graph step
    (``torch.compiler.cudagraph_mark_step_begin``) before each forward.

    Raises:
        ValueError: ``model`` is not patched, or ``token_multiple < 1``.
    """
    state = _state_of(model)
    if int(token_multiple) < 1:
        raise ValueError(f"token_multiple must be >= 1, got {token_multiple}")
    state.static_token_multiple = int(token_multiple)
