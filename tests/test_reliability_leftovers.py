"""Processes that the driver of ``python trainer/main.py`` starts outside Ray (``trainer/leftovers.py``). Found by
trying it: a custom reward file that starts ``subprocess.Popen(["sleep", "4321"], start_new_session=True)`` at import
left ``sleep 4321`` running with parent pid 1 after the run ended (exit 0), and after a Ctrl-C during start-up; the
probe's copy was killed, the driver's own import's was not. The command line's process is now a child subreaper and
kills what is left below it at its exit, however the run ends; a program that calls the trainer in its own process
keeps its children.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.e2e_utils import ROOT, pid_alive

_PR_GET_CHILD_SUBREAPER = 37


def _kill(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# what a custom reward file may do at import: a process in a session of its own, and a double-forked daemon
# (its parent exits at once: it is re-parented); both write their pid to PIDS and run for 10 minutes
_STARTS = """
    import subprocess
    def start_processes(pids_file):
        devnull = os.open(os.devnull, os.O_RDWR)
        child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=devnull, stdout=devnull,
                                 stderr=devnull)
        with open(pids_file, "a") as f:
            f.write(f"{child.pid} ")
        first = os.fork()
        if first == 0:
            os.setsid()
            if os.fork() == 0:
                with open(pids_file, "a") as f:
                    f.write(f"{os.getpid()} ")
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.execvp("sleep", ["sleep", "600"])
            os._exit(0)
        os.waitpid(first, 0)
        deadline = time.monotonic() + 5
        while len(open(pids_file).read().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    """

_FAKE_LAUNCH = _STARTS + """
    import types
    CASE = sys.argv[-1]
    launch = types.ModuleType("trainer.launch")
    launch.prestart = lambda cfg: {}

    def run(cfg):
        start_processes(PIDS)
        if CASE == "config_error":
            raise FileNotFoundError("data.train_files='x.jsonl': no such file")
        if CASE in ("sigint", "sigterm"):
            os.kill(os.getpid(), signal.SIGINT if CASE == "sigint" else signal.SIGTERM)
            time.sleep(30)
        if CASE == "exception":
            raise RuntimeError("a bug")
        return {}

    launch.run = run
    sys.modules["trainer.launch"] = launch
    sys.argv = [os.path.join(ROOT, "trainer", "main.py"), "trainer.output_dir=" + OUT]
    import runpy
    runpy.run_path(sys.argv[0], run_name="__main__")
    """


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "case.py"
    path.write_text(f"import os, signal, sys, time\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("case,rc,last", [
    ("ok", 0, None),
    ("config_error", 2, "error: data.train_files='x.jsonl': no such file"),
    ("sigint", 130, "interrupted at step 0; last checkpoint: none"),   # Ctrl-C during start-up
    ("sigterm", 143, "interrupted at step 0; last checkpoint: none"),
    ("exception", 1, None),
])
def test_the_entry_point_kills_what_it_started_however_the_run_ends(tmp_path, case, rc, last):
    """A process in a session of its own and a double-forked daemon, started by the driver (a reward file's import
    does this), are gone when ``trainer/main.py`` exits, with the exit code and last line of that ending."""
    pids_file = tmp_path / "pids"
    path = _script(tmp_path, f"ROOT, OUT, PIDS = {ROOT!r}, {str(tmp_path / 'out')!r}, {str(pids_file)!r}\n"
                   + textwrap.dedent(_FAKE_LAUNCH))
    pids = []
    try:
        out = subprocess.run([sys.executable, path, case], cwd=ROOT, capture_output=True, text=True, timeout=120)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 2, pids
        assert out.returncode == rc, (out.returncode, out.stderr[-3000:])
        if last is not None:
            assert out.stderr.strip().splitlines()[-1] == last, out.stderr[-3000:]
        if case == "exception":  # Hydra's report of it
            assert "RuntimeError: a bug" in out.stderr, out.stderr[-3000:]
        left = [p for p in pids if pid_alive(p)]
        assert left == [], f"left running after the driver exited ({case}): {left}"
    finally:
        _kill(pids)


def _subreaper() -> int:
    value = ctypes.c_int(-1)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0)
    return value.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_importing_the_entry_point_leaves_the_callers_processes_alone(tmp_path):
    """``import trainer.main`` (a test, a program that calls the trainer) neither makes the caller a subreaper nor
    kills its children at its exit; a process forked from the command line's driver runs no kill at its exit."""
    pids_file = tmp_path / "pids"
    path = _script(tmp_path, textwrap.dedent(_STARTS) + textwrap.dedent(f"""
        import trainer.main
        from trainer import leftovers
        start_processes({str(pids_file)!r})
        print(leftovers._DRIVER["pid"], flush=True)
        """))
    pids = []
    try:
        out = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.split() == ["None"], out.stdout + out.stderr[-3000:]
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 2 and all(map(pid_alive, pids)), pids  # still there: not the caller's to lose
    finally:
        _kill(pids)
    from trainer import leftovers

    assert leftovers._DRIVER["pid"] is None and _subreaper() == 0
    leftovers._DRIVER["pid"] = -1  # the driver is another process: this one is a fork of it
    try:
        child = subprocess.Popen(["sleep", "60"])
        leftovers.end_descendants(reap_s=0.5)
        assert child.poll() is None
    finally:
        leftovers._DRIVER["pid"] = None
        child.kill()
        child.wait()


_ZOMBIES = """
    from rewards.process_tree import make_subreaper
    from trainer.reward_probe import run_probe

    def hangs(pids_file):
        start_processes(pids_file)
        time.sleep(60)

    assert make_subreaper()
    status, _, _ = run_probe(hangs, (PIDS,), {{}}, 2.0)
    me = str(os.getpid())
    zombies = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{{name}}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] == "Z":
            zombies.append(int(name))
    print(status, zombies, flush=True)
    """


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_a_subreaper_reaps_the_processes_it_kills_below_a_child(tmp_path):
    """In a subreaper (the driver), the processes killed below a probe or a scoring worker are re-parented to it when
    their parent dies: :func:`rewards.process_tree.kill_tree` reaps them, no zombie stays until the driver's exit."""
    pids_file = tmp_path / "pids"
    path = _script(tmp_path, f"PIDS = {str(pids_file)!r}\n" + textwrap.dedent(_STARTS)
                   + textwrap.dedent(_ZOMBIES.format()))
    pids = []
    try:
        out = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=60)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert out.returncode == 0 and out.stdout.split() == ["timeout", "[]"], out.stdout + out.stderr[-3000:]
        assert len(pids) == 2 and not any(map(pid_alive, pids)), pids
    finally:
        _kill(pids)


