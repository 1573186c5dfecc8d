"""The start-up probe of the reward scorers (``trainer/reward_probe.py``) with a scorer that hangs on the empty
response. Found by trying it: the probe waited the whole ``reward_model.timeout_s`` in the driver and then started
the workers anyway; the run then spent ``timeout_s`` on every response (validation, then each step) before it
stopped, and the killed run's hung scoring processes stayed behind. Now the probe waits at most
``min(timeout_s, 60 s)`` in a forked process group, refuses the run in one line naming the scorer and the time, and
kills the group (the scorer's own subprocesses included)."""
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from tests.e2e_utils import pid_alive
from trainer.config_checks import ConfigError, check_reward_scorers

SIG = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"


class CharTokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(map(chr, r)) for r in rows]


def _datasets(*sources):
    return [SimpleNamespace(files=["train.jsonl"], rows=[{"data_source": s, "reward_model": {"ground_truth": "7"}}
                                                         for s in sources])]


def _load(tmp_path, body, name="my_reward.py"):
    from rewards.registry import load_custom_scorer

    path = tmp_path / name
    path.write_text(SIG + textwrap.indent(textwrap.dedent(body), "    "))
    return str(path), load_custom_scorer(str(path))


def test_the_probe_bound_is_timeout_s_or_60_s():
    from trainer.reward_probe import PROBE_BOUND_S, probe_bound

    assert PROBE_BOUND_S == 60.0
    assert probe_bound(10.0) == 10.0 and probe_bound(300) == 60.0 and probe_bound(0.5) == 0.5


