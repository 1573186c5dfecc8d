"""A checkpoint file whose bytes changed after the save (same size, still a zip archive, values still finite) is
named before anything loads it: ``torch.save`` records each member's CRC-32 and ``torch.load`` does not check it.
Found by trying it: finite bytes written over an optimizer shard resumed silently with wrong moments."""
import logging
import os
import zipfile

import pytest
import torch

from tests.test_checkpoint_finite import dist_group, engine, save_two_steps  # noqa: F401 (the gloo group)
from trainer.checkpoint.base import step_dir
from trainer.checkpoint.resume import resolve_resume_path
from trainer.checkpoint.verify import IncompleteCheckpoint, damaged_member, verify_step_folder


def _overwrite_tensor_bytes(path, value=0x3F):
    """Overwrite 8 bytes inside the largest tensor member of the zip ``path``, in place (same size); the member's
    name."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        f.seek(info.header_offset + 30 + name_len + extra_len)
        old = f.read(8)
        f.seek(-8, os.SEEK_CUR)
        f.write(bytes([value]) * 8 if old != bytes([value]) * 8 else bytes([value + 1]) * 8)
    return info.filename


def _optim_file(role_dir):
    with open(os.path.join(role_dir, "latest")) as f:
        folder = os.path.join(role_dir, f.read().strip())
    return os.path.join(folder, next(n for n in sorted(os.listdir(folder)) if n.endswith("optim_states.pt")))


def test_finite_bytes_changed_in_a_shard_are_named_before_loading_and_auto_steps_back(tmp_path, caplog):
    root = str(tmp_path)
    save_two_steps(engine(2), root)
    step1, step2 = step_dir(root, 1), step_dir(root, 2)
    verify_step_folder(step2, ["actor"], 1)  # as saved: passes
    shard = _optim_file(os.path.join(step2, "actor"))
    size = os.path.getsize(shard)
    member = _overwrite_tensor_bytes(shard)
    assert os.path.getsize(shard) == size
    tensors = []  # torch itself loads it, every value finite

    def walk(obj):
        if torch.is_tensor(obj):
            tensors.append(obj)
        for value in obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ():
            walk(value)
    walk(torch.load(shard, weights_only=False))
    assert tensors and all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())
    assert damaged_member(shard) == member

    with pytest.raises(IncompleteCheckpoint) as err:
        verify_step_folder(step2, ["actor"], 1)
    assert str(err.value).startswith(f"{shard!r} is damaged: its member {member!r} does not match the CRC-32 "
                                     "recorded when it was saved (bytes changed since the save); use an earlier")
    with caplog.at_level(logging.WARNING):
        assert resolve_resume_path("auto", root) == (step1, 1)
    assert f"the newest checkpoint {step2} is incomplete or damaged ({shard!r} is damaged" in caplog.text


def test_a_member_saved_without_a_crc_is_not_judged_and_other_files_pass(tmp_path):
    from torch.utils.serialization import config

    path = str(tmp_path / "x.pt")
    torch.save({"w": torch.randn(64, 64)}, path)
    assert damaged_member(path) is None
    saved = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        torch.save({"w": torch.randn(64, 64)}, path)
    finally:
        config.save.compute_crc32 = saved
    _overwrite_tensor_bytes(path)
    assert damaged_member(path) is None  # no CRC-32 recorded (0): nothing to compare, the finite check is left
    torch.save({"w": torch.randn(64, 64)}, path)
    assert damaged_member(path) is None  # rewritten: read again (another size or modification time)
    member = _overwrite_tensor_bytes(path)
    os.utime(path, ns=(1, 1))
    assert damaged_member(path) == member


def test_a_damaged_newer_step_does_not_block_auto_in_a_checkpoint_folder_outside_the_output_folder(tmp_path):
    """``resume_mode=auto`` stepped back past the damaged step 2, then the later-steps check refused the resume for
    that same step ("holds checkpoints of later steps ... expected trainer.resume_mode=auto"), which it already was;
    and a damaged ``data.pt`` pickle was read by ``torch.load`` before its CRC-32 was checked (torch's advice to
    load it with ``weights_only=False`` in the line)."""
    from tests.test_checkpoint_finite import damage_pickle
    from trainer.later_steps import later_steps_problem

    root = str(tmp_path / "ck")
    save_two_steps(engine(0), root)
    step1, step2 = step_dir(root, 1), step_dir(root, 2)
    out = str(tmp_path / "out")
    assert "holds checkpoints of later steps (2..2)" in later_steps_problem(out, root, 1)  # a sound step 2: kept
    state = os.path.join(step2, "data.pt")
    damage_pickle(state)
    with pytest.raises(IncompleteCheckpoint) as err:
        verify_step_folder(step2, ["actor"], 1)
    assert str(err.value).startswith(f"{state!r} is damaged: its member ") and "weights_only" not in str(err.value)
    assert resolve_resume_path("auto", root) == (step1, 1)
    assert later_steps_problem(out, root, 1) is None  # the damaged step is no timeline: the resumed run saves over it
