"""DAPO dynamic sampling through ``RayPPOTrainer.train_step`` with a fake actor and a fake reward: joins of
generation batches whose non-tensor columns differ, and the step's metrics over every generated batch (peak
memory, generation time per token, reward counts and seconds, reward keys missing from the first batch). Found by a
review after the session-11 GPU crash (filler groups of different prompt widths)."""
import time

import pytest
import torch

from rewards.manager import RewardOutput
from trainer.dataset import PromptLoader, collate_prompts
from trainer.metric_utils import compute_timing_metrics
from trainer.protocol import DataProto

R, N = 3, 2


def _row(i, kind, width, **extra):
    # kind: "mixed" (one of the n responses right), "wrong" (all wrong)
    return {"input_ids": list(range(10 + i, 10 + i + width)), "data_source": "t",
            "reward_model": {"ground_truth": kind}, "prompt": f"q{i}", **extra}


class FakeActor:
    dp_size = 1

    def __init__(self, perf=None, sleep=0.0):
        self.calls, self.perf, self.sleep = 0, perf or {}, sleep

    def dispatch_all(self, method, prompts):
        assert method == "generate_sequences"
        self.calls += 1
        time.sleep(self.sleep)
        rep = prompts.repeat(N)
        b = len(rep)
        resp = torch.full((b, R), 7)
        rmask = torch.ones(b, R, dtype=torch.long)
        attn = torch.cat([rep["attention_mask"], rmask], 1)
        out = DataProto.from_dict({"prompts": rep["input_ids"], "responses": resp, "response_mask": rmask.float(),
                                   "rollout_log_probs": torch.zeros(b, R),
                                   "input_ids": torch.cat([rep["input_ids"], resp], 1), "attention_mask": attn,
                                   "position_ids": torch.clamp(torch.cumsum(attn, 1) - 1, min=0)},
                                  dict(rep.non_tensor), meta=dict(prompts.meta))
        out.meta.update(self.perf.get(self.calls, {}))
        return out

    def dispatch_dp(self, method, data):
        z = torch.zeros(len(data), R)
        return DataProto.from_dict({"old_log_probs": z, "entropys": z})

    def dispatch_dp_metrics(self, method, data):
        return [{}]


def make_reward(extra_by_call=None, metrics_by_call=None):
    calls = []

    def reward_fn(rows):
        calls.append(1)
        k = len(calls)
        acc = [float(rm["ground_truth"] == "mixed" and i % 2 == 0) for i, rm in enumerate(rows["reward_model"])]
        s = torch.zeros(len(rows), R)
        s[:, -1] = torch.tensor(acc)
        extra = {"score": list(acc), "acc": list(acc)}
        extra.update((extra_by_call or {}).get(k, {}))
        m = {"reward/score_mean": sum(acc) / len(acc), "reward/num_timeouts": 0.0, "reward/time_s": 1.0}
        m.update((metrics_by_call or {}).get(k, {}))
        return RewardOutput(s, extra, m)
    return reward_fn


def make_trainer(rows, bs, cap=10, actor=None, reward_fn=None):
    from tests.e2e_utils import resolved_config
    from trainer.ppo_trainer import RayPPOTrainer

    cfg = resolved_config("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                          f"algorithm.filter_groups.max_num_gen_batches={cap}", f"actor_rollout_ref.rollout.n={N}",
                          f"data.train_batch_size={bs}", "trainer.seed=1", "trainer.balance_batch=true")
    tok = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 0})()
    tr = RayPPOTrainer(cfg, tok, PromptLoader(rows, bs, 0, shuffle=False), None, reward_fn or make_reward(), None)
    tr.global_step = 1
    tr.roles.attach("actor", actor or FakeActor())
    return tr


def test_filler_batches_with_different_non_tensor_columns():
    # Two train files: one carries 'ability', the other not (collate_prompts keeps a key only if every row of
    # the batch has it, so the non-tensor columns depend on the batch)
    rows = [_row(0, "mixed", 2, ability="math"), _row(1, "wrong", 2, ability="math"),
            _row(2, "mixed", 3), _row(3, "mixed", 3)]
    tr = make_trainer(rows, bs=2)
    batch, _ = tr.loader.next_batch()
    trained, metrics = tr.train_step(batch, {})  # KeyError: 'ability' in DataProto.concat today
    assert metrics["dynamic_sampling/num_gen_batches"] == 2.0
    assert len(trained) == 4


