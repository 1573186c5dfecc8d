"""``trainer.resume_mode``'s allowed values (one line naming them) and ``resume_mode=auto`` over a damaged tracker or a
role folder without DeepSpeed's ``latest`` file (falls back to the newest complete step with a warning)."""

import logging
import os

import pytest

from trainer.checkpoint.base import TRACKER_FILE, save_trainer_state, step_dir, write_tracker
from trainer.checkpoint.resume import resolve_resume_path, resume_mode_problem
from trainer.config_checks import ConfigError


@pytest.mark.parametrize("value, hint", [("Auto", "did you mean 'auto'?"), ("DISABLE", "did you mean 'disable'?"),
                                         (True, ""), ("/x/y", ""), ("", "")])
def test_rm01_rm02_a_resume_mode_that_is_no_word_nor_step_path_is_one_line_naming_the_allowed_values(value, hint):
    line = resume_mode_problem(value)
    assert line.startswith(f"trainer.resume_mode={value!r}; expected auto, disable, resume_path") and "\n" not in line
    assert "global_step_<N>" in line and hint in line
    with pytest.raises(ValueError) as info:
        resolve_resume_path(value, None)
    assert str(info.value) == line


@pytest.mark.parametrize("value", ["auto", "disable", "resume_path", "/r/global_step_3", "ckpt/global_step_3/"])
def test_the_allowed_resume_modes_pass(value):
    assert resume_mode_problem(value) is None


def test_rm02_the_trainer_section_refuses_it_with_the_same_line():
    from tests.e2e_utils import resolved_config
    from trainer.config.trainer import TrainerConfig

    cfg = resolved_config("trainer.total_training_steps=2")
    cfg["trainer"]["resume_mode"] = True
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict(cfg["trainer"], "trainer")
    assert str(info.value) == resume_mode_problem(True)


def _deepspeed_like_save(root, step, latest=True):
    """A step folder that passes the completeness check without ranks' files: ``data.pt`` and ``actor/latest``
    naming a tag folder with a model-states file (a torch archive)."""
    import torch

    d = step_dir(str(root), step)
    tag = os.path.join(d, "actor", f"global_step_{step}")
    os.makedirs(tag, exist_ok=True)
    torch.save({}, os.path.join(tag, "mp_rank_00_model_states.pt"))
    torch.save({}, os.path.join(d, "actor", "rng_rank_0.pt"))
    if latest:
        with open(os.path.join(d, "actor", "latest"), "w") as f:
            f.write(f"global_step_{step}")
    save_trainer_state(d, {"pos": step}, step, {})
    return d


@pytest.mark.parametrize("text", ["", "\n", "abc", "4.5"])
def test_r7_r4_an_empty_or_garbage_tracker_falls_back_to_the_newest_complete_step(tmp_path, caplog, text):
    for step in (1, 2):
        _deepspeed_like_save(tmp_path, step)
    (tmp_path / TRACKER_FILE).write_text(text)
    with caplog.at_level(logging.WARNING):
        assert resolve_resume_path("auto", str(tmp_path)) == (step_dir(str(tmp_path), 2), 2)
    assert TRACKER_FILE in caplog.text and repr(text.strip()) in caplog.text
    assert "using the newest complete checkpoint" in caplog.text and "global_step_2" in caplog.text


def test_r6_a_role_folder_without_latest_steps_back_to_the_newest_complete_step(tmp_path, caplog):
    first = _deepspeed_like_save(tmp_path, 1)
    newest = _deepspeed_like_save(tmp_path, 2, latest=False)
    write_tracker(str(tmp_path), 2)
    with caplog.at_level(logging.WARNING):
        assert resolve_resume_path("auto", str(tmp_path)) == (first, 1)
    assert f"{newest} is incomplete" in caplog.text and "neither a DeepSpeed (latest)" in caplog.text


def test_resume_from_path_with_resume_mode_auto_resolves_and_logs_no_resume_before_its_refusal(tmp_path, caplog):
    from trainer.config_preflight import resume_path

    t = {"resume_mode": "auto", "resume_from_path": str(tmp_path / "other" / "global_step_1"),
         "default_local_dir": str(tmp_path / "checkpoints")}
    with caplog.at_level(logging.INFO):
        assert resume_path({"trainer": t}) is None
    assert not [r for r in caplog.records if "training from scratch" in r.getMessage()]


def test_a_tracker_naming_a_missing_step_is_warned_once_however_often_the_checkpoint_is_looked_up(tmp_path, caplog):
    from trainer.checkpoint.base import find_latest_checkpoint

    root = str(tmp_path / "checkpoints")
    for step in (1, 2, 3):
        os.makedirs(step_dir(root, step))
        save_trainer_state(step_dir(root, step), None, step)
    write_tracker(root, 9)
    with caplog.at_level(logging.INFO):
        for _ in range(3):  # the config checks, the trainer and the failure line look it up
            assert find_latest_checkpoint(root) == step_dir(root, 3)
            resolve_resume_path("auto", str(tmp_path / "empty"))
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "names step 9" in m]) == 1, lines
    assert len([m for m in lines if "training from scratch" in m]) == 1, lines
