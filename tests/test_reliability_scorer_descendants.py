"""Processes that a scorer starts (a subprocess in a session of its own, a daemon that re-parents itself) end with
the start-up probe (``trainer/reward_probe.py``) and the scoring workers (``rewards.pool.ScoringPool``) that ran the
scorer: when the probe ends or runs past its bound, when a worker runs past ``timeout_s`` or the pool closes, and
when the driver is killed (SIGKILL) while they run. Found by trying it: the probe killed only its process group and
the pool only its workers, so such processes kept running after the run ended."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.e2e_utils import ROOT, pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _gone_within(pids, seconds: float = 5.0) -> list[int]:
    """The pids of ``pids`` still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if pid_alive(p)]
    for p in left:  # do not leave them to the next test
        os.kill(p, signal.SIGKILL)
    return left


def _below(root: int) -> set[int]:
    """Every process below ``root`` (from the parent pids in /proc)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = set(), [root]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent and p not in found]
        found.update(kids)
        todo += kids
    return found


def _pids(path, n: int, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            words = open(path).read().split()
            if len(words) >= n:
                return [int(w) for w in words[:n]]
        time.sleep(0.02)
    raise AssertionError(f"no {n} pids in {path}")


def _escaping_scorer(pid_file: str, then: str):
    """A scorer that starts ``sleep 1000`` in a new session and a ``sleep 1000`` whose parent (a shell) has exited
    (re-parented away from the scorer), writes both pids, then returns 1.0 or hangs (``then``)."""
    def score(*args, **kwargs):
        child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        shell = subprocess.run(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"], capture_output=True,
                               text=True)
        with open(pid_file, "w") as f:
            f.write(f"{child.pid} {shell.stdout.strip()}")
        if then == "hang":
            while True:
                pass
        if then == "c_hang":  # C-level big-int arithmetic: no Python signal handler runs meanwhile
            return float(10 ** (10 ** 9) % 7)
        return 1.0

    return score


@pytest.mark.parametrize("then", ["return", "hang"])
def test_the_probe_leaves_no_process_that_its_scorer_started(tmp_path, then):
    from trainer.reward_probe import run_probe

    pid_file = str(tmp_path / "pids")
    status, _, _ = run_probe(_escaping_scorer(pid_file, then), (), {}, 1.0)
    assert status == ("ok" if then == "return" else "timeout")
    assert _gone_within(_pids(pid_file, 2)) == []


@pytest.mark.parametrize("then", ["return", "hang"])
def test_scoring_workers_leave_no_process_that_their_scorer_started(tmp_path, then):
    from rewards.pool import ScoringPool

    pid_file = str(tmp_path / "pids")
    pool = ScoringPool(1, table={"s": _escaping_scorer(pid_file, then)})
    try:
        out = pool.run([("s", (), {})], timeout_s=1.0)
        assert out[0][0] == ("ok" if then == "return" else "timeout")
        pids = _pids(pid_file, 2)
        if then == "return":
            assert all(map(pid_alive, pids))  # the worker lives on: so do they, until the pool closes
    finally:
        pool.close()
    assert _gone_within(pids) == []


_DRIVER = """
    import sys
    sys.path.insert(0, {root!r})
    from tests.test_reliability_scorer_descendants import _escaping_scorer
    score = _escaping_scorer({pid_file!r}, {then!r})
    if sys.argv[-1] == "probe":
        from trainer.reward_probe import run_probe
        run_probe(score, (), {{}}, 120.0)
    else:
        from rewards.pool import ScoringPool
        ScoringPool(1, table={{"s": score}}).run([("s", (), {{}})], timeout_s=120.0)
    """


@pytest.mark.parametrize("where,then", [("probe", "hang"), ("pool", "hang"), ("pool", "c_hang")])
def test_a_killed_driver_leaves_no_process_that_a_scorer_started(tmp_path, where, then):
    """The driver is SIGKILLed while the probe or a worker runs the scorer (a Python loop, or C code that holds the
    interpreter): the probe or worker and every process below it end within seconds."""
    pid_file = str(tmp_path / "pids")
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(_DRIVER.format(root=ROOT, pid_file=pid_file, then=then)))
    proc = subprocess.Popen([sys.executable, str(script), where], cwd=ROOT, start_new_session=True)
    try:
        pids = _pids(pid_file, 2)
        below = _below(proc.pid)  # the probe or worker, and what runs under it
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _gone_within(set(pids) | below) == []
