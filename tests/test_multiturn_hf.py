"""Multi-turn generation with the real transformers engine on a tiny Llama (mechanics, no learning), and the
trainer's loss on such a batch: tool-answer and template tokens get no gradient."""
from __future__ import annotations

import json

import pytest
import torch

from rollout.base import SamplingConfig
from rollout.hf_engine import HFRolloutEngine
from rollout.multiturn import MultiTurnConfig, multi_turn_generate, prepare_multi_turn
from tests.multiturn_utils import build_chat_tokenizer

CALL = "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": "123456 * 654321"}}) + \
    "</tool_call>"


def _bigram_llama(vocab: int, follow: dict[int, int], seed: int = 0):
    """A tiny Llama whose next token is mostly a function of the current one: attention and MLP outputs are
    scaled down (the context still matters a little) and the output head maps token i to ``follow[i]``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      max_position_embeddings=4096, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
        emb = model.model.embed_tokens.weight
        unit = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()  # what the final RMSNorm makes of a bare embedding
        head = model.lm_head.weight
        head.normal_(0, 0.02)
        for i, j in follow.items():
            head[j] += 2.5 * unit[i] / unit.shape[1] ** 0.5  # a logit margin of about 20
    return cfg, model


@pytest.fixture(scope="module")
def setup():
    tk = build_chat_tokenizer()
    tk.add_tokens([CALL])  # one token for the whole call, so that a bigram model can "write" it
    call_id = tk.convert_tokens_to_ids(CALL)
    newline = tk.encode("\n", add_special_tokens=False)[-1]
    cfg, actor = _bigram_llama(len(tk), {newline: call_id, call_id: tk.eos_token_id})
    engine = HFRolloutEngine.from_tokenizer(cfg, tk, device="cpu")
    engine.load_weights(actor.state_dict().items())
    prompts = [tk.encode(tk.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
               for q in ("What is 123456 * 654321?", "compute 2+2")]
    return tk, actor, engine, prompts, call_id


def _run(setup, **cfg):
    tk, actor, engine, prompts, _ = setup
    mt, tools, template = prepare_multi_turn({"enable": True, "tools": ["calculator"], **cfg}, tk)
    res = multi_turn_generate(engine, tk, prompts, SamplingConfig(n=2, temperature=1.0, max_new_tokens=160, seed=3),
                              tools, mt, template)
    return res


def test_hf_engine_multi_turn_mechanics(setup):
    tk, actor, engine, prompts, call_id = setup
    res = _run(setup, max_assistant_turns=3)
    out, attn = res.rollout, res.attention_mask
    assert out.responses.shape == (4, 160) and res.tool_calls.tolist() == [2, 2, 2, 2]  # call, answer, call, ...
    assert res.metrics["multi_turn/stop_reason/max_assistant_turns"] == 1.0
    answer = str(123456 * 654321)
    for row in range(4):
        n_valid = int(attn[row].sum())
        ids, mask = out.responses[row, :n_valid], out.response_mask[row, :n_valid]
        # the calculator's answers are in the context, not among the model's tokens
        assert tk.decode(ids[mask == 0], skip_special_tokens=False).count(answer) == 2
        assert ids[mask == 1].tolist() == [call_id, tk.eos_token_id] * 3
        assert mask[-1] == 1 and torch.all(out.response_mask[row, n_valid:] == 0)
        # the engine's log-prob of every model token = the trainer's recompute over prompt + whole response
        seq = torch.tensor([prompts[row // 2] + ids.tolist()])
        with torch.no_grad():
            logits = actor(input_ids=seq).logits[0, len(prompts[row // 2]) - 1:-1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, ids[:, None]).squeeze(-1)
        torch.testing.assert_close(out.rollout_log_probs[row, :n_valid][mask == 1], ref[mask == 1], atol=1e-4,
                                   rtol=0)
        assert torch.all(out.rollout_log_probs[row][out.response_mask[row] == 0] == 0)
    assert res.metrics["multi_turn/tool_calls_total"] == float(res.tool_calls.sum())
    assert 0 < res.metrics["multi_turn/tool_token_share"] < 1


def test_tool_tokens_get_no_gradient(setup):
    """The trainer's actor loss (policy loss + KL loss - entropy bonus, masked by ``response_mask``) on a
    multi-turn batch: the gradient w.r.t. the per-token log-probs and entropies is 0 on every token the model did
    not write, and garbage (NaN) in the per-token inputs at those positions does not reach the loss."""
    from trainer import core_algos
    from trainer.forward import forward_log_probs

    tk, actor, engine, prompts, _ = setup
    res = _run(setup, max_assistant_turns=2)
    out = res.rollout
    assert (res.attention_mask - out.response_mask).sum() > 0  # there are tool/template tokens
    width = max(len(p) for p in prompts)
    p_ids = torch.zeros((4, width), dtype=torch.long)
    p_mask = torch.zeros((4, width), dtype=torch.long)
    for i in range(4):
        p = prompts[i // 2]
        p_ids[i, width - len(p):], p_mask[i, width - len(p):] = torch.tensor(p), 1
    attn = torch.cat([p_mask, res.attention_mask], 1)
    input_ids = torch.cat([p_ids, out.responses], 1)
    pos = torch.clamp(torch.cumsum(attn, 1) - 1, min=0)
    lp, ent = forward_log_probs(actor, input_ids, attn, pos, response_length=out.responses.shape[1],
                                calculate_entropy=True)
    lp.retain_grad()
    ent.retain_grad()
    mask = out.response_mask.float()
    tool = (res.attention_mask == 1) & (out.response_mask == 0)

    def loss_of(old, adv, ref):
        pg, _ = core_algos.get_policy_loss_fn("vanilla")(old, lp, adv, mask, loss_agg_mode="token-mean")
        kl = core_algos.agg_loss(core_algos.kl_penalty(lp, ref, "low_var_kl"), mask, "token-mean")
        return pg + 0.1 * kl - 0.01 * core_algos.agg_loss(ent, mask, "token-mean")

    old, adv = out.rollout_log_probs.clone(), torch.randn(4, 1).expand_as(mask).clone()
    ref = out.rollout_log_probs - 0.1
    loss = loss_of(old, adv, ref)
    loss.backward()
    assert torch.all(lp.grad[tool] == 0) and torch.all(ent.grad[tool] == 0)
    assert torch.all(lp.grad[out.response_mask == 1] != 0)
    noisy = [t.clone() for t in (old, adv, ref)]
    for t in noisy:
        t[tool] = float("nan")
    with torch.no_grad():
        assert torch.equal(loss_of(*noisy), loss.detach())
    actor.zero_grad(set_to_none=True)


def test_multi_turn_config_from_omegaconf():
    from omegaconf import OmegaConf

    cfg = MultiTurnConfig.from_config(OmegaConf.create({"enable": True, "max_assistant_turns": 4,
                                                        "tools": ["calculator"], "format": "hermes"}))
    assert cfg.max_assistant_turns == 4 and cfg.tools == ["calculator"] and cfg.max_tool_response_length == 256
