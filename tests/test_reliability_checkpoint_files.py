"""A checkpoint that is cut short or incomplete stops a resume (and ``tools/export_hf.py``) in one line naming the
file, before any worker starts; nothing saved is changed. Found by trying it: a truncated ``model_states.pt``, an
emptied DeepSpeed tag folder or a resume with the critic of ``algorithm=gae`` from a GRPO checkpoint started the
workers and died there with a traceback; a missing ``data.pt`` was reported only after the workers had started."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.e2e_utils import ROOT, SHORT
from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.checkpoint.verify import verify_step_folder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real run's output folder with the checkpoint of its step 1 (2 DeepSpeed ranks, ZeRO-2)."""
    out = str(tmp_path_factory.mktemp("ckpt") / "run")
    proc = run_cli(out, *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=1",
                   "trainer.save_freq=1", "trainer.export_hf_on_end=false", timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return out


def _copy(saved, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(saved, out)
    return out, os.path.join(out, "checkpoints", "global_step_1")


def _truncate(path):
    with open(path, "rb") as f:
        head = f.read(1000)
    with open(path, "wb") as f:
        f.write(head)


def _resume(out, *more):
    return run_cli(out, *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=2",
                   "trainer.resume_mode=auto", "trainer.export_hf_on_end=false", *more)


def _tag_dir(step):
    return os.path.join(step, "actor", "global_step_1")


def test_an_intact_checkpoint_passes(saved):
    verify_step_folder(os.path.join(saved, "checkpoints", "global_step_1"), ["actor"])


@pytest.mark.parametrize("damage,needle", [
    (lambda step: _truncate(os.path.join(_tag_dir(step), "mp_rank_00_model_states.pt")), "mp_rank_00_model_states.pt"),
    (lambda step: _truncate(os.path.join(step, "actor", "rng_rank_1.pt")), "rng_rank_1.pt"),
    (lambda step: [os.remove(os.path.join(_tag_dir(step), n)) for n in os.listdir(_tag_dir(step))],
     "no *model_states.pt"),
    (lambda step: os.remove(os.path.join(step, "data.pt")), "data.pt"),
], ids=["truncated_model_states", "truncated_rng", "emptied_tag_folder", "no_trainer_state"])
def test_a_damaged_checkpoint_stops_the_resume_in_one_line(saved, tmp_path, damage, needle):
    out, step = _copy(saved, tmp_path)
    damage(step)
    before = sorted(os.listdir(step))
    proc = _resume(out)
    assert_one_line_error(proc, "trainer.resume_mode", needle)
    assert sorted(os.listdir(step)) == before          # nothing saved was touched


def test_a_role_the_checkpoint_lacks_stops_the_resume_in_one_line(saved, tmp_path):
    out, _ = _copy(saved, tmp_path)
    proc = _resume(out, "algorithm=gae")
    assert_one_line_error(proc, "has no critic/ folder")


def _export(*args):
    env = {**os.environ, "PYTHONPATH": ""}
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_hf.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_export_of_a_damaged_checkpoint_or_to_a_file_is_one_line(saved, tmp_path):
    out, step = _copy(saved, tmp_path)
    role = os.path.join(step, "actor")
    target_file = tmp_path / "a_file"
    target_file.write_text("x")
    for args, needle in ((["--local_dir", role, "--target_dir", str(target_file)], "is a file"),
                         (["--local_dir", os.path.join(out, "checkpoints"), "--target_dir", str(tmp_path / "hf")],
                          "is the checkpoint root")):
        proc = _export(*args)
        assert_one_line_error(proc, needle)
    _truncate(os.path.join(_tag_dir(step), "mp_rank_00_model_states.pt"))
    proc = _export("--local_dir", role, "--target_dir", str(tmp_path / "hf"))
    assert_one_line_error(proc, "mp_rank_00_model_states.pt", "cut short")
    assert not os.path.exists(tmp_path / "hf")


def test_a_resume_at_another_world_size_stops_in_one_line(saved, tmp_path):
    """DeepSpeed restores its partitions only at the world size that saved them; the worker's own check raised a
    ValueError traceback after the workers had started."""
    out, _ = _copy(saved, tmp_path)
    proc = _resume(out, "trainer.n_gpus_per_node=1", "data.train_batch_size=8")
    assert_one_line_error(proc, "saved by 2 ranks but this run has 1")


def test_a_role_folder_named_for_resume_points_at_its_step_folder(saved, tmp_path):
    out, step = _copy(saved, tmp_path)
    proc = run_cli(out, *SHORT, f"trainer.resume_mode={os.path.join(step, 'actor')}")
    assert_one_line_error(proc, "is a role folder", f"{step!r}")
