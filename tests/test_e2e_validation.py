"""Held-out validation through the real entry point: at step 0 (``val_before_train``), every ``test_freq`` steps,
and the extra greedy pass of ``trainer.val_also_greedy`` beside sampled ``val_kwargs``."""
import math
import types

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import SHORT, read_metrics
from trainer.config import DataConfig, SamplingKwargs, TrainerConfig
from trainer.config.packaged import packaged_section
from trainer.embedded import TASK_NAME


@pytest.mark.slow
def test_validation_before_training_every_test_freq_and_greedy_too(tmp_path):
    out = str(tmp_path / "run")
    run_main_forked(out, *SHORT, "trainer.val_before_train=true", "trainer.test_freq=2", "trainer.val_also_greedy=true",
                  "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.n=2",
                  "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
    rows = read_metrics(out)
    val_rows = {r["step"]: r for r in rows if f"val/{TASK_NAME}/acc" in r}
    assert sorted(val_rows) == [0, 2], sorted(val_rows)
    for step, r in val_rows.items():
        for key in (f"val/{TASK_NAME}/acc", f"val/{TASK_NAME}/greedy/acc"):
            assert isinstance(r[key], float) and 0.0 <= r[key] <= 1.0, (step, key, r.get(key))
    # the greedy pass holds one answer per question, the sampled pass val_kwargs.n of them; no sampled-pass
    # statistics (mean@N etc.) are made for the greedy one
    assert not [k for k in val_rows[0] if "/greedy/" in k and "@" in k]


class _Stub:
    """Just what ``PPOTrainer.validate`` reads, with the passes recorded."""

    def __init__(self, also_greedy, do_sample, temperature):
        self.val_dataset = [0]
        self.trainer_cfg = packaged_section(TrainerConfig, "trainer", val_also_greedy=also_greedy)
        self.val_kwargs = packaged_section(SamplingKwargs, "actor_rollout_ref.rollout.val_kwargs",
                                           do_sample=do_sample, temperature=temperature)
        self.cfg = {"trainer": {"val_also_greedy": also_greedy},
                    "actor_rollout_ref": {"rollout": {"val_kwargs": {"do_sample": do_sample,
                                                                     "temperature": temperature}}}}
        self.passes = []

    def validate_pass(self, greedy):
        self.passes.append(greedy)
        return {f"val/x/{'greedy/' if greedy else ''}acc": 0.5}


@pytest.mark.parametrize("also_greedy,do_sample,temperature,passes", [
    (True, True, 0.7, [False, True]),
    (True, False, 0.7, [False]),   # val_kwargs already greedy: no second, identical pass
    (True, True, 0.0, [False]),    # temperature 0 is greedy too
    (False, True, 0.7, [False]),
])
def test_val_also_greedy_runs_the_greedy_pass_only_beside_sampling(also_greedy, do_sample, temperature, passes):
    from trainer.ppo_trainer import RayPPOTrainer

    stub = _Stub(also_greedy, do_sample, temperature)
    metrics = RayPPOTrainer.validate(stub)
    assert stub.passes == passes
    assert ("val/x/greedy/acc" in metrics) == (True in passes)
    assert math.isclose(metrics["val/x/acc"], 0.5)


def test_greedy_pass_sampling_is_one_greedy_answer_at_the_rollout_width():
    from trainer.workers.actor import ActorRolloutRefWorker

    from trainer.config import RolloutConfig
    from trainer.config.packaged import packaged_section

    rc = packaged_section(RolloutConfig, "actor_rollout_ref.rollout", ["data.max_response_length=37"], n=8,
                          temperature=1.0, top_p=1.0, top_k=-1, do_sample=True,
                          val_kwargs={"n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "do_sample": True})
    worker = types.SimpleNamespace(rollout_cfg=rc)
    g = ActorRolloutRefWorker._sampling(worker, True, 5, greedy=True)
    assert (g.n, g.greedy, g.max_new_tokens, g.seed) == (1, True, 37, 5)
    v = ActorRolloutRefWorker._sampling(worker, True, 5)
    assert (v.n, v.greedy, v.temperature, v.top_p) == (2, False, 0.7, 0.9)
    t = ActorRolloutRefWorker._sampling(worker, False, None)
    assert (t.n, t.greedy, t.temperature) == (8, False, 1.0)


def test_validation_keeps_reward_keys_that_hold_a_slash():
    """A scorer's extra key such as ``fmt/ok`` is logged whole: ``val/<source>/fmt/ok``, beside ``fmt/len``."""
    import torch

    from rewards.manager import RewardOutput
    from trainer.ppo_trainer import RayPPOTrainer

    rows = [{"input_ids": [5, 6, 7][: 1 + i % 3], "reward_model": {"ground_truth": "1"}, "data_source": "a/b"}
            for i in range(4)]

    def reward(out):
        b = len(out)
        return RewardOutput(torch.ones(b, 1), {"score": [1.0] * b, "acc": [i % 2 == 0 for i in range(b)],
                                                 "fmt/ok": [True] * b, "fmt/len": [5.0] * b})

    stub = types.SimpleNamespace(
        val_dataset=rows, world=2, tokenizer=types.SimpleNamespace(pad_token_id=0, eos_token_id=1),
        cfg={"data": {"val_batch_size": 3}, "trainer": {"seed": 1}}, val_reward_fn=reward,
        trainer_cfg=packaged_section(TrainerConfig, "trainer", seed=1),
        data_cfg=packaged_section(DataConfig, "data", val_batch_size=3),
        roles=types.SimpleNamespace(rollout=types.SimpleNamespace(generate_sequences=lambda batch: batch)))
    m = RayPPOTrainer.validate_pass(stub, greedy=True)
    # batches of 3 and 1 rows (acc True, False, True | True)
    assert m == {"val/a/b/greedy/score": 1.0, "val/a/b/greedy/acc": 0.75, "val/a/b/greedy/fmt/ok": 1.0,
                 "val/a/b/greedy/fmt/len": 5.0}


@pytest.mark.parametrize("validation,source", [([], "start-up"), (["trainer.test_freq=2"], "trainer")])
def test_val_also_greedy_beside_greedy_val_kwargs_is_warned_once(validation, source, caplog):
    """``trainer.val_also_greedy=true`` with the shipped (greedy) ``val_kwargs`` and no validation was warned twice:
    by the start-up checks (ignored: no validation runs) and by the trainer (does nothing: already greedy). One line:
    the start-up one without validation, the trainer's with it."""
    import logging

    from tests.verl_scripts import composed
    from trainer.validation import warn_greedy_noop

    _, _, run, report = composed(["trainer.val_also_greedy=true", *validation])
    startup = [w for w in report.warnings if "val_also_greedy" in w]
    vk = SamplingKwargs.from_dict(run["actor_rollout_ref"]["rollout"]["val_kwargs"],
                                  "actor_rollout_ref.rollout.val_kwargs")
    caplog.clear()  # the start-up lines were logged too; counted from the report above
    with caplog.at_level(logging.WARNING, logger="trainer.validation"):
        warn_greedy_noop(run, True, vk)
    trainer = [r.getMessage() for r in caplog.records if "val_also_greedy" in r.getMessage()]
    assert len(startup + trainer) == 1, startup + trainer
    assert (startup if source == "start-up" else trainer) != []


@pytest.mark.parametrize("key", ["ability", "data_source"])
def test_val_metrics_are_grouped_by_the_reward_fn_key_column(key):
    """Rows without ``data_source`` whose scorer is picked by ``data.reward_fn_key=ability`` are reported per
    ability (``val/<ability>/acc``, and the best-of-n ``val-core/<ability>/...``), not merged under ``unknown``;
    with the default key, rows are grouped by ``data_source`` as before."""
    import torch

    from rewards.manager import RewardOutput
    from trainer.ppo_trainer import RayPPOTrainer

    abilities = ["synthetic/digits", "gsm8k"]
    rows = [{"input_ids": [5, 6], "reward_model": {"ground_truth": "1"}, key: abilities[i % 2]} for i in range(4)]

    def reward(out):  # the digits rows score 1, the gsm8k rows 0
        b = len(out)
        return RewardOutput(torch.zeros(b, 1), {"acc": [float(v == abilities[0]) for v in out[key]]})

    stub = types.SimpleNamespace(
        val_dataset=rows, world=1, tokenizer=types.SimpleNamespace(pad_token_id=0, eos_token_id=1),
        val_reward_fn=reward, val_samples=[], log_val_n=0, trainer_cfg=packaged_section(TrainerConfig, "trainer", seed=1),
        data_cfg=packaged_section(DataConfig, "data", val_batch_size=3, reward_fn_key=key),
        roles=types.SimpleNamespace(rollout=types.SimpleNamespace(generate_sequences=lambda b: b.repeat(2))))
    m = RayPPOTrainer.validate_pass(stub, greedy=False)
    assert m["val/synthetic/digits/acc"] == 1.0 and m["val/gsm8k/acc"] == 0.0
    assert m["val-core/synthetic/digits/acc/mean@2"] == 1.0 and m["val-core/gsm8k/acc/best@2/mean"] == 0.0
    assert not [k for k in m if "unknown" in k]
