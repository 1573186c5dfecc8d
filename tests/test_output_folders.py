"""A run's output and checkpoint folders are checked for writing before any worker starts. Found by a tester:
``trainer.default_local_dir`` naming a regular file (or a path under /proc) trained every step, then died at the first
save with a ``NotADirectoryError`` (``FileNotFoundError``) traceback, and the trained weights were lost."""
import json
import os

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.config_checks import ConfigError
from trainer.config_preflight import _check_output_folders, check_writable_folder

EXPECTED = "expected a folder (new or existing) that checkpoints can be written to"


def _check(path):
    check_writable_folder("trainer.default_local_dir", str(path), "checkpoints")


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(r, n), folder) for r, ds, fs in os.walk(folder) for n in ds + fs)


def test_a_file_is_refused_naming_the_key_and_value(tmp_path):
    f = tmp_path / "bfile"
    f.write_text("x")
    with pytest.raises(ConfigError) as info:
        _check(f)
    assert str(info.value) == f"trainer.default_local_dir={str(f)!r} is a file; {EXPECTED}"


def test_a_path_under_a_file_names_the_file(tmp_path):
    f = tmp_path / "bfile"
    f.write_text("x")
    with pytest.raises(ConfigError) as info:
        _check(f / "a" / "b")
    assert str(info.value) == (f"trainer.default_local_dir={str(f / 'a' / 'b')!r} is under {str(f)!r}, which is a "
                               f"file; {EXPECTED}")
    assert _listing(tmp_path) == ["bfile"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_path_in_proc_cannot_be_written():
    with pytest.raises(ConfigError, match=r"^trainer.default_local_dir='/proc/bckpt' cannot be written \(in its "
                                          r"nearest existing folder '/proc'\): creating a folder there failed"):
        _check("/proc/bckpt")
    assert not os.path.exists("/proc/bckpt")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="cannot be written"):
            _check(ro)
        with pytest.raises(ConfigError, match=f"nearest existing folder {str(ro)!r}"):
            _check(ro / "new")
    finally:
        ro.chmod(0o755)
    assert os.listdir(ro) == []


def test_a_new_nested_path_or_an_existing_folder_passes_and_nothing_is_created(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep.txt").write_text("x")
    before = _listing(tmp_path)
    _check(tmp_path / "new" / "nested" / "checkpoints")
    _check(tmp_path / "old")
    _check(tmp_path / "old" / "sub")
    assert _listing(tmp_path) == before          # no folder made, no temporary folder left


def test_output_dir_is_checked_always_and_the_checkpoint_folder_only_when_the_run_saves(tmp_path):
    f = tmp_path / "bfile"
    f.write_text("x")
    ok = str(tmp_path / "out")

    def check(out, ckpt, save_freq):
        _check_output_folders({"trainer": {"output_dir": out, "default_local_dir": ckpt, "save_freq": save_freq}})

    check(ok, str(f), -1)                        # never saves: the checkpoint folder is not written
    with pytest.raises(ConfigError, match=r"^trainer.default_local_dir=.* is a file"):
        check(ok, str(f), 2)
    with pytest.raises(ConfigError) as info:     # the default checkpoint folder inside it is not reported again
        check(str(f), str(f / "checkpoints"), 2)
    assert str(info.value).startswith(f"trainer.output_dir={str(f)!r} is a file; expected a folder")
    assert "\n" not in str(info.value)


def test_an_unwritable_checkpoint_folder_stops_the_run_before_any_worker(tmp_path):
    """The tester's command, refused in one line before training instead of after it."""
    f = tmp_path / "bfile"
    f.write_text("x")
    out = tmp_path / "out"
    proc = run_cli(str(out), f"trainer.default_local_dir={f}", "trainer.save_freq=2", "trainer.total_training_steps=2",
                   forked=True)
    line = assert_one_line_error(proc, f"trainer.default_local_dir={str(f)!r} is a file", EXPECTED)
    assert line == f"error: trainer.default_local_dir={str(f)!r} is a file; {EXPECTED}"
    assert f.read_text() == "x"
    assert not os.path.exists(out / "init_model")   # nothing was built


def test_an_output_dir_that_is_a_file_is_one_line_not_hydras_traceback(tmp_path):
    """Hydra creates its run folder (trainer.output_dir) before the run's checks: a file there gave Hydra's
    FileExistsError traceback. The entry point checks a command-line output_dir before Hydra starts."""
    import subprocess
    import sys

    from tests.e2e_utils import ROOT

    target = tmp_path / "afile"
    target.write_text("x")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"trainer.output_dir={target}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == [f"error: trainer.output_dir={str(target)!r} is a file; expected a folder (new or existing) that "
                      "the run's metrics and exports can be written to"]
    assert target.read_text() == "x"


