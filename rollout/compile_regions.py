"""Decoder layers as nested compile regions (``rollout.decode_compile_regions``): ``torch.compile`` of a decode step
then compiles ONE decoder layer and calls it for every layer, instead of lowering and generating code for each
layer of the unrolled model one after the other.

:func:`mark_layer_regions` replaces each decoder layer's ``forward`` (on that module instance only) by one shared
function marked with ``torch.compiler.nested_compile_region``, which takes the layer as its first argument: dynamo
still traces every call, but the traced layers are the same graph, so AOT autograd and inductor compile it once
(torch's hierarchical compilation, the ``invoke_subgraph`` operator). Outside ``torch.compile`` the marked function
just runs the layer. Which modules are decoder layers: those whose class transformers names in the model's
``_no_split_modules`` (e.g. ``LlamaDecoderLayer``).

The math is unchanged (the same layer code); inductor does not fuse across a layer boundary (a residual add with
the next layer's norm), which can cost a little per step. On CPU (SmolLM2-135M's shape, 30 layers, random weights,
inductor, empty caches, 2 cores): the first decode call took 23.2 s with regions against 44.4 s without, with the
same greedy tokens.
"""
from __future__ import annotations

import functools

import torch

__all__ = ["mark_layer_regions"]


def _layer_forward(layer: torch.nn.Module, *args, **kwargs):
    """The layer's own class ``forward`` (the body of the shared region)."""
    return type(layer).forward(layer, *args, **kwargs)


def mark_layer_regions(model: torch.nn.Module) -> int:
    """Make every decoder layer of ``model`` call one nested compile region; returns how many layers were marked
    (0 when the model names no layer class in ``_no_split_modules``, or none of its modules is one; the model is then
    left as it was). Marking a layer twice keeps one mark."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    region = torch.compiler.nested_compile_region(_layer_forward)  # one marked function: one region for all
    for layer in layers:
        layer.forward = functools.partial(region, layer)
    return len(layers)
