"""Fixtures shared by several test modules."""
import pytest


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """A real run's output folder with the checkpoint of its step 1 (2 DeepSpeed ranks, ZeRO-2), made once per
    session for every module that damages or resumes a copy of it (tests/test_reliability_checkpoint_files.py,
    tests/test_reliability_resume_settings.py). Nothing may change it: copy it first."""
    from tests.e2e_utils import SHORT
    from tests.test_reliability_config import run_cli

    out = str(tmp_path_factory.mktemp("ckpt") / "run")
    proc = run_cli(out, *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=1",
                   "trainer.save_freq=1", "trainer.export_hf_on_end=false", timeout=300, forked=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return out
