"""DAPO dynamic sampling (algorithm.filter_groups): which groups are informative, how batches are collected and
joined, the config checks, and one end-to-end run with the filter on."""
import math
import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rewards.manager import RewardOutput
from tests.e2e_shared import run_main_forked
from tests.e2e_utils import ROOT, SHORT, read_metrics
from trainer.hooks.dynamic_sampling import (collect_informative_groups, concat_padded, informative_rows,
                                            left_pad_prompts, metric_values)
from trainer.launch import ConfigError, validate
from trainer.protocol import DataProto

R = 3  # response width of the fake batches


def test_informative_rows_keeps_groups_whose_values_differ_in_order():
    uids = ["a", "a", "b", "b", "c", "c", "d"]
    vals = [0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    keep, drop, groups = informative_rows(uids, vals)
    assert keep.tolist() == [0, 1, 6]  # "a" differs; the one-row group "d" is kept (verl's rule)
    assert drop.tolist() == [2, 3, 4, 5]  # all wrong and all right give no GRPO gradient
    assert groups == 4
    with pytest.raises(ValueError, match="3 uids but 2 metric values"):
        informative_rows(["a", "a", "b"], [0.0, 1.0])


def test_p09_rows_without_response_tokens_do_not_make_a_group_informative():
    # group "a" differs only through its aborted row 0; "b" differs among valid rows; "c" has one valid row of
    # two; "d" is a one-row group (rollout.n=1) without a response token, "e" one with
    uids = ["a", "a", "a", "b", "b", "b", "c", "c", "d", "e"]
    vals = [5.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    valid = [False, True, True, True, True, True, True, False, False, True]
    keep, drop, groups = informative_rows(uids, vals, valid)
    assert keep.tolist() == [3, 4, 5, 9] and drop.tolist() == [0, 1, 2, 6, 7, 8] and groups == 5
    assert informative_rows(uids, vals)[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # every row valid
    with pytest.raises(ValueError, match="10 uids but 10 metric values and 9 valid flags"):
        informative_rows(uids, vals, valid[:-1])


def test_p09_collect_leaves_out_groups_whose_spread_is_an_aborted_row():
    def gen(prompts, k):  # q0's mixed rows: the right one (row 1) came back without response tokens
        rows, rew = _fake_generate({"q0": None, "q1": None}, 2, [])(prompts, k)
        rows["response_mask"] = torch.ones(4, R, dtype=torch.long)
        rows["response_mask"][1] = 0
        return rows, rew

    metrics = {}
    batch, _ = collect_informative_groups(_prompt_batch(2, 2, 0), lambda: None, gen, want_groups=2, n=2,
                                          metric="acc", max_num_gen_batches=1, pad_token_id=0, metrics=metrics)
    assert list(batch["qid"]) == ["q1", "q1", "q0", "q0"]  # q0 only as filler at the cap
    assert metrics["dynamic_sampling/informative_ratio"] == 0.5 and metrics["dynamic_sampling/filled_groups"] == 1.0


def test_metric_values_acc_score_and_unknown():
    scores = torch.tensor([[0.0, 0.0, 0.1], [0.0, 1.0, 0.0]])
    rew = RewardOutput(scores, {"score": [0.1, 1.0], "acc": [False, True]})
    assert metric_values(rew, "acc", 2) == [0.0, 1.0]
    assert [round(v, 6) for v in metric_values(rew, "score", 2)] == [0.1, 1.0]
    with pytest.raises(ValueError, match=r"metric='reward'; expected one of \['acc', 'score'\]"):
        metric_values(rew, "reward", 2)


def _prompt_batch(n_prompts: int, width: int, start: int) -> DataProto:
    ids = torch.arange(start, start + n_prompts * width).view(n_prompts, width) + 10
    return DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                               {"qid": [f"q{start + i}" for i in range(n_prompts)]})


def _fake_generate(correct: dict, n: int, calls: list):
    """Every response of prompt qid is right when ``correct[qid]`` is True, wrong when False, mixed when None."""

    def gen(prompts: DataProto, k: int):
        calls.append(k)
        prompts["uid"] = [f"{k}-{i}" for i in range(len(prompts))]
        rows = prompts.repeat(n)
        b, p = rows["input_ids"].shape
        responses = torch.full((b, R), 7)
        rows["prompts"] = rows["input_ids"]
        rows["responses"] = responses
        rows["input_ids"] = torch.cat([rows["input_ids"], responses], 1)
        rows["attention_mask"] = torch.cat([rows["attention_mask"], torch.ones(b, R, dtype=torch.long)], 1)
        rows["position_ids"] = torch.arange(p + R).expand(b, -1).clone()
        acc = []
        for i, q in enumerate(rows["qid"]):
            c = correct[q]
            acc.append(bool(i % 2) if c is None else c)
        scores = torch.zeros(b, R)
        scores[:, -1] = torch.tensor(acc, dtype=torch.float32)
        rows["token_level_scores"] = scores
        return rows, RewardOutput(scores, {"score": [float(a) for a in acc], "acc": acc}, {"reward/score_mean": 0.0})

    return gen


def _collect(correct: dict, widths: list, n: int, want: int, cap: int):
    """Run collect_informative_groups over prompt batches of ``widths[k]`` tokens, ``len(correct) // len(widths)``
    prompts each (``q0``, ``q1``, ... in order); returns (batch, rewards, calls, metrics)."""
    per = len(correct) // len(widths)
    batches = [_prompt_batch(per, w, k * per) for k, w in enumerate(widths)]
    later = iter(batches[1:])
    calls, metrics = [], {}
    batch, rews = collect_informative_groups(batches[0], lambda: next(later), _fake_generate(correct, n, calls),
                                             want_groups=want, n=n, metric="acc", max_num_gen_batches=cap,
                                             pad_token_id=0, metrics=metrics)
    return batch, rews, calls, metrics


def test_collect_takes_informative_groups_across_batches_of_different_widths():
    n, want = 2, 3
    # batch 1 (width 2): q0 mixed, q1 all wrong, q2 all right; batch 2 (width 4): q3 all wrong, q4 mixed, q5 mixed
    correct = {"q0": None, "q1": False, "q2": True, "q3": False, "q4": None, "q5": None}
    batch, rews, calls, metrics = _collect(correct, [2, 4], n, want, cap=10)
    assert calls == [1, 2] and len(rews) == 2
    assert list(batch["qid"]) == ["q0", "q0", "q4", "q4", "q5", "q5"]  # informative groups in generation order
    assert batch["prompts"].shape == (6, 4) and batch["input_ids"].shape == (6, 4 + R)
    # the width-2 prompt was left-padded (masked out) and its tokens kept at the right end
    assert batch["prompts"][0].tolist() == [0, 0, 10, 11] and batch["attention_mask"][0].tolist()[:2] == [0, 0]
    assert batch["input_ids"][0, 2:].tolist() == [10, 11, 7, 7, 7]
    assert batch["token_level_scores"].shape == (6, R)
    assert metrics["dynamic_sampling/num_gen_batches"] == 2.0
    assert math.isclose(metrics["dynamic_sampling/informative_ratio"], 3 / 6)
    assert metrics["dynamic_sampling/filled_groups"] == 0.0


def test_collect_stops_at_the_cap_and_fills_with_uninformative_groups():
    n, want = 2, 2
    correct = {f"q{i}": (None if i == 1 else False) for i in range(6)}
    batch, _, calls, metrics = _collect(correct, [2, 2, 2], n, want, cap=2)
    assert calls == [1, 2]
    assert list(batch["qid"]) == ["q1", "q1", "q0", "q0"]  # the one informative group, then the first dropped one
    assert metrics["dynamic_sampling/filled_groups"] == 1.0


def test_collect_fills_from_uninformative_groups_of_batches_of_different_widths():
    # Seen on an H200: at the cap, the dropped groups of three generation batches with prompts of
    # 111, 120, ... tokens were concatenated before padding ("Expected size 111 but got size 120").
    n, want = 2, 4
    correct = {f"q{i}": (None if i == 0 else False) for i in range(9)}
    batch, _, calls, metrics = _collect(correct, [2, 5, 3], n, want, cap=3)
    assert calls == [1, 2, 3] and metrics["dynamic_sampling/filled_groups"] == 3.0
    # the informative q0, then the first dropped groups in generation order: q1, q2 (width 2) and q3 (width 5)
    assert list(batch["qid"]) == ["q0", "q0", "q1", "q1", "q2", "q2", "q3", "q3"]
    assert batch["prompts"].shape == (8, 5) and batch["input_ids"].shape == (8, 5 + R)
    assert batch["prompts"][2].tolist() == [0, 0, 0, 12, 13] and batch["attention_mask"][2].tolist()[:3] == [0] * 3
    assert batch["attention_mask"][6].tolist() == [1] * (5 + R)


def test_collect_refuses_rows_that_are_not_n_per_group():
    def gen(prompts, k):
        rows, rew = _fake_generate({"q0": None, "q1": None}, 2, [])(prompts, k)
        return rows.index([0, 1, 2]), RewardOutput(rew.token_level_scores[:3], {"score": [0.0, 1.0, 0.0]})

    with pytest.raises(ValueError, match="3 rows in 2 groups; expected 2 per group"):
        collect_informative_groups(_prompt_batch(2, 2, 0), lambda: None, gen, want_groups=2, n=2, metric="acc",
                                   max_num_gen_batches=1, pad_token_id=0, metrics={})


def test_left_pad_prompts_refuses_a_narrower_width():
    rows, _ = _fake_generate({"q0": False}, 1, [])(_prompt_batch(1, 3, 0), 1)
    assert left_pad_prompts(rows, 3, 0) is rows
    with pytest.raises(ValueError, match="width 3 to 2"):
        left_pad_prompts(rows, 2, 0)
    with pytest.raises(ValueError, match="at least one batch"):
        concat_padded([], 0)


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


def test_filter_groups_config_checks():
    on = "algorithm.filter_groups.enable=true"
    validate(_cfg(on))
    with pytest.raises(ConfigError, match="filter_groups.metric='seq_reward'"):
        validate(_cfg(on, "algorithm.filter_groups.metric=seq_reward"))
    with pytest.raises(ConfigError, match="rollout.n=1"):
        validate(_cfg(on, "algorithm=gae", "actor_rollout_ref.rollout.n=1"))
    with pytest.raises(ConfigError, match="algorithm=prime"):
        validate(_cfg(on, "algorithm=prime"))


@pytest.mark.slow
def test_e2e_grpo_with_dynamic_sampling(tmp_path):
    out = str(tmp_path / "run")
    run_main_forked(out, *SHORT, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3")
    steps = [r for r in read_metrics(out) if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 1 <= r["dynamic_sampling/num_gen_batches"] <= 3
        assert 0.0 <= r["dynamic_sampling/informative_ratio"] <= 1.0
        assert math.isfinite(r["actor/pg_loss"]) and isinstance(r["reward/score/mean"], float)
    # the embedded task starts near 7% reward with groups of 4: most groups are uninformative, so more batches
    assert sum(r["dynamic_sampling/num_gen_batches"] for r in steps) > 2


def test_no_cap_stops_with_an_error_after_one_epoch_of_batches():
    correct = {f"q{i}": False for i in range(8)}  # a reward that never differs within a group
    later = iter([_prompt_batch(2, 2, 2 * i) for i in range(1, 4)])
    calls = []
    with pytest.raises(RuntimeError, match=r"0 of 2 informative groups after 3 generation batches \(6 groups"):
        collect_informative_groups(_prompt_batch(2, 2, 0), lambda: next(later), _fake_generate(correct, 2, calls),
                                   want_groups=2, n=2, metric="acc", max_num_gen_batches=0, pad_token_id=0,
                                   metrics={}, no_cap_limit=3)
    assert calls == [1, 2, 3]


def test_filter_groups_cap_must_be_an_integer():
    with pytest.raises(ConfigError, match="max_num_gen_batches='abc'; expected an integer"):
        validate(_cfg("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=abc"))


def test_filter_groups_values_are_checked_while_the_filter_is_off():
    # found by a new-user check: a typo in the metric passed silently until enable=true
    with pytest.raises(ConfigError, match=r"metric='accuracy'; expected one of \['acc', 'score'\]"):
        validate(_cfg("algorithm.filter_groups.metric=accuracy"))
    with pytest.raises(ConfigError, match="max_num_gen_batches=2.5; expected an integer"):
        validate(_cfg("algorithm.filter_groups.max_num_gen_batches=2.5"))
    validate(_cfg("algorithm.filter_groups.metric=score"))
