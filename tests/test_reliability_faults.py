"""Faults during a real run (Ray + 2 DeepSpeed workers, CPU): a killed worker, SIGTERM to the driver, an I/O error
while saving. In every case the last committed checkpoint stays valid and ``trainer.resume_mode=auto`` continues."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import ROOT, SHORT, read_metrics

pytestmark = pytest.mark.slow

FAST = [a for a in SHORT if not a.startswith("trainer.total_training_steps")] + ["trainer.export_hf_on_end=false"]


def _start(out_dir, *overrides):
    log = open(os.path.join(os.path.dirname(out_dir), os.path.basename(out_dir) + ".log"), "w+")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"trainer.output_dir={out_dir}",
                             *overrides], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def _wait_for_step(proc, log, out_dir, step, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, _tail(log)
        path = os.path.join(out_dir, "metrics.jsonl")
        if os.path.exists(path) and any(r.get("step", 0) >= step and "actor/pg_loss" in r for r in read_metrics(out_dir)):
            return
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"step {step} not reached in {timeout} s\n{_tail(log)}")


def _tail(log, n=6000):
    log.flush()
    log.seek(0)
    return log.read()[-n:]


def _tracker(out_dir):
    root = os.path.join(out_dir, "checkpoints")
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        step = int(f.read())
    assert os.path.isfile(os.path.join(root, f"global_step_{step}", "data.pt"))
    return step


def test_killed_worker_fails_fast_naming_role_and_rank_then_resumes(tmp_path):
    out = str(tmp_path / "kill")
    proc, log = _start(out, "trainer.total_training_steps=40", "trainer.save_freq=2", *FAST)
    try:
        _wait_for_step(proc, log, out, 3)        # step 2 is committed
        pids = re.search(r"actor workers: rank 0 pid (\d+), rank 1 pid (\d+)", _tail(log, 10 ** 7))
        assert pids, _tail(log)
        t0 = time.monotonic()
        os.kill(int(pids.group(2)), signal.SIGKILL)   # a worker this test's run started
        rc = proc.wait(timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = _tail(log, 10 ** 7)
    assert rc != 0 and elapsed < 60, (rc, elapsed)
    assert re.search(r"Worker(?:Failure|Died): actor rank 1 died during \w+", text), text[-4000:]
    last = _tracker(out)
    assert last >= 2
    # the resume in a forked driver on the session's Ray (the killed run had its own Ray)
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