# ---- a fresh run into a folder an earlier run wrote to; a finished run run again ------------------------------------

def _checkpoint(root, step, complete=True):
    import torch

    folder = os.path.join(str(root), f"global_step_{step}")
    os.makedirs(os.path.join(folder, "actor"))
    if complete:
        torch.save({"global_step": step}, os.path.join(folder, "data.pt"))
    return folder


def test_a_fresh_run_sets_aside_the_earlier_runs_checkpoints_with_its_outputs(tmp_path, caplog):
    """Found by a tester: a fresh run set the earlier run's metrics aside but left its checkpoints, so a later
    ``resume_mode=auto`` resumed the OLD run's checkpoint and appended to the NEW run's metrics.jsonl. The
    checkpoints (complete or not, and the tracker) go to the same earlier_runs folder; nothing is lost and the
    earlier run still resumes from there."""
    from trainer.checkpoint.base import write_tracker
    from trainer.checkpoint.resume import resolve_resume_path
    from trainer.tracking import set_aside_earlier_run

    out, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    for step in (2, 4):
        _checkpoint(ckpt, step)
    _checkpoint(ckpt, 6, complete=False)               # a save cut short
    write_tracker(str(ckpt), 4)
    (out / "metrics.jsonl").write_text('{"step": 4}\n')
    assert resolve_resume_path("auto", str(ckpt))[1] == 4
    before = _listing(out)
    with caplog.at_level("WARNING"):
        dest = set_aside_earlier_run(str(out), str(ckpt))
    assert sorted(os.listdir(ckpt)) == [] and resolve_resume_path("auto", str(ckpt)) == (None, 0)
    assert _listing(dest) == sorted(p for p in before if p != "earlier_runs")   # every file kept, same layout
    assert resolve_resume_path(os.path.join(dest, "checkpoints", "global_step_4"), None)[1] == 4
    (line,) = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    assert f"held an earlier run's metrics.jsonl, checkpoints (steps 2..6 of {ckpt}, now in " in line
    assert f"moved to {dest}" in line


