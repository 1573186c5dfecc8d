"""Weight conversion Hugging Face <-> megatron-core (local layer spec), with TP/PP sharding. Pure tensors.

Names (``i`` = layer index; megatron-core names are stage-local on a pipeline stage, HF names global)::

    HF (LlamaForCausalLM / Qwen2ForCausalLM)            megatron-core GPTModel (local spec)     TP split
    model.embed_tokens.weight       (V, H)              embedding.word_embeddings.weight (Vp,H) rows (vocab)
    model.layers.i.input_layernorm.weight               decoder.layers.i.input_layernorm.weight  replicated
    model.layers.i.self_attn.{q,k,v}_proj.{weight,bias} decoder.layers.i.self_attention.linear_qkv.{weight,bias}
                                                                                                 rows, per group
    model.layers.i.self_attn.o_proj.weight              ...self_attention.linear_proj.weight     columns
    model.layers.i.post_attention_layernorm.weight      decoder.layers.i.pre_mlp_layernorm.weight replicated
    model.layers.i.mlp.{gate,up}_proj.weight            decoder.layers.i.mlp.linear_fc1.weight   [gate_r; up_r]
    model.layers.i.mlp.down_proj.weight                 decoder.layers.i.mlp.linear_fc2.weight   columns
    model.norm.weight                                   decoder.final_layernorm.weight           replicated
    lm_head.weight                  (V, H)              output_layer.weight (Vp, H)               rows (vocab)

QKV layout (megatron-core ``SelfAttention``: the fused projection output is viewed as
``(num_query_groups, (heads_per_group + 2) * head_dim)`` and split into q, k, v per group)::

    linear_qkv rows = [q_g0 (heads_per_group*head_dim) | k_g0 (head_dim) | v_g0 (head_dim) | q_g1 | k_g1 | v_g1 | ...]

TP rank ``r`` holds the contiguous groups ``[r*G/tp, (r+1)*G/tp)``. SwiGLU fc1 on TP rank ``r`` is
``cat(gate.chunk(tp)[r], up.chunk(tp)[r])`` (megatron's ``glu`` splits its fc1 output in two halves).
The vocabulary is zero-padded to ``padded_vocab_size`` rows; export drops the padding.

Tied embeddings: with ``pp == 1`` megatron-core has no ``output_layer.weight``; with ``pp > 1`` the last stage
holds a copy named ``output_layer.weight``. HF export of a tied model emits only ``model.embed_tokens.weight``.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch

from trainer.megatron.config import ModelShape

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# megatron suffix (inside a layer) -> TP split kind
_LAYER_KINDS = {
    "input_layernorm.weight": "rep",
    "self_attention.linear_qkv.weight": "col",
    "self_attention.linear_qkv.bias": "col",
    "self_attention.linear_proj.weight": "row",
    "pre_mlp_layernorm.weight": "rep",
    "mlp.linear_fc1.weight": "fc1",
    "mlp.linear_fc2.weight": "row",
}
_TOP_KINDS = {"embedding.word_embeddings.weight": "vocab", "decoder.final_layernorm.weight": "rep",
              "output_layer.weight": "vocab"}
_SIMPLE_LAYER = {"input_layernorm.weight": "input_layernorm.weight",
                 "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
                 "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
                 "mlp.linear_fc2.weight": "mlp.down_proj.weight"}


def layer_range(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Global indices of the layers held by pipeline stage ``pp_rank`` (even split, as megatron-core).

    Raises ValueError if ``num_layers`` is not divisible by ``pp_size`` or ``pp_rank`` is out of range.
    """
    if pp_size < 1 or not 0 <= pp_rank < pp_size or num_layers % pp_size:
        raise ValueError(f"cannot split {num_layers} layers over pp_size={pp_size} (pp_rank={pp_rank})")
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def split_kind(mcore_name: str) -> str:
    """TP split kind of a megatron-core parameter: ``rep``, ``col``, ``row``, ``fc1`` or ``vocab``.

    Raises KeyError naming ``mcore_name`` when it is not a parameter of the local GPT spec.
    """
    m = _LAYER_RE.match(mcore_name)
    kind = _LAYER_KINDS.get(m.group(2)) if m else _TOP_KINDS.get(mcore_name)
    if kind is None:
        raise KeyError(f"unknown megatron-core parameter {mcore_name!r} (local GPT layer spec expected)")
    return kind


