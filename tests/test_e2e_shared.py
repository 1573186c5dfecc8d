"""The forked driver of :mod:`tests.e2e_shared`: a run's exit code and output come back as from a subprocess, and a
run over its timeout is killed without taking the driver with it."""
import pytest

from tests.e2e_shared import _CHILDREN, run_main_forked

pytestmark = pytest.mark.slow


def test_forked_run_reports_the_exit_code_and_output_and_a_timeout_kills_only_that_run(tmp_path):
    refused = run_main_forked(str(tmp_path / "bad"), "trainer.n_gpu_per_node=2", check=False, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "error: unknown config key 'trainer.n_gpu_per_node'" in refused.stderr
    driver = _CHILDREN["driver"].proc.pid
    # a run that cannot finish in 1 s: killed (SIGKILL) with its process group; the driver keeps serving
    slow = run_main_forked(str(tmp_path / "slow"), "trainer.total_training_steps=1", check=False, timeout=1)
    assert slow.returncode == -9
    again = run_main_forked(str(tmp_path / "again"), "trainer.n_gpu_per_node=2", check=False, timeout=120)
    assert again.returncode == 2 and _CHILDREN["driver"].proc.pid == driver