def test_checkpoints_in_the_output_folder_itself_or_outside_it(tmp_path):
    from trainer.tracking import set_aside_earlier_run

    out = tmp_path / "run"
    _checkpoint(out, 1)                                 # trainer.default_local_dir=trainer.output_dir
    (out / "keep.txt").write_text("x")
    dest = set_aside_earlier_run(str(out), str(out))
    assert sorted(os.listdir(dest)) == ["global_step_1"] and sorted(os.listdir(out)) == ["earlier_runs", "keep.txt"]
    other = _checkpoint(tmp_path / "elsewhere", 1)      # outside: never moved (preflight refuses that fresh run)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    dest = set_aside_earlier_run(str(out), str(tmp_path / "elsewhere"))
    assert sorted(os.listdir(dest)) == ["metrics.jsonl"] and os.path.isfile(os.path.join(other, "data.pt"))


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from tests.e2e_utils import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def test_the_earlier_run_is_set_aside_only_after_every_check_passed(tmp_path, monkeypatch):
    """Found by a tester: a config error found late (a scorer option no scorer takes, raised when the reward
    managers are built) stopped the run after the earlier run's outputs had been moved. They are moved once every
    check passed, the workers' placement last; the launch runs in this process up to there (no worker starts)."""
    from trainer.config_checks import ConfigError
    from trainer.launch import run
    from trainer.placement import PlacementError
    from trainer.ppo_trainer import RayPPOTrainer

    out = tmp_path / "run"
    _checkpoint(out / "checkpoints", 3)
    (out / "metrics.jsonl").write_text('{"step": 3}\n')
    (out / "final_metrics.json").write_text('{"step": 3}')
    earlier = _listing(out)
    with pytest.raises(ConfigError, match="scorer option 'bogus' is not taken"):
        run(_compose(f"trainer.output_dir={out}", "+reward_model.scorer_kwargs.bogus=1"))
    assert not os.path.exists(out / "earlier_runs") and set(earlier) <= set(_listing(out))

    def placement_fails(self):
        raise PlacementError("could not place 2 bundles")
    monkeypatch.setattr(RayPPOTrainer, "init_workers", placement_fails)
    with pytest.raises(PlacementError):
        run(_compose(f"trainer.output_dir={out}"))
    assert not os.path.exists(out / "earlier_runs") and set(earlier) <= set(_listing(out))

    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: None)
    monkeypatch.setattr(RayPPOTrainer, "fit", lambda self: {"new": 1.0})
    assert run(_compose(f"trainer.output_dir={out}")) == {"new": 1.0}
    (stamp,) = os.listdir(out / "earlier_runs")
    moved = _listing(out / "earlier_runs" / stamp)
    assert {"metrics.jsonl", "final_metrics.json", "checkpoints/global_step_3/data.pt"} <= set(moved)
    assert os.listdir(out / "checkpoints") == [] and (out / "final_metrics.json").read_text() == '{\n "new": 1.0\n}'


def test_final_metrics_are_kept_when_the_run_trained_no_step(tmp_path):
    """A resume with nothing left to train (the data used up at the first draw with dynamic sampling, a SIGTERM
    before the first step) rewrote final_metrics.json with the export path only: the finished run's are kept."""
    from trainer.launch import write_final_metrics

    path = tmp_path / "final_metrics.json"
    assert write_final_metrics(str(tmp_path), {"a": 1}, trained=False)        # none yet: written
    assert not write_final_metrics(str(tmp_path), {"hf_export_dir": "x"}, trained=False)
    assert json.loads(path.read_text()) == {"a": 1}
    assert write_final_metrics(str(tmp_path), {"a": 2}, trained=True)
    assert json.loads(path.read_text()) == {"a": 2}


def test_a_finished_run_resumed_again_is_complete_and_rewrites_nothing(saved, tmp_path, monkeypatch, capsys):
    """Found by a tester: ``resume_mode=auto`` on a run whose last checkpoint is its last step rewrote
    final_metrics.json with the export path only. Now it says the run is complete and exits 0 before any worker
    starts; nothing in the output folder changes (the session's ``saved`` run: 1 step, saved at step 1)."""
    import shutil

    from tests.e2e_utils import SHORT
    from trainer.launch import run
    from trainer.ppo_trainer import RayPPOTrainer

    out = str(tmp_path / "run")
    shutil.copytree(saved, out)
    with open(os.path.join(out, "final_metrics.json")) as f:
        final = f.read()
    files = {p: os.path.getmtime(os.path.join(out, p)) for p in _listing(out)   # the embedded task is written again
             if os.path.isfile(os.path.join(out, p)) and not p.startswith("data")
             and p != ".run.lock"}  # the folder's lock names the run that holds it

    def no_workers(self):
        raise AssertionError("a worker was started")
    monkeypatch.setattr(RayPPOTrainer, "init_workers", no_workers)
    summary = run(_compose(f"trainer.output_dir={out}", *[a for a in SHORT if "total_training_steps" not in a],
                           "trainer.total_training_steps=1", "trainer.resume_mode=auto", "trainer.save_freq=1"))
    assert summary == json.loads(final) and "actor/pg_loss" in summary
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("done: the run is already complete: ") and "is step 1 of 1, nothing left to train" in line
    with open(os.path.join(out, "final_metrics.json")) as f:
        assert f.read() == final
    assert {p: os.path.getmtime(os.path.join(out, p)) for p in files} == files and not os.path.exists(
        os.path.join(out, "earlier_runs"))


