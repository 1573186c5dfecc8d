"""Exact resume through the real entry point (Ray + 2 DeepSpeed workers on gloo, tiny model, CPU).

An uninterrupted 4-step run (``trainer.save_freq=2``) is the reference. A second run stops at step 2 (saving),
and a third resumes it to step 4. Steps 3-4 metrics (losses, grad norms, scores, LR, KL coefficient, values) and
the final weights must equal the reference BIT-EXACTLY: model, Adam state, LR schedule (cosine with warmup, so a
repeated warmup would show), KL controller (adaptive), dataloader position and RNG all come back.
Also: ``trainer.max_actor_ckpt_to_keep`` through the trainer, and ``trainer.resume_mode=<path>``.
"""
import glob
import math
import os

import pytest
import torch

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import read_metrics

pytestmark = pytest.mark.slow

BASE = ["trainer.total_training_steps=4", "trainer.save_freq=2", "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        # 8 optimizer steps per run (2 per training step): warmup 1 training step (2 optimizer steps), then
        # cosine decay; a resumed run that repeated the warmup or used another horizon would log another actor/lr
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
        "actor_rollout_ref.actor.optim.total_training_steps=4"]
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step", "perf/rollout_s/",
                "perf/worker_s/",  # wall seconds inside the workers, like timing_s/
                "reward/time_s")


def _step_rows(out_dir):
    return {r["step"]: r for r in read_metrics(out_dir) if "actor/pg_loss" in r}


def assert_same_steps(ref_dir, resumed_dir, steps, must_have):
    ref, res = _step_rows(ref_dir), _step_rows(resumed_dir)
    assert sorted(res) == list(steps), sorted(res)  # the resumed run logged only the steps it ran
    for s in steps:
        keys = [k for k in ref[s] if not k.startswith(NOT_COMPARED)]
        for k in must_have:
            assert k in keys and math.isfinite(ref[s][k]), (s, k)
        diff = {k: (ref[s][k], res[s].get(k)) for k in keys if ref[s][k] != res[s].get(k)}
        assert not diff, f"step {s} differs after resume: {diff}"


def assert_same_weights(dir_a, dir_b):
    from safetensors.torch import load_file

    a = load_file(os.path.join(dir_a, "hf_actor", "model.safetensors"))
    b = load_file(os.path.join(dir_b, "hf_actor", "model.safetensors"))
    init = load_file(os.path.join(dir_a, "init_model", "model.safetensors"))
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert any(not torch.equal(a[k], init[k]) for k in a), "the actor did not train"


def _ckpts(out_dir):
    root = os.path.join(out_dir, "checkpoints")
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        tracker = int(f.read())
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "global_step_*"))), tracker


def test_resume_exact_zero2_grpo_auto_with_retention(tmp_path):
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run_main_forked(full, "deepspeed=zero2", *BASE)
    assert _ckpts(full) == (["global_step_2", "global_step_4"], 4)        # no retention limit: both kept
    run_main_forked(part, "deepspeed=zero2", *BASE, "trainer.total_training_steps=2")  # "interrupted" after step 2
    assert _ckpts(part) == (["global_step_2"], 2)
    run_main_forked(part, "deepspeed=zero2", *BASE, "trainer.resume_mode=auto", "trainer.max_actor_ckpt_to_keep=1")
    assert _ckpts(part) == (["global_step_4"], 4)                         # retention ran after the new save
    rows = read_metrics(part)
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2, 3, 4]  # appended, no step logged twice
    assert_same_steps(full, part, steps=(1, 2, 3, 4),
                      must_have=("actor/pg_loss", "actor/grad_norm", "actor/lr", "critic/score/mean",
                                 "actor/entropy"))
    lrs = [_step_rows(full)[s]["actor/lr"] for s in (1, 2, 3, 4)]
    assert lrs[0] > 0 and lrs[1] > lrs[3]   # warmup done in step 1 (2 optimizer steps), then cosine decay
    assert_same_weights(full, part)


