"""Ctrl-C / SIGTERM of the driver at the awkward moments, without a run (tiny scripts in subprocesses, fakes).

A tester sent SIGTERM at 0.2 ... 8 s after ``python trainer/main.py`` started: inside ``import torch`` the exception
left torch half-initialised (an ``AttributeError``/``SystemError`` traceback or a segfault instead of the one line);
during ``ray.init`` Ray's own driver handler (``sys.exit(15)``) took over (exit 15, no line, the local Ray left
running, or ``Exception ignored ... SystemExit: 15`` and a run that trained to the end); Ray's C failure handler
printed a stack for SIGTERM. A SIGTERM to the whole process group mid-run (``timeout``, Slurm) killed Ray's
workers and the scoring processes under the step that was to finish: a traceback and exit 1, or a step trained on
scores that were errors, or scorer processes left running after the driver.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from tests.e2e_utils import ROOT
from trainer import interrupt


def _script(tmp_path, body: str, name: str = "case.py") -> str:
    path = tmp_path / name
    path.write_text(f"import os, signal, sys, time\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(body))
    return str(path)


def _python(path: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture
def driver_state(monkeypatch):
    """This (pytest) process as the driver, with a fresh state; its own signal handlers are left alone."""
    state = {**interrupt._STATE, "driver_pid": os.getpid(), "signum": None, "raised": False, "exiting": False,
             "held": False, "deferred": 0, "insist": False, "step": None, "stop_signal": None,
             "stop_step": None}
    monkeypatch.setattr(interrupt, "_STATE", state)
    monkeypatch.setattr(interrupt, "reinstall_handlers", lambda: None)
    return state


def test_a_signal_inside_an_import_is_raised_once_the_import_is_done(tmp_path):
    (tmp_path / "slowmod.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\nx = sum(range(3_000_000))\n"
        "time.sleep(0.3)\nDONE = True\n")
    path = _script(tmp_path, f"""
        sys.path.insert(0, {str(tmp_path)!r})
        from trainer.interrupt import RunInterrupted, install_handlers
        install_handlers()
        try:
            import slowmod
            time.sleep(10)  # the signal is raised here, after the import
            print("not interrupted")
        except RunInterrupted as exc:
            mod = sys.modules.get("slowmod")
            print("interrupted", exc.signum, getattr(mod, "DONE", False))
        """)
    out = _python(path)
    assert out.stdout.split() == ["interrupted", "15", "True"], out.stdout + out.stderr


def test_ray_init_keeps_the_drivers_handler_and_a_signal_stops_the_run_when_it_returns(tmp_path):
    """A fake ``ray.init`` does what Ray 2.60's does to the driver: installs a SIGTERM handler ``sys.exit(15)``
    through ``ray._private.utils.set_sigterm_handler``; SIGTERM arrives in the middle of it. Then (the same
    process, its state reset) a ``ray.init`` that hangs gets a second SIGTERM: that one does not wait."""
    path = _script(tmp_path, """
        import ray._private.utils as ray_utils
        from trainer import interrupt, placement
        from trainer.interrupt import RunInterrupted

        calls = []

        def fake_init(**kwargs):
            ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # ray/_private/worker.py
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # not interrupted: the signal waits for ray.init to return
            calls.append("finished")

        placement.ray.is_initialized = lambda: False
        placement.ray.init = fake_init
        interrupt.install_handlers()
        real = ray_utils.set_sigterm_handler
        try:
            placement.init_ray("cpu")
            print("no interrupt")
        except RunInterrupted as exc:
            ours = signal.getsignal(signal.SIGTERM) is interrupt._raise_interrupted
            print("interrupted", exc.signum, calls, ours, ray_utils.set_sigterm_handler is real)

        def hanging_init(**kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            calls.append("first waited")
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler insists
            time.sleep(5)
            calls.append("not interrupted")

        interrupt._STATE.update(signum=None, raised=False, insist=False)
        calls.clear()
        placement.ray.init = hanging_init
        t0 = time.monotonic()
        try:
            placement.init_ray("cpu")
        except RunInterrupted as exc:
            print("interrupted", exc.signum, calls, time.monotonic() - t0 < 3)
        """)
    out = _python(path)
    assert out.stdout.strip().splitlines() == ["interrupted 15 ['finished'] True True",
                                               "interrupted 15 ['first waited'] True"], out.stdout + out.stderr[-3000:]


def test_ray_init_guard_turns_off_the_installed_rays_handlers_and_starts_its_processes_in_a_new_session(
        driver_state):
    """The Ray that is installed still has what the guard relies on (a Ray upgrade that moved them fails here)."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    import ray._private.utils as ray_utils

    before = (ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER, services.ConsolePopen)
    with interrupt.ray_init_guard():
        assert ray_utils.set_sigterm_handler(lambda s, f: None) is None
        assert signal.getsignal(signal.SIGTERM) is not None
        assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True  # read when ray.init makes the core worker
        assert ray_utils.detect_fate_sharing_support()
        proc = services.ConsolePopen([sys.executable, "-c", "import os; print(os.getsid(0))"],
                                     stdout=subprocess.PIPE, text=True)
        sid = int(proc.communicate(timeout=30)[0])
        assert sid == proc.pid != os.getsid(0)  # a session of its own: a signal to our process group misses it
    assert (ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER,
            services.ConsolePopen) == before


def _fake_trainer(max_restarts: int = 0):
    from trainer.ppo_trainer import RayPPOTrainer

    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.trainer_cfg = SimpleNamespace(max_restarts=max_restarts)
    t.global_step, t._stop_requested, t.kl_ctrl = 0, False, None
    t.loader = SimpleNamespace(state_dict=lambda: {"epoch": 0, "position": 0})
    t.steps = []
    return t


def test_a_swallowed_interrupt_stops_fit_before_any_work(driver_state):
    # the handler's exception was dropped during start-up (Python ignores exceptions in finalizers): recorded only
    driver_state.update(signum=signal.SIGTERM, raised=True)
    t = _fake_trainer()
    t.last_step = lambda: pytest.fail("fit went on")
    with pytest.raises(interrupt.RunInterrupted) as exc:
        t.fit()
    assert exc.value.signum == signal.SIGTERM


def test_a_swallowed_interrupt_stops_the_loop_at_the_next_step(driver_state):
    t = _fake_trainer()

    def step(tracker, total):
        t.steps.append(t.global_step)
        if t.global_step == 2:  # a Ctrl-C whose exception was swallowed during step 2
            driver_state.update(signum=signal.SIGINT, raised=True)
        return {}

    t._step_with_saves = step
    with pytest.raises(interrupt.RunInterrupted) as exc:
        t._train_loop(SimpleNamespace(log=lambda *a, **k: None), 10, {})
    assert t.steps == [1, 2] and exc.value.step == 3 and exc.value.signum == signal.SIGINT


def test_workers_that_die_after_sigterm_asked_for_the_stop_are_not_restarted(driver_state):
    from trainer.placement import WorkerDied

    t = _fake_trainer(max_restarts=3)

    def step(tracker, total):
        t._on_sigterm(signal.SIGTERM, None)  # the process group got SIGTERM: the driver first, then its workers
        raise WorkerDied("actor rank 0 died during update_actor")

    t._driver_pid = os.getpid()
    t._step_with_saves = step
    with pytest.raises(WorkerDied):
        t._train_loop(SimpleNamespace(log=lambda *a, **k: None), 10, {})
    assert interrupt.stop_requested() == (signal.SIGTERM, 1)


_FAKE_LAUNCH = """
    import types
    CASE = sys.argv[-1]
    launch = types.ModuleType("trainer.launch")
    launch.prestart = lambda cfg: {}

    def run(cfg):
        if CASE == "sigterm_then_workers_died":
            from trainer.interrupt import request_stop
            request_stop(signal.SIGTERM, 3)  # the loop's handler: stop after step 3
            raise RuntimeError("actor rank 0 died during update_actor (ActorUnavailableError)")
        sys.exit(signal.SIGTERM)  # Ray's driver handler, had it been in force

    launch.run = run
    sys.modules["trainer.launch"] = launch
    sys.argv = [os.path.join(ROOT, "trainer", "main.py"), "trainer.output_dir=" + OUT]
    import runpy
    runpy.run_path(sys.argv[0], run_name="__main__")
    """


@pytest.mark.parametrize("case,line", [
    ("sigterm_then_workers_died", "interrupted at step 3; last checkpoint: none"),
    ("ray_sys_exit_15", "interrupted at step 0; last checkpoint: none"),
])
def test_the_entry_point_ends_a_sigterm_in_one_line_and_exit_143(tmp_path, case, line):
    path = _script(tmp_path, f"ROOT, OUT = {ROOT!r}, {str(tmp_path / 'out')!r}\n" + textwrap.dedent(_FAKE_LAUNCH))
    out = subprocess.run([sys.executable, path, case], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 143, (out.returncode, out.stderr[-3000:])
    assert out.stderr.strip().splitlines()[-1] == line and "Traceback" not in out.stderr, out.stderr[-3000:]


_POOL = """
    import threading
    from rewards.pool import ScoringPool

    def slow(seconds):
        time.sleep(seconds)
        return 1.0

    signal.signal(signal.SIGTERM, lambda *a: None)  # the trainer's loop: SIGTERM means "finish the step"
    pool = ScoringPool(2, table={"slow": slow})
    pool.start()
    print(*[w.proc.pid for w in pool._workers], flush=True)
    print(*[r[0] for r in pool.run([("slow", (1.5,), {})] * 2, timeout_s=20)], flush=True)  # SIGTERM meanwhile
    threading.Thread(target=pool.run, args=([("slow", (60.0,), {})] * 2, 120), daemon=True).start()
    time.sleep(0.5)  # both workers busy for a minute
    if sys.argv[-1] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)
    """


@pytest.mark.parametrize("end", ["killed", "exit"])
def test_scorer_processes_outlive_a_group_sigterm_and_not_the_driver(tmp_path, end):
    psutil = pytest.importorskip("psutil")
    path = _script(tmp_path, _POOL)
    proc = subprocess.Popen([sys.executable, path, end], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)  # what `timeout` and `kill -TERM -PGID` do
        statuses = proc.stdout.readline().split()
        t0 = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 10  # a normal exit does not wait for the busy workers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert statuses == ["ok", "ok"], (statuses, proc.stderr.read()[-3000:])  # the scores of the step survived
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert left == [], f"scorer processes left after the driver ended ({end}): {left}"


def test_sighup_stops_the_driver_as_sigterm_unless_nohup_ignores_it(tmp_path):
    path = _script(tmp_path, """
        from trainer.interrupt import RunInterrupted, install_handlers, stop_handlers
        # as started from a terminal, or under nohup (whatever this test session was started under)
        signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv[1:] == ["nohup"] else signal.SIG_DFL)
        install_handlers()
        old = stop_handlers(signal.SIG_DFL)  # what the training loop's handler would take over
        print(sorted(signal.Signals(s).name for s in old))
        for s, handler in old.items():
            signal.signal(s, handler)
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.5)  # a handled signal interrupts this at once; an ignored one lets it run out
            print("not interrupted")
        except RunInterrupted as exc:
            print("interrupted by", signal.Signals(exc.signum).name)
        """)
    got = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert got.stdout.split("\n")[:2] == ["['SIGHUP', 'SIGTERM']", "interrupted by SIGHUP"], got.stdout + got.stderr
    got = subprocess.run([sys.executable, path, "nohup"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert got.stdout.split("\n")[:2] == ["['SIGTERM']", "not interrupted"], got.stdout + got.stderr
