"""The staging folders a run writes into ``trainer.output_dir`` before its checks pass (trainer/run_folder.py):
named after the driver's pid, and those of a driver that was killed outright are removed by the next start."""
import os
import subprocess
import sys

from trainer import run_folder


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_drivers_staging_folders_are_removed_and_a_live_ones_kept(tmp_path, caplog):
    dead = _dead_pid()
    stale = [tmp_path / f".data-{dead}-abc", tmp_path / f".init_model-{dead}-xyz"]
    for d in stale:
        (d / "init_model").mkdir(parents=True)
        (d / "init_model" / "config.json").write_text("{}")
    live = tmp_path / f".data-{os.getppid()}-keep"  # the test runner's parent: alive
    live.mkdir()
    other = [tmp_path / ".data-old", tmp_path / "data", tmp_path / f".cache-{dead}-x"]  # not staging folders
    for d in other:
        d.mkdir()
    caplog.set_level("INFO", logger="trainer.run_folder")
    removed = run_folder.remove_stale_staging(str(tmp_path))
    assert sorted(removed) == sorted(str(d) for d in stale)
    assert not any(d.exists() for d in stale)
    assert live.is_dir() and all(d.is_dir() for d in other)
    assert "removed 2 temporary folder(s) of an earlier start that was killed" in caplog.text
    assert run_folder.remove_stale_staging(str(tmp_path / "absent")) == []


def test_this_runs_staging_folders_carry_its_pid_and_sweep_the_dead_ones(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".init_model-{dead}-abc").mkdir()

    def write(folder, seed):
        paths = [os.path.join(folder, n) for n in run_folder.DATA_FILES]
        for p in paths:
            with open(p, "w") as f:
                f.write(f"{seed}\n")
        return paths

    os.makedirs(tmp_path / "data")
    (tmp_path / "data" / "train.jsonl").write_text("earlier run\n")  # other rows: this run's wait in staging
    train, _ = run_folder.write_embedded_data(write, str(tmp_path), seed=3)
    staged = os.path.basename(os.path.dirname(train))
    assert staged.startswith(f".data-{os.getpid()}-"), staged
    assert not (tmp_path / f".init_model-{dead}-abc").exists()
    run_folder._staged.pop(os.path.realpath(tmp_path)).cleanup()
