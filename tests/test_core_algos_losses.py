"""KL estimators/controllers and losses: hand-computed values, P05, P06, P08, gradient accumulation."""
import math

import pytest
import torch

from trainer import core_algos as ca


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------------- KL
def test_kl_estimators_hand_values_and_gradients():
    # logp=-1, ref=-2 -> x = logp - ref = 1
    e = math.exp(-1)
    expected = {"kl": (1.0, 1.0), "k1": (1.0, 1.0), "abs": (1.0, 1.0), "mse": (0.5, 1.0), "k2": (0.5, 1.0),
                # k3 = exp(-x) + x - 1 ; d/dlogp = 1 - exp(-x)
                "low_var_kl": (e, 1 - e), "k3": (e, 1 - e)}
    for name, (val, grad) in expected.items():
        lp = torch.tensor([-1.0], requires_grad=True)
        out = ca.kl_penalty(lp, torch.tensor([-2.0]), name)
        out.sum().backward()
        assert out.item() == pytest.approx(val, abs=1e-6), name
        assert lp.grad.item() == pytest.approx(grad, abs=1e-6), name
        # straight-through: forward of `name`, gradient of k2 (= x = 1)
        lp = torch.tensor([-1.0], requires_grad=True)
        out = ca.kl_penalty(lp, torch.tensor([-2.0]), name + "+")
        out.sum().backward()
        assert out.item() == pytest.approx(val, abs=1e-6), name + "+"
        assert lp.grad.item() == pytest.approx(1.0, abs=1e-6), name + "+"
    with pytest.raises(ValueError, match="unknown kl_penalty 'full'"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "full")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["low_var_kl", "k3", "k3+"])
def test_p05_k3_clamp_keeps_value_and_gradient_finite(dtype, name):
    lp = torch.tensor([0.0, -100.0, 100.0], dtype=dtype, requires_grad=True)
    ref = torch.zeros(3, dtype=dtype)
    kl = ca.kl_penalty(lp, ref, name)
    assert torch.isfinite(kl).all()
    assert ((kl >= 0) & (kl <= 10.0)).all()
    assert kl.tolist() == [0.0, 10.0, 10.0]  # exp(20)-21 and exp(-20)+19 both saturate at 10
    kl.sum().backward()
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[0].item() == 0.0  # logp == ref: value and gradient exactly 0
    if name != "k3+":
        assert lp.grad[1:].tolist() == [0.0, 0.0]  # saturated -> no gradient
    # unsaturated entries keep their gradient: logp=-1, ref=0 -> x=-1, k3 = e - 2, d/dlogp = 1 - e
    lp2 = torch.tensor([-1.0], dtype=dtype, requires_grad=True)
    v = ca.kl_penalty(lp2, torch.zeros(1, dtype=dtype), "k3")
    v.sum().backward()
    assert v.float().item() == pytest.approx(math.e - 2, rel=1e-2)
    assert lp2.grad.float().item() == pytest.approx(1 - math.e, rel=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("adv", [-1.0, 1.0])
@pytest.mark.parametrize("mode", sorted(ca.POLICY_LOSS_REGISTRY))
def test_p05_every_policy_loss_stays_finite_at_extreme_log_ratios(mode, adv, dtype):
    """Each built-in loss bounds the log-ratio before ``exp``: log-ratios of 0, -100 and +100 on three tokens (one
    sequence and three one-token sequences) give a finite loss and gradient, with either sign of the advantage."""
    for shape in ((1, 3), (3, 1)):
        lp = torch.tensor([0.0, -100.0, 100.0], dtype=dtype).view(shape).requires_grad_(True)
        old, a = torch.zeros(shape, dtype=dtype), torch.full(shape, adv, dtype=dtype)
        loss, _ = ca.get_policy_loss_fn(mode)(old, lp, a, torch.ones(shape), loss_agg_mode="token-mean", config={})
        loss.backward()
        assert torch.isfinite(loss).item(), (mode, shape, float(loss))
        assert torch.isfinite(lp.grad).all(), (mode, shape, lp.grad.tolist())


def test_p06_apply_kl_penalty_masks_with_where():
    mask = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, float("nan")]])
    ref = torch.tensor([[0.0, float("nan")]])
    scores = torch.tensor([[1.0, 0.0]])
    ctrl = ca.FixedKLController(0.1)
    for kind in ("kl", "abs", "k2", "low_var_kl", "k3+"):
        rewards, metrics = ca.apply_kl_penalty(scores, old, ref, mask, ctrl, kind)
        assert torch.isfinite(rewards).all(), kind
        assert rewards.tolist() == [[1.0, 0.0]], kind
        assert metrics["actor/reward_kl_penalty"] == 0.0
        assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)