def test_peak_gen_memory_of_a_batch_without_kept_rows_is_kept():
    rows = [_row(0, "wrong", 2), _row(1, "wrong", 2), _row(2, "mixed", 2), _row(3, "mixed", 2)]
    key = "perf/max_memory_allocated_gb/gen"
    tr = make_trainer(rows, bs=2, actor=FakeActor(perf={1: {key: 5.0}, 2: {key: 1.0}}))
    batch, _ = tr.loader.next_batch()
    _, metrics = tr.train_step(batch, {})
    assert metrics["dynamic_sampling/num_gen_batches"] == 2.0
    assert metrics[key] == 5.0  # today 1.0: batch 1 contributed no rows, so its meta is dropped


def test_gen_time_per_token_uses_the_generated_tokens():
    rows = [_row(0, "wrong", 2), _row(1, "wrong", 2), _row(2, "mixed", 2), _row(3, "mixed", 2)]
    tr = make_trainer(rows, bs=2, actor=FakeActor(sleep=0.05))
    batch, _ = tr.loader.next_batch()
    timing = {}
    trained, _ = tr.train_step(batch, timing)
    out = compute_timing_metrics(trained, timing)
    generated_response_tokens = 2 * 2 * N * R  # 2 generation batches of 2 prompts x N responses x R tokens
    assert out["timing_per_token_ms/gen"] == pytest.approx(timing["gen"] * 1000 / generated_response_tokens)


def test_reward_counts_over_all_generated_batches():
    rows = [_row(0, "wrong", 2), _row(1, "wrong", 2), _row(2, "mixed", 2), _row(3, "mixed", 2)]
    rew = make_reward(metrics_by_call={2: {"reward/num_timeouts": 4.0, "reward/time_s": 3.0}})
    tr = make_trainer(rows, bs=2, reward_fn=rew)
    batch, _ = tr.loader.next_batch()
    _, m = tr.train_step(batch, {})
    assert m["reward/num_timeouts"] == 4.0   # today 2.0 (mean of 0 and 4)
    assert m["reward/time_s"] == 4.0         # today 2.0, while timing_s/reward sums both batches


def test_extra_info_key_absent_from_first_batch_is_still_logged():
    rows = [_row(0, "wrong", 2), _row(1, "wrong", 2), _row(2, "mixed", 2), _row(3, "mixed", 2)]
    rew = make_reward(extra_by_call={1: {"format": [None] * 4}, 2: {"format": [1.0] * 4}})

    def drop_first(rows, _f=rew, _c=[]):
        out = _f(rows)
        _c.append(1)
        if len(_c) == 1:
            out.reward_extra_info.pop("format")  # batch 1: scorer returned no 'format' (e.g. all errors)
        return out
    tr = make_trainer(rows, bs=2, reward_fn=drop_first)
    batch, _ = tr.loader.next_batch()
    _, m = tr.train_step(batch, {})
    assert m["reward/format/mean"] == 1.0   # today missing: keys are taken from rews[0] only


def test_multi_turn_call_seconds_add_up_over_the_steps_generation_batches():
    rows = [_row(0, "wrong", 2), _row(1, "wrong", 2), _row(2, "mixed", 2), _row(3, "mixed", 2)]
    tr = make_trainer(rows, bs=2, actor=FakeActor(perf={1: {"multi_turn/generate_s": 3.0,
                                                            "multi_turn/tool_wall_s": 0.5},
                                                        2: {"multi_turn/generate_s": 2.0,
                                                            "multi_turn/tool_wall_s": 0.25}}))
    batch, _ = tr.loader.next_batch()
    trained, metrics = tr.train_step(batch, {})
    assert metrics["dynamic_sampling/num_gen_batches"] == 2.0
    assert trained.meta["multi_turn/generate_s"] == 5.0  # batch 1 kept no rows, its seconds still count
    assert trained.meta["multi_turn/tool_wall_s"] == 0.75


def test_tool_metrics_join_over_the_steps_generation_batches():
    """The sandbox level of a step is the weakest of every generation batch (batch 1 kept no rows, its calls still
    ran), joined as over workers (:func:`trainer.protocol.join_tool_metrics`), not taken from the kept rows' batch."""
    level = "tool/python/isolation_level"
    rows = [_row(0, "wrong", 2), _row(1, "wrong", 2), _row(2, "mixed", 2), _row(3, "mixed", 2)]
    tr = make_trainer(rows, bs=2, actor=FakeActor(perf={1: {level: 1.0}, 2: {level: 3.0}}))
    batch, _ = tr.loader.next_batch()
    trained, metrics = tr.train_step(batch, {})
    assert metrics["dynamic_sampling/num_gen_batches"] == 2.0
    assert trained.meta[level] == 1.0
