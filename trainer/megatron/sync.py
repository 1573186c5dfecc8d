"""Gather a TP/PP-sharded megatron-core model into HF-named tensors (rollout weight sync and HF export).

Per parameter of this pipeline stage: all-gather over the tensor-parallel group, merge with
``trainer.megatron.weights.merge_tp`` and convert to HF names. With ``pp > 1`` every stage then broadcasts its
HF tensors over the pipeline group (stage-local names and shapes are exchanged first with
``all_gather_object``), so every rank yields the whole model, in the same order on every rank. With tp = pp = 1
no communication happens. Yields CPU-or-device tensors detached from autograd.

The rollout engine takes buckets of ``(name, tensor)`` (``rollout.context``); :func:`iter_hf_buckets` groups
the stream by byte size.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from trainer.megatron.weights import layer_range, mcore_full_to_hf, merge_tp, split_kind


def _groups():
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_rank())


def _local_hf(model: torch.nn.Module, shape, tp_group, tp_size, pp_size, pp_rank) -> Iterator[tuple[str, torch.Tensor]]:
    offset = layer_range(shape.num_layers, pp_size, pp_rank).start
    for name, p in model.named_parameters():
        if name == "output_layer.weight" and shape.tie_word_embeddings:
            continue
        t = p.detach()
        if tp_size > 1 and split_kind(name) != "rep":
            parts = [torch.empty_like(t) for _ in range(tp_size)]
            torch.distributed.all_gather(parts, t.contiguous(), group=tp_group)
            t = merge_tp(split_kind(name), parts)
        yield from mcore_full_to_hf(name, t, shape, offset)


@torch.no_grad()
def iter_hf_weights(model: torch.nn.Module, shape) -> Iterator[tuple[str, torch.Tensor]]:
    """All HF ``(name, tensor)`` pairs of the model (every rank of the model-parallel group must iterate).

    Args:
        model: this rank's megatron-core GPTModel (unwrapped from DDP).
        shape: ``trainer.megatron.config.ModelShape`` of the HF config.
    """
    tp_group, tp_size, pp_group, pp_size, pp_rank = _groups()
    if pp_size == 1:
        yield from _local_hf(model, shape, tp_group, tp_size, pp_size, pp_rank)
        return
    mine = list(_local_hf(model, shape, tp_group, tp_size, pp_size, pp_rank))
    meta = [(n, tuple(t.shape), t.dtype) for n, t in mine]
    all_meta: list = [None] * pp_size
    torch.distributed.all_gather_object(all_meta, meta, group=pp_group)
    for stage, stage_meta in enumerate(all_meta):
        src = torch.distributed.get_global_rank(pp_group, stage)
        for i, (name, shp, dtype) in enumerate(stage_meta):
            t = mine[i][1].contiguous() if stage == pp_rank else torch.empty(
                shp, dtype=dtype, device=mine[0][1].device if mine else "cpu")
            torch.distributed.broadcast(t, src=src, group=pp_group)
            yield name, t


def iter_hf_buckets(model: torch.nn.Module, shape, bucket_bytes: int = 512 * 2 ** 20
                    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """:func:`iter_hf_weights` grouped in lists of at most ``bucket_bytes`` (one tensor may exceed it)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be > 0")
    from rollout.context import bucket_named_tensors

    yield from bucket_named_tensors(iter_hf_weights(model, shape), bucket_bytes)
