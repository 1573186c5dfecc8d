"""What a run stopped by SIGTERM keeps. With the defaults (``save_freq=-1``) a SIGTERM threw the run's training
away (no checkpoint, no HF export) and the process exited 0, so a scheduler counted an unfinished job as done. Now
the step finishes, then a checkpoint is saved (``save_freq > 0``: the run can resume) or else the actor is exported
to ``hf_actor`` (``export_hf_on_end``), and ``trainer/main.py`` exits 143."""
from types import SimpleNamespace

import pytest

from trainer.ppo_trainer import RayPPOTrainer


def _trainer(tmp_path, stop: bool, save_freq: int, export: bool = True):
    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.trainer_cfg = SimpleNamespace(save_freq=save_freq, export_hf_on_end=export, output_dir=str(tmp_path),
                                    total_training_steps=10, total_epochs=1)
    t._stop_requested, t.global_step, t.stop_reason = stop, 3 if stop else 10, ""
    t.calls = []
    t.roles = SimpleNamespace(actor=SimpleNamespace(export_hf=lambda out: t.calls.append(("export", out))))
    t.save_checkpoint = lambda: t.calls.append(("save", t.global_step))
    return t


@pytest.mark.parametrize("stop,save_freq,export,calls", [
    (True, -1, True, ["export"]),     # no checkpoints: the export keeps the work
    (True, 2, True, ["save"]),        # checkpoints: save the step (resumable), no export
    (True, -1, False, []),            # nothing asked for
    (False, -1, True, ["export"]),    # the end of a run
    (False, 2, True, ["export"]),
])
def test_what_a_stopped_or_finished_run_keeps(tmp_path, stop, save_freq, export, calls):
    t = _trainer(tmp_path, stop, save_freq, export)
    last: dict = {}
    t._finish(last)
    assert [c[0] for c in t.calls] == calls
    assert last.get("_stopped_by_sigterm", False) is stop
    assert ("SIGTERM" in t.stop_reason) is stop
    if "export" in calls:
        assert last["hf_export_dir"] == str(tmp_path / "hf_actor")
