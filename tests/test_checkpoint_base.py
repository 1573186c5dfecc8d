"""Tracker, numeric ordering, retention (P16), RNG capture/restore, trainer state and resume_mode parsing."""

import logging
import os
import random

import numpy as np
import pytest
import torch

from trainer.checkpoint import base
from trainer.checkpoint.base import (TRACKER_FILE, apply_retention, capture_rng_state, commit_checkpoint,
                                     find_latest_checkpoint, list_checkpoints, load_trainer_state, parse_step,
                                     read_tracker, restore_rng_state, save_trainer_state, step_dir,
                                     write_tracker)
from trainer.checkpoint.resume import resolve_resume_path


def _fake_save(root, step, complete=True):
    d = step_dir(str(root), step)
    os.makedirs(os.path.join(d, "actor"), exist_ok=True)
    if complete:
        save_trainer_state(d, {"pos": step}, step, {"lr": 1e-6})
    return d


def _steps(root):
    return [s for s, _ in list_checkpoints(str(root))]


def test_tracker_roundtrip_and_atomic(tmp_path):
    write_tracker(str(tmp_path), 7)
    assert (tmp_path / TRACKER_FILE).read_text() == "7\n"
    assert read_tracker(str(tmp_path)) == 7
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []  # no temp left behind
    with pytest.raises(ValueError, match="-1"):
        write_tracker(str(tmp_path), -1)
    (tmp_path / TRACKER_FILE).write_text("seven")
    with pytest.raises(ValueError, match="seven"):
        read_tracker(str(tmp_path))


def test_find_latest_missing_folder_warns(tmp_path, caplog):
    assert find_latest_checkpoint(str(tmp_path)) is None          # no tracker
    assert find_latest_checkpoint(str(tmp_path / "nope")) is None  # no root
    write_tracker(str(tmp_path), 3)
    with caplog.at_level(logging.WARNING):
        assert find_latest_checkpoint(str(tmp_path)) is None
    assert "global_step_3" in caplog.text
    _fake_save(tmp_path, 3)
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_3")


def test_find_latest_falls_back_to_newest_complete_folder(tmp_path, caplog):
    """A tracker naming a deleted folder, or a lost tracker, must not make resume_mode=auto train from scratch
    over existing checkpoints (found by a fresh-user test: global_step_2 was then overwritten)."""
    for step in (2, 10):
        _fake_save(tmp_path, step)
    os.makedirs(tmp_path / "global_step_11")                 # incomplete: no data.pt
    write_tracker(str(tmp_path), 12)                          # names a folder that is gone
    with caplog.at_level(logging.WARNING):
        assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_10")
    assert "global_step_12" in caplog.text and "global_step_10" in caplog.text
    os.remove(tmp_path / TRACKER_FILE)                        # no tracker at all
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_10")
    assert resolve_resume_path("auto", str(tmp_path)) == (str(tmp_path / "global_step_10"), 10)


def test_p16_numeric_order(tmp_path):
    for s in (10, 9, 2, 100, 1):
        _fake_save(tmp_path, s)
    os.makedirs(tmp_path / "global_step_11.tmp")
    os.makedirs(tmp_path / "global_step_x")
    assert _steps(tmp_path) == [1, 2, 9, 10, 100]
    write_tracker(str(tmp_path), 100)
    assert apply_retention(str(tmp_path), 2) == [str(tmp_path / f"global_step_{s}") for s in (1, 2, 9)]
    assert _steps(tmp_path) == [10, 100]  # lexical order would have kept 9 and dropped 10


def test_p16_retention_keep_1_2_0(tmp_path):
    r1, r2, r0 = tmp_path / "k1", tmp_path / "k2", tmp_path / "k0"
    for step in (1, 2, 3):
        for root, keep in ((r1, 1), (r2, 2), (r0, 0)):
            _fake_save(root, step)
            commit_checkpoint(str(root), step, keep)
    assert _steps(r1) == [3]
    assert _steps(r2) == [2, 3]
    assert _steps(r0) == [1, 2, 3]
    assert apply_retention(str(r0), None) == []