def test_a_run_forked_on_the_shared_ray_kills_what_it_started_and_leaves_the_cluster(tmp_path):
    """End to end, in a run forked from the pre-imported driver (``tests/e2e_shared.py``) that joins the session's
    Ray instance (``RAY_ADDRESS``): the reward file's processes (its import in the probe and in the driver) are gone
    after the run, which trained; the joined cluster's GCS and raylet, not below the run's driver, still run."""
    psutil = pytest.importorskip("psutil")
    from tests.e2e_shared import _CHILDREN, run_main_forked, shared_ray_env
    from tests.e2e_utils import SHORT

    pids_file = tmp_path / "pids"
    reward = tmp_path / "starts.py"
    reward.write_text("import os, time\n" + textwrap.dedent(_STARTS)
                      + f"start_processes({str(pids_file)!r})\n"
                      "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                      "    return 0.0\n")
    shared_ray_env()
    cluster = [p for p in psutil.Process(_CHILDREN["holder"].proc.pid).children()
               if any(n in " ".join(p.cmdline()) for n in ("gcs_server", "raylet"))]
    assert len(cluster) == 2, cluster
    pids = []
    try:
        proc = run_main_forked(str(tmp_path / "out"), *SHORT, "trainer.total_training_steps=1",
                               f"reward_model.custom_reward_function.path={reward}", timeout=300)
        assert "done: step 1 of 1" in proc.stdout + proc.stderr, proc.stderr[-3000:]
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 4, pids  # the probe's import and the driver's
        left = [p for p in pids if pid_alive(p)]
        assert left == [], f"left running after the run: {left}"
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in cluster), cluster
        shared_ray_env(idle_timeout_s=60)  # the session's Ray still answers
    finally:
        _kill(pids)


def test_a_forked_run_killed_at_its_timeout_takes_what_it_started_with_it(tmp_path):
    """``tests/e2e_shared.py`` kills a forked run that runs over its timeout: with every process below it (a subreaper,
    as the run is), not only its process group."""
    from tests.e2e_shared import _wait

    pids_file = tmp_path / "pids"
    path = _script(tmp_path, textwrap.dedent(_STARTS) + textwrap.dedent(f"""
        from rewards.process_tree import make_subreaper
        make_subreaper()
        start_processes({str(pids_file)!r})
        time.sleep(60)
        """))
    proc = subprocess.Popen([sys.executable, path], cwd=ROOT, start_new_session=True)
    pids = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (pids_file.exists() and len(pids_file.read_text().split()) == 2):
            time.sleep(0.05)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert _wait(proc.pid, 0.1) == (-signal.SIGKILL, True)
        deadline = time.monotonic() + 5
        while any(map(pid_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(pid_alive, pids)), pids
    finally:
        _kill([proc.pid, *pids])
