"""The old-log-prob pass is skipped when the actor update is one optimizer step over the batch (trainer/on_policy.py):
the update's own forward, detached, is pi_old. Loss, gradient and metrics equal those of the update fed with the
pass's log-probs (tests/update_sim.py simulates the data-parallel ranks); a batch marked on-policy that would take
more than one optimizer step is refused, and an unmarked batch without old log-probs still fails as before."""
import pytest
import torch

from tests.update_sim import patch, run_update
from trainer import core_algos as ca
from trainer.algos.rollout_correction import LogProbGap, log_prob_gap_metrics
from trainer.on_policy import OLD_FROM_UPDATE
from trainer.protocol import DataProto

W = 0.5  # the fake model's weight: log_prob = W * feat (tests/update_sim.py)


def _rows(lengths, width, seed, with_old: bool):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    feat = torch.randn(B, width, generator=g)
    cols = {"feat": feat, "advantages": torch.randn(B, width, generator=g), "ent": torch.rand(B, width, generator=g),
            "rollout_log_probs": W * feat.double() + 0.1 * torch.randn(B, width, generator=g, dtype=torch.float64),
            "response_mask": mask, "attention_mask": torch.cat([torch.ones(B, 1), mask], dim=1)}
    if with_old:  # what the separate pass gives: the policy the step starts from
        cols["old_log_probs"] = W * feat.double()
    # without the pass, the trainer marks the batch instead (trainer.ppo_trainer._old_log_probs)
    return DataProto.from_dict(cols, meta={} if with_old else {OLD_FROM_UPDATE: True})


def _cfg(rows, mode, loss_mode, micro, entropy_coeff=0.0, epochs=1):
    return {"ppo_mini_batch_size": rows, "ppo_micro_batch_size_per_gpu": micro, "ppo_epochs": epochs,
            "loss_agg_mode": mode, "policy_loss": {"loss_mode": loss_mode}, "entropy_coeff": entropy_coeff,
            "use_kl_loss": False, "use_dynamic_bsz": False, "loss_scale_factor": 8.0, "clip_ratio": 0.2,
            "clip_ratio_c": 3.0}


@pytest.mark.parametrize("loss_mode", sorted(ca.POLICY_LOSS_SPECS))
@pytest.mark.parametrize("mode", list(ca.LOSS_AGG_MODES))
@pytest.mark.parametrize("dp,micro,entropy_coeff", [(1, 8, 0.0), (2, 1, 0.01), (2, 3, 0.0)])
def test_update_without_old_log_probs_equals_the_update_fed_by_the_pass(monkeypatch, loss_mode, mode, dp, micro,
                                                                        entropy_coeff):
    patch(monkeypatch)
    lengths = [3, 5, 0, 6, 2, 6, 1, 4]
    cfg = _cfg(len(lengths), mode, loss_mode, micro, entropy_coeff)
    fed, fed_grads = run_update(_rows(lengths, 6, 7, with_old=True), cfg, "actor", dp, w=W)
    own, own_grads = run_update(_rows(lengths, 6, 7, with_old=False), cfg, "actor", dp, w=W)
    assert len(own_grads) == len(fed_grads) == 1
    assert own_grads[0] == pytest.approx(fed_grads[0], rel=1e-12, abs=1e-15)
    for key, val in fed.items():
        if key.startswith("perf/"):
            continue
        assert own[key] == pytest.approx(val, rel=1e-12, abs=1e-15), key
    rows = _rows(lengths, 6, 7, with_old=True)
    m = rows["response_mask"]
    # what the pass reported before: its entropy and the engine-vs-trainer gap, now from the update's forward
    assert own["actor/entropy"] == pytest.approx(float(ca.masked_mean(rows["ent"], m)), rel=1e-6)  # f32 column
    gap = log_prob_gap_metrics(rows["old_log_probs"], rows["rollout_log_probs"], m)
    # both take the float32 differences (the driver's precision)
    assert own["rollout/log_prob_diff_mean"] == pytest.approx(gap["rollout/log_prob_diff_mean"], rel=1e-6)
    assert own["rollout/log_prob_diff_max"] == pytest.approx(gap["rollout/log_prob_diff_max"], rel=1e-6)
    assert "rollout/log_prob_diff_mean" not in fed  # with the pass, the trainer measures the gap itself
    assert ("actor/entropy" in fed) == (entropy_coeff != 0)


@pytest.mark.parametrize("cfg_change,msg", [({"ppo_mini_batch_size": 4}, r"2 mini-batch\(es\) of 4 rows"),
                                            ({"ppo_epochs": 2}, r"takes 2 epoch\(s\)")])
def test_an_on_policy_batch_is_refused_when_the_update_is_more_than_one_step(monkeypatch, cfg_change, msg):
    patch(monkeypatch)
    cfg = {**_cfg(8, "token-mean", "vanilla", 2), **cfg_change}
    with pytest.raises(ValueError, match=msg):
        run_update(_rows([2] * 8, 4, 1, with_old=False), cfg, "actor", 1, w=W)
    run_update(_rows([2] * 8, 4, 1, with_old=True), cfg, "actor", 1, w=W)  # the pass's log-probs: fine
    unmarked = _rows([2] * 8, 4, 1, with_old=False)
    unmarked.meta.clear()
    with pytest.raises(KeyError, match="old_log_probs"):  # not marked: the column is required, as before
        run_update(unmarked, {**cfg, "ppo_mini_batch_size": 8, "ppo_epochs": 1}, "actor", 1, w=W)


def test_log_prob_gap_over_pieces_equals_the_whole_batch():
    g = torch.Generator().manual_seed(3)
    lp, rl = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.4).float()
    gap = LogProbGap()
    for s in (slice(0, 2), slice(2, 3), slice(3, 6)):
        gap.add(lp[s], rl[s], mask[s])
    whole = log_prob_gap_metrics(lp, rl, mask)
    got = gap.metrics()
    assert got["rollout/log_prob_diff_mean"] == pytest.approx(whole["rollout/log_prob_diff_mean"], rel=1e-6)
    assert got["rollout/log_prob_diff_max"] == pytest.approx(whole["rollout/log_prob_diff_max"], rel=1e-6)
    empty = LogProbGap()
    empty.add(lp[:2], rl[:2], torch.zeros(2, 5))
    assert empty.metrics() == {} and LogProbGap().metrics() == {}
    with pytest.raises(ValueError, match="one shape"):
        gap.add(lp, rl[:2], mask)
