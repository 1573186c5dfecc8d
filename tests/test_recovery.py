"""In-job recovery (``trainer.max_restarts``) of a real run (Ray + 2 CPU workers, embedded tiny task).

A worker process killed by PID mid-run with ``save_freq=1``: the driver re-creates the workers, loads the last
checkpoint and finishes with the same final step, one restart counted, every step's metrics exactly once, and
the data loader where the checkpoint left it (no batch trained twice). ``max_restarts=0`` keeps failing fast
(``test_reliability_faults.py::test_killed_worker_fails_fast_naming_role_and_rank_then_resumes``). The run is forked
from the session's pre-imported driver on its Ray instance (:class:`tests.e2e_shared.ForkedRun`).
"""
import os
import re
import signal

import pytest

from tests.e2e_shared import ForkedRun
from tests.e2e_utils import SHORT, read_metrics

pytestmark = pytest.mark.slow

STEPS = 6
ARGS = [a for a in SHORT if not a.startswith("trainer.total_training_steps")] + [
    f"trainer.total_training_steps={STEPS}", "trainer.export_hf_on_end=false", "trainer.save_freq=1"]


def test_killed_worker_is_restarted_from_the_last_checkpoint(tmp_path):
    run = ForkedRun(str(tmp_path / "rec"), *ARGS, "trainer.max_restarts=1")
    try:
        run.wait_for(lambda: run.stepped(2), "step 2")
        pids = re.search(r"actor workers: rank 0 pid (\d+), rank 1 pid (\d+)", run.text())
        os.kill(int(pids.group(2)), signal.SIGKILL)          # a worker this test's run started
        rc = run.finish(timeout=300)
    finally:
        run.kill()
    text = run.text()
    assert rc == 0, text[-5000:]
    rows = [r for r in read_metrics(run.out) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), [r["step"] for r in rows]
    assert rows[0]["trainer/restarts"] == 0.0 and rows[-1]["trainer/restarts"] == 1.0
    assert re.search(r"restart 1 of 1 after: actor rank 1 died during \w+", text), text[-5000:]
    m = re.search(r"restart 1 of 1: resumed from \S+global_step_(\d+) at step (\d+), data loader at epoch 0 "
                  r"after (\d+) batches", text)
    assert m and m.group(1) == m.group(2) == m.group(3) and int(m.group(1)) >= 2, text[-5000:]
    new = re.findall(r"actor workers: rank 0 pid (\d+), rank 1 pid (\d+)", text)
    assert len(new) == 2 and set(new[0]).isdisjoint(new[1])     # a new group of worker processes
    assert f"done: step {STEPS} of {STEPS}" in text


def test_max_restarts_must_be_a_non_negative_integer(tmp_path):
    from tests.test_reliability_config import assert_one_line_error, run_cli

    assert_one_line_error(run_cli(str(tmp_path / "out"), "trainer.max_restarts=-1", forked=True),
                          "trainer.max_restarts=-1")
