"""HF config (Llama / Qwen2 / Mistral family) -> megatron-core ``TransformerConfig`` and ``GPTModel`` arguments.

The mapping is pure Python (:func:`hf_to_mcore_args` needs neither megatron-core nor a GPU) so that it is tested
everywhere; :func:`build_transformer_config` turns it into a ``megatron.core.transformer.TransformerConfig``.

What maps to what (megatron-core names on the right; local, non-Transformer-Engine layer spec):

=====================================  =========================================================
HF                                      megatron-core
=====================================  =========================================================
num_hidden_layers                       num_layers
hidden_size                             hidden_size
num_attention_heads                     num_attention_heads
num_key_value_heads (GQA)               num_query_groups
head_dim                                kv_channels
intermediate_size                       ffn_hidden_size (SwiGLU: gated_linear_unit=True, silu)
rms_norm_eps                            layernorm_epsilon (normalization="RMSNorm")
rope_theta / rope_parameters            GPTModel(rotary_base=...), position_embedding_type="rope"
tie_word_embeddings                     GPTModel(share_embeddings_and_output_weights=...)
Qwen2 (q/k/v bias, no o bias)           add_qkv_bias=True, add_bias_linear=False
vocab_size                              GPTModel(vocab_size=padded to a multiple of tp * divisible_by)
=====================================  =========================================================

Not supported (raise ``ValueError`` naming the field): RoPE scaling, sliding-window attention,
a bias on ``o_proj`` or the MLP, activations other than silu.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class ModelShape:
    """The sizes the weight converter needs (all ints); built by :func:`model_shape`.

    ``vocab_size`` is the HF vocabulary; ``padded_vocab_size`` the Megatron one (a multiple of ``tp``).
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def rope_theta_of(hf_config: Any) -> float:
    """The RoPE base: ``rope_parameters['rope_theta']`` (transformers 5) or ``rope_theta`` (older configs).

    Raises:
        ValueError: the config asks for RoPE scaling (``rope_type`` other than ``default``).
    """
    params = _get(hf_config, "rope_parameters") or {}
    scaling = _get(hf_config, "rope_scaling")
    rope_type = (params.get("rope_type") or params.get("type") or "default") if params else "default"
    if scaling and (scaling.get("rope_type") or scaling.get("type") or "default") != "default":
        rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type != "default":
        raise ValueError(f"rope_type={rope_type!r}: the Megatron path supports only plain RoPE "
                                  f"(rope_type 'default')")
    theta = params.get("rope_theta") if params else None
    if theta is None:
        theta = _get(hf_config, "rope_theta", 10000.0)
    return float(theta)


# config fields that fix the weights' shapes or the forward's numerics; a checkpoint must agree on every one
MODEL_CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias",
                     "rms_norm_eps", "rope_theta", "rope_parameters")


def model_config_difference(saved: Any, current: Any) -> str | None:
    """The first of :data:`MODEL_CONFIG_KEYS` set (not None) in both configs with different values, as
    ``"hidden_size=64 in the checkpoint, 32 in the model"``; None when they agree.

    Args: HF configs as ``PretrainedConfig`` objects or ``config.json`` dicts.
    """
    for key in MODEL_CONFIG_KEYS:
        a, b = _get(saved, key), _get(current, key)
        if a is not None and b is not None and a != b:
            return f"{key}={a!r} in the checkpoint, {b!r} in the model"
    return None


