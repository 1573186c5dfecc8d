"""Algorithms and Ulysses through the real entry point, 2 steps each on 2 CPU workers (tiny model: 4 heads, 2 KV).

The runs join one Ray instance of the test session and run ``trainer/main.py`` in a driver forked from a
pre-imported one (:mod:`tests.e2e_shared`); a config the checks refuse goes through ``python trainer/main.py``
itself.
"""
import math

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import SHORT, read_metrics, run_main
from trainer import core_algos

pytestmark = pytest.mark.slow


def _finite_steps(out_dir, keys):
    rows = [r for r in read_metrics(out_dir) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k in keys:
            assert k in r and isinstance(r[k], (int, float)) and math.isfinite(r[k]), (r["step"], k, r.get(k))
    return rows


@pytest.fixture(scope="module")
def gae_run(tmp_path_factory):
    """GAE with actor + critic + reference (use_kl_loss), 2 steps on 2 workers; also the gae case of the p31 sweep."""
    out = str(tmp_path_factory.mktemp("gae") / "gae")
    run_main_forked(out, "algorithm=gae", "actor_rollout_ref.actor.use_kl_loss=true", "trainer.export_hf_on_end=false",
                    *SHORT)
    return out


@pytest.fixture(scope="module")
def sp2_run(tmp_path_factory):
    """GRPO (the default estimator) with Ulysses SP=2 and dynamic batch sizes, 2 steps on 2 workers; also the grpo
    case of the p31 sweep."""
    out = str(tmp_path_factory.mktemp("sp2") / "sp2")
    run_main_forked(out, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                    "actor_rollout_ref.actor.use_dynamic_bsz=true",
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64", "actor_rollout_ref.actor.use_kl_loss=true",
                    "trainer.export_hf_on_end=false", *SHORT)
    return out


def test_gae_three_roles_with_kl_loss(gae_run):
    """actor + critic + reference (use_kl_loss) on the same bundles."""
    rows = _finite_steps(gae_run, ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss",
                               "critic/grad_norm", "critic/values/mean", "critic/vf_explained_var"))
    # low_var_kl >= 0; 0 on the first mini-batch (actor == reference), > 0 once the actor has moved
    assert all(r["actor/kl_loss"] > 0.0 for r in rows)


def test_ulysses_sp2_dynamic_bsz(sp2_run):
    """SP=2 over the 2 workers (one data-parallel rank), token-budget micro-batches, reference with SP too."""
    rows = _finite_steps(sp2_run, ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"))
    # 16 rows of <= 18 tokens with a 64*2-token budget: several micro-batches per mini-batch
    assert len({r["actor/pg_loss"] for r in rows}) == 2


# one step on ONE worker: these sweeps check that each registry entry's stages run; data parallelism over 2
# workers is covered by the tests above and tests/test_e2e_main.py. An estimator with a run above (2 steps on 2
# workers, its step's stages and more) is checked on that run's last step instead of a run of its own.
RUN_OF = {"gae": "gae_run", "grpo": "sp2_run"}
ONE_STEP = ["trainer.total_training_steps=1", *SHORT[1:], "trainer.export_hf_on_end=false",
            "trainer.n_gpus_per_node=1"]


def _config_error(overrides):
    """The ConfigError message validate() gives for ``overrides``, or None when the config is accepted."""
    import os

    from hydra import compose, initialize_config_dir

    from tests.e2e_utils import ROOT
    from trainer.launch import ConfigError, resolve_config, validate

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        cfg = resolve_config(compose("ppo_trainer", overrides=list(overrides)))
    try:
        validate(cfg)
    except ConfigError as exc:
        return str(exc)
    return None


def _accepted_runs_or_refused_cleanly(tmp_path, overrides, keys, out=None):
    """The last step's metrics of a run of ``overrides`` (``out``: that run's folder, made already), or None when the
    config is refused before start-up (then the entry point exits 2 with the check's one-line reason)."""
    err = _config_error(overrides)
    if err is not None:
        proc = run_main(str(tmp_path / "run"), *overrides, check=False, timeout=120)
        assert proc.returncode == 2 and err in proc.stderr, proc.stderr[-2000:]
        return None
    if out is None:
        out = str(tmp_path / "run")
        run_main_forked(out, *overrides)
    row = [r for r in read_metrics(out) if "actor/pg_loss" in r][-1]
    for k in keys:
        assert k in row and math.isfinite(row[k]), (k, row.get(k))
    return row


def _two_component_reward(tmp_path):
    """A verl-style scorer file returning a dict with the score and two components, and GDPO's keys for them."""
    path = tmp_path / "two_components.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    acc = float(solution_str.strip() == str(ground_truth))\n"
                    "    digit = float(solution_str.strip()[:1].isdigit())\n"
                    "    return {'score': acc + 0.5 * digit, 'acc': acc, 'digit': digit}\n")
    return [f"reward_model.custom_reward_function.path={path}", "algorithm.gdpo_reward_keys=[acc,digit]",
            "algorithm.gdpo_reward_weights=[1.0,0.5]"]


ESTIMATOR_SETTINGS = {"gdpo": _two_component_reward}  # what an estimator needs besides its name


@pytest.mark.parametrize("est", sorted(core_algos.ADV_ESTIMATOR_REGISTRY))
def test_p31_every_registered_estimator_runs_a_step_or_is_refused_before_start(tmp_path, est, request):
    from trainer.algos.registry import get_adv_estimator_spec

    extra = ESTIMATOR_SETTINGS[est](tmp_path) if est in ESTIMATOR_SETTINGS else []
    out = request.getfixturevalue(RUN_OF[est]) if est in RUN_OF else None
    row = _accepted_runs_or_refused_cleanly(tmp_path, [f"algorithm.adv_estimator={est}", *extra, *ONE_STEP],
                                            ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean",
                                             "critic/score/mean"), out)
    if row is not None:  # a critic is started (and trained) exactly for the estimators that read values
        assert ("critic/vf_loss" in row) == get_adv_estimator_spec(est).needs_critic, sorted(row)
    if est == "remax":  # the greedy baseline rollout ran inside the step
        assert row is not None and "timing_s/adv_inputs/reward_baselines" in row
    if est == "optimal_token_baseline":  # sum_pi_squared came from the actor's log-prob pass
        assert row is not None
    if est == "gdpo":  # the components reached the estimator; its batch whitening centres the advantages
        assert row is not None and {"reward/acc/mean", "reward/digit/mean"} <= set(row)
        assert abs(row["critic/advantages/mean"]) < 1e-4, row["critic/advantages/mean"]


