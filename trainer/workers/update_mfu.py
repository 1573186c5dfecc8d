"""Model FLOPs utilisation of the actor update, logged as ``perf/mfu/actor`` (verl's key).

``MFU = (6 N T + 12 L H d sum_i s_i^2) / (seconds * peak)`` per rank (:func:`trainer.flops.compute_mfu`;
PaLM, Chowdhery et al. 2022, appendix B): ``T`` the tokens this rank trained (the attention mask's ones, times
``ppo_epochs``, divided by the Ulysses degree since SP peers share their rows' tokens), ``s_i`` the rows' lengths,
``seconds`` the update's wall time on this rank with the device synchronised at its end, ``peak`` the GPU's dense
bf16 peak (:data:`PEAK_BF16_FLOPS`, matched on ``torch.cuda.get_device_name``). The controller averages ranks.
The count is that of full fine-tuning: with LoRA the frozen weights' gradients are not computed, so the figure
over-states the work done. Not logged off CUDA or on a GPU missing from the table.
"""
from __future__ import annotations

import functools
import logging
import time

import torch

logger = logging.getLogger(__name__)

# dense bf16 tensor-core peak FLOP/s (vendor data sheets; no structured sparsity). A device name is matched by the
# longest entry it contains, so "H200" wins over "H20" and "A100" over "A10".
PEAK_BF16_FLOPS = {"H100": 989e12, "H100 PCIe": 756e12, "H200": 989e12, "GH200": 989e12, "H800": 989e12,
                   "H20": 148e12, "B200": 2250e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12,
                   "L4": 121e12, "A10": 125e12}


@functools.lru_cache(maxsize=None)
def device_peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``device_name`` (e.g. ``"NVIDIA H100 80GB HBM3"``), or None when no
    entry of :data:`PEAK_BF16_FLOPS` is part of the name (then logged once at INFO)."""
    hits = [k for k in PEAK_BF16_FLOPS if k.lower() in device_name.lower()]
    if not hits:
        logger.info("perf/mfu/actor is not logged: no peak FLOP/s known for %r", device_name)
        return None
    return PEAK_BF16_FLOPS[max(hits, key=len)]


def update_mfu(role, data, ppo_epochs: int, t0: float, device: torch.device) -> float | None:
    """MFU of an update that started at ``time.perf_counter() == t0`` and has just returned (module docstring).

    Args:
        role: the trained :class:`trainer.workers.model_utils.ModelRole` (its ``hf_config``, counted by
            :func:`trainer.flops.flops_per_token`'s rules, and ``sp_size``, the Ulysses degree).
        data: this rank's update batch (:class:`trainer.protocol.DataProto` or a mapping); its ``attention_mask``,
            (rows, seq), 1 on real tokens (any integer or bool dtype), is read only on CUDA.
        ppo_epochs: passes over the batch.
        device: the worker's device; None is returned off CUDA.

    Returns:
        the fraction of peak (0.4 = 40%), or None off CUDA, on an unknown GPU, or for a batch without an attention
        mask or with no tokens.
    """
    if device.type != "cuda" or "attention_mask" not in data:
        return None
    peak = device_peak_flops(torch.cuda.get_device_name(device))
    if peak is None:
        return None
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    seqlens = data["attention_mask"].sum(-1).tolist()
    if not sum(seqlens) or seconds <= 0:
        return None
    from trainer.flops import compute_mfu

    epochs_per_sp = ppo_epochs / max(role.sp_size, 1)
    mfu = compute_mfu(role.hf_config, int(sum(seqlens)), seqlens, seconds, 1, peak)
    return mfu * epochs_per_sp
