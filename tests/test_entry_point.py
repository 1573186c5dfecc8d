"""trainer/main.py under DeepSpeed's launcher: secondary local ranks exit at once; --local_rank is stripped."""
import os
import subprocess
import sys
import time

from tests.e2e_utils import ROOT

MAIN = os.path.join(ROOT, "trainer", "main.py")


def _run(args, env_extra=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    env.update(env_extra or {})
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, MAIN, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p, time.perf_counter() - t0


def test_secondary_local_rank_exits_zero_without_work():
    # DeepSpeed's launcher appends --local_rank=N; rank 1 must leave before importing torch or touching a GPU
    p, seconds = _run(["--local_rank=1", "trainer.total_training_steps=1"])
    assert p.returncode == 0 and p.stdout == "" and "error" not in p.stderr
    assert seconds < 10
    p, _ = _run(["trainer.total_training_steps=1"], env_extra={"LOCAL_RANK": "2"})
    assert p.returncode == 0 and p.stdout == ""


def test_local_rank_zero_is_the_driver_and_the_argument_is_stripped(tmp_path):
    from tests.e2e_shared import run_main_forked

    # rank 0 goes on to Hydra: with the launcher's argument stripped, the first error is the user's bad key (the
    # script forked from the session's pre-imported driver: its module-level code runs as in a new process)
    p = run_main_forked(str(tmp_path / "out"), "--local_rank=0", "trainer.no_such_key=1", check=False, timeout=120,
                        env={"LOCAL_RANK": None})
    assert p.returncode == 2
    assert "no_such_key" in p.stderr and "local_rank" not in p.stderr
