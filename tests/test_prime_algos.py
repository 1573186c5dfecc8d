"""PRIME pure functions (rewards/prime.py, trainer/algos/prime.py) and the hook's logic without workers
(trainer/hooks/prime.py).

Hand-computed examples: implicit token reward, PRM cross-entropy and its gradient, per-source RLOO combination
(and a brute-force leave-one-out check), batch normalisation, the accuracy-band filter, PRIME metrics.
"""
import math
import random

import numpy as np
import pytest
import torch

from rewards.prime import implicit_token_rewards
from rewards.verify import accuracy_from_reward
from trainer.algos.prime import (band_filter_indices, compute_prime_advantages, last_token_mask,
                                 normalize_implicit_rewards, prime_metrics, prm_ce_loss, rloo_per_token)
from trainer.hooks.prime import PrimeHook, truncated_rows
from trainer.protocol import DataProto
from trainer.roles import PRMGroup

NAN = float("nan")


# ---- implicit reward ----------------------------------------------------------------------------------------------
def test_implicit_reward_every_valid_token_including_last():
    prm = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, NAN]])
    ref = torch.tensor([[-1.5, -1.0, -0.9], [-0.1, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    r = implicit_token_rewards(prm, ref, mask, beta=0.1)
    # q = [[0.5, -1.0, 0.4], [-0.2, -0.5, masked]]; the last valid token keeps its reward (verl drops it)
    assert torch.allclose(r, torch.tensor([[0.05, -0.1, 0.04], [-0.02, -0.05, 0.0]]), atol=1e-7)
    assert torch.isfinite(r).all()


def test_implicit_reward_bad_input():
    with pytest.raises(ValueError, match="beta"):
        implicit_token_rewards(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), beta=0.0)
    with pytest.raises(ValueError, match="ref_log_probs"):
        implicit_token_rewards(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), beta=0.1)


# ---- PRM loss -----------------------------------------------------------------------------------------------------
def _loss_case():
    ln3 = math.log(3.0)
    prm = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.4, NAN]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -1.0], [-0.2 - ln3, -0.4, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    acc = torch.tensor([1.0, 0.0])
    return prm, ref, mask, acc


def test_prm_ce_loss_value_and_gradient():
    prm, ref, mask, acc = _loss_case()
    # beta = 1: z_0 = sum q_0 = 0.5 - 1 + 0.5 = 0 -> sigma = 0.5, acc 1 -> loss log 2
    #           z_1 = ln 3 -> sigma = 0.75, acc 0 -> loss -log(0.25) = log 4
    loss = prm_ce_loss(prm, ref, mask, acc, beta=1.0)
    assert loss.item() == pytest.approx(1.5 * math.log(2.0), abs=1e-6)
    loss.backward()
    # dL/dlogp_t = (sigma(z_i) - acc_i) * beta * m_t / B: row 0 (0.5-1)/2 = -0.25; row 1 (0.75-0)/2 = 0.375
    assert torch.allclose(prm.grad, torch.tensor([[-0.25, -0.25, -0.25], [0.375, 0.375, 0.0]]), atol=1e-6)
    per = prm_ce_loss(prm.detach(), ref, mask, acc, beta=1.0, reduction="none")
    assert torch.allclose(per, torch.tensor([math.log(2.0), math.log(4.0)]), atol=1e-6)


def test_prm_ce_loss_beta_scales_logit_and_gradient():
    prm, ref, mask, acc = _loss_case()
    loss = prm_ce_loss(prm, ref, mask, acc, beta=0.5, reduction="sum")
    z1 = 0.5 * math.log(3.0)
    expect = math.log(2.0) + math.log1p(math.exp(z1))  # softplus(0)*1 + softplus(z1) for acc 0
    assert loss.item() == pytest.approx(expect, abs=1e-6)
    loss.backward()
    s1 = 1.0 / (1.0 + math.exp(-z1))
    assert prm.grad[0, 0].item() == pytest.approx(0.5 * (0.5 - 1.0), abs=1e-6)
    assert prm.grad[1, 1].item() == pytest.approx(0.5 * s1, abs=1e-6)
    assert prm.grad[1, 2].item() == 0.0


def test_prm_ce_loss_rejects_bad_acc():
    prm, ref, mask, _ = _loss_case()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        prm_ce_loss(prm, ref, mask, torch.tensor([1.5, 0.0]), beta=1.0)
    with pytest.raises(ValueError, match="acc must be"):
        prm_ce_loss(prm, ref, mask, torch.tensor([1.0]), beta=1.0)


# ---- RLOO ---------------------------------------------------------------------------------------------------------
def _rloo_case():
    rm = torch.tensor([[0.2, 0.4], [0.1, -0.1], [0.6, 9.9]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    acc = torch.tensor([1.0, 0.0, 0.0])
    return rm, mask, acc, ["a", "a", "a"]


def test_rloo_combination_hand_computed():
    rm, mask, acc, uid = _rloo_case()
    # gt: acc_i - mean_{j!=i} acc_j = [1, -0.5, -0.5] at the last valid token
    # implicit: row means m = [0.3, 0, 0.6]; baselines mean_{j!=i} m_j = [0.3, 0.45, 0.15]
    #   -> [[-0.1, 0.1], [-0.35, -0.55], [0.45, 0]]
    # final = 2 * implicit + 1 * gt = [[-0.2, 1.2], [-0.7, -1.6], [0.4, 0]]; returns = reverse cumsum
    adv, ret = compute_prime_advantages(rm, acc, mask, uid, reward_dpo_coef=2.0, reward_gt_coef=1.0)
    expect_ret = torch.tensor([[1.0, 1.2], [-2.3, -1.6], [0.4, 0.0]])
    assert torch.allclose(ret, expect_ret, atol=1e-6)
    # whitening over the 5 valid tokens: mean -0.26, unbiased variance 10.112 / 4 = 2.528
    expect_adv = (expect_ret + 0.26) / math.sqrt(2.528 + 1e-8)
    expect_adv[2, 1] = 0.0
    assert torch.allclose(adv, expect_adv, atol=1e-5)
    # sources can be switched off
    _, ret_gt = compute_prime_advantages(rm, acc, mask, uid, reward_dpo_coef=0.0, reward_gt_coef=1.0)
    assert torch.allclose(ret_gt, torch.tensor([[1.0, 1.0], [-0.5, -0.5], [-0.5, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="at least one source"):
        compute_prime_advantages(rm, acc, mask, uid, reward_dpo_coef=0.0, reward_gt_coef=0.0)


def _brute_force_loo(values, mask, uid):
    out = torch.zeros_like(values, dtype=torch.float64)
    b = values.shape[0]
    for i in range(b):
        if mask[i].sum() == 0:
            continue
        others = [j for j in range(b) if j != i and uid[j] == uid[i] and mask[j].sum() > 0]
        if not others:
            continue
        base = sum(float(values[j][mask[j] > 0].double().mean()) for j in others) / len(others)
        for t in range(values.shape[1]):
            if mask[i, t] > 0:
                out[i, t] = float(values[i, t]) - base
    return out


def test_rloo_matches_brute_force_leave_one_out_random():
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(20):
        b, r = rng.randint(1, 9), rng.randint(1, 6)
        uid = [rng.choice("xyz") for _ in range(b)]
        lengths = [rng.randint(0, r) for _ in range(b)]
        mask = torch.tensor([[1 if t < n else 0 for t in range(r)] for n in lengths])
        rm = torch.randn(b, r).masked_fill(mask == 0, NAN)
        acc = torch.tensor([float(rng.random() < 0.5) for _ in range(b)])
        got = rloo_per_token(rm, mask, uid)
        assert torch.allclose(got.double(), _brute_force_loo(rm, mask, uid), atol=1e-6)
        last = last_token_mask(mask)
        x_gt = torch.where(last, acc.unsqueeze(1), torch.zeros(()))
        expect = 3.0 * _brute_force_loo(rm, mask, uid) + 0.5 * _brute_force_loo(x_gt, last, uid)
        expect_ret = torch.flip(torch.cumsum(torch.flip(expect, [1]), 1), [1]) * mask
        _, ret = compute_prime_advantages(rm, acc, mask, uid, reward_dpo_coef=3.0, reward_gt_coef=0.5,
                                          whiten=False)
        assert torch.allclose(ret.double(), expect_ret, atol=1e-5)
        assert torch.isfinite(ret).all()


def test_rloo_singletons_and_empty_rows_get_zero():
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])
    vals = torch.tensor([[1.0, 2.0], [5.0, 5.0], [3.0, 7.0]])
    out = rloo_per_token(vals, mask, ["a", "a", "b"])  # "a" has one valid member, "b" one row
    assert torch.equal(out, torch.zeros(3, 2))


# ---- normalisation ------------------------------------------------------------------------------------------------
def test_batch_norm_divides_by_max_abs_suffix_sum_of_whole_batch():
    rm = torch.tensor([[1.0, -3.0], [2.0, 0.0]])
    mask = torch.ones(2, 2)
    # suffix sums: [[-2, -3], [2, 0]] -> max |.| = 3
    assert torch.allclose(normalize_implicit_rewards(rm, mask), rm / (3.0 + 1e-6))
    assert torch.equal(normalize_implicit_rewards(rm, mask, "none"), rm)
    with pytest.raises(ValueError, match="prime_norm"):
        normalize_implicit_rewards(rm, mask, "layer")


# ---- band filter --------------------------------------------------------------------------------------------------
def _band_batch():
    # groups of 4 (rows interleaved on purpose): accuracy means g0 1.0, g1 0.25, g2 0.0, g3 0.5 (truncated), g4 0.75
    accs = {"g0": [1, 1, 1, 1], "g1": [1, 0, 0, 0], "g2": [0, 0, 0, 0], "g3": [1, 1, 0, 0], "g4": [1, 1, 1, 0]}
    uid, acc, trunc = [], [], []
    for k in range(4):
        for g in ("g0", "g1", "g2", "g3", "g4"):
            uid.append(g)
            acc.append(accs[g][k])
            trunc.append(g == "g3" and k == 2)
    return uid, acc, trunc


def test_band_filter_constructed_batch():
    uid, acc, trunc = _band_batch()
    keep, m = band_filter_indices(acc, uid, keep_groups=3, truncated=trunc)
    kept = [uid[i] for i in keep]
    # passing: g1, g4 (g3 truncated); then the first failing group (g0) fills the batch; groups contiguous
    assert kept == ["g1"] * 4 + ["g4"] * 4 + ["g0"] * 4
    assert list(keep[:4]) == [1, 6, 11, 16]
    assert m["prime/groups_passed"] == 2.0 and m["prime/truncated_groups"] == 1.0
    assert m["prime/solve_none"] == pytest.approx(0.2) and m["prime/solve_all"] == pytest.approx(0.2)
    keep, m = band_filter_indices(acc, uid, keep_groups=2, truncated=trunc, filter_truncate=False)
    assert [uid[i] for i in keep] == ["g1"] * 4 + ["g3"] * 4 and m["prime/groups_passed"] == 3.0
    keep, _ = band_filter_indices(acc, uid, keep_groups=5, truncated=trunc, filter_accuracy=False)
    assert [uid[i] for i in keep][::4] == ["g0", "g1", "g2", "g4", "g3"]


def test_band_filter_bounds_inclusive_and_errors():
    keep, m = band_filter_indices([1, 0, 0, 0, 0, 1, 1, 1, 1, 0], ["a"] * 5 + ["b"] * 5, keep_groups=2)
    assert m["prime/groups_passed"] == 2.0  # means 0.2 and 0.8 are inside [0.2, 0.8]
    with pytest.raises(ValueError, match="cannot keep 3 groups"):
        band_filter_indices([1, 0], ["a", "b"], keep_groups=3)
    with pytest.raises(ValueError, match="bounds"):
        band_filter_indices([1, 0], ["a", "a"], keep_groups=1, lower=0.9, upper=0.1)


# ---- metrics ------------------------------------------------------------------------------------------------------
def test_prime_metrics_hand_computed():
    rm = torch.tensor([[0.3], [-0.1], [0.5], [0.1], [0.2], [-0.2], [3.0], [2.0], [1.0]])
    acc = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5])
    uid = ["a", "a", "b", "b", "c", "c", "d", "d", "d"]
    m = prime_metrics(rm, acc, torch.ones(9, 1), uid)
    # a: right (1); b: wrong (0); c: equal accs (0.5); d: weighted pairs 1 + 0.5 right, 0.5 wrong -> 0.75
    assert m["reward_model/dpo_acc"] == pytest.approx((1 + 0 + 0.5 + 0.75) / 4)
    # sign(sum r) == sign(2 acc - 1): rows 0, 1, 3, 4, 6 agree; 2, 5, 7 disagree; 8 (acc .5 -> 0) disagrees
    assert m["reward_model/dpo_acc_abs"] == pytest.approx(5 / 9)
    assert m["reward_model/reward"] == pytest.approx(float(rm.sum()) / 9)


# ---- controller logic without workers -----------------------------------------------------------------------------
def _cfg(**over):
    cfg = {"data": {"train_batch_size": 2, "oversample_factor": 2.0, "accuracy_lower_bound": 0.2,
                    "accuracy_upper_bound": 0.8, "filter_accuracy": True, "filter_truncate": True},
           "actor_rollout_ref": {"rollout": {"n": 2}},
           "reward_model": {"model": {"update": "before", "loss_type": "ce"}, "prime_granularity": "token",
                            "prime_norm": "batch_norm"},
           "algorithm": {"use_prime": True, "reward_dpo_coef": 5.0, "reward_gt_coef": 5.0}}
    for k, v in over.items():
        sec, key = k.split("__")
        cfg[sec][key] = v
    return cfg


def test_controller_config_errors():
    with pytest.raises(ValueError, match="n >= 2"):
        PrimeHook(_cfg(actor_rollout_ref__rollout={"n": 1}), world=2)
    with pytest.raises(ValueError, match="divide over the 4 workers"):
        PrimeHook(_cfg(data__oversample_factor=1.5), world=4)
    with pytest.raises(ValueError, match="reward_model.model.update='sideways'"):
        PrimeHook(_cfg(reward_model__model={"update": "sideways"}), world=2)
    assert PrimeHook(_cfg(), world=2).n_prompts == 4


class _Rew:
    def __init__(self, extra):
        self.reward_extra_info = extra


def test_controller_filter_batch_on_constructed_batch():
    ctl = PrimeHook(_cfg(), world=2, stop_token_ids=2)
    uid = ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]
    responses = torch.tensor([[5, 2], [5, 2], [5, 2], [5, 2], [5, 7], [5, 2], [5, 2], [5, 0]])
    mask = torch.tensor([[1, 1]] * 7 + [[1, 0]]).float()
    batch = DataProto.from_dict({"responses": responses, "response_mask": mask}, {"uid": uid})
    # accs: p0 [1,1] (too easy), p1 [1,0] ok, p2 [1,0] but row 4 truncated (no EOS), p3 [0,1] ok
    rew = _Rew({"score": [0.1, 0.1, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0], "acc": [1, True, None, None, 1, 0, 0, 1]})
    metrics = {}
    out = ctl.band_filter(batch, rew, metrics)
    assert out["uid"].tolist() == ["p1", "p1", "p3", "p3"]
    assert out["acc"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert metrics["prime/acc"] == pytest.approx(5 / 8) and metrics["prime/truncated_groups"] == 1.0


def test_truncated_rows():
    responses = torch.tensor([[5, 2], [5, 7], [5, 0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    assert truncated_rows(responses, mask, stop_token_ids=2).tolist() == [False, True, False]


class _FakeWG:
    sp_size, dp_size = 1, 2

    def __init__(self):
        self.calls = []

    def dispatch_dp(self, method, data):
        self.calls.append(method)
        return DataProto.from_dict({"rm_scores": torch.full(data["responses"].shape, 0.5)})

    def dispatch_dp_metrics(self, method, data):
        self.calls.append(method)
        parts = []
        for c in data.chunk(2):
            p = DataProto.from_dict({"rm_scores": torch.full(c["responses"].shape, -0.5)})
            p.meta["metrics"] = {"reward_model/ce_loss": [0.7]}
            parts.append(p)
        return parts


@pytest.mark.parametrize("mode,calls,score", [("before", ["update_rm", "compute_rm_scores"], 0.5),
                                              ("after", ["update_rm"], -0.5), ("none", ["compute_rm_scores"], 0.5)])
def test_controller_update_modes(mode, calls, score):
    ctl = PrimeHook(_cfg(reward_model__model={"update": mode, "loss_type": "ce"},
                         reward_model__prime_norm="none"), world=2)
    ctl.prm = PRMGroup(_FakeWG())
    b = DataProto.from_dict({k: torch.ones(4, 2, dtype=torch.long) for k in
                             ("input_ids", "attention_mask", "position_ids", "responses")} |
                            {"response_mask": torch.ones(4, 2), "acc": torch.tensor([1.0, 0.0, 1.0, 1.0])},
                            {"uid": ["a", "a", "b", "b"]})
    metrics = {}
    ctl.prime_advantage(b, metrics)
    assert ctl.prm.wg.calls == calls
    assert torch.equal(b["rm_scores"], torch.full((4, 2), score))
    assert b["advantages"].shape == (4, 2) and torch.isfinite(b["advantages"]).all()
    assert ("reward_model/ce_loss" in metrics) == (mode != "none")


# ---- accuracy = RewardManager.verify; custom reward_fn_key (case P20) ------------------------------------------------
class _Tok:
    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(str(t) for t in r) for r in rows]


def _p20_scorer(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "math"
    if extra_info["kind"] == "dict":
        return {"score": 0.5, "acc": 1.0, "tag": extra_info["tag"]}
    return 1.0


def test_p20_prime_accuracy_custom_reward_fn_key_matches_verify():
    from rewards.manager import RewardManager

    batch = DataProto.from_dict(
        {"responses": torch.tensor([[4, 5], [6, 0]]), "response_mask": torch.tensor([[1, 1], [1, 0]])},
        {"ability": ["math", "math"], "reward_model": [{"ground_truth": "1"}, {"ground_truth": "2"}],
         "extra_info": [{"kind": "dict", "tag": "t0"}, {"kind": "float", "tag": "t1"}]})
    rm = RewardManager(_Tok(), reward_fn_key="ability", scorer=_p20_scorer, num_workers=0)
    out = rm(batch)
    assert out.token_level_scores.tolist() == [[0.0, 0.5], [1.0, 0.0]]
    assert out.reward_extra_info["tag"] == ["t0", None]
    acc = accuracy_from_reward(out.reward_extra_info, 2)
    assert acc == rm.verify(batch) == [1.0, 1.0]
    with pytest.raises(ValueError, match="must hold 3 values"):
        accuracy_from_reward(out.reward_extra_info, 3)


def test_accuracy_from_reward_non_numbers():
    assert accuracy_from_reward({"score": [0.3, 0.4, 0.5], "acc": ["x", float("nan"), None]}, 3) == [0.0, 0.0, 0.5]
    assert np.allclose(accuracy_from_reward({"score": [0.3]}, 1), [0.3])


def test_a_batch_where_no_group_passes_is_warned_once_naming_why(caplog):
    """Every group filtered out (all truncated, or all outside the band): the batch is the groups the filters
    dropped (verl's fill-up), which a user saw only as prime/groups_passed=0."""
    import logging

    ctl = PrimeHook(_cfg(), world=2, stop_token_ids=2)
    uid = ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]
    responses = torch.tensor([[5, 7]] * 4 + [[5, 2]] * 4)  # p0, p1 cut at the length limit; p2, p3 end
    batch = DataProto.from_dict({"responses": responses, "response_mask": torch.ones(8, 2)}, {"uid": uid})
    rew = _Rew({"score": [0.0] * 8, "acc": [0, 0, 0, 0, 0, 0, 1, 1]})
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            metrics = {}
            assert len(ctl.band_filter(batch, rew, metrics)) == 4 and metrics["prime/groups_passed"] == 0
    lines = [r.getMessage() for r in caplog.records if "no group of this batch passed" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "2 of 4 groups hold a response cut at data.max_response_length (data.filter_truncate)" in lines[0]
    assert "75% of groups solve none and 25% all, outside the accuracy band [0.2, 0.8]" in lines[0]
    caplog.clear()
    metrics = {}
    rew = _Rew({"score": [0.0] * 8, "acc": [0, 1] * 4})
    with caplog.at_level(logging.WARNING):
        PrimeHook(_cfg(), world=2, stop_token_ids=2).band_filter(batch, rew, metrics)
    assert metrics["prime/groups_passed"] == 2 and "no group" not in caplog.text


def test_truncated_rows_reads_the_attended_response_of_a_multi_turn_trajectory():
    """breakerD §5: a multi-turn trajectory cut at the length limit has tool tokens (response_mask 0, attended) in
    its R columns; it is truncated by the response part of attention_mask, as a single-turn row is by its
    response_mask. One that ends on the end-of-turn token on the last column is not."""
    from rollout.base import SamplingConfig
    from rollout.multiturn import MultiTurnConfig, multi_turn_generate
    from rollout.tools.calculator import CalculatorTool
    from tests.multiturn_utils import ScriptedEngine, build_chat_tokenizer, hermes

    tk, end = build_chat_tokenizer(), "<|im_end|>"
    prompt = tk.encode(tk.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)
    answer = "#### 42" + end
    width = len(tk.encode(answer, add_special_tokens=False))

    def run(script, w):
        return multi_turn_generate(ScriptedEngine(tk, script), tk, [prompt], SamplingConfig(n=1, max_new_tokens=w),
                                   {"calculator": CalculatorTool()}, MultiTurnConfig(enable=True))

    looping = run(lambda c, k: "again " + hermes("calculator", expression="1 * 2") + end, 200)  # never answers
    exact = run(lambda c, k: answer, width)  # the end-of-turn token lands on the last column
    stops = [tk.eos_token_id]
    for res, truncated in ((looping, True), (exact, False)):
        r = res.rollout
        assert int(res.attention_mask.sum()) == r.responses.shape[1]  # every column filled
        assert res.metrics["multi_turn/stop_reason/length"] == float(truncated)
        P = 3  # the trainer's attention_mask is (B, P+R): the response part is read
        attn = torch.cat([torch.ones(1, P, dtype=torch.long), res.attention_mask], dim=1)
        assert truncated_rows(r.responses, r.response_mask, stops, attn).tolist() == [truncated]
        assert truncated_rows(r.responses, r.response_mask, stops, res.attention_mask).tolist() == [truncated]
    # the model's tokens alone do not fill the columns of the looping trajectory
    assert int(looping.rollout.response_mask.sum()) < 200
    assert truncated_rows(looping.rollout.responses, looping.rollout.response_mask, stops).tolist() == [False]
    with pytest.raises(ValueError, match="does not cover"):
        truncated_rows(looping.rollout.responses, looping.rollout.response_mask, stops, looping.attention_mask[:, :5])

    # band_filter reads the batch's attention_mask: the groups holding the looping trajectory are dropped
    ctl = PrimeHook(_cfg(), world=2, stop_token_ids=stops)
    pad = torch.full((1, 200 - width), tk.pad_token_id)
    rows = {"loop": (looping.rollout.responses, looping.rollout.response_mask, looping.attention_mask),
            "exact": (torch.cat([exact.rollout.responses, pad], 1), torch.cat([exact.rollout.response_mask, pad * 0], 1),
                      torch.cat([exact.attention_mask, pad * 0], 1))}
    order = ["loop", "exact", "loop", "exact", "exact", "exact", "exact", "exact"]
    resp, rmask, amask = (torch.cat([rows[o][j] for o in order]) for j in range(3))
    batch = DataProto.from_dict({"responses": resp, "response_mask": rmask.float(),
                                 "attention_mask": torch.cat([torch.ones(8, 2, dtype=torch.long), amask], 1)},
                                {"uid": ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]})
    metrics = {}
    out = ctl.band_filter(batch, _Rew({"score": [1.0, 0.0] * 4, "acc": [1, 0] * 4}), metrics)
    assert metrics["prime/truncated_groups"] == 2.0 and metrics["prime/groups_passed"] == 2.0
    assert out["uid"].tolist() == ["p2", "p2", "p3", "p3"]


def test_truncated_rows_reads_a_multi_turn_trajectorys_stop_reason():
    """A trajectory whose budget ran out before its tool answers fit ends ``length`` on its end-of-turn token with
    columns to spare: truncated by its stop reason (the filled-columns rule alone calls it finished), and PRIME's
    truncation filter drops its group."""
    from rollout.base import SamplingConfig
    from rollout.multiturn import MultiTurnConfig, multi_turn_generate
    from rollout.tools.calculator import CalculatorTool
    from tests.multiturn_utils import ScriptedEngine, build_chat_tokenizer, hermes

    tk, end = build_chat_tokenizer(), "<|im_end|>"
    prompt = tk.encode(tk.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)
    call = hermes("calculator", expression="1 * 2") + end
    width = len(tk.encode(call, add_special_tokens=False)) + 2  # no room for the tool's answer
    res = multi_turn_generate(ScriptedEngine(tk, lambda c, k: call), tk, [prompt],
                              SamplingConfig(n=1, max_new_tokens=width), {"calculator": CalculatorTool()},
                              MultiTurnConfig(enable=True))
    r, reasons = res.rollout, res.row_columns["mt_stop_reason"]
    assert list(reasons) == ["length"] and int(res.attention_mask.sum()) < width
    assert int(r.responses[0, int(res.attention_mask.sum()) - 1]) == tk.eos_token_id
    stops = [tk.eos_token_id]
    assert truncated_rows(r.responses, r.response_mask, stops, res.attention_mask).tolist() == [False]
    assert truncated_rows(r.responses, r.response_mask, stops, res.attention_mask, reasons).tolist() == [True]
    assert truncated_rows(r.responses, r.response_mask, stops, None, ["no_tool_call"]).tolist() == [False]
    with pytest.raises(ValueError, match=r"stop_reasons has 2 entries; expected one per row \(1\)"):
        truncated_rows(r.responses, r.response_mask, stops, None, ["length", "length"])

    ctl = PrimeHook(_cfg(), world=2, stop_token_ids=stops)
    n = 8
    batch = DataProto.from_dict({"responses": r.responses.repeat(n, 1),
                                 "response_mask": r.response_mask.float().repeat(n, 1),
                                 "attention_mask": torch.cat([torch.ones(n, 2, dtype=torch.long),
                                                              res.attention_mask.long().repeat(n, 1)], 1)},
                                {"uid": ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"],
                                 "mt_stop_reason": ["length", "no_tool_call"] * 2 + ["no_tool_call"] * 4})
    metrics = {}
    out = ctl.band_filter(batch, _Rew({"score": [1.0, 0.0] * 4, "acc": [1, 0] * 4}), metrics)
    assert metrics["prime/truncated_groups"] == 2.0 and out["uid"].tolist() == ["p2", "p2", "p3", "p3"]