# ------------------------------------------------------------------------------------------ QKV / fc1 layouts


def qkv_hf_to_mcore(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Interleave HF q/k/v projections per query group into megatron's fused ``linear_qkv`` layout.

    Args:
        q: ``(num_heads*head_dim[, hidden])``; k, v: ``(num_query_groups*head_dim[, hidden])`` (weights 2-D,
            biases 1-D).
    Returns:
        ``((num_heads + 2*num_query_groups)*head_dim[, hidden])``, layout in the module doc.
    Raises:
        ValueError: shapes do not match ``shape``.
    """
    g, hpg, d = shape.num_query_groups, shape.heads_per_group, shape.head_dim
    if q.shape[0] != g * hpg * d or k.shape[0] != g * d or v.shape[0] != g * d:
        raise ValueError(f"q/k/v rows {q.shape[0]}/{k.shape[0]}/{v.shape[0]} do not match heads={g * hpg}, "
                         f"kv_heads={g}, head_dim={d}")
    rest = q.shape[1:]
    qkv = torch.cat([q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return qkv.reshape(g * (hpg + 2) * d, *rest)


def qkv_mcore_to_hf(qkv: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`qkv_hf_to_mcore` on a TP-merged ``linear_qkv`` weight or bias; returns ``(q, k, v)``.

    Raises ValueError when ``qkv`` has the wrong number of rows.
    """
    g, hpg, d = shape.num_query_groups, shape.heads_per_group, shape.head_dim
    if qkv.shape[0] != g * (hpg + 2) * d:
        raise ValueError(f"linear_qkv has {qkv.shape[0]} rows; expected {g * (hpg + 2) * d}")
    rest = qkv.shape[1:]
    per = qkv.reshape(g, (hpg + 2) * d, *rest)
    q, k, v = per.split([hpg * d, d, d], dim=1)
    return (q.reshape(g * hpg * d, *rest).contiguous(), k.reshape(g * d, *rest).contiguous(),
            v.reshape(g * d, *rest).contiguous())


def split_tp(kind: str, full: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """This TP rank's shard of a TP-merged megatron tensor (``fc1``: ``[gate; up]`` halves split separately)."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank} outside tp_size={tp_size}")
    if kind == "rep" or tp_size == 1:
        return full
    if kind in ("col", "vocab"):
        return full.chunk(tp_size, dim=0)[tp_rank]
    if kind == "row":
        return full.chunk(tp_size, dim=1)[tp_rank]
    if kind == "fc1":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, 0)[tp_rank], up.chunk(tp_size, 0)[tp_rank]], dim=0)
    raise ValueError(f"unknown split kind {kind!r}")


def merge_tp(kind: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`split_tp`: the TP-merged tensor from the shards of ranks ``0..tp-1`` in order."""
    if kind == "rep" or len(shards) == 1:
        return shards[0]
    if kind in ("col", "vocab"):
        return torch.cat(shards, dim=0)
    if kind == "row":
        return torch.cat(shards, dim=1)
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    raise ValueError(f"unknown split kind {kind!r}")


def _pad_vocab(t: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    if t.shape[0] != shape.vocab_size:
        raise ValueError(f"embedding/lm_head has {t.shape[0]} rows; expected vocab_size={shape.vocab_size}")
    extra = shape.padded_vocab_size - shape.vocab_size
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])], dim=0) if extra else t


# --------------------------------------------------------------------------------------- HF -> megatron


