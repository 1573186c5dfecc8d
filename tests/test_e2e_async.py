"""The async loop through the real entry point on CPU: one DeepSpeed actor worker and one rollout worker (gloo),
``trainer.rollout_placement=separate trainer.async.staleness=1``.

* The embedded default for a few steps: every batch after the first is one update old (``async/staleness``), the
  truncated importance weights are logged, and the trace shows each batch generated while the previous step trained
  (the on-policy loop would start it after that step's update).
* Exact resume mid-pipeline: resuming the checkpoint of step 2 of a longer run (saved while its batch 3 was being
  generated) gives steps 3-4 equal to the uninterrupted run's bit for bit (metrics and final weights): the in-flight
  batch is dropped and generated again with the same weights (the rollout role's checkpoint), prompts and seeds;
  nothing is trained twice.

The runs are forked drivers on the session's Ray instance (:mod:`tests.e2e_shared`): each a process of its own.
"""
import json
import math
import os

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import read_metrics
from tests.test_e2e_resume import BASE, assert_same_weights
from trainer.async_rollout import read_trace

pytestmark = pytest.mark.slow

ASYNC = ["trainer.rollout_placement=separate", "trainer.async.staleness=1", "trainer.n_gpus_per_node=1"]
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step", "perf/rollout_s/",
                "perf/worker_s/",  # wall seconds inside the workers, like timing_s/
                "reward/time_s", "async/wait_gen_s", "async/gen_s", "async/gen_overlap_s")


def _steps(out_dir):
    return {r["step"]: r for r in read_metrics(out_dir) if "actor/pg_loss" in r}


def test_embedded_default_with_separate_rollout_and_staleness_1_overlaps_generation_and_training(tmp_path):
    out = str(tmp_path / "async")
    os.makedirs(out)  # an earlier run's outputs: set aside at start-up, before the trace file is opened
    for name, text in (("metrics.jsonl", '{"step": 9}\n'), ("async_trace.json", '[\n{"name": "old"},\n')):
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    run_main_forked(out, *ASYNC, "trainer.total_training_steps=5", "trainer.export_hf_on_end=false")
    (earlier,) = os.listdir(os.path.join(out, "earlier_runs"))
    assert sorted(os.listdir(os.path.join(out, "earlier_runs", earlier))) == ["async_trace.json", "metrics.jsonl"]
    rows = _steps(out)
    assert sorted(rows) == [1, 2, 3, 4, 5]
    assert [rows[k]["async/staleness"] for k in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [rows[k]["async/weights_version"] for k in rows] == [0.0, 0.0, 1.0, 2.0, 3.0]
    for r in rows.values():  # truncated IS is on by default in async mode; the sync time is measured
        for key in ("rollout_corr/is_weight_mean", "rollout_corr/is_weight_max", "rollout_corr/is_truncated_frac",
                    "timing_s/sync_weights"):
            assert math.isfinite(r[key]), key
    assert rows[1]["rollout/log_prob_diff_max"] < 1e-4      # step 1: the rollout holds the actor's very weights
    assert rows[3]["rollout/log_prob_diff_max"] > 1e-3      # later: one update apart
    events = read_trace(os.path.join(out, "async_trace.json"))
    gen = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "generate"}
    train = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "train_step"}
    update = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "update_actor"}
    assert sorted(gen) == sorted(train) == sorted(update) == [1, 2, 3, 4, 5]
    for k in (2, 3, 4, 5):  # batch k was generated while step k-1 trained, before its update ended
        assert gen[k][0] < update[k - 1][1], (k, gen[k], update[k - 1])
    assert sum(rows[k]["async/gen_overlap_s"] for k in (2, 3, 4, 5)) > 0
    with open(os.path.join(out, "final_metrics.json")) as f:
        assert json.load(f)["async/staleness"] == 1.0


def test_async_resume_mid_pipeline_is_exact(tmp_path):
    full, longer, resumed = str(tmp_path / "full"), str(tmp_path / "longer"), str(tmp_path / "resumed")
    run_main_forked(full, *ASYNC, *BASE)                                 # 4 steps, the reference
    run_main_forked(longer, *ASYNC, *BASE, "trainer.total_training_steps=6", "trainer.export_hf_on_end=false")
    step2 = os.path.join(longer, "checkpoints", "global_step_2")         # saved while batch 3 was generating
    with open(os.path.join(step2, "rollout", "versions.json")) as f:
        assert json.load(f) == {"versions": [1]}                         # the weights batch 3 is made with
    run_main_forked(resumed, *ASYNC, *BASE, f"trainer.resume_mode={step2}")
    ref, res = _steps(full), _steps(resumed)
    assert sorted(res) == [3, 4]                                         # nothing trained twice
    for s in (3, 4):
        keys = [k for k in ref[s] if not k.startswith(NOT_COMPARED)]
        for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "async/staleness",
                  "rollout_corr/is_weight_mean"):
            assert k in keys and math.isfinite(ref[s][k]), (s, k)
        diff = {k: (ref[s][k], res[s].get(k)) for k in keys if ref[s][k] != res[s].get(k)}
        assert not diff, f"step {s} differs after resume: {diff}"
    assert ref[3]["async/staleness"] == 1.0
    assert_same_weights(full, resumed)
