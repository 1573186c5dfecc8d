"""A resume restores the optimizer's settings from the checkpoint (DeepSpeed loads each param group's lr, betas and
weight_decay, and the LR scheduler its base rates), so a new value of those keys would be ignored. Found by trying
it: resuming with ``actor_rollout_ref.actor.optim.lr=1e-4`` trained on at the checkpoint's 5e-3 (``actor/lr``) without
a word. Now it stops before start-up naming the key and both values; the same settings resume."""
import json
import os

import pytest

from tests.test_reliability_checkpoint_files import _copy, _resume  # the checkpoint: tests/conftest.py's saved
from tests.test_reliability_config import assert_one_line_error

pytestmark = pytest.mark.slow
OPTIM = "actor_rollout_ref.actor.optim"


@pytest.mark.parametrize("override,needle", [
    (f"{OPTIM}.lr=1e-4", f"{OPTIM}.lr=0.0001 (checkpoint: 0.005)"),
    (f"{OPTIM}.betas=[0.9,0.95]", f"{OPTIM}.betas=[0.9, 0.95] (checkpoint: [0.9, 0.999])"),
    (f"{OPTIM}.weight_decay=0.1", f"{OPTIM}.weight_decay=0.1 (checkpoint: 0.0)"),
])
def test_an_optimizer_setting_the_resume_would_ignore_is_refused(saved, tmp_path, override, needle):
    out, _ = _copy(saved, tmp_path)
    assert_one_line_error(_resume(out, override), "trainer.resume_mode", needle, "would be ignored")


@pytest.mark.parametrize("override,needle", [
    ("deepspeed=zero3", "(actor) was saved with ZeRO stage 2 but this run trains with stage 3 (deepspeed.zero_stage); "
                        "resume with deepspeed=zero2"),
    ("deepspeed=zero1", "(actor) was saved with ZeRO stage 2 but this run trains with stage 1"),
    ("actor_rollout_ref.model.lora_rank=8", "(actor) was saved without LoRA adapters (every weight trained) but "
                                            "actor_rollout_ref.model.lora_rank=8"),
])
def test_a_resume_with_another_zero_stage_or_lora_setting_is_refused_before_the_workers(saved, tmp_path, override,
                                                                                        needle):
    """The worker's load refused these after the workers had started (exit 1, a traceback); the checkpoint's client
    state says the stage and LoRA setting it was saved with, so the check runs before start-up."""
    out, _ = _copy(saved, tmp_path)
    proc = _resume(out, override)
    assert_one_line_error(proc, "trainer.resume_mode", needle)
    assert "workers ready" not in proc.stdout + proc.stderr


def test_a_changed_data_order_on_resume_is_refused(saved, tmp_path):
    """The saved loader position counts batches of the checkpoint's row order: a new seed would repeat or skip rows."""
    out, _ = _copy(saved, tmp_path)
    assert_one_line_error(_resume(out, "data.seed=5"), "trainer.resume_mode", "data.seed=5 (checkpoint: 0)",
                          "rows would repeat or be skipped")


def test_the_same_settings_resume(saved, tmp_path):
    out, _ = _copy(saved, tmp_path)
    proc = _resume(out, f"{OPTIM}.lr=5e-3", f"{OPTIM}.lr_scheduler_type=constant")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "actor/lr" in r]
    assert steps[-1]["step"] == 2 and steps[-1]["actor/lr"] == pytest.approx(5e-3)
