"""Truncated importance sampling between the rollout engine's and the trainer's log-probs, on hand-computed values."""
import math

import pytest
import torch

from trainer.algos.rollout_correction import RolloutCorrection, log_prob_gap_metrics, rollout_is_weights

OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, 0.0, 0.0]])
ROLL = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-0.5, -2.5, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_token_level_weights_clamp_and_metrics():
    w, m = rollout_is_weights(OLD, ROLL, MASK, RolloutCorrection("token", 1.5))
    raw = [math.exp(0.5), math.exp(-1.0), 1.0, math.exp(-0.5), math.exp(1.5)]
    assert torch.allclose(w, torch.tensor([[1.5, math.exp(-1.0), 1.0, 0.0], [math.exp(-0.5), 1.5, 0.0, 0.0]]))
    assert m["rollout_corr/is_weight_max"] == pytest.approx(max(raw))
    assert m["rollout_corr/is_weight_mean"] == pytest.approx(sum(raw) / 5)
    assert m["rollout_corr/is_truncated_frac"] == pytest.approx(2 / 5)   # e^0.5 and e^1.5 exceed 1.5
    final = [1.5, math.exp(-1.0), 1.0, math.exp(-0.5), 1.5]
    assert m["rollout_corr/is_eff_sample_size"] == pytest.approx(sum(final) ** 2 / (5 * sum(x * x for x in final)))


def test_sequence_level_one_weight_per_response():
    w, m = rollout_is_weights(OLD, ROLL, MASK, RolloutCorrection("sequence", 2.0))
    # row 0: sum delta = 0.5 - 1.0 + 0 = -0.5; row 1: -0.5 + 1.5 = 1.0 -> e^1 > 2 -> clamped to 2
    assert torch.allclose(w, torch.tensor([[math.exp(-0.5)] * 3 + [0.0], [2.0, 2.0, 0.0, 0.0]]))
    assert m["rollout_corr/is_truncated_frac"] == pytest.approx(0.5)
    assert m["rollout_corr/is_weight_max"] == pytest.approx(math.e)


def test_batch_normalize_makes_mean_one_and_log_ratio_is_bounded():
    w, _ = rollout_is_weights(OLD, ROLL, MASK, RolloutCorrection("token", 10.0, True))
    assert float(w[MASK.bool()].mean()) == pytest.approx(1.0)
    huge = torch.tensor([[100.0]]), torch.tensor([[0.0]]), torch.tensor([[1]])
    w, _ = rollout_is_weights(*huge, RolloutCorrection("token", 1e30))
    assert float(w) == pytest.approx(math.exp(20.0))


def test_gap_metrics_and_bad_config():
    m = log_prob_gap_metrics(OLD, ROLL, MASK)
    assert m["rollout/log_prob_diff_max"] == pytest.approx(1.5)
    assert m["rollout/log_prob_diff_mean"] == pytest.approx((0.5 + 1.0 + 0 + 0.5 + 1.5) / 5)
    assert log_prob_gap_metrics(OLD, ROLL, torch.zeros_like(MASK)) == {}
    with pytest.raises(ValueError, match="rollout_is='tok'"):
        RolloutCorrection.from_config({"rollout_is": "tok"})
    with pytest.raises(ValueError, match="rollout_is_threshold=0"):
        RolloutCorrection.from_config({"rollout_is": "token", "rollout_is_threshold": 0})
    assert not RolloutCorrection.from_config({"rollout_is": None}).enabled


def test_config_check_names_the_key():
    from trainer.config_checks import ConfigError, check_rollout_correction

    with pytest.raises(ConfigError, match="rollout_is_threshold='x'"):
        check_rollout_correction({"algorithm": {"rollout_correction": {"rollout_is": "token",
                                                                       "rollout_is_threshold": "x"}}})


@pytest.mark.slow
def test_rollout_is_end_to_end_step(tmp_path):
    from tests.e2e_shared import run_main_forked
    from tests.e2e_utils import SHORT, read_metrics

    out = str(tmp_path / "tis")
    run_main_forked(out, "algorithm.rollout_correction.rollout_is=token", "trainer.export_hf_on_end=false", *SHORT)
    steps = [r for r in read_metrics(out) if "actor/pg_loss" in r]
    assert len(steps) == 2
    for r in steps:
        for key in ("rollout_corr/is_weight_mean", "rollout_corr/is_truncated_frac", "rollout/log_prob_diff_max"):
            assert math.isfinite(r[key]), key


@pytest.mark.parametrize("bad", [float("nan"), -float("inf"), float("inf")])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("normalize", [False, True])
def test_p06_a_non_finite_log_prob_at_a_masked_position_leaves_every_weight_and_metric_finite(bad, level, normalize):
    """Masking by multiplying made a masked NaN (or -inf: -inf * 0 is NaN) the row's sequence weight, and with batch
    normalisation every row's; the weights must be those of the counted tokens alone."""
    from trainer.algos.losses import compute_policy_loss_vanilla
    from trainer.algos.rollout_correction import RolloutCorrection, apply_rollout_correction
    from trainer.protocol import DataProto

    mask = torch.tensor([[1, 0], [1, 1]])
    batch = DataProto.from_dict({"old_log_probs": torch.tensor([[0.0, bad], [-0.1, -0.2]]),
                                 "rollout_log_probs": torch.tensor([[0.0, 0.0], [0.0, 0.0]]), "response_mask": mask})
    metrics = apply_rollout_correction(batch, RolloutCorrection(level, 2.0, normalize))
    w = batch["rollout_is_weights"]
    raw = torch.tensor([[1.0, 0.0], [0.9048374, 0.8187308]]) if level == "token" else \
        torch.tensor([[1.0, 0.0], [0.7408182, 0.7408182]])
    counted = raw[mask > 0] if level == "token" else raw[:, 0]
    expected = raw / counted.mean() if normalize else raw
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=1e-6)
    assert all(math.isfinite(v) for v in metrics.values()) and metrics
    lp = batch["old_log_probs"]
    loss, _ = compute_policy_loss_vanilla(lp, lp, torch.ones(2, 2), mask, rollout_is_weights=w)
    assert torch.isfinite(loss)
