"""Where the sequence-parallel slice is taken when it cannot be taken on the token ids: at the decoder's input.

A text-only model embeds token by token, so the caller slices the packed ``input_ids`` before the model
(``patches.sequence_parallel.pad_and_slice_inputs``). A vision-language model first merges image features into
the text embeddings over the whole row; :func:`slice_decoder_inputs` then makes the decoder (the module
:func:`decoder_of` finds, with a forward pre-hook :func:`install_decoder_slicing` adds) keep only this SP rank's
chunk of ``inputs_embeds`` and of ``position_ids`` (whatever their number of rows, e.g. M-RoPE's ``(4, 1, S)``).
The same mechanism serves both kinds of model; nothing here depends on a model class.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from patches.sequence_parallel import UlyssesGroup

__all__ = ["boundary_positions", "slice_decoder_inputs", "decoder_of", "install_decoder_slicing"]


def boundary_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """The 1-D row of ``position_ids`` whose zeros mark where packed sequences start: ``(S,)`` from ``(S,)``,
    ``(1, S)`` or a multi-row layout ``(C, 1, S)`` / ``(C, S)`` (row 0).

    Multi-row layouts: a multimodal decoder with 3-D rotary positions (Qwen2-VL's M-RoPE) is called with
    ``(4, 1, S)``, row 0 the text positions (0, 1, ... per sequence) and rows 1-3 the temporal/height/width
    positions; transformers hands row 0 to the attention. Row 0 of any layout given here must restart at 0
    exactly at sequence starts (a bare 3-row M-RoPE layout does not when a sequence opens with an image).
    """
    if position_ids.dim() <= 1:
        return position_ids
    return position_ids.reshape(-1, position_ids.shape[-1])[0]


_DECODER_SLICE: contextvars.ContextVar[UlyssesGroup | None] = contextvars.ContextVar("ulysses_decoder_slice",
                                                                                     default=None)


@contextlib.contextmanager
def slice_decoder_inputs(sp: UlyssesGroup):
    """Inside the block, the decoder of every model patched by :func:`apply_ulysses_patch` keeps only this SP rank's
    contiguous chunk of its inputs: ``inputs_embeds`` / ``input_ids`` ``(1, S, ...) -> (1, S/sp, ...)`` and
    ``position_ids`` ``(..., S) -> (..., S/sp)`` (any leading rows, e.g. the ``(4, 1, S)`` M-RoPE layout).

    For inputs whose embeddings are not token-wise: a vision-language model merges image features into the text
    embeddings over the WHOLE packed row (every image of the micro-batch, on every SP rank: the vision tower runs
    replicated), and only its decoder sees the SP slice. ``S`` must be a multiple of ``sp.size`` (pad the row
    first). Backward: the slice's gradient flows into the full embeddings (zeros elsewhere), so each rank's vision
    tower and embedding get the gradient of its own tokens; the gather's x sp scale and the optimizer's average
    over all ranks then sum them (see :mod:`patches.sequence_parallel`). A text-only model gets the same result
    when the caller slices ``input_ids`` itself (embeddings are token-wise), without embedding the whole row.
    """
    token = _DECODER_SLICE.set(sp)
    try:
        yield sp
    finally:
        _DECODER_SLICE.reset(token)


def _slice_seq(x: torch.Tensor, dim: int, sp: UlyssesGroup, name: str) -> torch.Tensor:
    n = x.shape[dim]
    if n % sp.size:
        raise ValueError(f"slice_decoder_inputs: {name} has {n} positions along dim {dim}, not a multiple of the SP "
                         f"size {sp.size}; pad the packed row to a multiple of it first")
    return x.narrow(dim, sp.rank * (n // sp.size), n // sp.size)


def _decoder_pre_hook(module, args, kwargs):
    """forward pre-hook of the patched model's decoder: :func:`slice_decoder_inputs` when it is active."""
    sp = _DECODER_SLICE.get()
    if sp is None or sp.size == 1:
        return None
    if args:
        raise ValueError("slice_decoder_inputs needs the decoder called with keyword arguments; got "
                         f"{len(args)} positional argument(s)")
    for key, dim in (("inputs_embeds", 1), ("input_ids", 1), ("position_ids", -1)):
        if isinstance(kwargs.get(key), torch.Tensor):
            kwargs[key] = _slice_seq(kwargs[key], dim, sp, key)
    return args, kwargs


def install_decoder_slicing(decoder: torch.nn.Module) -> None:
    """Add the forward pre-hook that applies :func:`slice_decoder_inputs` to ``decoder`` (idempotent)."""
    if not getattr(decoder, "_ulysses_slice_hook", False):
        decoder.register_forward_pre_hook(_decoder_pre_hook, with_kwargs=True)
        decoder._ulysses_slice_hook = True


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The module that runs attention over the text stream: ``model.get_decoder()`` (transformers: the inner
    ``...Model`` of a causal LM, the language model of a vision-language model), else ``model`` itself."""
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_decoder", None)
    decoder = get() if callable(get) else None
    return decoder if isinstance(decoder, torch.nn.Module) else inner