def test_a_scorer_that_hangs_on_the_empty_response_is_refused_and_killed(tmp_path, monkeypatch):
    """A hung scorer with a large timeout_s is stopped at the probe's bound (not timeout_s), named with its file,
    function and the time in one line; its process group (a subprocess it started included) is killed."""
    import trainer.reward_probe as probe
    from rewards.manager import RewardManager

    monkeypatch.setattr(probe, "PROBE_BOUND_S", 0.5)
    pids = tmp_path / "pids"
    path, fn = _load(tmp_path, f"""
        import os, subprocess
        child = subprocess.Popen(["sleep", "120"])
        with open({str(pids)!r}, "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        while True:
            pass
        """)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(lambda: RewardManager(CharTokenizer(), scorer=fn, timeout_s=60.0, num_workers=0),
                             "data_source", _datasets("openai/gsm8k"))
    assert time.monotonic() - t0 < 20  # not timeout_s=60
    msg = str(info.value)
    assert "\n" not in msg and "compute_score" in msg and path in msg and "did not return within 0.5 s" in msg, msg
    assert "data_source='openai/gsm8k'" in msg and "reward_model.timeout_s=60" in msg
    scorer_pid, sleep_pid = map(int, pids.read_text().split())
    deadline = time.monotonic() + 5
    while (pid_alive(scorer_pid) or pid_alive(sleep_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(scorer_pid) and not pid_alive(sleep_pid)


def test_a_routed_scorer_that_hangs_is_named_by_its_data_source(monkeypatch):
    import trainer.reward_probe as probe
    from rewards.manager import RewardManager
    from rewards.registry import _REGISTRY, register_scorer

    def stuck(solution_str, ground_truth):
        time.sleep(60)
        return 1.0

    monkeypatch.setitem(_REGISTRY, "tests/stuck", stuck)
    register_scorer("tests/stuck", overwrite=True)(stuck)
    with pytest.raises(ConfigError, match=r"the scorer of data_source='tests/stuck' \(stuck of .*within 0\.3 s"):
        check_reward_scorers(lambda: RewardManager(CharTokenizer(), timeout_s=0.3, num_workers=0), "data_source",
                             _datasets("gsm8k", "tests/stuck"))
    monkeypatch.setattr(probe, "PROBE_BOUND_S", 0.3)  # a fixed scorer by name: named by reward_model.scorer
    with pytest.raises(ConfigError, match=r"reward_model.scorer=tests/stuck \(stuck of "):
        check_reward_scorers(lambda: RewardManager(CharTokenizer(), scorer="tests/stuck", num_workers=0),
                             "data_source", _datasets("gsm8k"))


def test_slow_raising_and_dying_scorers_pass_the_probe(tmp_path):
    """A scorer that returns within the bound passes; one that raises on the empty response, or whose process dies,
    is not judged (as before)."""
    from rewards.manager import RewardManager

    for name, body in {"slow": "import time\ntime.sleep(0.3)\nreturn 1.0\n",
                       "raises": "raise ValueError('no answer')\n",
                       "dies": "import os\nos._exit(3)\n"}.items():
        _, fn = _load(tmp_path, body, name=f"{name}.py")
        check_reward_scorers(lambda: RewardManager(CharTokenizer(), scorer=fn, num_workers=0), "data_source",
                             _datasets("gsm8k"))


def test_a_scorer_raising_keyboard_interrupt_on_the_empty_response_passes_the_probe_quietly(tmp_path, capfd):
    """``KeyboardInterrupt`` (a ``BaseException``) on the empty response is not judged, like an exception, and its
    probe process prints no traceback (it printed ``Process reward-probe: Traceback ...``)."""
    from rewards.manager import RewardManager

    _, fn = _load(tmp_path, "raise KeyboardInterrupt('oops')\n", name="kbint.py")
    check_reward_scorers(lambda: RewardManager(CharTokenizer(), scorer=fn, num_workers=0), "data_source",
                         _datasets("gsm8k"))
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "oops" not in out + err, err[-2000:]


def test_an_async_scorer_passes_the_probe_and_one_raising_on_the_empty_response_is_not_judged(tmp_path, capfd):
    """An ``async def compute_score`` was refused by the probe (``float() argument must be ... not 'coroutine'``)
    with a ``RuntimeWarning: coroutine ... was never awaited``; its coroutine is awaited now, and what it raises when
    awaited is not judged, as for a plain function."""
    from rewards.manager import RewardManager
    from rewards.registry import load_custom_scorer

    for name, body in {"async_ok": "return 1.0\n", "async_raises": "raise ValueError('no answer')\n"}.items():
        path = tmp_path / f"{name}.py"
        path.write_text("async " + SIG + textwrap.indent(body, "    "))
        fn = load_custom_scorer(str(path))
        check_reward_scorers(lambda: RewardManager(CharTokenizer(), scorer=fn, num_workers=0), "data_source",
                             _datasets("gsm8k"))
    assert "never awaited" not in "".join(capfd.readouterr())


def test_a_hung_custom_reward_function_stops_main_before_workers(tmp_path):
    """End to end: one line naming the file, the function and the bound, before any worker; the probe's process is
    gone."""
    from tests.test_reliability_config import assert_one_line_error, run_cli

    path, pid_file = tmp_path / "hang.py", tmp_path / "probe.pid"
    path.write_text(SIG + f"    import os\n    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                    "    while True:\n        pass\n")
    t0 = time.monotonic()
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}", "reward_model.timeout_s=1",
                   timeout=120, forked=True)
    line = assert_one_line_error(proc, "compute_score", str(path), "did not return within 1 s")
    assert time.monotonic() - t0 < 60, line
    assert not pid_alive(int(pid_file.read_text()))


HANGS_AT_IMPORT = """import os, subprocess, time
print("imported")
child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
open({pid_file!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(10 ** 6)  # a blocking call at import (a network call without a timeout)
""" + SIG + "    return 1.0\n"


def _gone(pid_file) -> bool:
    deadline = time.monotonic() + 5
    pids = [int(p) for p in pid_file.read_text().split()]
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(pid_alive, pids))