def test_p16_failed_save_keeps_previous(tmp_path, monkeypatch):
    _fake_save(tmp_path, 1)
    commit_checkpoint(str(tmp_path), 1, max_keep=1)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        _fake_save(tmp_path, 2)  # data.pt write fails -> step 2 incomplete
    monkeypatch.undo()
    assert not os.path.exists(tmp_path / "global_step_2" / "data.pt")
    assert [n for n in os.listdir(tmp_path / "global_step_2") if n.startswith(".tmp")] == []
    with pytest.raises(FileNotFoundError, match="data.pt"):
        commit_checkpoint(str(tmp_path), 2, max_keep=1)  # refuses to name an incomplete step
    assert read_tracker(str(tmp_path)) == 1
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_1")
    assert apply_retention(str(tmp_path), 1) == []  # never deletes the tracker's checkpoint
    assert load_trainer_state(str(tmp_path / "global_step_1"))["dataloader"] == {"pos": 1}
    # a later successful save cleans up the failed folder and the old one
    _fake_save(tmp_path, 2)
    _fake_save(tmp_path, 3)
    commit_checkpoint(str(tmp_path), 3, max_keep=1)
    assert _steps(tmp_path) == [3]


def test_retention_keeps_complete_over_incomplete(tmp_path):
    _fake_save(tmp_path, 1)
    _fake_save(tmp_path, 2, complete=False)  # crashed save
    _fake_save(tmp_path, 3)
    _fake_save(tmp_path, 4, complete=False)  # newer than the tracker: left alone
    commit_checkpoint(str(tmp_path), 3, max_keep=2)
    assert _steps(tmp_path) == [1, 3, 4]
    with pytest.raises(ValueError, match="-2"):
        apply_retention(str(tmp_path), -2)


def test_rng_capture_restore_weights_only(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # has_gauss / cached gaussian state
    state = capture_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    assert got[:3] == expected[:3]
    assert torch.equal(got[3], expected[3])
    with pytest.raises(KeyError, match="numpy"):
        restore_rng_state({"python": state["python"], "torch_cpu": state["torch_cpu"]})


def test_trainer_state_roundtrip(tmp_path):
    from omegaconf import OmegaConf

    d = step_dir(str(tmp_path), 12)
    cfg = OmegaConf.create({"trainer": {"total_epochs": 2}, "lr": "${trainer.total_epochs}"})
    dl = {"_sampler_iter_yielded": 24, "generator": torch.tensor([1, 2], dtype=torch.uint8)}
    save_trainer_state(d, dl, 12, cfg)
    st = load_trainer_state(d)
    assert st["global_step"] == 12 and st["config"] == {"trainer": {"total_epochs": 2}, "lr": 2}
    assert st["dataloader"]["_sampler_iter_yielded"] == 24
    assert torch.equal(st["dataloader"]["generator"], torch.tensor([1, 2], dtype=torch.uint8))
    with pytest.raises(ValueError, match="global_step=13"):
        save_trainer_state(d, None, 13, None)
    with pytest.raises(TypeError, match="object"):
        save_trainer_state(d, {"x": object()}, 12, None)
    with pytest.raises(FileNotFoundError, match="global_step_5"):
        load_trainer_state(step_dir(str(tmp_path), 5))


def test_resolve_resume_path(tmp_path):
    assert resolve_resume_path("disable", str(tmp_path)) == (None, 0)
    assert resolve_resume_path("auto", str(tmp_path)) == (None, 0)
    d = _fake_save(tmp_path, 20)
    commit_checkpoint(str(tmp_path), 20)
    assert resolve_resume_path("auto", str(tmp_path)) == (d, 20)
    assert resolve_resume_path(d, None) == (d, 20)
    assert resolve_resume_path(d + "/", None) == (d + "/", 20)
    with pytest.raises(ValueError, match="no_step_here"):
        resolve_resume_path(str(tmp_path / "no_step_here"), None)
    with pytest.raises(FileNotFoundError, match="global_step_21"):
        resolve_resume_path(str(tmp_path / "global_step_21"), None)
    with pytest.raises(ValueError, match="resume_mode"):
        resolve_resume_path("", None)
    assert parse_step("/a/global_step_5/actor") == 5
    assert base.parse_step("global_step_007") == 7
