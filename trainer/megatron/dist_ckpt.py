"""Model and optimizer state through ``megatron.core.dist_checkpointing`` (sharded state dicts, reshardable).

What is saved, under ``<role>/dist_ckpt/`` (torch.distributed.checkpoint files ``__<rank>_<i>.distcp``,
``.metadata``, Megatron's ``common.pt`` and ``metadata.json``):

* ``model`` (``model<i>`` per virtual-pipeline chunk): ``GPTModel.sharded_state_dict()``. Every tensor is stored
  once, with its GLOBAL shape: tensor-parallel shards are concatenated along their split axis (SwiGLU's fc1 as
  ``[gate; up]``), pipeline stages carry global layer numbers, data-parallel replicas are written by one rank.
  Loading builds the sharded state dict of the model as it is now (any TP/PP) and each rank reads its own slices,
  so a checkpoint written at TP=2 resumes at TP=1, and PP may change too.
* ``optimizer``: Megatron optimizers give their own ``sharded_state_dict`` (the distributed optimizer with
  ``distrib_optim_sharding_type=fully_reshardable``: moments stored in model-parameter shape, so they reshard with
  the model). A torch optimizer (the CPU path's AdamW) is mapped onto the model's sharding by
  :func:`torch_optimizer_sharded_state_dict`; Adam's step count is stored once (``common_step``).
* the sharding metadata (:data:`SHARDING_METADATA`), stored with ``content_metadata`` and read back on load so
  that load builds the same layout as save.

Vocabulary padding depends on TP (a multiple of ``tp``); megatron-core marks the embedding and output layer
``allow_shape_mismatch``, so the padded rows are dropped or zero-filled when the padding changes.

Loading the distributed optimizer without Apex / Transformer Engine (torch's Adam keeps a ``step`` tensor in every
parameter's state): :func:`load_megatron_optimizer_state` restores the param groups and steps first and the
per-parameter tensors second, with the ``step`` entries set aside (:func:`step_state_set_aside`), because
megatron-core's ``_set_main_param_and_optimizer_states`` copies every tensor of a parameter's state from the loaded
tensors, which never hold ``step`` (KeyError 'step', megatron-core 0.16 to 0.19).

CPU: megatron-core's torch_dist writer calls ``torch.cuda.synchronize`` and builds a flag tensor on
``torch.cuda.current_device()``; :func:`cpu_device_compat` maps both to the CPU while saving or loading (gloo).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

from trainer.megatron.engine import unwrap

# Megatron-LM's keys (megatron/training/checkpointing.py): fully_reshardable lets TP/PP change on load
SHARDING_METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "singleton_local_shards": False,
                     "chained_optim_avoid_prefix": True}


@contextmanager
def cpu_device_compat():
    """Without CUDA: ``torch.cuda.synchronize`` does nothing and ``torch.cuda.current_device()`` is ``"cpu"``
    inside the block (megatron-core's torch_dist save/load assume a GPU there). A no-op context with CUDA."""
    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None), \
            mock.patch.object(torch.cuda, "current_device", lambda: "cpu"):
        yield


def model_sharded_state_dict(chunks: list, metadata: dict) -> dict:
    """``{"model": ...}`` (one chunk) or ``{"model0": ..., "model1": ...}`` of ``sharded_state_dict`` per chunk."""
    if len(chunks) == 1:
        return {"model": unwrap(chunks[0]).sharded_state_dict(metadata=metadata)}
    return {f"model{i}": unwrap(c).sharded_state_dict(metadata=metadata) for i, c in enumerate(chunks)}


