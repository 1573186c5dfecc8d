"""megatron-core GPTModel (local spec) built from HF Llama / Qwen2 configs, run on CPU, compared with HF.

Skipped when megatron-core is not importable. Runs with a gloo group of world size 1, tp = pp = 1, and
``trainer.megatron.model.install_cpu_compat`` (three CUDA assumptions of megatron-core's forward).
"""
import pytest
import torch

from trainer.megatron.model import megatron_available

_OK, _WHY = megatron_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)


def _hf(kind, tie, seed=0):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    C = LlamaConfig if kind == "llama" else Qwen2Config
    cfg = C(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return cfg, model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 61, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :3] = 0          # left-padded prompt
    mask[1, 8:] = 0          # right-padded response
    return ids, mask


@pytest.mark.parametrize("kind,tie", [("llama", False), ("qwen2", True)])
def test_logits_and_log_probs_match_hf(kind, tie):
    from trainer.forward import log_probs_from_logits
    from trainer.megatron.model import (build_gpt_model, forward_logits, load_hf_weights, response_log_probs,
                                        single_process_group)
    from trainer.megatron.weights import iter_hf_from_mcore

    cfg, hf = _hf(kind, tie)
    ids, mask = _batch()
    pos = torch.clamp(mask.cumsum(1) - 1, min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    with single_process_group():
        model, tcfg, shape = build_gpt_model(cfg)
        assert tcfg.num_query_groups == 2 and tcfg.add_qkv_bias == (kind == "qwen2")
        load_hf_weights(model, hf.state_dict(), shape)
        with torch.no_grad():
            out = forward_logits(model, ids, mask, 61)
            lp, ent = response_log_probs(model, ids, mask, 4, 61, temperature=0.7, calculate_entropy=True)
        # export from the live model is bit-exact with the HF weights
        exported = dict(iter_hf_from_mcore(model.state_dict(), shape))
    valid = mask.bool()
    assert out.shape == (3, 10, 61)
    assert torch.allclose(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    ref_lp, ref_ent = log_probs_from_logits(ref[:, -5:-1].reshape(-1, 61), ids[:, -4:].reshape(-1), 0.7, True)
    rmask = valid[:, -4:].reshape(-1)
    assert torch.allclose(lp.reshape(-1)[rmask], ref_lp[rmask], atol=1e-5)
    assert torch.allclose(ent.reshape(-1)[rmask], ref_ent[rmask], atol=1e-5)
    sd = hf.state_dict()
    assert set(exported) == {k for k in sd if not (tie and k == "lm_head.weight")}
    assert all(torch.equal(exported[k], sd[k]) for k in exported)


def test_backward_runs_on_cpu():
    from trainer.megatron.model import build_gpt_model, load_hf_weights, response_log_probs, single_process_group

    cfg, hf = _hf("llama", False)
    ids, mask = _batch()
    with single_process_group():
        model, _, shape = build_gpt_model(cfg)
        load_hf_weights(model, hf.state_dict(), shape)
        lp, _ = response_log_probs(model, ids, mask, 4, 61)
        (-lp * mask[:, -4:]).sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["decoder.layers.0.self_attention.linear_qkv.weight"].abs().sum() > 0


def test_left_align_rejects_holes():
    from trainer.megatron.model import left_align

    ids = torch.arange(8).view(2, 4)
    aligned, shifts = left_align(ids, torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]]))
    assert aligned.tolist() == [[1, 2, 3, 0], [4, 5, 6, 7]] and shifts.tolist() == [1, 0]
    with pytest.raises(ValueError, match="contiguous"):
        left_align(ids, torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]))
