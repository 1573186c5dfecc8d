"""Every loss_agg_mode against its definition, and the update loop's micro-batch/data-parallel scaling against the
full-batch value and gradient (tests/update_sim.py drives ``ppo_update`` with simulated ranks)."""
import pytest
import torch

from tests.update_sim import patch, run_update
from trainer import core_algos as ca
from trainer.protocol import DataProto

# L, m: rows of 3, 2 and 0 valid tokens
L = torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 8, 9]])
M = torch.tensor([[1.0, 1, 1], [1, 1, 0], [0, 0, 0]])
# (mode, value by hand, paper): sums per row 6 and 9, lengths 3 and 2, 5 tokens, 2 non-empty rows, width 3
TABLE = [
    ("token-mean", 15 / 5, "DAPO arXiv:2503.14476"),
    ("token-sum", 15.0, "sum over tokens"),
    ("seq-mean-token-sum", (6 + 9) / 2, "verl"),
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2, "GRPO arXiv:2402.03300"),
    ("seq-mean-token-sum-norm", (6 + 9) / 3 / 2, "Dr.GRPO arXiv:2503.20783"),
]


def test_table_covers_every_mode():
    assert sorted(m for m, _, _ in TABLE) == sorted(ca.LOSS_AGG_MODES)


@pytest.mark.parametrize("mode,expected,paper", TABLE)
def test_loss_agg_mode_hand_values(mode, expected, paper):
    assert ca.agg_loss(L, M, mode).item() == pytest.approx(expected)


def test_p23_dr_grpo_norm_is_a_mean_over_sequences():
    for rows in (4, 8):
        value = ca.agg_loss(torch.ones(rows, 5), torch.ones(rows, 5), "seq-mean-token-sum-norm", loss_scale_factor=5)
        assert value.item() == pytest.approx(1.0)
    # the constant replaces 1/|o_i| only: with the padded width as the factor, a row of 2 of 4 tokens counts 2/4
    assert ca.agg_loss(torch.ones(2, 4), torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]]),
                       "seq-mean-token-sum-norm").item() == pytest.approx((2 / 4 + 4 / 4) / 2)


def _reference(mode: str, X: torch.Tensor, m: torch.Tensor, scale: float) -> float:
    """The full-batch aggregate of ``X`` written out with plain sums (not through agg_loss)."""
    Xm = X * m
    n_seq = float((m.sum(-1) > 0).sum())
    per_seq = Xm.sum(-1)
    return {"token-mean": float(Xm.sum() / m.sum()),
            "token-sum": float(Xm.sum()),
            "seq-mean-token-sum": float(per_seq.sum() / n_seq),
            "seq-mean-token-mean": float((per_seq / m.sum(-1).clamp(min=1)).sum() / n_seq),
            "seq-mean-token-sum-norm": float(per_seq.sum() / scale / n_seq)}[mode]


def _rows(B=8, R=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 0, 4, 2, 6, 3, 5])[:B]
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    return DataProto.from_dict({
        "feat": torch.randn(B, R, generator=g), "advantages": torch.randn(B, R, generator=g),
        "old_log_probs": torch.zeros(B, R), "ent": torch.rand(B, R, generator=g) + 0.5,
        "response_mask": mask, "attention_mask": torch.cat([torch.ones(B, 2), mask], dim=1)})


def _actor_cfg(mode, micro, dyn=False, scale=None, entropy_coeff=0.01):
    return {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": micro, "ppo_epochs": 1, "loss_agg_mode": mode,
            "policy_loss": {"loss_mode": "gpg"}, "entropy_coeff": entropy_coeff, "use_kl_loss": False,
            "use_dynamic_bsz": dyn, "ppo_max_token_len_per_gpu": 10, "loss_scale_factor": scale}


SPLITS = [(1, 8, False), (1, 3, False), (1, 1, False), (2, 2, False), (2, 4, True), (4, 1, False), (4, 2, True)]


