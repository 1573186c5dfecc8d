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


def test_cc2_a_checkpoint_folder_outside_the_output_folder_that_a_live_run_saves_to_is_refused(tmp_path, monkeypatch):
    import subprocess
    import sys

    from tests.e2e_utils import ROOT
    from trainer import run_lock
    from trainer.config_checks import ConfigError

    monkeypatch.setattr(run_lock, "_held", {})
    shared = str(tmp_path / "shared")
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from trainer.run_lock import hold_checkpoint_dir; "
                              "hold_checkpoint_dir(sys.argv[1], sys.argv[2]); print('held', flush=True); time.sleep(600)",
                              str(tmp_path / "first"), shared], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as info:
            run_lock.hold_checkpoint_dir(str(tmp_path / "second"), shared)
        assert str(info.value).startswith(f"trainer.default_local_dir={shared!r} is in use by another run "
                                          f"(pid {other.pid})") and "\n" not in str(info.value)
    finally:
        other.kill()
        other.wait()
    run_lock.hold_checkpoint_dir(str(tmp_path / "out"), str(tmp_path / "out" / "checkpoints"))  # the output lock's
    assert not os.path.exists(tmp_path / "out" / "checkpoints" / run_lock.LOCK_FILE)
    run_lock.hold_checkpoint_dir(str(tmp_path / "second"), shared)  # once the other run has ended
    os.close(run_lock._held.pop(os.path.realpath(shared)))


def test_a_checkpoint_folder_inside_this_output_folder_that_another_live_run_saves_to_is_refused(tmp_path,
                                                                                                   monkeypatch):
    """The other run has its own output folder and saves into this one's ``checkpoints`` (or a folder in it): this
    run's set-aside of earlier checkpoints would move its steps away."""
    import subprocess
    import sys

    from tests.e2e_utils import ROOT
    from trainer import run_lock
    from trainer.config_checks import ConfigError

    monkeypatch.setattr(run_lock, "_held", {})
    out = tmp_path / "out"
    for held in (out / "checkpoints", out / "checkpoints" / "sub"):
        other = subprocess.Popen([sys.executable, "-c", "import sys, time; from trainer.run_lock import "
                                  "hold_checkpoint_dir; hold_checkpoint_dir(sys.argv[1], sys.argv[2]); "
                                  "print('held', flush=True); time.sleep(600)", str(tmp_path / "first"), str(held)],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout.readline().strip() == "held"
            run_lock.hold_output_dir(str(out))  # the output folder itself is free
            for mine in (out / "checkpoints", out / "checkpoints" / "sub"):
                if held == out / "checkpoints" or mine == held:
                    with pytest.raises(ConfigError) as info:
                        run_lock.hold_checkpoint_dir(str(out), str(mine))
                    assert str(info.value).startswith(f"trainer.default_local_dir={str(mine)!r} is in use by another "
                                                      f"run (pid {other.pid})") and "\n" not in str(info.value)
                    assert (f"(its folder {str(held)!r})" in str(info.value)) == (mine != held)
                else:  # a sibling of the other run's folder inside this one's
                    run_lock.hold_checkpoint_dir(str(out), str(mine))
        finally:
            other.kill()
            other.wait()
        run_lock.hold_checkpoint_dir(str(out), str(held))  # once the other run has ended
        os.close(run_lock._held.pop(os.path.realpath(out)))


def test_cc2_a_second_run_into_a_live_runs_folder_stops_in_one_line_and_moves_nothing(tmp_path):
    from tests.test_reliability_config import assert_one_line_error, run_cli

    out = str(tmp_path / "run")
    os.makedirs(os.path.join(out, "checkpoints", "global_step_3"))
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1}\n')
    with open(os.path.join(out, "main.log"), "w") as f:
        f.write("the live run's line\n")
    other = _holder(out)
    try:  # data.val_files unused: a warning of the checks, which must not reach the live run's log
        proc = run_cli(out, "trainer.total_training_steps=2", "data.val_files=/no/val.parquet", forked=True)
    finally:
        other.kill()
        other.wait()
    assert_one_line_error(proc, f"trainer.output_dir={out!r} is in use by another run (pid {other.pid})")
    assert sorted(os.listdir(out)) == [".run.lock", "checkpoints", "main.log", "metrics.jsonl"]
    assert open(os.path.join(out, "main.log")).read() == "the live run's line\n"
    assert os.listdir(os.path.join(out, "checkpoints")) == ["global_step_3"]


