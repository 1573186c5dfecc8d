"""A checkpoint file damaged in place (bytes overwritten, same size: still a complete zip archive) is named before
the workers start (each member's CRC-32, recorded by ``torch.save``): an explicit resume from it is refused in one
line and ``resume_mode=auto`` steps back to the newest sound step. A step whose files are sound but hold NaN/inf
(saved so, e.g. with ``torch.save``'s CRC-32 off) stops the resume in one line naming the step folder, role, rank
and state, with the earlier step to resume from; nothing is written. Found by trying it: the resume loaded NaN
optimizer moments silently, step 3 saved non-finite weights as the newest checkpoint and moved the tracker to it,
step 4 died in the rollout with a traceback (``probability tensor contains either inf, nan or element < 0``)."""
import os
import shutil

import pytest
import torch

from tests.e2e_utils import SHORT
from tests.test_reliability_config import run_cli
from trainer.checkpoint.base import read_tracker, write_tracker

pytestmark = pytest.mark.slow

_SHARD1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt"


def _snapshot(root):
    """Every file under ``root`` with its size and modification time."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            out[os.path.join(folder, name)] = (st.st_size, st.st_mtime_ns)
    return out


def _all_finite(folder):
    from trainer.checkpoint.deepspeed_manager import load_deepspeed_file

    def walk(obj):
        if torch.is_tensor(obj):
            return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
        return all(walk(v) for v in items)

    files = [os.path.join(d, n) for d, _, ns in os.walk(folder) for n in ns if n.endswith("_states.pt")]
    return bool(files) and all(walk(load_deepspeed_file(f)) for f in files)


def test_bytes_overwritten_in_an_optimizer_shard_stop_the_resume_and_no_poisoned_step_is_saved(saved, tmp_path):
    from tests.test_checkpoint_finite import corrupt_exp_avg_sq

    out = str(tmp_path / "run")
    shutil.copytree(saved, out)
    root = os.path.join(out, "checkpoints")
    step1, step2 = os.path.join(root, "global_step_1"), os.path.join(root, "global_step_2")
    shutil.copytree(step1, step2)  # the newest step, whose data.pt still says step 1: the loader resumes there
    write_tracker(root, 2)
    shard = os.path.join(step2, "actor", "global_step_1", _SHARD1)
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:  # the fault as found: 4000 bytes of 0xff at offset 200000 (here: a file's middle)
        f.seek(200000 if size > 250000 else size // 2)
        f.write(b"\xff" * 4000)
    assert os.path.getsize(shard) == size
    before = _snapshot(root)
    common = [a for a in SHORT if "total_training_steps" not in a] + ["trainer.save_freq=1",
                                                                      "trainer.export_hf_on_end=false"]

    # named explicitly: refused before any worker, naming the file
    proc = run_cli(out, *common, "trainer.total_training_steps=3", f"trainer.resume_mode={step2}", forked=True)
    text = proc.stdout + proc.stderr
    errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert f"{shard!r} is damaged: its member " in errors[0] and "does not match the CRC-32" in errors[0], errors
    assert "actor workers:" not in text and _snapshot(root) == before and read_tracker(root) == 2

    # sound files holding NaN (the moments re-saved with a valid CRC-32): refused once the workers hold the state
    shutil.copy2(os.path.join(step1, "actor", "global_step_1", _SHARD1), shard)  # rank 1's shard sound again
    corrupt_exp_avg_sq(os.path.join(step2, "actor"))  # rank 0's moments NaN
    before = _snapshot(root)
    proc = run_cli(out, *common, "trainer.total_training_steps=3", "trainer.resume_mode=auto", forked=True)
    text = proc.stdout + proc.stderr
    errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert errors[0].startswith("error: actor rank 0: the checkpoint " + step2 + " holds non-finite values in its "), \
        errors
    assert errors[0].endswith(f"it is damaged: resume from an earlier step with trainer.resume_mode={step1}, or start "
                              "afresh with trainer.resume_mode=disable"), errors
    assert _snapshot(root) == before and read_tracker(root) == 2  # nothing written, nothing saved

    # bytes changed again (the CRC-32 no longer matches): auto steps back to step 1 by itself and trains on, and
    # the damaged step is written over with finite weights
    with open(shard, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 4000)
    proc = run_cli(out, *common, "trainer.total_training_steps=2", "trainer.resume_mode=auto", forked=True)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert f"the newest checkpoint {step2} is incomplete or damaged ({shard!r} is damaged" in text
    assert f"resumed from {step1} (step 1)" in text
    assert read_tracker(root) == 2 and _all_finite(os.path.join(step2, "actor"))
