"""A LoRA model's adapter as peft saves it: its tensors under peft's names, ``adapter_config.json`` and the folder
``peft.PeftModel.from_pretrained`` (and vLLM's ``LoRARequest``) loads (the merge of adapters into the weights:
:mod:`trainer.workers.lora`)."""
from __future__ import annotations

import json
import os

import torch

from trainer.workers.lora import ADAPTER, ADAPTER_CONFIG, ADAPTER_WEIGHTS, _gathered

__all__ = ["adapter_state_dict", "peft_config_dict", "save_adapter_config", "save_adapter"]


def adapter_state_dict(module: torch.nn.Module, zero_stage: int, dtype: torch.dtype | None = None,
                       rank: int = 0) -> dict | None:
    """The adapter's tensors (and a critic's trained head) under peft's saved names
    (``base_model.model.<path>.lora_A.weight``; ``peft.get_peft_model_state_dict``), on CPU (in ``dtype`` when
    given), on ``rank`` 0; None elsewhere. Under ZeRO-3 every rank must call it (one gather of the trainable
    parameters)."""
    from peft import get_peft_model_state_dict

    trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    with _gathered([p for _, p in trainable], zero_stage):
        if rank != 0:
            return None
        own = {n: p.detach().to("cpu", dtype or p.dtype, copy=True) for n, p in trainable}
    return dict(get_peft_model_state_dict(module, state_dict=own, adapter_name=ADAPTER))


def peft_config_dict(module: torch.nn.Module) -> dict:
    """The adapter's ``adapter_config.json`` content (``LoraConfig.to_dict`` made JSON-safe)."""
    cfg = module.peft_config[ADAPTER].to_dict()
    out = {}
    for k, v in cfg.items():
        if isinstance(v, set):
            v = sorted(v)
        elif hasattr(v, "value"):  # TaskType / PeftType enums
            v = v.value
        out[k] = v
    return out


def save_adapter_config(module: torch.nn.Module, out_dir: str, base_model_path: str | None = None) -> str:
    """Write ``adapter_config.json`` into ``out_dir`` (``base_model_name_or_path``: ``base_model_path``, else the
    folder the base model was loaded from); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    config = peft_config_dict(module)
    if base_model_path:
        config["base_model_name_or_path"] = base_model_path
    path = os.path.join(out_dir, ADAPTER_CONFIG)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return path


def save_adapter(module: torch.nn.Module, out_dir: str, zero_stage: int, dtype: torch.dtype | None = None,
                 rank: int = 0, base_model_path: str | None = None) -> str | None:
    """Write the folder ``peft.PeftModel.from_pretrained(base, out_dir)`` loads (and vLLM's ``LoRARequest``):
    ``adapter_config.json`` (``base_model_name_or_path``: ``base_model_path`` when given) and
    ``adapter_model.safetensors``. Every rank calls it under ZeRO-3; rank 0 writes. Returns ``out_dir`` on rank 0."""
    from safetensors.torch import save_file

    sd = adapter_state_dict(module, zero_stage, dtype, rank)
    if rank != 0:
        return None
    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(out_dir, ADAPTER_WEIGHTS))
    save_adapter_config(module, out_dir, base_model_path)
    return out_dir