def test_a_custom_file_whose_import_hangs_is_refused_in_one_line_and_killed(tmp_path):
    """The file's import is bounded like the scorer probe: one line naming the key, the file and the seconds; the
    importing process and what it started are killed."""
    from trainer.config_checks import custom_scorer

    path, pid_file = tmp_path / "hangs.py", tmp_path / "pids"
    path.write_text(HANGS_AT_IMPORT.format(pid_file=str(pid_file)))
    cfg = {"reward_model": {"timeout_s": 0.5, "custom_reward_function": {"path": str(path)}}}
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        custom_scorer(cfg)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"reward_model.custom_reward_function.path={str(path)!r}: importing it "
                                              "did not finish in 0.5 s"), msg
    assert _gone(pid_file)


def test_a_custom_file_that_imports_slowly_within_the_bound_or_raises_keeps_its_behaviour(tmp_path, capfd):
    """A slow import within the bound loads (what it prints is printed once); one that raises is one line naming
    the file and the error, as before."""
    from trainer.config_checks import custom_scorer

    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('slow: imported')\ntime.sleep(0.5)\n" + SIG + "    return 1.0\n")
    fn = custom_scorer({"reward_model": {"timeout_s": 5.0, "custom_reward_function": {"path": str(slow)}}})
    assert fn("d", "x", "7") == 1.0
    assert capfd.readouterr().out.count("slow: imported") == 1
    raises = tmp_path / "raises.py"
    raises.write_text("raise RuntimeError('no model here')\n" + SIG + "    return 1.0\n")
    with pytest.raises(ConfigError, match=r"^reward_model.custom_reward_function.path='.*raises.py': importing custom "
                                          r"reward file .* failed: RuntimeError\('no model here'\)$"):
        custom_scorer({"reward_model": {"timeout_s": 5.0, "custom_reward_function": {"path": str(raises)}}})


def test_a_custom_file_whose_import_hangs_stops_main_before_workers(tmp_path):
    """End to end (verl's key): one line naming the key, the file and the bound, before any worker; no process of
    the import is left; the note that reads verl's key is printed once."""
    from tests.test_reliability_config import assert_one_line_error, run_cli

    path, pid_file = tmp_path / "hangs.py", tmp_path / "pids"
    path.write_text(HANGS_AT_IMPORT.format(pid_file=str(pid_file)))
    t0 = time.monotonic()
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}", "reward_model.timeout_s=1",
                   timeout=120, forked=True)
    line = assert_one_line_error(proc, "reward_model.custom_reward_function.path=", str(path),
                                 "did not finish in 1 s")
    assert time.monotonic() - t0 < 60, line
    assert _gone(pid_file)
    out = proc.stdout + proc.stderr
    assert out.count(f"custom_reward_function.path={path}: read as") == 1, out[-3000:]


# a file that ends the process at import, only where it is not imported by the process ``{pid}`` (this test's)
ENDS_IN_PROBE = "import os, signal, sys\nif os.getpid() != {pid}:\n    {end}\n" + SIG + "    return 1.0\n"


@pytest.mark.parametrize("end,how", [
    ("sys.exit(0)", "sys.exit(0)"),
    ("sys.exit()", "sys.exit()"),
    ("raise SystemExit('bye')", "sys.exit('bye')"),
    ("os._exit(0)", "exit code 0 without a Python exception: os._exit(0), or exit() in C code"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt raised at import"),
])
def test_a_custom_file_whose_import_ends_the_process_is_refused_in_one_line(tmp_path, end, how):
    """Found by trying it: ``sys.exit(0)`` at the top of the reward file ended the run after start-up with exit 0,
    no message and nothing trained (the probe's process died: not judged; then the driver's own import ended the
    driver). The probe's import now judges a process that ended: one line naming the key, the file and how."""
    from trainer.config_checks import custom_scorer

    path = tmp_path / "ends.py"
    path.write_text(ENDS_IN_PROBE.format(pid=os.getpid(), end=end))
    with pytest.raises(ConfigError) as info:
        custom_scorer({"reward_model": {"timeout_s": 5.0, "custom_reward_function": {"path": str(path)}}})
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"reward_model.custom_reward_function.path={str(path)!r}: importing it "
                                              f"ended the process ({how}); "), msg