def padded_vocab_size(vocab_size: int, tp_size: int, divisible_by: int = 1) -> int:
    """Smallest multiple of ``tp_size * divisible_by`` that is >= ``vocab_size`` (Megatron's vocab padding).

    Raises ValueError for non-positive arguments.
    """
    if vocab_size <= 0 or tp_size <= 0 or divisible_by <= 0:
        raise ValueError(f"vocab_size={vocab_size}, tp_size={tp_size}, divisible_by={divisible_by} must be > 0")
    m = tp_size * divisible_by
    return -(-vocab_size // m) * m


def model_shape(hf_config: Any, tp_size: int = 1, pp_size: int = 1, vocab_divisible_by: int = 1) -> ModelShape:
    """Check that ``hf_config`` is convertible for ``tp_size``/``pp_size`` and return its sizes.

    Raises:
        ValueError: unknown ``model_type``; heads not divisible by KV heads; KV heads, heads or
            intermediate size not divisible by ``tp_size``; layers not divisible by ``pp_size``.
        ValueError: features the local megatron-core spec cannot express (see module doc).
    """
    mt = _get(hf_config, "model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={mt!r}; the Megatron path supports {SUPPORTED_MODEL_TYPES}")
    if tp_size < 1 or pp_size < 1:
        raise ValueError(f"tensor/pipeline parallel sizes must be >= 1, got tp={tp_size}, pp={pp_size}")
    act = _get(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r}; only silu (SwiGLU) is supported")
    if _get(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported (megatron add_bias_linear would add o_proj bias)")
    if _get(hf_config, "use_sliding_window", False) or (mt == "mistral" and _get(hf_config, "sliding_window")):
        raise ValueError(f"sliding-window attention ({mt}) is not supported on the Megatron path")
    if mt == "qwen2":
        qkv_bias = True
    else:
        qkv_bias = bool(_get(hf_config, "attention_bias", False))
        if qkv_bias:
            raise ValueError(f"{mt} with attention_bias=True has an o_proj bias; not supported")
    rope_theta_of(hf_config)  # raises on RoPE scaling
    layers = int(_get(hf_config, "num_hidden_layers"))
    hidden = int(_get(hf_config, "hidden_size"))
    heads = int(_get(hf_config, "num_attention_heads"))
    groups = int(_get(hf_config, "num_key_value_heads") or heads)
    head_dim = int(_get(hf_config, "head_dim") or hidden // heads)
    ffn = int(_get(hf_config, "intermediate_size"))
    vocab = int(_get(hf_config, "vocab_size"))
    if heads % groups:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={groups}")
    for name, val in (("num_key_value_heads", groups), ("num_attention_heads", heads), ("intermediate_size", ffn)):
        if val % tp_size:
            raise ValueError(f"{name}={val} is not divisible by tensor_model_parallel_size={tp_size}")
    if layers % pp_size:
        raise ValueError(f"num_hidden_layers={layers} is not divisible by pipeline_model_parallel_size={pp_size}")
    return ModelShape(num_layers=layers, hidden_size=hidden, num_heads=heads, num_query_groups=groups,
                      head_dim=head_dim, ffn_hidden_size=ffn, vocab_size=vocab,
                      padded_vocab_size=padded_vocab_size(vocab, tp_size, vocab_divisible_by),
                      tie_word_embeddings=bool(_get(hf_config, "tie_word_embeddings", False)), qkv_bias=qkv_bias)


def hf_to_mcore_args(hf_config: Any, tp_size: int = 1, pp_size: int = 1, params_dtype: torch.dtype = torch.float32,
                     use_cpu_initialization: bool = False, vocab_divisible_by: int = 1) -> tuple[dict, dict]:
    """``(transformer_config_kwargs, gpt_model_kwargs)`` for ``hf_config``.

    ``transformer_config_kwargs`` feed ``TransformerConfig(**kw)``; ``gpt_model_kwargs`` feed
    ``GPTModel(config=..., transformer_layer_spec=..., **kw)`` (vocab_size, max_sequence_length,
    position_embedding_type, rotary_base, share_embeddings_and_output_weights). Dropout is 0 (RL training
    uses none) and every fused kernel is off, so the local spec runs on any device.

    Raises: as :func:`model_shape`; ValueError for a dtype other than float32/bfloat16/float16.
    """
    if params_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"params_dtype={params_dtype}; expected float32, bfloat16 or float16")
    s = model_shape(hf_config, tp_size, pp_size, vocab_divisible_by)
    tc = dict(num_layers=s.num_layers, hidden_size=s.hidden_size, num_attention_heads=s.num_heads,
              num_query_groups=s.num_query_groups, kv_channels=s.head_dim, ffn_hidden_size=s.ffn_hidden_size,
              normalization="RMSNorm", layernorm_epsilon=float(_get(hf_config, "rms_norm_eps", 1e-6)),
              gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
              add_qkv_bias=s.qkv_bias, hidden_dropout=0.0, attention_dropout=0.0,
              tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=pp_size,
              params_dtype=params_dtype, bf16=params_dtype == torch.bfloat16, fp16=params_dtype == torch.float16,
              use_cpu_initialization=use_cpu_initialization, attention_softmax_in_fp32=True,
              bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
              persist_layer_norm=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
              init_method_std=float(_get(hf_config, "initializer_range", 0.02)))
    if pp_size > 1:  # the dtype of the activations sent between pipeline stages
        tc["pipeline_dtype"] = params_dtype
    gm = dict(vocab_size=s.padded_vocab_size, max_sequence_length=int(_get(hf_config, "max_position_embeddings")),
              position_embedding_type="rope", rotary_base=rope_theta_of(hf_config), rotary_percent=1.0,
              share_embeddings_and_output_weights=s.tie_word_embeddings)
    return tc, gm


def build_transformer_config(hf_config: Any, **kwargs):
    """``megatron.core.transformer.TransformerConfig`` for ``hf_config`` (kwargs as :func:`hf_to_mcore_args`).

    Returns ``(TransformerConfig, gpt_model_kwargs)``. Raises ImportError when megatron-core is missing.
    """
    from megatron.core.transformer import TransformerConfig

    tc, gm = hf_to_mcore_args(hf_config, **kwargs)
    return TransformerConfig(**tc), gm