def test_a_resume_past_the_runs_length_is_refused_naming_both_steps(tmp_path, capsys):
    """Found by a tester: ``resume_mode=auto`` with ``trainer.total_training_steps=1`` on a run saved at step 2 said
    ``done: ... is step 2 of 1`` and exited 0, passing the 2-step run off as the 1-step run asked for. A resume
    cannot go back, so it is refused in one line (exit 2) naming the run's last step, its length keys and the
    checkpoint's step, before any worker; nothing in the output folder changes. At the last step it is done, as
    before."""
    from types import SimpleNamespace

    from trainer.launch import already_complete

    (tmp_path / "final_metrics.json").write_text('{"a": 1}')
    t = SimpleNamespace(total_training_steps=1, total_epochs=1)
    with pytest.raises(ConfigError) as info:
        already_complete(str(tmp_path), "/r/checkpoints/global_step_2", 2, 1, t)
    assert str(info.value) == (
        "trainer.resume_mode: the run ends at step 1 (trainer.total_training_steps=1, trainer.total_epochs=1), before "
        "the checkpoint it resumes: /r/checkpoints/global_step_2 is step 2, and a resume cannot go back to an earlier "
        "step; expected a run of at least 2 steps (2: the run is complete, nothing is trained), or "
        "trainer.resume_mode=disable for a new run of 1 steps (a fresh run sets the earlier run's outputs aside)")
    assert os.listdir(tmp_path) == ["final_metrics.json"] and capsys.readouterr().err == ""
    assert already_complete(str(tmp_path), "/r/checkpoints/global_step_2", 2, 2, t) == {"a": 1}
    assert "/r/checkpoints/global_step_2 is step 2 of 2, nothing left to train" in capsys.readouterr().err


def test_the_embedded_data_of_another_seed_waits_until_the_earlier_run_is_set_aside(tmp_path, monkeypatch):
    """Found by a tester: a fresh run of the embedded task with another ``data.seed`` rewrote the earlier run's
    ``data/train.jsonl`` and ``val.jsonl`` at start-up, though its other outputs were set aside. This run's rows wait
    in a temporary folder until every check has passed (a start that stops before leaves ``data/`` as it was); then
    the earlier rows go to ``earlier_runs/`` with that run's other outputs and this run's move into ``data/`` (the
    config's and the datasets' paths follow). The same seed's rows are kept as they are."""
    from types import SimpleNamespace

    from trainer import embedded
    from trainer.run_folder import settle_run_folder, write_embedded_data

    out = tmp_path / "run"
    names = ("train.jsonl", "val.jsonl")

    def write(folder, seed):
        return embedded.write_task(folder, train_rows=8, val_rows=2, seed=seed)

    assert write_embedded_data(write, str(out), 0) == tuple(str(out / "data" / n) for n in names)
    earlier = {n: (out / "data" / n).read_bytes() for n in names}
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    train, val = write_embedded_data(write, str(out), 1)   # another seed, its checks not passed yet
    assert {n: (out / "data" / n).read_bytes() for n in names} == earlier
    new = {n: open(p, "rb").read() for n, p in zip(names, (train, val))}
    assert new["train.jsonl"] != earlier["train.jsonl"]
    monkeypatch.chdir(tmp_path)                            # trainer.output_dir as the default gives it: relative
    cfg = {"trainer": {"output_dir": "run", "default_local_dir": "run/checkpoints"},
           "data": {"train_files": train, "val_files": val}}
    ds = SimpleNamespace(files=[train])
    settle_run_folder(cfg, True, [ds, None], {})
    (stamp,) = os.listdir(out / "earlier_runs")
    assert {n: (out / "earlier_runs" / stamp / "data" / n).read_bytes() for n in names} == earlier
    assert os.path.isfile(out / "earlier_runs" / stamp / "metrics.jsonl")
    assert {n: (out / "data" / n).read_bytes() for n in names} == new
    assert cfg["data"] == {"train_files": str(out / "data" / "train.jsonl"), "val_files": str(out / "data" / "val.jsonl")}
    assert ds.files == [cfg["data"]["train_files"]] and sorted(os.listdir(out)) == ["data", "earlier_runs"]
    mtime = os.path.getmtime(out / "data" / "train.jsonl")
    assert write_embedded_data(write, str(out), 1) == (cfg["data"]["train_files"], cfg["data"]["val_files"])
    settle_run_folder(cfg, True, [], {})                   # the same rows: kept, nothing set aside
    assert os.listdir(out / "earlier_runs") == [stamp] and os.path.getmtime(out / "data" / "train.jsonl") == mtime
    assert sorted(os.listdir(out)) == ["data", "earlier_runs"]