def test_cc2_a_run_into_a_checkpoint_folder_a_live_run_has_saved_to_stops_in_one_line_naming_its_pid(tmp_path):
    """The live run's checkpoints are there already: the refusal names that run, not "an earlier run"."""
    import subprocess
    import sys

    from tests.e2e_utils import ROOT
    from tests.test_reliability_config import assert_one_line_error, run_cli

    shared = str(tmp_path / "shared")
    _fake_steps(shared, [1], 1)
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from trainer.run_lock import hold_checkpoint_dir; "
                              "hold_checkpoint_dir(sys.argv[1], sys.argv[2]); print('held', flush=True); time.sleep(600)",
                              str(tmp_path / "first"), shared], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        proc = run_cli(str(tmp_path / "second"), "trainer.total_training_steps=2", "trainer.save_freq=1",
                       f"trainer.default_local_dir={shared}", forked=True)
    finally:
        other.kill()
        other.wait()
    assert_one_line_error(proc, f"trainer.default_local_dir={shared!r} is in use by another run (pid {other.pid})")
    assert sorted(os.listdir(shared)) == [".run.lock", "global_step_1", "latest_checkpointed_iteration.txt"]


def _fake_steps(root, steps, tracker):
    from trainer.checkpoint.base import save_trainer_state, step_dir, write_tracker

    for s in steps:
        os.makedirs(os.path.join(step_dir(root, s), "actor"), exist_ok=True)
        save_trainer_state(step_dir(root, s), {}, s, {})
    write_tracker(root, tracker)


def _rows(path):
    return [json.loads(line)["step"] for line in open(path)]


def test_rb2_a_resume_from_an_older_step_sets_the_later_timeline_aside(tmp_path, caplog):
    from trainer.checkpoint.base import apply_retention, list_checkpoints, read_tracker
    from trainer.later_steps import set_aside_later_steps

    out, root = str(tmp_path), str(tmp_path / "checkpoints")
    _fake_steps(root, range(1, 9), 8)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 9)))
    (tmp_path / "final_metrics.json").write_text('{"step": 8}')
    os.makedirs(tmp_path / "hf_actor")
    (tmp_path / "hf_actor" / "config.json").write_text("{}")
    with caplog.at_level(logging.WARNING):
        dest = set_aside_later_steps(out, root, os.path.join(root, "global_step_2"))
    assert [s for s, _ in list_checkpoints(root)] == [1, 2] and read_tracker(root) == 2
    assert [s for s, _ in list_checkpoints(os.path.join(dest, "checkpoints"))] == list(range(3, 9))
    assert read_tracker(os.path.join(dest, "checkpoints")) == 8
    assert _rows(tmp_path / "metrics.jsonl") == [1, 2]
    assert _rows(os.path.join(dest, "metrics.jsonl")) == list(range(3, 9))
    assert sorted(os.listdir(dest)) == ["checkpoints", "final_metrics.json", "hf_actor", "metrics.jsonl"]
    assert not (tmp_path / "hf_actor").exists() and not (tmp_path / "final_metrics.json").exists()
    line = [r.getMessage() for r in caplog.records if "earlier timeline" in r.getMessage()]
    assert len(line) == 1 and "steps 3..8" in line[0] and "metrics.jsonl (6 rows after step 2)" in line[0]
    _fake_steps(root, [3], 3)  # the resumed run's next save, with max_actor_ckpt_to_keep=1
    apply_retention(root, 1)
    assert [s for s, _ in list_checkpoints(root)] == [3]
    assert [s for s, _ in list_checkpoints(os.path.join(dest, "checkpoints"))] == list(range(3, 9))
    assert set_aside_later_steps(out, root, os.path.join(root, "global_step_3")) is None  # an ordinary resume


def test_a_cut_short_last_metrics_line_is_named_damaged_and_moves_no_output_of_the_run(tmp_path, caplog):
    from trainer.checkpoint.base import list_checkpoints
    from trainer.later_steps import set_aside_later_steps

    out, root = str(tmp_path), str(tmp_path / "checkpoints")
    _fake_steps(root, range(1, 4), 3)
    full = "".join(json.dumps({"step": s, "actor/pg_loss": 0.5}) + "\n" for s in range(1, 4))
    (tmp_path / "metrics.jsonl").write_text(full[:-12])  # step 3's row cut short
    (tmp_path / "final_metrics.json").write_text('{"step": 3}')
    os.makedirs(tmp_path / "hf_actor")
    (tmp_path / "hf_actor" / "config.json").write_text("{}")
    with caplog.at_level(logging.WARNING):
        dest = set_aside_later_steps(out, root, os.path.join(root, "global_step_3"))
    lines = [r.getMessage() for r in caplog.records if "trainer.resume_mode" in r.getMessage()]
    assert len(lines) == 1 and "earlier timeline" not in lines[0] and "rows after" not in lines[0]
    assert "metrics.jsonl (1 damaged line (cut short" in lines[0] and "other outputs stay in place" in lines[0]
    assert (tmp_path / "final_metrics.json").exists() and (tmp_path / "hf_actor" / "config.json").exists()
    assert [s for s, _ in list_checkpoints(root)] == [1, 2, 3]
    assert _rows(tmp_path / "metrics.jsonl") == [1, 2]
    assert open(os.path.join(dest, "metrics.jsonl")).read() == full[:-12].splitlines(True)[-1] + "\n"
    assert sorted(os.listdir(dest)) == ["metrics.jsonl"]