def test_the_drivers_import_that_raises_system_exit_is_refused_and_can_be_loaded_again(tmp_path):
    """Where only the driver's import ends the process (the file behaves otherwise in the probe), ``SystemExit`` is
    the same one line, and the half-imported module is not kept for a later load. A ``KeyboardInterrupt`` from the
    import is re-raised where it cannot be told from Ctrl-C (this process has Python's own SIGINT handler)."""
    from rewards.registry import ImportEndedError, load_custom_scorer
    from trainer.config_checks import custom_scorer

    path = tmp_path / "ends_in_driver.py"
    path.write_text(f"import os, sys\nif os.getpid() == {os.getpid()}:\n    sys.exit(3)\n" + SIG + "    return 1.0\n")
    cfg = {"reward_model": {"timeout_s": 5.0, "custom_reward_function": {"path": str(path)}}}
    with pytest.raises(ConfigError, match=r"^reward_model.custom_reward_function.path='.*': importing it ended the "
                                          r"process \(sys.exit\(3\)\); "):
        custom_scorer(cfg)
    with pytest.raises(ImportEndedError, match=r"ended the process \(sys.exit\(3\)\)"):
        load_custom_scorer(str(path))  # imported again, not the half-imported module
    path.write_text(f"import os\nif os.getpid() == {os.getpid()}:\n    raise KeyboardInterrupt\n" + SIG +
                    "    return 1.0\n")
    with pytest.raises(KeyboardInterrupt):
        custom_scorer(cfg)
    path.write_text(SIG + "    return 2.0\n")
    assert custom_scorer(cfg)("d", "x", "7") == 2.0


_DRIVER_IMPORT = """
    from trainer.config_checks import ConfigError, custom_scorer
    from trainer.interrupt import install_handlers

    install_handlers()
    open(PATH, "w").write("import os, signal\\nif os.getpid() == %d:\\n    %s\\n    raise KeyboardInterrupt\\n"
                          "def compute_score(solution_str, ground_truth, extra_info=None):\\n    return 1.0\\n"
                          % (os.getpid(), sys.argv[-1]))
    outcome = None
    try:
        try:
            custom_scorer({"reward_model": {"timeout_s": 5.0, "custom_reward_function": {"path": PATH}}})
            outcome = "loaded"
        except ConfigError as exc:
            outcome = "error: " + str(exc)
        time.sleep(0.3)  # a signal recorded during the import is raised once it is done (at once)
    except KeyboardInterrupt as exc:
        outcome = outcome or "interrupted"
    print(outcome, flush=True)
    """


@pytest.mark.parametrize("before,outcome", [
    ("pass", "error: "),                                        # the file's own KeyboardInterrupt
    ("os.kill(os.getpid(), signal.SIGINT)", "interrupted"),     # Ctrl-C came during the import
])
def test_in_the_driver_a_keyboard_interrupt_the_file_raises_is_refused_and_ctrl_c_is_not(tmp_path, before, outcome):
    """Found by trying it: ``raise KeyboardInterrupt`` at import was reported as ``interrupted at step 0`` (exit 130).
    In the driver (its handlers in force, every signal recorded before anything is raised for it) a
    ``KeyboardInterrupt`` with no signal recorded is the file's: the one line; one while a Ctrl-C was recorded stops
    the run as Ctrl-C."""
    from tests.e2e_utils import ROOT

    path = tmp_path / "case.py"
    path.write_text(f"import os, signal, sys, time\nsys.path.insert(0, {ROOT!r})\nPATH = {str(tmp_path / 'r.py')!r}\n"
                    + textwrap.dedent(_DRIVER_IMPORT))
    out = subprocess.run([sys.executable, str(path), before], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(outcome), out.stdout + out.stderr[-3000:]
    if outcome.startswith("error"):
        assert "importing it ended the process (KeyboardInterrupt raised at import); " in out.stdout, out.stdout
