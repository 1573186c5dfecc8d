"""A non-finite loss skips the optimizer step (on every rank), is counted, and too many in a row stop the run.

Drives :func:`trainer.workers.update.ppo_update` with real DeepSpeed engines (ZeRO-2 and ZeRO-3, gloo, CPU) and
a loss stub (``_actor_loss``) that returns NaN for poisoned rows.
"""
import os
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

deepspeed = pytest.importorskip("deepspeed")

from trainer.protocol import DataProto  # noqa: E402
from trainer.workers import update  # noqa: E402
from trainer.workers.base import free_port  # noqa: E402

CFG = {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2, "ppo_epochs": 1, "loss_agg_mode": "token-mean"}


def section(kind: str = "actor"):
    """The actor's (critic's) section of the packaged config with :data:`CFG` over it."""
    from trainer.config import ActorConfig, CriticConfig
    from trainer.config.packaged import packaged_section

    if kind == "actor":
        return packaged_section(ActorConfig, "actor_rollout_ref.actor", **CFG)
    return packaged_section(CriticConfig, "critic", ["algorithm=gae"], **CFG)


def _init_dist(rank=0, world=1, port=None):
    if torch.distributed.is_initialized():
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port or free_port()), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK="0")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def _engine(stage, bf16=False):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "managed_gradient_accumulation": False, "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
           "bf16": {"enabled": bf16}, "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def _params(engine):
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return [p.detach().clone() for p in engine.module.parameters()]


def _data(poison):
    """Rows of one rank: 2 rows per mini-batch (n=1, dp=1); ``poison[i]`` makes row i's loss NaN."""
    torch.manual_seed(1)
    n = len(poison)
    return DataProto.from_dict({"x": torch.randn(n, 4), "response_mask": torch.ones(n, 3),
                                "poison": torch.tensor(poison, dtype=torch.bool)})


def _loss_stub(role, mb, cfg, temperature, agg_mode, agg):
    loss = role.engine(mb["x"]).pow(2).mean()
    if bool(mb["poison"].any()):
        loss = loss * float("nan")
    return loss, {"pg_loss": loss.item()}


def _run(engine, data, dp_size=1):
    role = getattr(engine, "_test_role", None) or SimpleNamespace(engine=engine, dp_size=dp_size, dp_group=None,
                                                                  sp_size=1, device=torch.device("cpu"))
    engine._test_role = role
    worker = SimpleNamespace(device=torch.device("cpu"))
    return update.ppo_update(worker, role, data, section(), n=1, temperature=1.0, kind="actor")


@pytest.mark.parametrize("stage", [2, 3])
def test_nan_loss_skips_step_without_contaminating_the_next(monkeypatch, stage):
    _init_dist()
    monkeypatch.setattr(update, "_actor_loss", _loss_stub)
    skip = _engine(stage)
    before = _params(skip)
    m = _run(skip, _data([True, True, False, False]))       # mini-batch 1 NaN, mini-batch 2 clean
    assert m["actor/skipped_steps"] == [1.0] and m["actor/consecutive_skipped_steps"] == [0.0]
    assert len(m["actor/grad_norm"]) == 1                    # only the clean mini-batch stepped
    ref = _engine(stage)
    assert all(torch.equal(a, b) for a, b in zip(before, _params(ref)))
    _run(ref, _data([True, True, False, False]).index(slice(2, 4)))   # the clean mini-batch alone
    # bit-exact: the NaN backward left no gradient, Adam moment or step count behind
    assert all(torch.equal(a, b) for a, b in zip(_params(skip), _params(ref)))


def test_consecutive_skips_persist_across_updates(monkeypatch):
    _init_dist()
    monkeypatch.setattr(update, "_actor_loss", _loss_stub)
    engine = _engine(2)
    before = _params(engine)
    m1 = _run(engine, _data([True] * 4))
    m2 = _run(engine, _data([True] * 4))
    assert (m1["actor/skipped_steps"], m1["actor/consecutive_skipped_steps"]) == ([2.0], [2.0])
    assert (m2["actor/skipped_steps"], m2["actor/consecutive_skipped_steps"]) == ([2.0], [4.0])
    assert all(torch.equal(a, b) for a, b in zip(before, _params(engine)))   # never stepped
    m3 = _run(engine, _data([False] * 4))
    assert m3["actor/consecutive_skipped_steps"] == [0.0] and m3["actor/skipped_steps"] == [0.0]