def test_apply_kl_penalty_hand_values_and_adaptive_update():
    # k1 per token: [0.5, 1.0 | 2.0, masked]; rows' masked means 0.75 and 2.0 -> current_kl 1.375
    scores = torch.tensor([[0.0, 1.0], [3.0, 0.0]])
    old = torch.tensor([[0.0, 0.0], [0.0, 5.0]])
    ref = torch.tensor([[-0.5, -1.0], [-2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=10)
    rewards, metrics = ca.apply_kl_penalty(scores, old, ref, mask, ctrl, "kl")
    close(rewards, [[-0.05, 0.9], [2.8, 0.0]])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(1.375)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # err = clip(1.375/1 - 1, +-0.2) = 0.2 ; value = 0.1 * (1 + 0.2 * 2 / 10) = 0.104
    assert ctrl.value == pytest.approx(0.104)


def test_kl_controllers():
    c = ca.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    c.update(current_kl=0.1, n_steps=10)  # err clipped to 0.2 -> 0.1 * 1.02
    assert c.value == pytest.approx(0.102)
    c.update(current_kl=0.045, n_steps=100)  # err -0.1 -> * 0.9
    assert c.value == pytest.approx(0.0918)
    f = ca.get_kl_controller({"type": "fixed", "kl_coef": 0.3})
    f.update(5.0, 10)
    assert f.value == 0.3
    a = ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.2, "target_kl": 0.1, "horizon": 1000})
    assert isinstance(a, ca.AdaptiveKLController) and a.value == 0.2
    with pytest.raises(ValueError, match="target_kl"):
        ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.2})
    with pytest.raises(ValueError, match="'pid'"):
        ca.get_kl_controller({"type": "pid", "kl_coef": 0.2})


# ---------------------------------------------------------------------------------------------- policy losses
def _ppo_case():
    # tokens: (A, ratio) = (+1,1.5) clip binds ; (+1,0.5) ; (-1,1.5) ; (-1,0.5) clip binds ; (-1,5) dual clip binds ;
    # last token masked with NaN log-prob
    ratios = torch.tensor([1.5, 0.5, 1.5, 0.5, 5.0, 1.0])
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0, float("nan")]])
    logp = (old + torch.log(ratios)).clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0]])
    return old, logp, adv, mask


def test_vanilla_ppo_dual_clip_hand_values():
    old, logp, adv, mask = _ppo_case()
    loss, met = ca.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean",
                                               {"clip_ratio": 0.2, "clip_ratio_c": 3.0})
    # per token: -1.2, -0.5, 1.5, 0.8, 3.0 -> mean 0.72
    assert loss.item() == pytest.approx(0.72, abs=1e-6)
    assert met["pg_clipfrac"] == pytest.approx(0.4)
    assert met["pg_clipfrac_lower"] == pytest.approx(0.2)
    assert met["ppo_kl"] == pytest.approx(-(2 * math.log(1.5) + 2 * math.log(0.5) + math.log(5)) / 5, abs=1e-6)
    loss.backward()
    # d/dlogp: clipped -> 0 ; -A*ratio -> -A*ratio/5 ; dual clip constant -> 0 ; masked -> 0
    close(logp.grad, [[0.0, -0.1, 0.3, 0.0, 0.0, 0.0]])


