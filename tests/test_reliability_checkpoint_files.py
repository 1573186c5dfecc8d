"""A checkpoint that is cut short or incomplete stops a resume (and ``tools/export_hf.py``) in one line naming the
file, before any worker starts; nothing saved is changed. Found by trying it: a truncated ``model_states.pt``, an
emptied DeepSpeed tag folder or a resume with the critic of ``algorithm=gae`` from a GRPO checkpoint started the
workers and died there with a traceback; a missing ``data.pt`` was reported only after the workers had started. A
deleted per-rank file (rank 1's optimizer shard: a 117-line traceback from the workers; rank 1's RNG file: "saved by 1
ranks") is named as missing before start-up, and ``resume_mode=auto`` steps back to the newest complete step."""
import logging
import os
import shutil
import subprocess
import sys

import pytest

from tests.e2e_utils import ROOT, SHORT
from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.checkpoint.base import write_tracker
from trainer.checkpoint.resume import resolve_resume_path
from trainer.checkpoint.verify import IncompleteCheckpoint, expected_files, verify_step_folder
from trainer.config_checks import ConfigError

pytestmark = pytest.mark.slow


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
                   "trainer.resume_mode=auto", "trainer.export_hf_on_end=false", *more, forked=True)


_SHARD1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt"   # DeepSpeed's ZeRO-2 optimizer shard of rank 1 (fp32 on CPU)


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
    (lambda step: os.remove(os.path.join(_tag_dir(step), _SHARD1)), f"global_step_1/{_SHARD1}' is missing"),
    (lambda step: os.remove(os.path.join(step, "actor", "rng_rank_1.pt")), "actor/rng_rank_1.pt' is missing"),
], ids=["truncated_model_states", "truncated_rng", "emptied_tag_folder", "no_trainer_state", "missing_optim_shard",
        "missing_rng_file"])
def test_a_damaged_checkpoint_stops_the_resume_in_one_line(saved, tmp_path, damage, needle):
    """With no earlier step to fall back to, ``resume_mode=auto`` refuses the damaged one naming the file."""
    out, step = _copy(saved, tmp_path)
    damage(step)
    before = sorted(os.listdir(step))
    proc = _resume(out)
    line = assert_one_line_error(proc, "trainer.resume_mode", needle)
    assert "but this run has" not in line               # a missing file is not a world-size mismatch
    assert sorted(os.listdir(step)) == before          # nothing saved was touched


def test_a_zero2_role_folder_of_2_ranks_needs_every_ranks_files(saved):
    role = os.path.join(saved, "checkpoints", "global_step_1", "actor")
    ranks, files = expected_files(role, "global_step_1")
    assert ranks == 2
    assert sorted(files) == sorted(["global_step_1/mp_rank_00_model_states.pt", "rng_rank_0.pt", "rng_rank_1.pt",
                                    "global_step_1/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                    f"global_step_1/{_SHARD1}"])
    assert all(os.path.isfile(os.path.join(role, f)) for f in files)


def test_every_file_of_the_last_rank_deleted_is_still_named_missing(saved, tmp_path):
    """With all of rank 1's files gone the names show one rank; the ranks of the run that saved it (its data.pt)
    still name rank 1's files as missing instead of a checkpoint "saved by 1 ranks"."""
    _, step = _copy(saved, tmp_path)
    os.remove(os.path.join(_tag_dir(step), _SHARD1))
    os.remove(os.path.join(step, "actor", "rng_rank_1.pt"))
    with pytest.raises(IncompleteCheckpoint) as info:
        verify_step_folder(step, ["actor"], 2)
    assert f"{os.path.join(_tag_dir(step), _SHARD1)!r} (and 1 more) is missing" in str(info.value)
    assert "saved by 2 ranks" in str(info.value) and "\n" not in str(info.value)


def _two_steps_newest_damaged(saved, tmp_path):
    """A copy of the run whose tracker names global_step_2 (a copy of step 1) with rank 1's optimizer shard deleted."""
    out, step1 = _copy(saved, tmp_path)
    root = os.path.dirname(step1)
    step2 = os.path.join(root, "global_step_2")
    shutil.copytree(step1, step2)
    os.remove(os.path.join(step2, "actor", "global_step_1", _SHARD1))
    write_tracker(root, 2)
    return out, root, step1, step2


def test_auto_resumes_from_the_newest_complete_step_and_an_explicit_path_is_refused(saved, tmp_path, caplog):
    from tests.test_launch_checks import _resume_cfg
    from trainer.config_preflight import resume_path
    from trainer.resume_checks import check_resume_checkpoint

    _, root, step1, step2 = _two_steps_newest_damaged(saved, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert resolve_resume_path("auto", root) == (step1, 1)
        assert resume_path({"trainer": {"resume_mode": "auto", "default_local_dir": root}}) == step1
    warnings = [r.getMessage() for r in caplog.records if "resume_mode=auto" in r.getMessage()]
    assert len(warnings) == 1, warnings              # once per run, though resolved several times
    assert f"{step2} is incomplete" in warnings[0] and _SHARD1 in warnings[0] and step1 in warnings[0]
    assert resolve_resume_path(step2, None) == (step2, 2)   # a path named explicitly is taken as named ...
    with pytest.raises(ConfigError) as info:                 # ... and refused before start-up
        check_resume_checkpoint(_resume_cfg(), step2)
    assert str(info.value).startswith(f"trainer.resume_mode: {os.path.join(step2, 'actor', 'global_step_1', _SHARD1)!r}"
                                      " is missing (the checkpoint is incomplete")


def test_auto_with_a_damaged_newest_step_trains_on_from_the_complete_one(saved, tmp_path):
    out, _, step1, step2 = _two_steps_newest_damaged(saved, tmp_path)
    proc = _resume(out)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert f"the newest checkpoint {step2} is incomplete" in text and _SHARD1 in text
    assert f"resumed from {step1} (step 1)" in text


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
    proc = run_cli(out, *SHORT, f"trainer.resume_mode={os.path.join(step, 'actor')}", forked=True)
    assert_one_line_error(proc, "is a role folder", f"{step!r}")
