"""Metrics: hand-computed values for every key, P11, P12, timing, throughput, MFU, validation, reduce."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trainer.metric_utils import (_majority_value, bootstrap_metric, completion_length_stats, compute_data_metrics,
                                  compute_mfu, compute_throughput_metrics, compute_timing_metrics, flops_per_token,
                                  flatten_validation_metrics, process_validation_metrics, reduce_metrics)
from trainer.protocol import DataProto


def make_batch(prompt_lens, resp_lens, P, R, **tensors):
    B = len(prompt_lens)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        attn[i, P - p:P] = 1  # left-padded prompt
        attn[i, P:P + r] = 1  # right-padded response
    t = {"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, R, dtype=torch.long),
         "attention_mask": attn, "response_mask": attn[:, P:].float()}
    for k in ("token_level_scores", "token_level_rewards", "advantages", "returns", "values"):
        t[k] = tensors.get(k, torch.zeros(B, R))
    return DataProto.from_dict(t)


def test_data_metrics_hand_values():
    # 2 samples, responses of 2 and 1 tokens (R=2), prompts of 3 and 1 tokens (P=3)
    b = make_batch([3, 1], [2, 1], 3, 2,
                   token_level_scores=torch.tensor([[1.0, 2.0], [3.0, 4.0]]),  # sums 3, 7 (verl's example)
                   token_level_rewards=torch.tensor([[0.5, 0.5], [2.0, 0.0]]),  # sums 1, 2
                   advantages=torch.tensor([[1.0, -1.0], [3.0, 99.0]]),  # 99 is masked
                   returns=torch.tensor([[1.0, 2.0], [3.0, float("nan")]]),
                   values=torch.tensor([[1.0, 1.0], [2.0, 5.0]]))
    m = compute_data_metrics(b, use_critic=True, max_response_length=2, max_prompt_length=4)
    assert m["critic/score/mean"] == 5.0 and m["critic/score/max"] == 7.0 and m["critic/score/min"] == 3.0
    assert m["critic/rewards/mean"] == 1.5 and m["critic/rewards/max"] == 2.0 and m["critic/rewards/min"] == 1.0
    assert m["critic/advantages/mean"] == 1.0 and m["critic/advantages/max"] == 3.0
    assert m["critic/advantages/min"] == -1.0
    assert m["critic/returns/mean"] == 2.0 and m["critic/returns/max"] == 3.0 and m["critic/returns/min"] == 1.0
    assert m["critic/values/mean"] == pytest.approx(4 / 3) and m["critic/values/max"] == 2.0
    # R - V = [0,1,1]: var 1/3 ; Var(R) = 1 -> 1 - (1/3)/(1 + 1e-5)
    assert m["critic/vf_explained_var"] == pytest.approx(1 - (1 / 3) / (1 + 1e-5), abs=1e-6)
    assert m["response_length/mean"] == 1.5 and m["response_length/max"] == 2 and m["response_length/min"] == 1
    assert m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/mean"] == 2.0 and m["prompt_length/max"] == 3 and m["prompt_length/min"] == 1
    assert m["prompt_length/clip_ratio"] == 0.0
    assert m["response/aborted_ratio"] == 0.0
    assert all(math.isfinite(v) for v in m.values())
    m2 = compute_data_metrics(b, use_critic=False, max_response_length=2, max_prompt_length=4)
    assert "critic/values/mean" not in m2 and "critic/vf_explained_var" not in m2


def test_p11_clip_ratio_uses_configured_max_not_padded_width():
    b = make_batch([2, 2], [3, 5], 2, 5)  # padded to 5 = the batch max
    m = compute_data_metrics(b, use_critic=False, max_response_length=8, max_prompt_length=8)
    assert m["response_length/clip_ratio"] == 0.0  # the buggy cap (padded width 5) gives 0.5
    assert m["response_length/mean"] == 4.0
    b = make_batch([2, 2], [8, 5], 2, 8)
    m = compute_data_metrics(b, use_critic=False, max_response_length=8, max_prompt_length=8)
    assert m["response_length/clip_ratio"] == 0.5
    # prompts: lengths [3,5] left-padded to 5, configured max 8 -> 0.0 ; [8,5] -> 0.5
    b = make_batch([3, 5], [1, 1], 5, 1)
    assert compute_data_metrics(b, False, 4, 8)["prompt_length/clip_ratio"] == 0.0
    b = make_batch([8, 5], [1, 1], 8, 1)
    assert compute_data_metrics(b, False, 4, 8)["prompt_length/clip_ratio"] == 0.5


def test_p11_a_response_that_stops_exactly_at_the_cap_is_not_counted_as_cut():
    """A response whose stop token is its max_response_length-th token ended by itself: with the rollout's stop
    ids it is not cut (the P12 statistic says the same); without them every response at the cap counts (verl)."""
    b = make_batch([2, 2, 2], [3, 3, 2], 2, 3)
    b.batch["responses"][:] = torch.tensor([[5, 6, 1], [5, 6, 7], [5, 2, 0]])  # stop ids 1, 2; row 1 is cut
    m = compute_data_metrics(b, False, 3, 8, stop_token_ids=[1, 2])
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["response_length_non_aborted/clip_ratio"] == pytest.approx(1 / 3)
    assert completion_length_stats(b.batch["responses"][:2], [1, 2], 3).clipped_ratio == 0.5
    assert compute_data_metrics(b, False, 3, 8)["response_length/clip_ratio"] == pytest.approx(2 / 3)
    assert compute_data_metrics(b, False, 3, 8, stop_token_ids=[9])["response_length/clip_ratio"] == \
        pytest.approx(2 / 3)


def test_data_metrics_aborted_samples():
    b = make_batch([1, 1, 1], [0, 2, 1], 1, 2, token_level_scores=torch.tensor([[0.0, 0], [0, 1], [3, 0]]))
    m = compute_data_metrics(b, use_critic=False, max_response_length=2, max_prompt_length=1)
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["critic/score/mean"] == 2.0 and m["critic/score/min"] == 1.0  # aborted sample excluded
    assert m["response_length/min"] == 0 and m["response_length_non_aborted/min"] == 1
    assert m["response_length_non_aborted/mean"] == 1.5 and m["response_length_non_aborted/clip_ratio"] == 0.5


def test_p12_completion_lengths_before_truncation_masking():
    comp = torch.tensor([[5, 6, 2, 0, 0, 0], [5, 5, 5, 5, 5, 5]])
    s = completion_length_stats(comp, eos_id=2, max_len=6)
    assert (s.mean, s.min, s.max, s.clipped_ratio, s.mean_terminated) == (4.5, 3.0, 6.0, 0.5, 3.0)
    assert s.loss_mask.tolist() == [[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    mean, mn, mx, clipped, mean_term, mask = s  # also a plain tuple
    assert mn == 3.0
    assert completion_length_stats(comp, 2, 6, mask_truncated=False).loss_mask[1].tolist() == [1] * 6
    with pytest.raises(ValueError, match="max_len"):
        completion_length_stats(comp, 2, 5)


def test_timing_metrics():
    # response tokens 2 + 4 = 6 ; all tokens 6 + prompts 3 + 3 = 12 (verl's example)
    b = make_batch([3, 3], [2, 4], 3, 4)
    m = compute_timing_metrics(b, {"gen": 0.5, "ref": 0.3, "step": 2.0, "testing": 1.0})
    assert m["timing_s/gen"] == 0.5 and m["timing_s/step"] == 2.0 and m["timing_s/testing"] == 1.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(0.5 * 1000 / 6)
    assert m["timing_per_token_ms/ref"] == pytest.approx(0.3 * 1000 / 12)
    assert "timing_per_token_ms/step" not in m


def test_throughput_metrics():
    b = make_batch([3, 3], [2, 4], 3, 4)
    b.meta["global_token_num"] = [300, 300]
    m = compute_throughput_metrics(b, {"step": 2.0}, n_gpus=2)
    assert m == {"perf/total_num_tokens": 600.0, "perf/time_per_step": 2.0, "perf/throughput": 150.0}
    del b.meta["global_token_num"]
    assert compute_throughput_metrics(b, {"step": 2.0}, 1)["perf/total_num_tokens"] == 12.0
    with pytest.raises(ValueError, match="step"):
        compute_throughput_metrics(b, {}, 1)


def test_flops_and_mfu_hand_values():
    cfg = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          intermediate_size=16, vocab_size=10, model_type="llama")
    # head_dim 4; per layer: q,k,v 8*4*(2+1+1)=128, o 64, mlp 3*8*16=384 -> 576 ; N = 2*576 + lm head 80 = 1232
    assert flops_per_token(cfg, 10) == 6 * 1232 + 12 * 2 * 2 * 4 * 10  # 9312
    mfu = compute_mfu(cfg, num_tokens=20, seqlens=[10, 10], seconds=1.0, n_gpus=2, peak_flops=1e4)
    assert mfu == pytest.approx((6 * 1232 * 20 + 12 * 2 * 2 * 4 * 200) / 2e4)  # 9.312
    with pytest.raises(ValueError):
        compute_mfu(cfg, 1, [1], 0.0, 1, 1.0)


def test_flops_param_count_matches_a_real_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=50, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    assert flops_per_token(cfg, 0) == 6 * n


def test_validation_metrics():
    infos = {"acc": [1, 0, 1, 1, 0, 0, 0, 1], "pred": ["a", "b", "a", "a", "x", "y", "x", "z"],
             "note": ["s"] * 8}
    uids = ["u1"] * 4 + ["u2"] * 4
    res = process_validation_metrics(["gsm8k"] * 8, uids, infos, seed=42)
    acc = res["gsm8k"]["acc"]
    assert "note" not in res["gsm8k"] and "pred" not in res["gsm8k"]
    assert acc["mean@4"] == pytest.approx(0.5)  # (0.75 + 0.25) / 2
    assert acc["std@4"] == pytest.approx(math.sqrt(0.1875))  # both prompts: std of one 1/0 among four
    assert set(k.split("/")[0] for k in acc) == {"mean@4", "std@4", "best@2", "best@4", "worst@2", "worst@4",
                                                 "maj@2", "maj@4"}
    assert acc["best@4/mean"] >= acc["best@2/mean"] >= acc["mean@4"] >= acc["worst@2/mean"] >= acc["worst@4/mean"]
    assert res == process_validation_metrics(["gsm8k"] * 8, uids, infos, seed=42)  # fixed seed
    # u1: majority "a" (value 1) almost always; u2: "x" (value 0) usually wins -> about (1 + 0) / 2
    assert acc["maj@4/mean"] > 0.4
    flat = flatten_validation_metrics(res)
    assert "val-core/gsm8k/acc/mean@4" in flat and "val-core/gsm8k/acc/maj@4/mean" in flat
    assert "val-aux/gsm8k/acc/best@2/mean" in flat and "val-aux/gsm8k/acc/maj@4/std" in flat
    # all-equal data: best = worst = 1, std 0
    [(bm, bs), (wm, ws)] = bootstrap_metric([1.0, 1.0, 1.0], 2, [max, min])
    assert (bm, bs, wm, ws) == (1.0, 0.0, 1.0, 0.0)


def test_majority_vote_ties_go_to_first_seen_pred():
    assert _majority_value([("b", 0.0), ("a", 1.0), ("a", 1.0), ("b", 0.0)]) == 0.0
    assert _majority_value([("b", 0.0), ("a", 1.0), ("a", 1.0)]) == 1.0


def test_reduce_metrics_is_explicit():
    lists = {"timing_s/gen": [1.0, 3.0], "actor/pg_clipfrac_max": [1.0, 5.0], "n": [torch.tensor(2.0), 4]}
    assert reduce_metrics(lists) == {"timing_s/gen": 2.0, "actor/pg_clipfrac_max": 3.0, "n": 3.0}
    out = reduce_metrics(lists, {"actor/pg_clipfrac_max": "max", "timing_s/gen": "min", "n": "sum"})
    assert out == {"timing_s/gen": 1.0, "actor/pg_clipfrac_max": 5.0, "n": 6.0}
    assert math.isnan(reduce_metrics({"e": []})["e"])
    with pytest.raises(ValueError, match="median"):
        reduce_metrics(lists, {"n": "median"})