def hf_to_mcore(hf_state: Mapping[str, torch.Tensor], shape: ModelShape, tp_size: int = 1, tp_rank: int = 0,
                pp_size: int = 1, pp_rank: int = 0) -> dict[str, torch.Tensor]:
    """The megatron-core state dict (parameters only) of one (tp_rank, pp_rank) from a full HF state dict.

    Layer names are stage-local. Tensors keep the HF dtype (cast when loading into the model).

    Raises:
        KeyError: an HF tensor the model needs is missing (names it).
        ValueError: a shape does not match ``shape`` or the ranks are out of range.
    """
    def get(name):
        if name not in hf_state:
            raise KeyError(f"HF state dict lacks {name!r}")
        return hf_state[name]

    out: dict[str, torch.Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    layers = layer_range(shape.num_layers, pp_size, pp_rank)
    full: dict[str, torch.Tensor] = {}
    if first:
        full["embedding.word_embeddings.weight"] = _pad_vocab(get("model.embed_tokens.weight"), shape)
    for local, i in enumerate(layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{local}."
        for m_suf, h_suf in _SIMPLE_LAYER.items():
            full[dst + m_suf] = get(src + h_suf)
        a = src + "self_attn."
        full[dst + "self_attention.linear_qkv.weight"] = qkv_hf_to_mcore(
            get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight"), shape)
        if shape.qkv_bias:
            full[dst + "self_attention.linear_qkv.bias"] = qkv_hf_to_mcore(
                get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias"), shape)
        full[dst + "mlp.linear_fc1.weight"] = torch.cat([get(src + "mlp.gate_proj.weight"),
                                                         get(src + "mlp.up_proj.weight")], dim=0)
    if last:
        full["decoder.final_layernorm.weight"] = get("model.norm.weight")
        if not shape.tie_word_embeddings:
            full["output_layer.weight"] = _pad_vocab(get("lm_head.weight"), shape)
        elif pp_size > 1:  # the last stage's copy of the tied embedding
            full["output_layer.weight"] = _pad_vocab(get("model.embed_tokens.weight"), shape)
    for name, t in full.items():
        out[name] = split_tp(split_kind(name), t, tp_size, tp_rank).contiguous()
    return out


# --------------------------------------------------------------------------------------- megatron -> HF


def mcore_full_to_hf(name: str, full: torch.Tensor, shape: ModelShape,
                     layer_offset: int = 0) -> list[tuple[str, torch.Tensor]]:
    """HF ``(name, tensor)`` pairs of ONE TP-merged megatron-core tensor (streaming export / weight sync).

    Args:
        name: stage-local megatron-core name; ``layer_offset`` (first global layer of the stage) makes it global.
        full: the TP-merged tensor (see :func:`merge_tp`).
    Returns:
        ``[]`` for ``output_layer.weight`` of a tied model, the unpadded vocab for embeddings, q/k/v and
        gate/up split for the fused tensors.
    Raises:
        KeyError: ``name`` is not a parameter of the local GPT spec.
    """
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", full[:shape.vocab_size])]
    if name == "output_layer.weight":
        return [] if shape.tie_word_embeddings else [("lm_head.weight", full[:shape.vocab_size])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", full)]
    m = _LAYER_RE.match(name)
    if not m or m.group(2) not in _LAYER_KINDS:
        raise KeyError(f"unknown megatron-core parameter {name!r} (local GPT layer spec expected)")
    i, suf = int(m.group(1)) + layer_offset, m.group(2)
    pre = f"model.layers.{i}."
    if suf in _SIMPLE_LAYER:
        return [(pre + _SIMPLE_LAYER[suf], full)]
    if suf.startswith("self_attention.linear_qkv."):
        kind = suf.rsplit(".", 1)[1]
        q, k, v = qkv_mcore_to_hf(full, shape)
        return [(f"{pre}self_attn.{p}_proj.{kind}", t) for p, t in (("q", q), ("k", k), ("v", v))]
    gate, up = full.chunk(2, dim=0)  # mlp.linear_fc1.weight
    return [(pre + "mlp.gate_proj.weight", gate.contiguous()), (pre + "mlp.up_proj.weight", up.contiguous())]


def mcore_to_hf(shards: Mapping[tuple[int, int], Mapping[str, torch.Tensor]], shape: ModelShape,
                tp_size: int, pp_size: int) -> dict[str, torch.Tensor]:
    """Full HF state dict from every rank's megatron-core state dict, keyed ``(tp_rank, pp_rank)``.

    Keys that are not parameters (``*._extra_state``) are ignored.

    Raises:
        KeyError: a ``(tp_rank, pp_rank)`` shard is missing, or shards of one stage hold different names.
    """
    out: dict[str, torch.Tensor] = {}
    for pp in range(pp_size):
        for tp in range(tp_size):
            if (tp, pp) not in shards:
                raise KeyError(f"missing megatron-core shard for tp_rank={tp}, pp_rank={pp}")
        names = [n for n in shards[(0, pp)] if not n.endswith("_extra_state")]
        offset = layer_range(shape.num_layers, pp_size, pp).start
        for name in names:
            parts = []
            for tp in range(tp_size):
                if name not in shards[(tp, pp)]:
                    raise KeyError(f"{name!r} is on tp_rank 0 but not on tp_rank {tp} (pp_rank {pp})")
                parts.append(shards[(tp, pp)][name])
            if name == "output_layer.weight" and shape.tie_word_embeddings:
                continue
            out.update(mcore_full_to_hf(name, merge_tp(split_kind(name), parts), shape, offset))
    return out


def iter_hf_from_mcore(local_state: Mapping[str, torch.Tensor], shape: ModelShape,
                       layer_offset: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """HF pairs of a TP-merged (tp=1 or already gathered) stage-local state dict, in its order."""
    for name, t in local_state.items():
        if not name.endswith("_extra_state"):
            yield from mcore_full_to_hf(name, t, shape, layer_offset)


# ----------------------------------------------------------------------------- megatron dist checkpoint -> HF

# the local layer spec's ``sharded_state_dict_keys_map`` (megatron.core.models.gpt.gpt_layer_specs
# .get_gpt_layer_local_spec): a dist checkpoint names the layer norms as Transformer Engine's fused layers do
DIST_KEYS_MAP = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                 "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def dist_ckpt_to_mcore(tensors: Mapping[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Per-layer megatron-core names (TP-merged, global layer numbers) from a dist checkpoint's model tensors.

    Args:
        tensors: the checkpoint's model tensors at their global shapes, keyed by sharded key: top-level names
            as in the model, and ``decoder.layers.<suffix>`` of shape ``(num_layers, ...)`` (layers stacked on
            a leading axis; layer norms named by :data:`DIST_KEYS_MAP`).
        num_layers: the model's ``num_hidden_layers``.
    Returns:
        ``{name: tensor}`` with ``decoder.layers.<i>.<local-spec suffix>``, the input of :func:`mcore_full_to_hf`
        with ``layer_offset=0``.
    Raises:
        ValueError: a stacked layer tensor's leading axis is not ``num_layers``.
    """
    inverse = {v: k for k, v in DIST_KEYS_MAP.items()}
    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if not key.startswith("decoder.layers."):
            out[key] = t
            continue
        suffix = key[len("decoder.layers."):]
        for dist_prefix, local_prefix in inverse.items():
            if suffix.startswith(dist_prefix):
                suffix = local_prefix + suffix[len(dist_prefix):]
        if t.shape[0] != num_layers:
            raise ValueError(f"{key!r} stacks {t.shape[0]} layers; the config has num_hidden_layers={num_layers}")
        for i in range(num_layers):
            out[f"decoder.layers.{i}.{suffix}"] = t[i]
    return out
