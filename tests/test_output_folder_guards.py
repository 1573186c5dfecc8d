"""What a run keeps of an output folder: a run that would write no model is warned at start, a second run into a
folder a live run holds is refused, ``trainer.val_only`` keeps the training run's ``final_metrics.json`` and a resume
from an older checkpoint sets the later timeline aside."""
import json
import logging
import os
import shutil

import pytest

from tests.e2e_utils import resolved_config
from trainer.run_folder import nothing_saved_warnings


def test_e01_a_run_that_writes_no_model_is_warned_at_start(caplog):
    with caplog.at_level(logging.WARNING):
        resolved_config("trainer.export_hf_on_end=false", "trainer.total_training_steps=2")
    lines = [r.getMessage() for r in caplog.records if "written nowhere" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("trainer.export_hf_on_end=false with trainer.save_freq=-1")


@pytest.mark.parametrize("trainer", [{"export_hf_on_end": True, "save_freq": -1},
                                     {"export_hf_on_end": False, "save_freq": 5},
                                     {"export_hf_on_end": False, "save_freq": -1, "export_hf_freq_s": 60},
                                     {"export_hf_on_end": False, "save_freq": 0, "val_only": True}])
def test_a_run_that_writes_a_model_or_trains_nothing_is_not_warned(trainer):
    assert nothing_saved_warnings(trainer) == []
    assert len(nothing_saved_warnings({**trainer, "export_hf_on_end": False, "save_freq": 0, "export_hf_freq_s": -1,
                                       "val_only": False})) == 1


def test_vo1_val_only_writes_its_own_file_and_keeps_final_metrics(tmp_path):
    from trainer.run_folder import FINAL_METRICS, VAL_ONLY_METRICS, write_final_metrics

    (tmp_path / FINAL_METRICS).write_text('{"actor/pg_loss": 0.5}')
    assert write_final_metrics(str(tmp_path), {"val/x/acc": 1.0}, trained=False, val_only=True)
    assert (tmp_path / FINAL_METRICS).read_text() == '{"actor/pg_loss": 0.5}'
    assert json.loads((tmp_path / VAL_ONLY_METRICS).read_text()) == {"val/x/acc": 1.0}


def test_vo1_a_val_only_resume_of_a_finished_run_keeps_its_final_metrics(saved, tmp_path):
    """The session's ``saved`` run (1 step, saved at step 1), validated again with ``trainer.val_only=true``."""
    from tests.e2e_utils import SHORT
    from tests.test_reliability_config import run_cli

    out = str(tmp_path / "run")
    shutil.copytree(saved, out)
    final = open(os.path.join(out, "final_metrics.json")).read()
    proc = run_cli(out, *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=1",
                   "trainer.save_freq=1", "trainer.export_hf_on_end=false", "trainer.val_only=true",
                   "trainer.resume_mode=auto", timeout=300, forked=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert open(os.path.join(out, "final_metrics.json")).read() == final
    got = json.loads(open(os.path.join(out, "val_only_metrics.json")).read())
    assert got and all(k.startswith("val/") for k in got)


def _holder(folder):
    """Another process that holds ``folder`` as a live run does (until killed)."""
    import subprocess
    import sys

    from tests.e2e_utils import ROOT

    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; from trainer.run_lock import hold_output_dir; "
                             "hold_output_dir(sys.argv[1]); print('held', flush=True); time.sleep(600)", folder],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_cc2_a_folder_a_live_run_holds_is_refused_and_a_dead_runs_lock_does_not_block(tmp_path, monkeypatch):
    from trainer import run_lock
    from trainer.config_checks import ConfigError

    monkeypatch.setattr(run_lock, "_held", {})
    folder = str(tmp_path / "out")
    other = _holder(folder)
    try:
        with pytest.raises(ConfigError) as info:
            run_lock.hold_output_dir(folder)
        assert str(info.value).startswith(f"trainer.output_dir={folder!r} is in use by another run (pid {other.pid})")
    finally:
        other.kill()
        other.wait()
    run_lock.hold_output_dir(folder)  # the lock file of a dead run is no obstacle
    run_lock.hold_output_dir(folder)  # nor is this process's own hold
    assert open(os.path.join(folder, run_lock.LOCK_FILE)).read().strip() == str(os.getpid())
    os.close(run_lock._held.pop(os.path.realpath(folder)))


def test_cc2_a_second_run_into_a_live_runs_folder_stops_in_one_line_and_moves_nothing(tmp_path):
    from tests.test_reliability_config import assert_one_line_error, run_cli

    out = str(tmp_path / "run")
    os.makedirs(os.path.join(out, "checkpoints", "global_step_3"))
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1}\n')
    other = _holder(out)
    try:
        proc = run_cli(out, "trainer.total_training_steps=2", forked=True)
    finally:
        other.kill()
        other.wait()
    assert_one_line_error(proc, f"trainer.output_dir={out!r} is in use by another run (pid {other.pid})")
    assert sorted(set(os.listdir(out)) - {"main.log"}) == [".run.lock", "checkpoints", "metrics.jsonl"]  # log: appended
    assert os.listdir(os.path.join(out, "checkpoints")) == ["global_step_3"]