def test_a_resume_over_an_edited_generated_data_file_is_refused_and_keeps_the_file(tmp_path):
    """The embedded task's ``data/train.jsonl`` edited after the run wrote it was written over at a resume without a
    word (the generated rows moved in once the checks passed). Now the resume is refused in one line naming the file
    and the two ways on, as for a tiny model built from other settings; the edited file is kept, and pointing
    ``data.train_files`` / ``val_files`` at it resumes on it as it is."""
    from tests.test_init_model import _prepare
    from trainer.run_folder import settle_run_folder

    out = tmp_path / "run"
    settle_run_folder(_prepare(str(out)), True, [], {})
    data = out / "data"
    rows = (data / "train.jsonl").read_text().splitlines()
    edited = "\n".join([json.dumps({**json.loads(rows[0]), "prompt": [{"role": "user", "content": "1+1"}]}),
                        *rows[1:]]) + "\n"
    (data / "train.jsonl").write_text(edited)
    with pytest.raises(ConfigError) as info:
        settle_run_folder(_prepare(str(out), resuming=True), False, [], {})
    assert str(info.value) == (
        f"trainer.resume_mode: {data / 'train.jsonl'} differs from the rows the embedded task writes for data.seed=0 "
        "(edited since the run wrote it?), and the resume would write those rows over it; to resume on the files as "
        "they are (the resume's row checks compare them with the checkpoint's), set "
        f"data.train_files={data / 'train.jsonl'} data.val_files={data / 'val.jsonl'}; to have the "
        f"generated rows again, move the edited files out of {data}")
    assert (data / "train.jsonl").read_text() == edited and sorted(os.listdir(data)) == ["train.jsonl", "val.jsonl"]
    assert [n for n in os.listdir(out) if n.startswith(".data-")] == []
    cfg = _prepare(str(out), f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}",
                   resuming=True)
    settle_run_folder(cfg, False, [], {})
    assert (data / "train.jsonl").read_text() == edited and cfg["data"]["train_files"] == str(data / "train.jsonl")


def test_a_fresh_run_keeps_its_own_log_lines_and_sets_the_earlier_ones_aside(tmp_path):
    """Found by a tester: a fresh run appended its lines to the earlier run's ``main.log`` (Hydra's log of the run
    folder, opened in mode ``a``). The lines the log held when the run started go to ``earlier_runs/`` with that
    run's other outputs; this run's stay in ``main.log`` and its next lines follow them."""
    import logging

    from trainer.run_folder import log_sizes
    from trainer.tracking import set_aside_earlier_run

    out = tmp_path / "run"
    out.mkdir()
    (out / "main.log").write_text("the earlier run\n")
    handler = logging.FileHandler(str(out / "main.log"))
    root, log = logging.getLogger(), logging.getLogger("tests.run_log")
    root.addHandler(handler)
    try:
        sizes = log_sizes()
        log.warning("this run, before the earlier run is set aside")
        dest = set_aside_earlier_run(str(out), str(out / "checkpoints"), logs=sizes)
        log.warning("this run, after")
    finally:
        root.removeHandler(handler)
        handler.close()
    assert sizes[str(out / "main.log")] == len("the earlier run\n")
    assert open(os.path.join(dest, "main.log")).read() == "the earlier run\n"
    lines = (out / "main.log").read_text().splitlines()
    assert lines[0] == "this run, before the earlier run is set aside" and lines[-1] == "this run, after"
    assert len(lines) == 3 and "held an earlier run's main.log (the lines before this run's): moved to" in lines[1]


