"""Export a trained model (plain module or DeepSpeed engine, ZeRO 0-3) as a Hugging Face folder.

The folder holds ``config.json`` (with ``dtype`` = the given training dtype), ``model.safetensors``
(sharded files + index for big models), ``generation_config.json`` and the tokenizer files including the chat
template, and loads with ``AutoModelForCausalLM.from_pretrained`` (or ``AutoModelForTokenClassification``
for a value model). Tied input/output embeddings are written once; ``save_pretrained`` re-ties them on load.

Under ZeRO-3 every rank must call :func:`export_hf`: parameters are gathered one module at a time with
``deepspeed.zero.GatheredParameters`` and copied to CPU on rank 0, so peak extra memory is one layer.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from trainer.checkpoint.atomic import barrier, give_umask_modes
from trainer.checkpoint.deepspeed_manager import LORA_SUBDIR, save_hf_metadata, trained_model_config

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def to_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32|bfloat16|float16`` from a dtype or a name (``"bf16"``, ``"bfloat16"``, ``"fp32"``...).

    Raises ValueError naming the bad value."""
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.replace("torch.", "") in _DTYPES:
        return _DTYPES[dtype.replace("torch.", "")]
    raise ValueError(f"dtype={dtype!r}; expected one of float32, bfloat16, float16")


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def unwrap_module(module_or_engine: Any) -> torch.nn.Module:
    """The ``nn.Module`` inside a DeepSpeed engine (``engine.module``), or the module itself."""
    try:
        from deepspeed import DeepSpeedEngine
        if isinstance(module_or_engine, DeepSpeedEngine):
            return module_or_engine.module
    except ImportError:  # pragma: no cover - deepspeed is a hard dependency of the trainer
        pass
    if not isinstance(module_or_engine, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module or DeepSpeedEngine, got {type(module_or_engine).__name__}")
    return module_or_engine


def gather_full_state_dict(module: torch.nn.Module, zero_stage: int, dtype: torch.dtype) -> dict | None:
    """Full (unpartitioned) state dict on CPU in ``dtype`` on rank 0; None on other ranks.

    ZeRO-3: gathers each module's own parameters with ``deepspeed.zero.GatheredParameters`` (all ranks must
    call this). Tensors shared between modules (tied embeddings) stay one tensor in the result, so
    ``save_pretrained`` writes them once. Floating-point buffers are cast too; integer ones are kept.
    """
    rank = _rank()
    sd: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}

    def take(t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        if key not in seen:
            t = t.detach().to("cpu", copy=True)
            seen[key] = t.to(dtype) if t.is_floating_point() else t
        return seen[key]

    if zero_stage == 3:
        import deepspeed
        for prefix, sub in module.named_modules():
            params = list(sub.named_parameters(recurse=False))
            if not params:
                continue
            with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
                if rank == 0:
                    for name, p in params:
                        sd[f"{prefix}.{name}" if prefix else name] = take(p)
        full_keys = module.state_dict().keys() if rank == 0 else []
        shared_from = {id(p): n for n, p in module.named_parameters()} if rank == 0 else {}
        # tied parameters are listed under both names in state_dict(); map the alias to the same tensor
        if rank == 0:
            for n, p in module.named_parameters(remove_duplicate=False):
                if n not in sd and id(p) in shared_from:
                    sd[n] = sd[shared_from[id(p)]]
            for n, b in module.named_buffers():
                if n in full_keys and n not in sd:
                    sd[n] = take(b)
    else:
        if rank == 0:
            for n, t in module.state_dict(keep_vars=True).items():
                sd[n] = take(t)
    return sd if rank == 0 else None


def export_hf(module_or_engine: Any, out_dir: str, tokenizer: Any = None, dtype: torch.dtype | str = torch.bfloat16,
              zero_stage: int = 0, value_head: bool = False, max_shard_size: str = "5GB") -> str | None:
    """Write a Hugging Face model folder from a training model; all ranks call it under ZeRO-3.

    Args:
        module_or_engine: a ``transformers.PreTrainedModel`` or a DeepSpeed engine wrapping one.
        out_dir: target folder (created; files overwritten).
        tokenizer: saved with its chat template (None: skipped).
        dtype: weight dtype written and recorded as ``config.dtype`` (the training dtype).
        zero_stage: the engine's ZeRO stage (3 gathers partitioned parameters).
        value_head: the model is a value model (critic): its head must have one output; the config is
            written with ``num_labels=1`` so ``AutoModelForTokenClassification`` reloads it.
    A LoRA model (``peft.PeftModel``) is written merged (``trainer.workers.lora.merged_state_dict``) as its base
    model's class, with the adapter folder that ``peft.PeftModel.from_pretrained`` loads in ``<out_dir>/lora_adapter``.

    Returns:
        ``out_dir`` on rank 0, None elsewhere.
    Raises:
        ValueError: bad ``dtype``/``zero_stage``, or ``value_head`` with a head that is not one output wide.
        TypeError: a module that is not a ``PreTrainedModel`` (no ``save_pretrained``/``config``).
    """
    from trainer.workers.lora import is_lora_model, merged_state_dict
    from trainer.workers.lora_adapter import save_adapter

    dtype = to_dtype(dtype)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r}; expected 0, 1, 2 or 3")
    module = unwrap_module(module_or_engine)
    if is_lora_model(module):  # the merged weights under the base model's names, and the adapter beside them
        save_adapter(module, os.path.join(out_dir, LORA_SUBDIR), zero_stage, dtype, _rank())
        sd, module = merged_state_dict(module, zero_stage, dtype, _rank()), module.get_base_model()
    elif not hasattr(module, "save_pretrained") or not hasattr(module, "config"):
        raise TypeError(f"{type(module).__name__} is not a transformers PreTrainedModel; cannot export to HF")
    else:
        sd = gather_full_state_dict(module, zero_stage, dtype)
    if _rank() != 0:
        barrier()
        return None
    config = trained_model_config(module, dtype=dtype)
    if value_head:
        head = [k for k in sd if k.endswith(("score.weight", "classifier.weight", "value_head.weight", "v_head.weight"))]
        if not head or sd[head[0]].shape[0] != 1:
            shape = tuple(sd[head[0]].shape) if head else None
            raise ValueError(f"value_head=True but the model has no one-output head (found {head}, shape {shape})")
        config.num_labels = 1
    os.makedirs(out_dir, exist_ok=True)
    module.save_pretrained(out_dir, state_dict=sd, safe_serialization=True, max_shard_size=max_shard_size)
    # save_pretrained records the live parameters' dtype; overwrite config.json with the training dtype
    config.dtype = dtype
    config.save_pretrained(out_dir)
    gen = getattr(module, "generation_config", None) if not value_head else None
    save_hf_metadata(out_dir, None, tokenizer, None, gen)
    give_umask_modes(out_dir)  # safetensors writes its weights 0600
    logger.info("exported HF model (%s) to %s", dtype, out_dir)
    barrier()
    return out_dir