def _optim_states(out_dir, role):
    """Every tensor in the ZeRO optimizer-state files of ``role`` at step 4 (fp32 master weights + Adam moments)."""
    from trainer.checkpoint.deepspeed_manager import deepspeed_safe_globals

    files = sorted(glob.glob(os.path.join(out_dir, "checkpoints", "global_step_4", role, "global_step_4",
                                          "*optim_states.pt")))
    assert len(files) == 2, files
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        for f in files:
            walk(torch.load(f, map_location="cpu", weights_only=True))  # DeepSpeed files load weights_only
    return out


def test_resume_exact_zero3_gae_critic_kl_ctrl_from_path(tmp_path):
    full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
    gae = ["deepspeed=zero3", "algorithm=gae", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
           "critic.optim.lr_scheduler_type=cosine", "critic.optim.total_training_steps=4"]
    run_main_forked(full, *gae, *BASE)
    # resume from an explicit path into another output folder
    run_main_forked(resumed, *gae, *BASE, f"trainer.resume_mode={os.path.join(full, 'checkpoints', 'global_step_2')}")
    assert_same_steps(full, resumed, steps=(3, 4),
                      must_have=("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm",
                                 "critic/values/mean", "critic/score/mean", "actor/reward_kl_penalty_coeff"))
    coef = [_step_rows(full)[s]["actor/reward_kl_penalty_coeff"] for s in (1, 2, 3, 4)]
    assert coef[0] == 0.001 and len(set(coef)) == 4   # the adaptive coefficient moved every step
    assert_same_weights(full, resumed)
    for role in ("actor", "critic"):
        a, b = _optim_states(full, role), _optim_states(resumed, role)
        assert len(a) == len(b) > 0
        assert all(torch.equal(x, y) for x, y in zip(a, b)), role


@pytest.mark.parametrize("draws", [["actor_rollout_ref.model.override_config.attention_dropout=0.2"],
                                   ["actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
                                    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.3",
                                    "actor_rollout_ref.actor.policy_loss.clip_cov_lb=-100",
                                    "actor_rollout_ref.actor.policy_loss.clip_cov_ub=100"]],
                         ids=["dropout", "clip_cov"])
def test_two_runs_of_one_seed_are_the_same_when_the_update_draws_random_numbers(tmp_path, draws):
    """Dropout in the actor and the ``clip_cov`` loss's token choice draw from the worker's global generator, which
    nothing seeded: two runs of one ``trainer.seed`` differed from step 1 (``actor/entropy``, ``actor/grad_norm``)."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    short = [o for o in BASE if not o.startswith(("trainer.total_training_steps", "trainer.save_freq"))]
    for out in (a, b):
        run_main_forked(out, *short, *draws, "trainer.total_training_steps=2", "trainer.save_freq=-1")
    assert_same_steps(a, b, steps=(1, 2), must_have=("actor/pg_loss", "actor/grad_norm", "actor/entropy"))


def test_resume_with_dropout_in_the_actor_is_exact(tmp_path):
    """The old-log-prob pass ran in the train mode the previous update left (dropout on from step 2), while a resumed
    run's first pass was in eval mode: step 3 differed (``rollout/log_prob_diff_mean`` 0.0136 against 1e-7)."""
    full, head, resumed = str(tmp_path / "full"), str(tmp_path / "head"), str(tmp_path / "resumed")
    drop = ["deepspeed=zero2", "actor_rollout_ref.model.override_config.attention_dropout=0.2"]
    run_main_forked(full, *drop, *BASE)
    first = [o if not o.startswith("trainer.total_training_steps") else "trainer.total_training_steps=2" for o in BASE]
    run_main_forked(head, *drop, *first)  # an interrupted run: its own 2 steps, then resumed into another folder
    run_main_forked(resumed, *drop, *BASE, f"trainer.resume_mode={os.path.join(head, 'checkpoints', 'global_step_2')}")
    assert_same_steps(full, resumed, steps=(3, 4), must_have=("actor/pg_loss", "actor/entropy",
                                                              "rollout/log_prob_diff_mean"))
