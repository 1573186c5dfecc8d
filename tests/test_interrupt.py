"""Ctrl-C, SIGTERM and SIGHUP of a real run (``python trainer/main.py``, embedded tiny task, Ray + 2 CPU workers).

Ctrl-C (SIGINT to the whole process group, as a terminal sends it) after the first step: one line
``interrupted at step N; last checkpoint: ...``, exit 130, no traceback, and none of the run's processes (Ray's GCS,
raylet, workers) left. SIGTERM during start-up: the same line, exit 143. SIGTERM to the whole process group during
training (``timeout``, ``kill -TERM -PGID``), while the step's rewards are being scored: the step finishes with
every score (the scoring processes and Ray's workers do not die under it), a checkpoint is saved, exit 143, nothing
left behind. (That group signal used to kill Ray's workers and the scorers under the step: an ``ActorUnavailableError``
traceback and exit 1 in 1 of 4 tries, or a step trained on scores that were errors.)
"""
import os
import re
import signal
import time

import pytest

from tests.e2e_utils import SHORT, MainRun, read_metrics

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


@pytest.fixture(scope="module")
def stopped_in_start_up(saved, tmp_path_factory):
    """One fresh run (``resume_mode=disable``) sent SIGTERM during start-up (once its workers are up), made once for
    the two tests below: into a copy of a real run's output folder, whose checkpoints it had not set aside yet.
    ``out``, ``rc``, ``text``, ``earlier`` (the step folders before the run), ``alive`` (its processes still running
    after it ended) and ``session_left`` (processes left in its session)."""
    import shutil

    out = str(tmp_path_factory.mktemp("early") / "again")
    shutil.copytree(saved, out)  # an earlier run's output folder with its checkpoint of step 1 (tests/conftest.py)
    earlier = sorted(n for n in os.listdir(os.path.join(out, "checkpoints")) if n.startswith("global_step_"))
    assert earlier, os.listdir(os.path.join(out, "checkpoints"))
    run = Run(out, "trainer.resume_mode=disable")
    run.wait_for(lambda: "actor workers: rank" in run.text(), "worker start-up")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGTERM)
    rc = run.finish()
    return dict(out=out, rc=rc, text=run.text(), earlier=earlier, alive=_alive(procs),
                session_left=_session_left(run.proc.pid))


def test_sigterm_during_start_up_stops_at_once_with_exit_143(stopped_in_start_up):
    run = stopped_in_start_up
    assert run["rc"] == 143, (run["rc"], run["text"][-3000:])
    _one_line(run["text"], r"interrupted at step 0; last checkpoint: none")
    assert run["alive"] == [] and run["session_left"] == []


def test_a_fresh_run_stopped_during_start_up_names_none_of_the_earlier_runs_checkpoints(stopped_in_start_up):
    """A fresh run (``resume_mode=disable``) into a folder holding an earlier run's checkpoints, stopped before it
    set them aside: the line names no checkpoint (the earlier run's latest is not this run's), and they stay."""
    run = stopped_in_start_up
    out = run["out"]
    assert run["rc"] == 143, run["text"][-3000:]
    _one_line(run["text"], r"interrupted at step 0; last checkpoint: none")
    assert sorted(n for n in os.listdir(os.path.join(out, "checkpoints")) if n.startswith("global_step_")) == \
        run["earlier"]


_SIGTERM_RUN: dict = {}


# a custom reward that, once the test arms it, holds the scoring of the step until the test has sent its signal
_HOLDING_SCORER = """import os, time
HOLD = {hold!r}
def compute_score(solution_str, ground_truth, extra_info=None):
    if os.path.exists(os.path.join(HOLD, "armed")) and not os.path.exists(os.path.join(HOLD, "go")):
        open(os.path.join(HOLD, "held"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(HOLD, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
    return float(solution_str.strip() == str(ground_truth).strip())
"""


def sigterm_during_training(tmp_path_factory) -> dict:
    """One run (``trainer.save_freq=100``, 200 steps) whose process group was sent SIGTERM while the second step's
    rewards were being scored, made once per test session and shared with tests/test_reliability_faults.py: ``out``
    (its output folder), ``rc``, ``text`` (its output), ``alive`` (its processes still running after it ended) and
    ``session_left`` (processes left in its session)."""
    if not _SIGTERM_RUN:
        tmp = tmp_path_factory.mktemp("sigterm")
        hold = tmp / "hold"
        hold.mkdir()
        scorer = tmp / "holding_scorer.py"
        scorer.write_text(_HOLDING_SCORER.format(hold=str(hold)))
        run = Run(str(tmp / "term"), "trainer.save_freq=100", f"reward_model.custom_reward_function.path={scorer}")
        run.wait_for(run.stepped, "the first step")
        (hold / "armed").touch()
        run.wait_for(lambda: (hold / "held").exists(), "the second step's scoring")
        procs = run.descendants()
        os.killpg(run.proc.pid, signal.SIGTERM)  # the driver, its scoring processes (and, before, Ray's)
        time.sleep(1.0)  # every process of the group has taken the signal
        (hold / "go").touch()
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
    last = read_metrics(run["out"])[-1]
    assert last["step"] == int(m.group(1)) and last["reward/num_errors"] == 0, last  # every score of the step
    assert run["alive"] == [] and run["session_left"] == []


def test_sighup_during_training_finishes_the_step_saves_exits_129_and_leaves_no_ray_process(tmp_path):
    """SIGHUP (the terminal or ssh session closed) to the driver is taken as SIGTERM is: the step finishes, the
    checkpoint is saved, exit 129 (128 + SIGHUP), and no process of the run is left."""
    run = Run(str(tmp_path / "hup"), "trainer.save_freq=100")
    run.wait_for(run.stepped, "the first step")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGHUP)
    rc = run.finish()
    text = run.text()
    assert rc == 129, text[-3000:]
    m = re.search(r"done: step (\d+) of 200 \(stopped early by SIGHUP\)", text)
    assert m and os.path.isdir(os.path.join(run.out, "checkpoints", f"global_step_{m.group(1)}")), text[-3000:]
    assert "Traceback" not in text and read_metrics(run.out)[-1]["step"] == int(m.group(1))
    assert _alive(procs) == [] and _session_left(run.proc.pid) == []


def test_ctrl_c_after_the_done_line_exits_0_and_does_not_report_an_interrupt(tmp_path):
    """Ctrl-C right after the run printed ``done: ...`` (its work complete and saved) landed in the shut-down of Ray
    and made the run exit 130 with ``interrupted at step N``; now the shut-down is cut short and the run exits 0."""
    run = MainRun(str(tmp_path / "done"), *SHORT, "trainer.export_hf_on_end=false", "trainer.test_freq=-1")
    deadline = time.monotonic() + 300
    while "done: step 2 of 2" not in run.text():
        assert run.proc.poll() is None and time.monotonic() < deadline, run.text()[-5000:]
        time.sleep(0.02)
    procs = psutil.Process(run.proc.pid).children(recursive=True)
    os.killpg(run.proc.pid, signal.SIGINT)       # what Ctrl-C in a terminal does
    rc = run.finish()
    text = run.text()
    assert rc == 0, (rc, text[-3000:])
    assert "interrupted at step" not in text and "Traceback" not in text, text[-3000:]
    assert _alive(procs) == [] and _session_left(run.proc.pid) == []
