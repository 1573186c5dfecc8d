"""Algorithms and Ulysses through the real entry point, 2 steps each on 2 CPU workers (tiny model: 4 heads, 2 KV)."""
import math

import pytest

from tests.e2e_utils import SHORT, read_metrics, run_main

pytestmark = pytest.mark.slow


def _finite_steps(out_dir, keys):
    rows = [r for r in read_metrics(out_dir) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k in keys:
            assert k in r and isinstance(r[k], (int, float)) and math.isfinite(r[k]), (r["step"], k, r.get(k))
    return rows


def test_gae_three_roles_with_kl_loss(tmp_path):
    """actor + critic + reference (use_kl_loss) on the same bundles."""
    out = str(tmp_path / "gae")
    run_main(out, "algorithm=gae", "actor_rollout_ref.actor.use_kl_loss=true", "trainer.export_hf_on_end=false",
             *SHORT)
    rows = _finite_steps(out, ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss",
                               "critic/grad_norm", "critic/values/mean", "critic/vf_explained_var"))
    # low_var_kl >= 0; 0 on the first mini-batch (actor == reference), > 0 once the actor has moved
    assert all(r["actor/kl_loss"] > 0.0 for r in rows)


def test_rloo(tmp_path):
    out = str(tmp_path / "rloo")
    run_main(out, "algorithm=rloo", "trainer.export_hf_on_end=false", *SHORT)
    _finite_steps(out, ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean", "critic/score/mean"))
    assert "critic/vf_loss" not in read_metrics(out)[-1]   # no critic for RLOO


def test_ulysses_sp2_dynamic_bsz(tmp_path):
    """SP=2 over the 2 workers (one data-parallel rank), token-budget micro-batches, reference with SP too."""
    out = str(tmp_path / "sp2")
    run_main(out, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.actor.use_dynamic_bsz=true",
             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64", "actor_rollout_ref.actor.use_kl_loss=true",
             "trainer.export_hf_on_end=false", *SHORT)
    rows = _finite_steps(out, ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"))
    # 16 rows of <= 18 tokens with a 64*2-token budget: several micro-batches per mini-batch
    assert len({r["actor/pg_loss"] for r in rows}) == 2