def test_rb2_later_steps_outside_the_output_folder_are_refused_before_start(tmp_path):
    from trainer.later_steps import later_steps_problem

    import torch

    root = str(tmp_path / "elsewhere")
    _fake_steps(root, [1, 2, 3], 3)
    for s in (2, 3):  # sound later steps (a role folder with its checkpoint): a timeline to keep
        torch.save({}, os.path.join(root, f"global_step_{s}", "actor", "meta.pt"))
    line = later_steps_problem(str(tmp_path / "out"), root, 1)
    assert line.startswith("trainer.resume_mode: resuming from step 1, but trainer.default_local_dir=")
    assert "(2..3)" in line and later_steps_problem(str(tmp_path / "out"), root, 3) is None
    assert later_steps_problem(str(tmp_path), root, 1) is None  # inside the output folder: set aside instead


def test_rb2_a_run_resumed_from_an_older_checkpoint_keeps_the_later_ones(saved, tmp_path):
    """The session's ``saved`` run (step 1), with copies of its checkpoint as later steps 2 and 3 and their metrics
    rows, resumed from step 1 for a 2-step run: steps 2-3 and their rows go to earlier_runs/, the run saves its own
    step 2."""
    from tests.e2e_utils import SHORT
    from tests.test_reliability_config import run_cli
    from trainer.checkpoint.base import read_tracker, write_tracker

    out = str(tmp_path / "run")
    shutil.copytree(saved, out)
    root = os.path.join(out, "checkpoints")
    for s in (2, 3):
        shutil.copytree(os.path.join(root, "global_step_1"), os.path.join(root, f"global_step_{s}"))
    write_tracker(root, 3)
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write('{"step": 2, "old": 1}\n{"step": 3, "old": 1}\n')
    proc = run_cli(out, *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=2",
                   "trainer.save_freq=1", "trainer.export_hf_on_end=false",
                   f"trainer.resume_mode={os.path.join(root, 'global_step_1')}", timeout=300, forked=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (dest,) = os.listdir(os.path.join(out, "earlier_runs"))
    dest = os.path.join(out, "earlier_runs", dest)
    assert sorted(os.listdir(os.path.join(dest, "checkpoints"))) == ["global_step_2", "global_step_3",
                                                                      "latest_checkpointed_iteration.txt"]
    assert [json.loads(x) for x in open(os.path.join(dest, "metrics.jsonl"))] == [{"step": 2, "old": 1},
                                                                                  {"step": 3, "old": 1}]
    assert read_tracker(root) == 2 and sorted(os.listdir(root))[:2] == ["global_step_1", "global_step_2"]
    assert _rows(os.path.join(out, "metrics.jsonl")) == [1, 2] and "earlier timeline" in proc.stderr + proc.stdout


def test_cc2_a_folder_inside_a_live_runs_folder_is_refused_naming_that_run(tmp_path, monkeypatch):
    """A checkpoint or output folder placed inside another live run's output folder would mix the two runs' files:
    refused like the live run's folder itself; once that run has ended it is taken."""
    from trainer import run_lock
    from trainer.config_checks import ConfigError

    monkeypatch.setattr(run_lock, "_held", {})
    live = str(tmp_path / "live")
    inside = str(tmp_path / "live" / "deep" / "ckpt")
    other = _holder(live)
    try:
        with pytest.raises(ConfigError) as info:
            run_lock.hold_checkpoint_dir(str(tmp_path / "mine"), inside)
        assert str(info.value).startswith(f"trainer.default_local_dir={inside!r} lies inside {live!r}, the folder of "
                                          f"another run (pid {other.pid})") and "\n" not in str(info.value)
        with pytest.raises(ConfigError, match=r"trainer.output_dir=.* lies inside .*live"):
            run_lock.hold_output_dir(str(tmp_path / "live" / "sub"))
        assert not os.path.exists(tmp_path / "live" / "deep") and not os.path.exists(tmp_path / "live" / "sub")
    finally:
        other.kill()
        other.wait()
    run_lock.hold_checkpoint_dir(str(tmp_path / "mine"), inside)  # once the other run has ended
    os.close(run_lock._held.pop(os.path.realpath(inside)))
    run_lock.hold_output_dir(live)  # this process's own folder: a folder inside it is this run's to use
    run_lock.hold_output_dir(str(tmp_path / "live" / "sub"))
    for folder in (live, str(tmp_path / "live" / "sub")):
        os.close(run_lock._held.pop(os.path.realpath(folder)))
