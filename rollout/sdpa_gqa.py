"""``"sdpa_gqa"``: transformers attention that keeps grouped-query attention inside SDPA also with a padding mask
(the transformers rollout engine's default attention on CUDA, :mod:`rollout.hf_engine`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["sdpa_gqa_attention_forward", "register_sdpa_gqa", "auto_attn_implementation"]


def sdpa_gqa_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                               is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention function (registered as ``"sdpa_gqa"``) that lets SDPA do grouped-query attention
    (``enable_gqa=True``) also when a padding mask is given.

    transformers' ``sdpa`` uses ``enable_gqa`` only without a mask on CUDA; with the left-padding mask of batched
    generation (and under ``torch.compile``) it copies K and V ``num_heads / num_kv_heads`` times (``repeat_kv``)
    on every layer of every decoding step, which reads and writes the whole static KV cache. On one H200, SDPA on
    (1024 rows, 9 query / 3 KV heads, 1 query x 512 keys, head dim 64, bf16, bool mask) took 1.64 ms with
    ``repeat_kv`` and 0.117 ms with ``enable_gqa=True`` (cuDNN), outputs equal within 5e-4 (docs/benchmarks.md).

    Shapes: ``query`` (B, H, q, D), ``key``/``value`` (B, KV, k, D) with H a multiple of KV, ``attention_mask``
    None or broadcastable to (B, H, q, k) (bool: True attends; float: additive). Returns ((B, q, H, D), None).
    Falls back to transformers' ``sdpa_attention_forward`` for what it does not handle (no GQA, ``position_bias``,
    ``softcap``, K and V head dims that differ or exceed 256).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.shape[1] == key.shape[1] or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or key.shape[-1] != value.shape[-1] or key.shape[-1] > 256):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    q_len = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = q_len > 1 and attention_mask is None and bool(causal)
    if causal and key.shape[2] > q_len:  # prefill into an empty static cache: the keys beyond q are unused
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register_sdpa_gqa() -> None:
    """Register :func:`sdpa_gqa_attention_forward` and SDPA's mask builder under the name ``"sdpa_gqa"`` with
    transformers (``AttentionInterface`` / ``AttentionMaskInterface``); idempotent."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register("sdpa_gqa", sdpa_gqa_attention_forward)
    AttentionMaskInterface.register("sdpa_gqa", sdpa_mask)


def auto_attn_implementation(model_config, on_cuda: bool) -> str:
    """``attn_implementation="auto"``: ``"sdpa_gqa"`` on CUDA and ``"sdpa"`` elsewhere when the model class
    supports SDPA (``_supports_sdpa``), else ``"eager"`` (e.g. Gemma-2, whose soft-capped attention has no
    SDPA path in transformers)."""
    from transformers import AutoModelForCausalLM

    try:
        cls = AutoModelForCausalLM._model_mapping[type(model_config)]
    except KeyError:
        return "eager"
    if not getattr(cls, "_supports_sdpa", False):
        return "eager"
    return "sdpa_gqa" if on_cuda else "sdpa"