def _rank_main(rank, port, q):
    try:
        _init_dist(rank, 2, port)
        update._actor_loss = _loss_stub
        engine = _engine(2)
        before = _params(engine)
        # only rank 1 sees a NaN in its first mini-batch; both ranks must skip it
        m = _run(engine, _data([False, False, False, False] if rank == 0 else [True, False, False, False]), dp_size=2)
        first_changed = not all(torch.equal(a, b) for a, b in zip(before, _params(engine)))
        q.put((rank, m["actor/skipped_steps"], len(m["actor/grad_norm"]), first_changed))
    except Exception as exc:  # report instead of hanging the parent
        q.put((rank, repr(exc), None, None))


def run_two_ranks(target, timeout_s: float = 180) -> list:
    """``target(rank, port, queue)`` in 2 spawned processes (one gloo group); what they put, sorted."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=timeout_s) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


def test_nan_on_one_rank_skips_on_all_ranks():
    results = run_two_ranks(_rank_main)
    # dp=2: a mini-batch of 2 prompts is 1 row per rank, so 4 mini-batches; the first is skipped on BOTH ranks
    # (only rank 1 saw the NaN), the other 3 step
    assert results == [(0, [1.0], 3, True), (1, [1.0], 3, True)], results


def test_trainer_stops_after_max_consecutive_skips(tmp_path):
    from trainer.config import TrainerConfig
    from trainer.config.packaged import packaged_section
    from trainer.ppo_trainer import RayPPOTrainer, TrainingDiverged

    tr = RayPPOTrainer.__new__(RayPPOTrainer)
    tr.cfg = {"trainer": {"max_consecutive_skipped_steps": 3, "default_local_dir": str(tmp_path)}}
    tr.trainer_cfg = packaged_section(TrainerConfig, "trainer", **tr.cfg["trainer"])
    tr.global_step = 7
    tr._check_skipped({"actor/consecutive_skipped_steps": 2.0, "critic/consecutive_skipped_steps": 0.0})
    with pytest.raises(TrainingDiverged, match=r"critic: 3 optimizer steps in a row.*max_consecutive_skipped_steps=3"
                                               r".*step 7"):
        tr._check_skipped({"actor/consecutive_skipped_steps": 0.0, "critic/consecutive_skipped_steps": 3.0})


def _loss_share_stub(role, mb, cfg, temperature, agg_mode, agg):
    """A token-mean loss aggregated like the real one (share of the mini-batch's global token count)."""
    per_row = role.engine(mb["x"]).pow(2).squeeze(-1)                       # (rows,)
    tok = mb["response_mask"]                                               # (rows, 3)
    loss = (per_row[:, None] * tok).sum() / agg["global_num_tokens"] * agg["dp_size"]
    return loss, {"pg_loss": loss.item(), "pg_clipfrac": 0.25}


def test_stage0_fp32_steps_are_not_counted_as_skipped_and_loss_metric_ignores_micro_size(monkeypatch):
    """ZeRO-0 without bf16 steps are counted as applied, with one gradient norm per mini-batch. pg_loss is the
    mini-batch loss (micro-batch shares summed), the same for 1 or 2 micro-batches; a per-token statistic is one
    token mean per mini-batch too."""
    _init_dist()
    monkeypatch.setattr(update, "_actor_loss", _loss_share_stub)
    data = _data([False] * 4)
    out = {}
    for micro in (2, 1):
        monkeypatch.setitem(CFG, "ppo_micro_batch_size_per_gpu", micro)
        engine = _engine(0)
        m = _run(engine, data)
        assert m["actor/skipped_steps"] == [0.0] and m["actor/consecutive_skipped_steps"] == [0.0]
        assert len(m["actor/grad_norm"]) == 2
        assert len(m["actor/pg_loss"]) == 2                        # one per mini-batch (2 rows each)
        assert m["actor/pg_clipfrac"] == [pytest.approx(0.25)] * 2
        out[micro] = m["actor/pg_loss"][0]
    x = data["x"][:2]
    torch.manual_seed(0)
    expected = torch.nn.Linear(4, 1)(x).pow(2).mean().item()      # first mini-batch, weights before any step
    assert out[1] == pytest.approx(out[2], rel=1e-6) and out[2] == pytest.approx(expected, rel=1e-6)
