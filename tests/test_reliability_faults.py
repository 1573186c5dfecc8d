"""Faults during a real run (Ray + 2 DeepSpeed workers, CPU): a killed worker, SIGTERM to the driver, an I/O error
while saving. In every case the last committed checkpoint stays valid and ``trainer.resume_mode=auto`` continues.
The killed-worker and I/O-error runs are forked from the session's pre-imported driver on its Ray instance
(:mod:`tests.e2e_shared`); the SIGTERM run (tests/test_interrupt.py) is a new process with its own Ray."""
import json
import os
import re
import signal
import time

import pytest

from tests.e2e_shared import ForkedRun, run_main_forked
from tests.e2e_utils import SHORT, read_metrics

pytestmark = pytest.mark.slow

FAST = [a for a in SHORT if not a.startswith("trainer.total_training_steps")] + ["trainer.export_hf_on_end=false"]


def _tracker(out_dir):
    root = os.path.join(out_dir, "checkpoints")
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        step = int(f.read())
    assert os.path.isfile(os.path.join(root, f"global_step_{step}", "data.pt"))
    return step


def test_killed_worker_fails_fast_naming_role_and_rank_then_resumes(tmp_path):
    out = str(tmp_path / "kill")
    run = ForkedRun(out, "trainer.total_training_steps=40", "trainer.save_freq=2", *FAST)
    try:
        run.wait_for(lambda: run.stepped(3), "step 3", timeout=240)        # step 2 is committed
        pids = re.search(r"actor workers: rank 0 pid (\d+), rank 1 pid (\d+)", run.text())
        assert pids, run.text()[-6000:]
        t0 = time.monotonic()
        os.kill(int(pids.group(2)), signal.SIGKILL)   # a worker this test's run started
        rc = run.finish(timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        run.kill()
    text = run.text()
    assert rc == 1 and elapsed < 60, (rc, elapsed, text[-4000:])
    # one line naming the role, rank and call, and the checkpoint to resume from (not the driver's traceback)
    line = re.search(r"^error: actor rank 1 died during \w+.*; last checkpoint: (\S+)$", text, re.M)
    assert line and "Error executing job" not in text, text[-4000:]
    last = _tracker(out)
    assert last >= 2 and line.group(1) == os.path.join(out, "checkpoints", f"global_step_{last}")
    # the resume
    run_main_forked(out, f"trainer.total_training_steps={last + 1}", "trainer.save_freq=2", "trainer.resume_mode=auto",
                    *FAST)
    steps = [r["step"] for r in read_metrics(out) if "actor/pg_loss" in r]
    assert steps[-1] == last + 1


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path_factory):
    from tests.test_interrupt import sigterm_during_training

    # the run of tests/test_interrupt.py (its own driver and Ray): 200 steps, save_freq=100, SIGTERM after step 1
    run = sigterm_during_training(tmp_path_factory)
    out = run["out"]
    assert run["rc"] == 143, run["text"][-6000:]
    last = max(r["step"] for r in read_metrics(out) if "actor/pg_loss" in r)
    assert _tracker(out) == last < 200             # saved although save_freq=100 was never reached
    assert not os.path.exists(os.path.join(out, "hf_actor"))
    with open(os.path.join(out, "final_metrics.json")) as f:
        assert json.load(f)["training/global_step"] == last


def test_io_error_during_save_keeps_previous_checkpoint(tmp_path):
    out = str(tmp_path / "io")
    root = os.path.join(out, "checkpoints")
    os.makedirs(root)
    with open(os.path.join(root, "global_step_4"), "w") as f:   # a FILE where step 4's folder must go
        f.write("not a folder")
    proc = run_main_forked(out, "trainer.total_training_steps=4", "trainer.save_freq=2", *FAST, check=False,
                           timeout=300)
    assert proc.returncode != 0
    assert re.search(r"actor rank \d raised in save_checkpoint", proc.stderr), proc.stderr[-4000:]
    assert _tracker(out) == 2                                   # the tracker still names the good checkpoint
    os.remove(os.path.join(root, "global_step_4"))
    run_main_forked(out, "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.resume_mode=auto", *FAST)
    assert _tracker(out) == 4
    assert [r["step"] for r in read_metrics(out) if "actor/pg_loss" in r][-2:] == [3, 4]
