"""Logged per-token statistics of the actor and critic updates are token means over the whole mini-batch, whatever
the loss_agg_mode, the micro-batch split and the data-parallel size (tests/update_sim.py simulates the ranks)."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.update_sim import patch, run_update
from trainer import core_algos as ca
from trainer.protocol import DataProto

MODES = list(ca.LOSS_AGG_MODES)
# Clip-Cov and KL-Cov select tokens by a statistic of the micro-batch (their definition): not split-invariant
SPLIT_INVARIANT_LOSSES = sorted(k for k, s in ca.POLICY_LOSS_SPECS.items() if not s.micro_batch_local)


def _cfg(mode, micro, dyn=False, loss_mode="vanilla", entropy_coeff=0.01):
    return {"ppo_mini_batch_size": 0, "ppo_micro_batch_size_per_gpu": micro, "ppo_epochs": 1, "loss_agg_mode": mode,
            "policy_loss": {"loss_mode": loss_mode}, "entropy_coeff": entropy_coeff, "use_kl_loss": False,
            "use_dynamic_bsz": dyn, "ppo_max_token_len_per_gpu": 9, "loss_scale_factor": 8.0, "clip_ratio": 0.2,
            "clip_ratio_c": 3.0, "cliprange_value": 0.1}


def _rows(lengths, width, seed):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    return DataProto.from_dict({
        "feat": torch.randn(B, width, generator=g), "advantages": torch.randn(B, width, generator=g),
        "old_log_probs": 0.3 * torch.randn(B, width, generator=g), "ent": torch.rand(B, width, generator=g) * 2,
        "returns": torch.randn(B, width, generator=g), "values": torch.randn(B, width, generator=g),
        "response_mask": mask, "attention_mask": torch.cat([torch.ones(B, 1), mask], dim=1)})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp,micro", [(1, 2), (1, 1), (2, 1)])
def test_p26_entropy_of_one_nat_logs_one_under_every_mode(monkeypatch, mode, dp, micro):
    patch(monkeypatch)
    rows = _rows([2, 4], 8, seed=0)
    rows["ent"] = torch.ones(2, 8)
    cfg = {**_cfg(mode, micro), "ppo_mini_batch_size": 2}
    metrics, _ = run_update(rows, cfg, "actor", dp)
    assert metrics["actor/entropy"] == pytest.approx(1.0, rel=1e-6)


def _full_batch_reference(rows, cfg, w=0.5):
    """The metrics of ONE call over the whole mini-batch: token means over all its valid tokens."""
    m = rows["response_mask"]
    logp = w * rows["feat"].double()
    loss_fn = ca.get_policy_loss_fn(cfg["policy_loss"]["loss_mode"])
    _, pg_m = loss_fn(rows["old_log_probs"], logp, rows["advantages"], m, loss_agg_mode=cfg["loss_agg_mode"],
                      config=cfg)
    actor = {f"actor/{k}": float(v) for k, v in pg_m.items()}
    actor["actor/entropy"] = float(ca.masked_mean(rows["ent"], m))
    _, clipfrac = ca.compute_value_loss(logp, rows["returns"], rows["values"], m, cfg["cliprange_value"])
    critic = {"critic/vf_clipfrac": float(clipfrac), "critic/vpred_mean": float(ca.masked_mean(logp, m))}
    return actor, critic


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dp=st.sampled_from([1, 2, 4]), rows_per_rank=st.integers(1, 4), micro=st.integers(1, 4),
       dyn=st.booleans(), mode=st.sampled_from(MODES), loss_mode=st.sampled_from(SPLIT_INVARIANT_LOSSES),
       lengths=st.lists(st.integers(0, 6), min_size=16, max_size=16), seed=st.integers(0, 10 ** 6))
def test_p26_every_per_token_statistic_is_a_mini_batch_token_mean(monkeypatch, dp, rows_per_rank, micro, dyn,
                                                                 mode, loss_mode, lengths, seed):
    patch(monkeypatch)
    B = dp * rows_per_rank
    rows = _rows(lengths[:B], 6, seed)
    cfg = {**_cfg(mode, micro, dyn, loss_mode), "ppo_mini_batch_size": B}
    ref_actor, ref_critic = _full_batch_reference(rows, cfg)
    actor, _ = run_update(rows, cfg, "actor", dp)
    critic, _ = run_update(rows, cfg, "critic", dp)
    for key, val in ref_actor.items():
        assert actor[key] == pytest.approx(val, rel=1e-5, abs=1e-6), key
    for key, val in ref_critic.items():
        assert critic[key] == pytest.approx(val, rel=1e-5, abs=1e-6), key
