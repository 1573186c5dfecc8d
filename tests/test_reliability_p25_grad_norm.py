"""A FINITE loss whose gradient is not finite skips the optimizer step on every path (P25).

The loss ``sqrt(0 * f(theta))`` is 0 (finite) but its gradient is ``0 * inf = NaN``. Through the real update loops
(``trainer.workers.update.ppo_update`` for actor and critic, ``PRMWorker.update_rm``, the Megatron engine) with real
DeepSpeed engines (gloo, CPU) at ZeRO stages 0-3, fp32 and bf16: the parameters stay bit-identical, the
skipped-step metric is 1 per poisoned mini-batch, the streak grows across updates and the trainer stops the run
when it reaches ``trainer.max_consecutive_skipped_steps``.
"""
import os
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

deepspeed = pytest.importorskip("deepspeed")

from tests.test_reliability_skip import _engine, _init_dist, _params, run_two_ranks, section  # noqa: E402
from trainer.protocol import DataProto  # noqa: E402
from trainer.workers import update  # noqa: E402


def _nan_grad_loss(out, poison):
    """``sqrt(0 * f)`` (value 0, gradient NaN) where ``poison``; else the mean square of ``out``."""
    f = out.float().pow(2).mean()
    return (0 * f).sqrt() if poison else f


def _actor_stub(role, mb, cfg, temperature, agg_mode, agg):
    x = mb["x"].to(next(role.engine.parameters()).dtype)
    loss = _nan_grad_loss(role.engine(x), bool(mb["poison"].any()))
    return loss, {"pg_loss": loss.detach()}


def _critic_stub(role, mb, cfg, agg_mode, agg):
    x = mb["x"].to(next(role.engine.parameters()).dtype)
    loss = _nan_grad_loss(role.engine(x), bool(mb["poison"].any()))
    return loss, {"vf_loss": loss.detach()}


def _data(poison, seed=1):
    """One mini-batch per 2 rows (CFG: ppo_mini_batch_size=2, n=1, dp=1); ``poison[i]`` poisons row i's batch."""
    g = torch.Generator().manual_seed(seed)
    n = len(poison)
    return DataProto.from_dict({"x": torch.randn(n, 4, generator=g), "response_mask": torch.ones(n, 3),
                                "poison": torch.tensor(poison, dtype=torch.bool)})


def _update(engine, data, kind="actor", dp_size=1):
    role = getattr(engine, "_test_role", None) or SimpleNamespace(engine=engine, dp_size=dp_size, dp_group=None,
                                                                  sp_size=1, device=torch.device("cpu"))
    engine._test_role = role
    return update.ppo_update(SimpleNamespace(device=torch.device("cpu")), role, data, section(kind), n=1,
                             temperature=1.0, kind=kind)


def _trainer(tmp_path, limit):
    from trainer.config import TrainerConfig
    from trainer.config.packaged import packaged_section
    from trainer.ppo_trainer import RayPPOTrainer

    tr = RayPPOTrainer.__new__(RayPPOTrainer)
    tr.cfg = {"trainer": {"max_consecutive_skipped_steps": limit, "default_local_dir": str(tmp_path)}}
    tr.trainer_cfg = packaged_section(TrainerConfig, "trainer", **tr.cfg["trainer"])
    tr.global_step = 0
    return tr


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_p25_nan_gradient_of_a_finite_loss_is_skipped(monkeypatch, tmp_path, stage, bf16):
    from trainer.metric_utils import reduce_rank_metrics
    from trainer.ppo_trainer import TrainingDiverged

    _init_dist()
    monkeypatch.setattr(update, "_actor_loss", _actor_stub)
    engine = _engine(stage, bf16)
    before = _params(engine)
    tr = _trainer(tmp_path, limit=3)
    for step in (1, 2):
        tr.global_step = step
        m = _update(engine, _data([True, True]))
        assert m["actor/skipped_steps"] == [1.0] and m["actor/consecutive_skipped_steps"] == [float(step)]
        assert _same(before, _params(engine)), "a NaN gradient reached the weights"
        tr._check_skipped(reduce_rank_metrics([m]))         # 1 and 2 in a row: the run goes on
    tr.global_step = 3
    with pytest.raises(TrainingDiverged, match=r"actor: 3 optimizer steps in a row.*step 3"):
        tr._check_skipped(reduce_rank_metrics([_update(engine, _data([True, True]))]))
    assert _same(before, _params(engine))
    # the skipped steps left no gradient, Adam moment or LR-schedule step behind: a clean update now equals a clean
    # update of a fresh engine
    _update(engine, _data([False, False], seed=2))
    ref = _engine(stage, bf16)
    m = _update(ref, _data([False, False], seed=2))
    assert m["actor/skipped_steps"] == [0.0] and not _same(before, _params(ref))
    assert _same(_params(engine), _params(ref))


def test_p25_critic_nan_gradient_is_skipped_at_stage0(monkeypatch):
    _init_dist()
    monkeypatch.setattr(update, "_critic_loss", _critic_stub)
    engine = _engine(0, False)
    before = _params(engine)
    m = _update(engine, _data([True, True, False, False]), kind="critic")
    assert m["critic/skipped_steps"] == [1.0] and m["critic/consecutive_skipped_steps"] == [0.0]
    after = _params(engine)
    assert all(torch.isfinite(p).all() for p in after) and not _same(before, after)  # the clean batch stepped


