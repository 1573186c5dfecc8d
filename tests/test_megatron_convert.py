"""HF <-> megatron-core weight conversion (pure tensors; megatron-core not needed) and config mapping."""
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from trainer.megatron.config import hf_to_mcore_args, model_shape, padded_vocab_size
from trainer.megatron.weights import (hf_to_mcore, layer_range, mcore_to_hf, merge_tp, qkv_hf_to_mcore,
                                      qkv_mcore_to_hf, split_tp)


def _cfg(kind, tie, vocab=61, layers=4):
    C = LlamaConfig if kind == "llama" else Qwen2Config
    return C(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)


def _hf_state(cfg, seed=0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_qkv_layout_hand_reference():
    # 4 heads, 2 KV groups, head_dim 1, hidden 1: rows are easy to read
    s = model_shape(LlamaConfig(vocab_size=8, hidden_size=4, intermediate_size=4, num_hidden_layers=1,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=1))
    q = torch.tensor([[10.], [11.], [12.], [13.]])   # heads 0,1 -> group 0; heads 2,3 -> group 1
    k = torch.tensor([[20.], [21.]])
    v = torch.tensor([[30.], [31.]])
    qkv = qkv_hf_to_mcore(q, k, v, s)
    assert qkv.flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    # TP=2: rank 1 holds exactly group 1
    assert split_tp("col", qkv, 2, 1).flatten().tolist() == [12, 13, 21, 31]
    q2, k2, v2 = qkv_mcore_to_hf(qkv, s)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)
    # bias (1-D) uses the same layout
    assert qkv_hf_to_mcore(q[:, 0], k[:, 0], v[:, 0], s).tolist() == [10, 11, 20, 30, 12, 13, 21, 31]


def test_fc1_tp_split_is_gate_then_up_per_rank():
    full = torch.arange(8.).unsqueeze(1)            # gate rows 0..3, up rows 4..7
    assert split_tp("fc1", full, 2, 0).flatten().tolist() == [0, 1, 4, 5]
    assert split_tp("fc1", full, 2, 1).flatten().tolist() == [2, 3, 6, 7]
    assert torch.equal(merge_tp("fc1", [split_tp("fc1", full, 2, r) for r in range(2)]), full)


@pytest.mark.parametrize("kind,tie", [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True)])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (2, 2), (1, 4)])
def test_round_trip_bit_exact(kind, tie, tp, pp):
    cfg = _cfg(kind, tie)
    hf = _hf_state(cfg)
    s = model_shape(cfg, tp, pp)
    assert s.padded_vocab_size == (62 if tp == 2 else 61)
    shards = {(t, p): hf_to_mcore(hf, s, tp, t, pp, p) for t in range(tp) for p in range(pp)}
    back = mcore_to_hf(shards, s, tp, pp)
    expect = {k for k in hf if not (tie and k == "lm_head.weight")}
    assert set(back) == expect
    for k in expect:
        assert back[k].dtype == hf[k].dtype and torch.equal(back[k], hf[k]), k
    # per-rank shapes: TP splits heads / ffn / vocab
    r0 = shards[(0, 0)]
    assert r0["decoder.layers.0.self_attention.linear_qkv.weight"].shape == ((4 + 2 * 2) * 8 // tp, 32)
    assert r0["decoder.layers.0.mlp.linear_fc1.weight"].shape == (2 * 48 // tp, 32)
    assert r0["decoder.layers.0.self_attention.linear_proj.weight"].shape == (32, 32 // tp)
    assert r0["embedding.word_embeddings.weight"].shape == (s.padded_vocab_size // tp, 32)
    assert ("decoder.layers.0.self_attention.linear_qkv.bias" in r0) == (kind == "qwen2")
    last = shards[(0, pp - 1)]
    assert ("output_layer.weight" in last) == (not tie or pp > 1)
    assert sum(1 for n in last if n.startswith("decoder.layers.") and n.endswith("input_layernorm.weight")) == 4 // pp


def test_vocab_padding_rows_are_zero_and_dropped():
    cfg = _cfg("llama", False)
    hf = _hf_state(cfg)
    s = model_shape(cfg, 2, 1, vocab_divisible_by=4)
    assert s.padded_vocab_size == 64
    r1 = hf_to_mcore(hf, s, 2, 1)
    assert torch.equal(r1["output_layer.weight"][-3:], torch.zeros(3, 32))
    assert torch.equal(r1["output_layer.weight"][:-3], hf["lm_head.weight"][32:])


def test_layer_range_and_bad_splits():
    assert list(layer_range(4, 2, 1)) == [2, 3]
    with pytest.raises(ValueError, match="pp_size=3"):
        layer_range(4, 3, 0)
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible by tensor_model_parallel_size=4"):
        model_shape(_cfg("llama", False), tp_size=4)
    with pytest.raises(ValueError, match="num_hidden_layers=4 is not divisible"):
        model_shape(_cfg("llama", False), pp_size=3)
    assert padded_vocab_size(61, 2, 64) == 128


def test_config_mapping_and_unsupported():
    tc, gm = hf_to_mcore_args(_cfg("qwen2", True), tp_size=2)
    assert (tc["num_query_groups"], tc["kv_channels"], tc["ffn_hidden_size"]) == (2, 8, 48)
    assert tc["add_qkv_bias"] is True and tc["add_bias_linear"] is False and tc["gated_linear_unit"] is True
    assert tc["normalization"] == "RMSNorm" and tc["tensor_model_parallel_size"] == 2
    assert gm == dict(vocab_size=62, max_sequence_length=64, position_embedding_type="rope", rotary_base=10000.0,
                      rotary_percent=1.0, share_embeddings_and_output_weights=True)
    assert hf_to_mcore_args(_cfg("llama", False))[0]["add_qkv_bias"] is False
    with pytest.raises(ValueError, match="rope_type='linear'"):
        c = _cfg("llama", False)
        c.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
        model_shape(c)
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        model_shape(LlamaConfig(hidden_act="gelu"))
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        model_shape({"model_type": "gpt2"})
    with pytest.raises(KeyError, match="model.layers.0.self_attn.q_proj.bias"):
        cfg = _cfg("qwen2", False)
        hf = _hf_state(cfg)
        del hf["model.layers.0.self_attn.q_proj.bias"]
        hf_to_mcore(hf, model_shape(cfg))