@torch.no_grad()
def materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the per-parameter state of a torch optimizer that has not stepped yet (a load template).

    One step with zero gradients at learning rate 0 and weight decay 0: the parameters do not change, Adam's
    moments are created as zeros (their values are replaced by the loaded ones). Parameters that already have
    state are left as they are.
    """
    todo = [p for g in optimizer.param_groups for p in g["params"] if not optimizer.state.get(p)]
    if not todo:
        return
    saved = [(g["lr"], g.get("weight_decay")) for g in optimizer.param_groups]
    grads = {p: p.grad for p in todo}
    for g in optimizer.param_groups:
        g["lr"] = 0.0 if not isinstance(g["lr"], torch.Tensor) else g["lr"].new_zeros(())
        if "weight_decay" in g:
            g["weight_decay"] = 0.0
    for p in todo:
        p.grad = torch.zeros_like(p)
    try:
        optimizer.step()
    finally:
        for g, (lr, wd) in zip(optimizer.param_groups, saved):
            g["lr"] = lr
            if wd is not None:
                g["weight_decay"] = wd
        for p, grad in grads.items():
            p.grad = grad


def torch_optimizer_sharded_state_dict(optimizer: torch.optim.Optimizer, model_sd: dict,
                                       is_loading: bool = False) -> dict:
    """The sharded state dict of a torch optimizer whose parameters are the model's (e.g. AdamW on CPU).

    Each per-parameter state tensor (``exp_avg``, ``exp_avg_sq``, ...) gets the sharding of its parameter
    (``megatron.core.dist_checkpointing.optimizer.optim_state_to_sharding_state``); the ``step`` counts, equal
    for every parameter, are stored once as ``state["common_step"]``; param groups are kept as local objects.

    Raises:
        ValueError: parameters have different step counts.
    """
    from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                            optim_state_to_sharding_state)

    if is_loading:
        materialize_optimizer_state(optimizer)
    sd = optimizer.state_dict()
    steps = {float(s["step"]) for s in sd["state"].values() if "step" in s}
    if len(steps) > 1:
        raise ValueError(f"optimizer parameters have different step counts {sorted(steps)}; expected one")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    optim_state_to_sharding_state(sd, get_param_id_to_sharded_param_map(model_sd, params), exclude_keys=("step",))
    if steps:
        sd["state"]["common_step"] = steps.pop()
    return sd


def load_torch_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of :func:`torch_optimizer_sharded_state_dict` on the loaded dict: one ``step`` tensor per parameter."""
    step = state["state"].pop("common_step", None)
    if step is not None:
        for s in state["state"].values():
            s["step"] = torch.tensor(float(step), dtype=torch.float32)
    optimizer.load_state_dict(state)