@pytest.mark.parametrize("kind", ["actor", "critic"])
def test_p25_stage0_fp32_logs_the_grad_norm_before_clipping_as_stage1_does(monkeypatch, kind):
    """ZeRO-0 with a plain torch optimizer logs ``<role>/grad_norm``: the global L2 norm before clipping
    (``gradient_clipping`` 1.0 here, norms far above it), one per applied mini-batch, equal to ZeRO-1's on the same
    data and to the norm of the first mini-batch's gradient computed by hand."""
    _init_dist()
    monkeypatch.setattr(update, f"_{kind}_loss", _actor_stub if kind == "actor" else _critic_stub)
    data = _data([False] * 4)
    data["x"] = data["x"] * 10
    norms = {stage: _update(_engine(stage, False), data, kind=kind)[f"{kind}/grad_norm"] for stage in (0, 1)}
    assert len(norms[0]) == 2 and norms[0] == pytest.approx(norms[1], rel=1e-5)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)                                   # the engines' first weights (see _engine)
    model(data["x"][:2]).pow(2).mean().backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    assert expected > 10 and norms[0][0] == pytest.approx(expected, rel=1e-5)


def _rank_main(rank, port, q):
    try:
        _init_dist(rank, 2, port)
        update._actor_loss = _actor_stub
        out = []
        for stage in (0, 2):
            engine = _engine(stage, False)
            before = _params(engine)
            # only rank 1's first mini-batch has the NaN gradient; both ranks must skip it
            m = _update(engine, _data([rank == 1, False, False, False]), dp_size=2)
            after = _params(engine)
            out.append((stage, m["actor/skipped_steps"], bool(all(torch.isfinite(p).all() for p in after)),
                        not _same(before, after), [float(p.double().sum()) for p in after],
                        m.get("actor/grad_norm")))
        q.put((rank, out))
    except Exception as exc:  # report instead of hanging the parent
        q.put((rank, repr(exc)))


def test_p25_nan_gradient_on_one_rank_skips_on_all_ranks():
    results = dict(run_two_ranks(_rank_main))
    assert all(isinstance(v, list) for v in results.values()), results
    for (s0, skip0, fin0, moved0, sums0, _), (s1, skip1, fin1, moved1, sums1, _) in zip(results[0], results[1]):
        # dp=2: a mini-batch of 2 prompts is 1 row per rank, 4 mini-batches; the first is skipped on both ranks
        assert (skip0, skip1) == ([1.0], [1.0]) and fin0 and fin1 and moved0 and moved1, s0
        assert sums0 == sums1, s0                                      # the ranks hold the same weights
    # the norm of the gradient reduced over the ranks, the same on both, at ZeRO-0 as at ZeRO-2 for the 3 applied
    # steps (ZeRO-2 finds the first step's NaN itself and reports inf; this guard skipped it at ZeRO-0)
    (_, *_, zero0), (_, *_, zero2) = results[0]
    assert len(zero0) == 3 and zero0 == results[1][0][-1] and zero0 == pytest.approx(zero2[1:], rel=1e-5)


def test_p25_prm_nan_gradient_is_skipped(monkeypatch, tmp_path):
    """PRIME's PRM update (ZeRO-0, fp32): same guard, counted in reward_model/(consecutive_)skipped_steps."""
    import trainer.algos.prime as prime_algos
    from tests.test_prime_worker import _batch, _config, _make_models
    from trainer.workers.prm import PRMWorker

    real = prime_algos.prm_ce_loss

    def nan_grad_ce(*args, **kwargs):
        per_seq = real(*args, **kwargs)
        return (0 * per_seq).sqrt()

    vocab, (prm, ref) = _make_models(str(tmp_path))
    w = PRMWorker(_config(prm, ref, dynamic=False, zero_stage=0), 0, 1, device="cpu", role="prm")
    w.init_model()
    before = [p.detach().clone() for p in w.prm.engine.module.parameters()]
    monkeypatch.setattr(prime_algos, "prm_ce_loss", nan_grad_ce)
    for streak in (1.0, 2.0):                   # one mini-batch per update (2 prompts x n=2 rows)
        m = w.update_rm(_batch(vocab)).meta["metrics"]
        assert m["reward_model/skipped_steps"] == [1.0] and m["reward_model/consecutive_skipped_steps"] == [streak]
    assert _same(before, list(w.prm.engine.module.parameters()))
    monkeypatch.setattr(prime_algos, "prm_ce_loss", real)
    m = w.update_rm(_batch(vocab)).meta["metrics"]
    assert m["reward_model/skipped_steps"] == [0.0] and m["reward_model/consecutive_skipped_steps"] == [0.0]
    assert not _same(before, list(w.prm.engine.module.parameters()))


def test_ds_config_that_turns_off_deepspeeds_norm_check_is_refused():
    from tests.test_reliability_config import OK_BATCH, _cfg
    from trainer.launch import ConfigError, validate

    zero2 = (*OK_BATCH, "deepspeed=zero2")
    validate(_cfg(*zero2, "deepspeed.ds_config={zero_optimization:{compute_grad_norm:true}}"))
    with pytest.raises(ConfigError, match=r"^deepspeed.ds_config.zero_optimization.compute_grad_norm=False"):
        validate(_cfg(*zero2, "deepspeed.ds_config={zero_optimization:{compute_grad_norm:false}}"))
    with pytest.raises(ConfigError, match=r"^deepspeed.ds_config.bf16.check_grad_overflow=False"):
        validate(_cfg(*OK_BATCH, "deepspeed.ds_config={bf16:{enabled:true,check_grad_overflow:false}}"))