@pytest.mark.parametrize("mode", list(ca.LOSS_AGG_MODES))
@pytest.mark.parametrize("dp,micro,dyn", SPLITS)
def test_p23_update_equals_full_batch_for_every_mode_split_and_dp(monkeypatch, mode, dp, micro, dyn):
    """gpg: loss = -w * feat * A per token, so the full-batch loss is w * agg(-feat*A) and its gradient
    agg(-feat*A) - entropy_coeff * agg(ent); the update over micro-batches and simulated ranks must give both."""
    patch(monkeypatch)
    rows, w, c = _rows(), 0.5, 0.01
    m = rows["response_mask"]
    X = (-rows["feat"] * rows["advantages"]).double()
    E = rows["ent"].double()
    # the constant comes from rollout.response_length (10, not the padded width 6) unless loss_scale_factor is set
    for scale, expect_scale in ((None, 10.0), (7.0, 7.0)):
        metrics, grads = run_update(rows, _actor_cfg(mode, micro, dyn, scale), "actor", dp, w=w,
                                    response_length=10)
        ref_x, ref_e = _reference(mode, X, m, expect_scale), _reference(mode, E, m, expect_scale)
        assert metrics["actor/pg_loss"] == pytest.approx(w * ref_x, rel=1e-6, abs=1e-7)  # metrics are read as float32
        assert grads == [pytest.approx(ref_x - c * ref_e, rel=1e-6, abs=1e-7)]


@pytest.mark.parametrize("mode", list(ca.LOSS_AGG_MODES))
@pytest.mark.parametrize("dp,micro,dyn", SPLITS)
def test_p23_critic_update_equals_full_batch(monkeypatch, mode, dp, micro, dyn):
    patch(monkeypatch)
    rows = _rows()
    rows["returns"] = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    rows["values"] = torch.randn(8, 6, generator=torch.Generator().manual_seed(4))
    cfg = {**_actor_cfg(mode, micro, dyn, scale=6.0), "cliprange_value": 0.2}
    metrics, grads = run_update(rows, cfg, "critic", dp)
    w = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    full, _ = ca.compute_value_loss(w * rows["feat"].double(), rows["returns"].double(), rows["values"].double(),
                                    rows["response_mask"], 0.2, mode, loss_scale_factor=6.0)
    full.backward()
    assert metrics["critic/vf_loss"] == pytest.approx(full.item(), rel=1e-6, abs=1e-7)
    assert grads == [pytest.approx(w.grad.item(), rel=1e-6, abs=1e-7)]


def test_p23_agg_loss_needs_global_counts_under_dp():
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        with pytest.raises(ValueError, match="dp_size > 1 needs global_num"):
            ca.agg_loss(L, M, mode, dp_size=2)
    assert ca.agg_loss(L, M, "token-sum", dp_size=2).item() == pytest.approx(30.0)  # no count: the share is x dp
    for bad in (0, -1.0, float("inf"), float("nan")):  # inf scaled every loss and gradient to 0
        with pytest.raises(ValueError, match="loss_scale_factor must be a finite number > 0"):
            ca.agg_loss(L, M, "seq-mean-token-sum-norm", loss_scale_factor=bad)


def test_loss_agg_mode_and_scale_factor_are_checked_before_start():
    from tests.test_launch_checks import _cfg
    from trainer.launch import ConfigError, validate

    validate(_cfg("actor_rollout_ref.actor.loss_agg_mode=token-sum"))
    validate(_cfg("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                  "actor_rollout_ref.actor.loss_scale_factor=4096"))
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.loss_agg_mode='seq-mean'; expected one of "
                                          r"\['token-mean', 'token-sum'"):
        validate(_cfg("actor_rollout_ref.actor.loss_agg_mode=seq-mean"))
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=rf"actor_rollout_ref.actor.loss_scale_factor={bad}; expected null "
                                              r"\(rollout.response_length\) or a positive finite number"):
            validate(_cfg(f"actor_rollout_ref.actor.loss_scale_factor={bad}"))
