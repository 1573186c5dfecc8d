"""A run's output and checkpoint folders are checked for writing before any worker starts. Found by a tester:
``trainer.default_local_dir`` naming a regular file (or a path under /proc) trained every step, then died at the first
save with a ``NotADirectoryError`` (``FileNotFoundError``) traceback, and the trained weights were lost."""
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
