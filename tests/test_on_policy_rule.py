"""The trainer's old-log-prob rule (trainer/on_policy.py): the pass is skipped exactly when the actor update is one
optimizer step over the step's batch and nothing reads old log-probs before it; through ``train_step`` with a fake
actor, the skipped pass is not called, the update gets a batch without ``old_log_probs`` and the step says which
path ran (``perf/old_log_prob_pass``)."""
import pytest
import torch

from rewards.manager import RewardOutput
from tests.e2e_utils import resolved_config
from trainer.dataset import PromptLoader
from trainer.on_policy import OLD_FROM_UPDATE, OnPolicyRule
from trainer.protocol import DataProto

R, N = 3, 2


@pytest.mark.parametrize("overrides,blocker", [
    ([], None),
    (["actor_rollout_ref.actor.ppo_epochs=2"], "ppo_epochs=2"),
    (["algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
    (["algorithm.rollout_correction.rollout_is=token"], "rollout_is=token"),
    (["algorithm.adv_estimator=optimal_token_baseline"], "reads old_log_probs, sum_pi_squared"),
])
def test_config_reasons_for_the_pass(overrides, blocker):
    cfg = resolved_config("algorithm=grpo", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                          "actor_rollout_ref.rollout.n=4", *overrides)
    rule = OnPolicyRule.from_config(cfg, separate_rollout=False)
    assert rule.update_rows == 32
    if blocker is None:
        assert rule.blockers == () and not rule.needs_pass(32, True)
    else:
        assert any(blocker in b for b in rule.blockers) and rule.needs_pass(32, True)
    assert rule.needs_pass(16, True) and rule.needs_pass(32, False)  # two mini-batches; no actor update
    assert rule.reasons(16, False)[-2:] == ["16 rows are not one actor mini-batch of 32 rows",
                                            "the actor is not updated in this step (trainer.critic_warmup)"]
    assert "trainer.rollout_placement=separate" in OnPolicyRule.from_config(cfg, separate_rollout=True).blockers


class FakeActor:
    """The actor group's dispatch methods; records each call and the columns it received."""

    dp_size = 1

    def __init__(self):
        self.calls: list[tuple[str, set]] = []
        self.non_tensor: list[set] = []  # the non-tensor columns of each recorded call

    def dispatch_all(self, method, prompts):
        rep = prompts.repeat(N)
        b = len(rep)
        resp, rmask = torch.full((b, R), 7), torch.ones(b, R, dtype=torch.long)
        attn = torch.cat([rep["attention_mask"], rmask], 1)
        return DataProto.from_dict({"prompts": rep["input_ids"], "responses": resp, "response_mask": rmask.float(),
                                    "rollout_log_probs": torch.zeros(b, R),
                                    "input_ids": torch.cat([rep["input_ids"], resp], 1), "attention_mask": attn,
                                    "position_ids": torch.clamp(torch.cumsum(attn, 1) - 1, min=0)},
                                   dict(rep.non_tensor), meta=dict(prompts.meta))

    def dispatch_dp(self, method, data):
        self.calls.append((method, set(data.tensor_keys())))
        self.non_tensor.append(set(data.non_tensor))
        z = torch.full((len(data), R), 0.25)
        return DataProto.from_dict({"old_log_probs": z, "entropys": z})

    def dispatch_dp_metrics(self, method, data):
        self.calls.append((method, set(data.tensor_keys())))
        self.non_tensor.append(set(data.non_tensor))
        on_policy = bool(data.meta.get(OLD_FROM_UPDATE))
        assert on_policy != ("old_log_probs" in data)  # marked exactly when the pass did not run
        return [{"actor/pg_loss": [0.0], **({"actor/entropy": [1.5], "rollout/log_prob_diff_mean": [0.01],
                                             "rollout/log_prob_diff_max": [0.2]} if on_policy else {})}]


def _reward(rows):
    s = torch.zeros(len(rows), R)
    s[::2, -1] = 1.0
    return RewardOutput(s, {"score": s[:, -1].tolist()}, {"reward/score_mean": float(s.sum() / len(rows))})


def _step(mini_batch_prompts: int, global_step: int = 1, *overrides):
    from trainer.ppo_trainer import RayPPOTrainer

    cfg = resolved_config(f"actor_rollout_ref.rollout.n={N}", "data.train_batch_size=2",
                          f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch_prompts}", *overrides)
    tok = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 0})()
    rows = [{"input_ids": [10 + i, 11 + i], "data_source": "t", "reward_model": {"ground_truth": "x"},
             "prompt": f"q{i}"} for i in range(2)]
    tr = RayPPOTrainer(cfg, tok, PromptLoader(rows, 2, 0, shuffle=False), None, _reward, None)
    tr.global_step = global_step
    actor = FakeActor()
    tr.roles.attach("actor", actor)
    _, metrics = tr.train_step(tr.loader.next_batch()[0], timing := {})
    assert actor.non_tensor and all(not cols for cols in actor.non_tensor)  # uid, reward_model, ... stay here
    return actor.calls, metrics, timing


def test_one_step_update_skips_the_pass_and_takes_its_metrics_from_the_update():
    calls, metrics, timing = _step(2)  # 2 prompts x 2 samples = one mini-batch of 4 rows
    assert [c[0] for c in calls] == ["update_actor"]
    assert "old_log_probs" not in calls[0][1] and "rollout_log_probs" in calls[0][1]
    assert metrics["perf/old_log_prob_pass"] == 0.0 and "old_log_prob" not in timing
    assert metrics["actor/entropy"] == 1.5 and metrics["rollout/log_prob_diff_max"] == 0.2


@pytest.mark.parametrize("mini,global_step,overrides", [
    (1, 1, ()),                                            # two mini-batches
    (2, 1, ("algorithm.rollout_correction.rollout_is=token",)),  # importance weights read old_log_probs
    (2, 1, ("trainer.critic_warmup=1",)),                 # the actor is not updated in step 1
])
def test_the_pass_runs_when_the_rule_does_not_hold(mini, global_step, overrides):
    calls, metrics, timing = _step(mini, global_step, *overrides)
    assert calls[0] == ("compute_log_prob", calls[0][1]) and metrics["perf/old_log_prob_pass"] == 1.0
    assert "old_log_prob" in timing and metrics["actor/entropy"] == pytest.approx(0.25)
    assert "rollout/log_prob_diff_max" in metrics  # from the pass, as before
    updates = [c for c in calls if c[0] == "update_actor"]
    assert all("old_log_probs" in cols for _, cols in updates)
    assert len(updates) == (0 if "trainer.critic_warmup=1" in overrides else 1)


def test_the_workers_get_only_the_columns_they_read():
    from trainer.roles import FORWARD_COLUMNS, UPDATE_COLUMNS

    calls, _, _ = _step(1)  # the pass runs: both calls
    (_, pass_cols), (_, update_cols) = calls
    assert pass_cols == set(FORWARD_COLUMNS)
    assert update_cols == set(UPDATE_COLUMNS) - {"ref_log_prob", "rollout_is_weights"}  # no KL loss, no IS
