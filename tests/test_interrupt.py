"""Ctrl-C and SIGTERM of a real run (``python trainer/main.py``, embedded tiny task, Ray + 2 CPU workers).

Ctrl-C (SIGINT to the whole process group, as a terminal sends it) after the first step: one line
``interrupted at step N; last checkpoint: ...``, exit 130, no traceback, and none of the run's processes (Ray's GCS,
raylet, workers) left. SIGTERM during start-up: the same line, exit 143. SIGTERM during training: the step finishes,
a checkpoint is saved, exit 0, nothing left behind.
"""
import os
import re
import signal
import time

import pytest

from tests.e2e_utils import SHORT, MainRun

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.slow

ARGS = [a for a in SHORT if not a.startswith("trainer.total_training_steps")] + [
    "trainer.total_training_steps=200", "trainer.export_hf_on_end=false", "trainer.test_freq=-1"]


class Run(MainRun):
    def __init__(self, out_dir, *overrides):
        super().__init__(out_dir, *ARGS, *overrides)

    def descendants(self):
        return psutil.Process(self.proc.pid).children(recursive=True)


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append((p.pid, p.name()))
        except psutil.NoSuchProcess:
            pass
    return out


def _session_left(sid):
    left = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                left.append((p.pid, p.info["name"]))
        except (ProcessLookupError, psutil.Error):
            pass
    return left


def _one_line(text, pattern):
    lines = [ln for ln in text.splitlines() if ln.startswith("interrupted at step")]
    assert len(lines) == 1, text[-5000:]
    m = re.fullmatch(pattern, lines[0])
    assert m, lines[0]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-5000:]
    return m


def test_ctrl_c_prints_one_line_exits_130_and_leaves_no_ray_process(tmp_path):
    run = Run(str(tmp_path / "int"), "trainer.save_freq=1")
    run.wait_for(run.stepped, "the first step")
    procs = run.descendants()
    assert any("raylet" in p.name() for p in procs), [p.name() for p in procs]   # a local Ray under the driver
    t0 = time.monotonic()
    os.killpg(run.proc.pid, signal.SIGINT)       # what Ctrl-C in a terminal does
    rc = run.finish()
    assert rc == 130 and time.monotonic() - t0 < 60, (rc, run.text()[-3000:])
    m = _one_line(run.text(), r"interrupted at step (\d+); last checkpoint: (\S+)")
    step, ckpt = int(m.group(1)), m.group(2)
    assert step >= 1 and re.search(r"checkpoints/global_step_\d+$", ckpt) and os.path.isdir(ckpt), m.group(0)
    assert int(ckpt.rsplit("_", 1)[1]) in (step - 1, step)    # the step in progress, or the one before it
    assert _alive(procs) == [] and _session_left(run.proc.pid) == []


def test_sigterm_during_start_up_stops_at_once_with_exit_143(tmp_path):
    run = Run(str(tmp_path / "early"))
    run.wait_for(lambda: "actor workers: rank" in run.text(), "worker start-up")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGTERM)
    rc = run.finish()
    assert rc == 143, (rc, run.text()[-3000:])
    _one_line(run.text(), r"interrupted at step 0; last checkpoint: none")
    assert _alive(procs) == [] and _session_left(run.proc.pid) == []


_SIGTERM_RUN: dict = {}


def sigterm_during_training(tmp_path_factory) -> dict:
    """One run (``trainer.save_freq=100``, 200 steps) sent SIGTERM after its first step, made once per test session
    and shared with tests/test_reliability_faults.py: ``out`` (its output folder), ``rc``, ``text`` (its output),
    ``alive`` (its processes still running after it ended) and ``session_left`` (processes left in its session)."""
    if not _SIGTERM_RUN:
        run = Run(str(tmp_path_factory.mktemp("sigterm") / "term"), "trainer.save_freq=100")
        run.wait_for(run.stepped, "the first step")
        procs = run.descendants()
        run.proc.send_signal(signal.SIGTERM)
        rc = run.finish()
        _SIGTERM_RUN.update(out=run.out, rc=rc, text=run.text(), alive=_alive(procs),
                            session_left=_session_left(run.proc.pid))
    return _SIGTERM_RUN


def test_sigterm_during_training_finishes_the_step_saves_and_leaves_no_ray_process(tmp_path_factory):
    run = sigterm_during_training(tmp_path_factory)
    text = run["text"]
    assert run["rc"] == 143, text[-3000:]  # the run did not end: a scheduler must not count it as done
    m = re.search(r"done: step (\d+) of 200 \(stopped early by SIGTERM\)", text)
    assert m and os.path.isdir(os.path.join(run["out"], "checkpoints", f"global_step_{m.group(1)}")), text[-3000:]
    assert "Traceback" not in text
    assert run["alive"] == [] and run["session_left"] == []