@pytest.mark.slow
def test_a_fresh_run_of_the_embedded_task_with_another_seed_sets_the_earlier_data_and_log_aside(tmp_path):
    """The tester's case end to end (``python trainer/main.py`` into the folder of an earlier run of the embedded
    task, with another ``data.seed``): the earlier run's ``data/*.jsonl`` and its ``main.log`` lines are in
    ``earlier_runs/`` as they were, ``data/`` holds this run's rows and ``main.log`` only this run's lines."""
    from tests.e2e_utils import SHORT
    from tests.test_reliability_config import run_cli
    from trainer.embedded_tool import embedded_task

    out, names = tmp_path / "run", ("train.jsonl", "val.jsonl")
    embedded_task("digits").write_task(str(out / "data"), 0)
    earlier = {n: (out / "data" / n).read_bytes() for n in names}
    embedded_task("digits").write_task(str(tmp_path / "seed1"), 1)
    (out / "main.log").write_text("[earlier] a line of the earlier run\n")
    (out / "metrics.jsonl").write_text('{"step": 2}\n')
    proc = run_cli(str(out), *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=1",
                   "data.seed=1", "trainer.export_hf_on_end=false", forked=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (stamp,) = os.listdir(out / "earlier_runs")
    dest = out / "earlier_runs" / stamp
    assert _listing(dest) == ["data", "data/train.jsonl", "data/val.jsonl", "main.log", "metrics.jsonl"]
    assert {n: (dest / "data" / n).read_bytes() for n in names} == earlier
    assert (dest / "main.log").read_text() == "[earlier] a line of the earlier run\n"
    assert {n: (out / "data" / n).read_bytes() for n in names} == {n: (tmp_path / "seed1" / n).read_bytes()
                                                                   for n in names}
    log = (out / "main.log").read_text()
    assert "[earlier]" not in log and "train rows: 2240" in log and "held an earlier run's" in log
    assert not [n for n in os.listdir(out) if n.startswith(".data-")]


def test_a_resume_with_a_filter_change_that_keeps_the_rows_goes_on(saved, tmp_path, monkeypatch, caplog):
    """The launch side of the row fingerprint deciding a filter key (``test_launch_checks.py::
    test_a_filter_key_change_that_keeps_the_rows_resumes_when_the_checkpoint_has_their_fingerprint``): the
    session's ``saved`` run (embedded task, prompts of 2 tokens, saved at its last step 1) resumed with a larger
    ``data.max_prompt_length`` and ``data.max_rows`` passes every check and is complete (it was refused before the
    rows were built)."""
    import shutil

    from tests.e2e_utils import SHORT
    from trainer.launch import run
    from trainer.ppo_trainer import RayPPOTrainer

    out = str(tmp_path / "run")
    shutil.copytree(saved, out)
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: pytest.fail("a worker was started"))
    with caplog.at_level("INFO", logger="trainer.resume_checks"):
        summary = run(_compose(f"trainer.output_dir={out}", *[a for a in SHORT if "total_training_steps" not in a],
                               "trainer.total_training_steps=1", "trainer.resume_mode=auto", "trainer.save_freq=1",
                               "data.max_prompt_length=32", "data.max_rows=100000"))
    assert "actor/pg_loss" in summary
    (note,) = [r.getMessage() for r in caplog.records if r.name == "trainer.resume_checks"]
    assert note.startswith("trainer.resume_mode: data.max_rows=100000 (checkpoint: None), data.max_prompt_length=32 "
                           "(checkpoint: 16): the same 2240 training rows as the checkpoint's")