def inner_torch_optimizers(optimizer: Any) -> list:
    """The torch optimizers inside a Megatron optimizer: ``ChainedOptimizer.chained_optimizers`` each hold one in
    ``.optimizer`` (the distributed optimizer's steps the fp32 main-parameter shards). A torch optimizer is its own."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    inner = getattr(optimizer, "chained_optimizers", None)
    if inner is not None:
        return [t for o in inner for t in inner_torch_optimizers(o)]
    inner = getattr(optimizer, "optimizer", None)
    return inner_torch_optimizers(inner) if inner is not None else []


def prepare_optimizer_for_load(optimizer: Any) -> None:
    """Give every torch optimizer inside ``optimizer`` its per-parameter state before a dist-checkpoint load.

    A fresh optimizer has none, and without Apex or Transformer Engine megatron-core's
    ``DistributedOptimizer.state_dict()`` (which ``sharded_state_dict(..., is_loading=True)`` calls) reads Adam's
    ``step`` from that state and asserts that there is exactly one value. :func:`materialize_optimizer_state`
    creates it at learning rate 0, so the fp32 main parameters do not change; the load then replaces the values.
    """
    for inner in inner_torch_optimizers(optimizer):
        materialize_optimizer_state(inner)


@contextmanager
def step_state_set_aside(optimizer: Any):
    """Hide torch Adam's per-parameter ``step`` tensors inside a Megatron optimizer (``.optimizer``, or a chained
    one's ``.chained_optimizers[i].optimizer``) in the block.

    Megatron's distributed optimizer loads its per-parameter state (``load_parameter_state`` of the torch format,
    ``load_parameter_state_from_*`` of the dist formats) through ``_set_main_param_and_optimizer_states``, which
    copies EVERY tensor of the inner optimizer's state for a parameter from the loaded tensors. Without Apex /
    Transformer Engine that state holds ``step`` (torch's Adam; ``DistributedOptimizer.load_state_dict`` has just
    set it from the param groups), and the loaded per-parameter tensors never do (megatron stores the step in the
    param groups): KeyError 'step' (megatron-core 0.19.2 on H200). The steps are put back unchanged afterwards.
    """
    inner = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    saved = []
    for opt in inner:
        for state in (getattr(opt, "state", None) or {}).values():
            if isinstance(state, dict) and "step" in state:
                saved.append((state, state.pop("step")))
    try:
        yield
    finally:
        for state, step in saved:
            state["step"] = step


# DistributedOptimizer.load_state_dict's dispatch on ``param_state_sharding_type`` (megatron-core 0.16 - 0.19)
_PARAM_STATE_LOADERS = {"fully_reshardable": "load_parameter_state_from_fully_reshardable",
                        "dp_reshardable": "load_parameter_state_from_dp_reshardable",
                        "fully_sharded_model_space": "load_parameter_state_from_fs_model_space",
                        "dp_zero_gather_scatter": "load_parameter_state_from_dp_zero"}


def _optimizer_parts(optimizer: Any, state: Any) -> list:
    """``(optimizer, state)`` per part, as ``ChainedOptimizer.load_state_dict`` hands them out (one part gets the
    whole state; several get the entries in key order)."""
    parts = getattr(optimizer, "chained_optimizers", None)
    if parts is None:
        return [(optimizer, state)]
    if len(parts) == 1:
        return [(parts[0], state)]
    states = [v for _, v in sorted(state.items())] if isinstance(state, dict) else list(state)
    return list(zip(parts, states))


@torch.no_grad()  # megatron copies into its fp32 main parameters in place
def load_megatron_optimizer_state(optimizer: Any, state: Any) -> None:
    """``optimizer.load_state_dict(state)`` for a Megatron optimizer (distributed, chained, mixed precision) loaded
    from a dist checkpoint, in two parts for the distributed optimizer.

    Its ``load_state_dict`` restores the param groups and the step (a ``step`` tensor in each parameter's state of
    torch's Adam), then the per-parameter tensors (``param_state``), which fails on that ``step`` (see
    :func:`step_state_set_aside`). Here the ``param_state`` entries are taken out, ``load_state_dict`` loads the rest,
    and each distributed optimizer then loads its own ``param_state`` with the steps set aside.
    """
    deferred = []
    for part, sub in _optimizer_parts(optimizer, state):
        loader = _PARAM_STATE_LOADERS.get(sub.get("param_state_sharding_type")) if isinstance(sub, dict) else None
        if loader is not None and "param_state" in sub and hasattr(part, loader):
            deferred.append((getattr(part, loader), sub.pop("param_state")))
            del sub["param_state_sharding_type"]
    optimizer.load_state_dict(state)
    with step_state_set_aside(optimizer):
        for load_param_state, param_state in deferred:
            load_param_state(param_state)


def _optimizer_sharded(optimizer: Any, model_sd: dict, is_loading: bool, metadata: dict) -> dict:
    if hasattr(optimizer, "sharded_state_dict"):  # Megatron's optimizers (distributed, chained, fp32)
        if is_loading:
            prepare_optimizer_for_load(optimizer)
        return optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=metadata)
    return torch_optimizer_sharded_state_dict(optimizer, model_sd, is_loading)


def _save_strategy():
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    strategy = get_default_save_sharded_strategy("torch_dist")
    if torch.distributed.is_initialized() and ps.get_data_parallel_world_size() > 1:
        # spread the writes of data-parallel replicas over the DP ranks (Megatron-LM's fully parallel save)
        strategy = FullyParallelSaveStrategyWrapper(strategy, ps.get_data_parallel_group(with_context_parallel=True))
    return strategy


def save_dist(chunks: list, optimizer: Any, ckpt_dir: str, metadata: dict | None = None) -> None:
    """Save the model chunks (and the optimizer unless None) into the existing empty folder ``ckpt_dir``.

    Collective: every rank of the job calls it with its own chunks and optimizer.
    """
    from megatron.core import dist_checkpointing

    metadata = dict(SHARDING_METADATA if metadata is None else metadata)
    with cpu_device_compat():
        sd = model_sharded_state_dict(chunks, metadata)
        if optimizer is not None:
            sd["optimizer"] = _optimizer_sharded(optimizer, sd, False, metadata)
        dist_checkpointing.save(sd, ckpt_dir, sharded_strategy=_save_strategy(), content_metadata=metadata)


def load_dist(chunks: list, optimizer: Any, ckpt_dir: str, load_optimizer: bool = True) -> None:
    """Load the model chunks (and the optimizer when ``load_optimizer``) from ``ckpt_dir``, resharded to this
    rank's TP/PP position. Collective.

    Raises:
        FileNotFoundError: ``ckpt_dir`` has no dist-checkpoint metadata.
        RuntimeError: the model's parameter names differ from the checkpoint's (names them).
    """
    from megatron.core import dist_checkpointing

    if not os.path.isfile(os.path.join(ckpt_dir, "metadata.json")):
        raise FileNotFoundError(f"{ckpt_dir!r} is not a Megatron dist checkpoint (no metadata.json)")
    metadata = dist_checkpointing.load_content_metadata(ckpt_dir) or dict(SHARDING_METADATA)
    with cpu_device_compat():
        sd = model_sharded_state_dict(chunks, metadata)
        want_optimizer = load_optimizer and optimizer is not None
        if want_optimizer:
            sd["optimizer"] = _optimizer_sharded(optimizer, sd, True, metadata)
        state = dist_checkpointing.load(sd, ckpt_dir)
    keys = ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]
    for key, chunk in zip(keys, chunks):
        res = unwrap(chunk).load_state_dict(state[key], strict=False)
        bad = [k for k in res.missing_keys if not k.endswith("_extra_state")] + list(res.unexpected_keys)
        if bad:
            raise RuntimeError(f"model state mismatch loading {ckpt_dir!r}: {bad}")
    if want_optimizer and hasattr(optimizer, "sharded_state_dict"):
        load_megatron_optimizer_state(optimizer, state["optimizer"])
    elif want_optimizer:
        load_torch_optimizer_state(optimizer, state["optimizer"])