def test_vanilla_ppo_asymmetric_clip_is_weights_and_errors():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.25, 1.25]]))
    adv = torch.tensor([[1.0, 1.0]])
    cfg = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    loss, met = ca.compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, 2), config=cfg)
    assert loss.item() == pytest.approx(-1.25) and met["pg_clipfrac"] == 0.0  # 1.25 < 1.28: not clipped
    loss, met = ca.compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, 2), config={"clip_ratio": 0.2})
    assert loss.item() == pytest.approx(-1.2) and met["pg_clipfrac"] == 1.0
    w = torch.tensor([[2.0, 0.5]])
    loss, _ = ca.compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, 2), config=cfg, rollout_is_weights=w)
    assert loss.item() == pytest.approx((-2.5 - 0.625) / 2)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ca.compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, 2), config={"clip_ratio_c": 1.0})
    with pytest.raises(ValueError, match="rollout_is_weights"):
        ca.compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, 2), rollout_is_weights=torch.ones(2))


def test_gspo_hand_values():
    old = torch.zeros(1, 3)
    logp = torch.tensor([[math.log(1.1), math.log(1.1), 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.ones(1, 3)
    loss, met = ca.get_policy_loss_fn("gspo")(old, logp, adv, mask, config={"clip_ratio": 0.2})
    assert loss.item() == pytest.approx(-1.1, abs=1e-6)  # sequence ratio exp(mean log 1.1) = 1.1
    loss.backward()
    close(logp.grad, [[-0.55, -0.55, 0.0]])  # -A * s / |seq|
    logp = torch.tensor([[math.log(1.5), math.log(1.5), 0.0]], requires_grad=True)
    loss, met = ca.get_policy_loss_fn("gspo")(old, logp, adv, mask, config={"clip_ratio": 0.2})
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and met["pg_clipfrac"] == 1.0
    assert (logp.grad == 0).all()


def test_gpg_hand_values():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = ca.get_policy_loss_fn("gpg")(torch.zeros(1, 2), logp, torch.tensor([[2.0, -1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx((2.0 - 2.0) / 2)  # -(-1*2) + -(-2*-1) = 2 - 2
    loss.backward()
    close(logp.grad, [[-1.0, 0.5]])


def test_value_loss_hand_values():
    vpreds = torch.tensor([[1.0, 2.5, 9.0]], requires_grad=True)
    values = torch.zeros(1, 3)
    returns = torch.tensor([[0.8, 0.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    # v_clip = [.5,.5]; token0: max(.04,.09)=.09 (clip binds); token1: max(6.25,.25)=6.25 -> .5*mean = 1.585
    assert loss.item() == pytest.approx(1.585)
    assert clipfrac == pytest.approx(0.5)
    loss.backward()
    close(vpreds.grad, [[0.0, 2.5 / 2, 0.0]])  # 0.5 * 2(v-R) / 2 tokens


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    h = ca.entropy_from_logits(logits)
    expected = [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    assert h.tolist() == pytest.approx(expected, abs=1e-6)
    big = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0)) * 5
    torch.testing.assert_close(ca.entropy_from_logits(big, chunk_size=5), ca.entropy_from_logits(big))
    ref = -(torch.softmax(big, -1) * torch.log_softmax(big, -1)).sum(-1)
    torch.testing.assert_close(ca.entropy_from_logits(big), ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- agg_loss
def test_agg_loss_modes_hand_values():
    L = torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 8, 9]])
    m = torch.tensor([[1.0, 1, 1], [1, 1, 0], [0, 0, 0]])  # last row empty
    assert ca.agg_loss(L, m, "token-mean").item() == pytest.approx(3.0)  # 15 / 5
    assert ca.agg_loss(L, m, "seq-mean-token-sum").item() == pytest.approx(7.5)  # (6 + 9) / 2
    assert ca.agg_loss(L, m, "seq-mean-token-mean").item() == pytest.approx(3.25)  # (2 + 4.5) / 2
    assert ca.agg_loss(L, m, "seq-mean-token-sum-norm").item() == pytest.approx(2.5)  # 15 / 3 / 2
    assert ca.agg_loss(L, m, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.75)
    assert ca.agg_loss(L, m, "token-sum").item() == pytest.approx(15.0)
    assert ca.agg_loss(L, m, "token-mean", global_num_tokens=10, dp_size=2).item() == pytest.approx(3.0)
    assert ca.agg_loss(L, torch.zeros_like(m), "token-mean").item() == 0.0
    with pytest.raises(ValueError, match="loss_agg_mode 'bad'"):
        ca.agg_loss(L, m, "bad")
    with pytest.raises(ValueError, match="global_num_tokens"):
        ca.agg_loss(L, m, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_num_seqs"):
        ca.agg_loss(L, m, "seq-mean-token-mean", dp_size=2)


def test_p08_token_sum_divisor_is_the_optimizer_step_not_the_generation_batch():
    # 4 micro-batches of 3 tokens, loss 1.0 per token, steps_per_generation=4 micro-batches, GA=2 per step
    micro = [(torch.ones(1, 3), torch.ones(1, 3)) for _ in range(4)]
    ga = 2
    steps = [micro[i:i + ga] for i in range(0, 4, ga)]
    for step in steps:
        tokens_in_step = sum(int(mk.sum()) for _, mk in step)
        total = sum(ca.agg_loss(L, mk, "token-mean", global_num_tokens=tokens_in_step) for L, mk in step)
        assert total.item() == pytest.approx(1.0)
        buggy = sum(ca.agg_loss(L, mk, "token-mean", global_num_tokens=12) for L, mk in step)
        assert buggy.item() == pytest.approx(0.5)  # what dividing by the generation batch gives
    # spg == GA: one optimizer step over all 4 micro-batches
    total = sum(ca.agg_loss(L, mk, "token-mean", global_num_tokens=12) for L, mk in micro)
    assert total.item() == pytest.approx(1.0)


def _globals(mask):
    return {"global_num_tokens": int(mask.sum()), "global_num_seqs": int(mask.any(-1).sum())}


@pytest.mark.parametrize("mode", list(ca.LOSS_AGG_MODES))
def test_grad_accumulation_and_dp_equivalence(mode):
    g = torch.Generator().manual_seed(0)
    B, R = 8, 6
    X = torch.randn(B, R, generator=g)
    mask = (torch.rand(B, R, generator=g) > 0.4).float()
    mask[2] = 0  # an empty sequence
    mask[5, 0] = 1
    theta0 = torch.randn(B, R, generator=g)
    kw = {"loss_scale_factor": R} if mode == "seq-mean-token-sum-norm" else {}

    def grad_of(parts, dp_size=1, glob=None):
        theta = theta0.clone().requires_grad_(True)
        total = 0
        for rows in parts:
            lm = (theta[rows] ** 2) * X[rows]
            total = total + ca.agg_loss(lm, mask[rows], mode, dp_size=dp_size, **(glob or {}), **kw)
        total.backward()
        return theta.grad

    single = grad_of([list(range(B))])
    four = grad_of([[0, 1], [2, 3], [4, 5], [6, 7]], glob=_globals(mask))
    torch.testing.assert_close(four, single, atol=1e-6, rtol=0)
    # 2 DP ranks x 2 micro-batches each; DeepSpeed averages the per-rank gradient sums
    rank0 = grad_of([[0, 1], [2, 3]], dp_size=2, glob=_globals(mask))
    rank1 = grad_of([[4, 5], [6, 7]], dp_size=2, glob=_globals(mask))
    torch.testing.assert_close((rank0 + rank1) / 2, single, atol=1e-6, rtol=0)
    # and the buggy local normalisation differs (so the test can fail)
    if mode != "token-sum":
        local = grad_of([[0, 1], [2, 3], [4, 5], [6, 7]])
        assert not torch.allclose(local, single, atol=1e-6)
