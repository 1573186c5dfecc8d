"""The python tool's sandbox against hostile code: every attempt is contained, answered with an error string, and
the trainer's process (this one) is unharmed. Tight limits keep the file well under a minute on 2 cores."""
from __future__ import annotations

import builtins
import os
import socket
import subprocess
import sys
import time

import pytest

from rollout.tools import ToolCall, run_tool_calls
from rollout.tools.python_tool import PythonTool
from rollout.tools.sandbox import (ISOLATION_LEVELS, SandboxLimits, _uid_processes, detect_isolation, isolation_rank,
                                   run_python)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVEL = detect_isolation()
STRONG = isolation_rank(LEVEL) >= isolation_rank("userns")
needs_ns = pytest.mark.skipif(not STRONG, reason=f"isolation here is {LEVEL!r}: no mount/network namespaces")
# both namespace levels where they work (root can also create user namespaces)
NS_LEVELS = [lv for lv in ("namespace", "userns") if STRONG and run_python("print(1)", isolation=lv).status == "ok"]


def _tool(level: str | None = None, wall: float = 2.0, **kw) -> PythonTool:
    tool = PythonTool(timeout_s=wall, cpu_s=2, memory_mb=512, max_processes=16, max_output_bytes=4096,
                      isolation=level, min_isolation="process", **kw)
    tool.check()
    return tool


def _run(code: str, tool: PythonTool):
    (out,) = run_tool_calls([ToolCall("python", {"code": code})], {"python": tool})
    return out


def _assert_error(out, *absent: str):
    assert out.status in ("error", "timeout") and out.text.startswith("Error:"), out
    for s in absent:
        assert s not in out.text


def _leftover(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


@pytest.fixture(params=NS_LEVELS or [LEVEL])
def tool(request):
    return _tool(request.param)


def test_plain_code_runs_and_prints(tool):
    out = _run("import math\nprint(math.factorial(30) * 123456789)", tool)
    assert out.status == "ok" and out.text.strip() == str(__import__("math").factorial(30) * 123456789)


@needs_ns
def test_reading_etc_passwd_and_the_repo_is_contained(tool):
    out = _run("print(open('/etc/passwd').read())", tool)
    _assert_error(out, "root:x:0:0")
    assert "FileNotFoundError" in out.text
    readme = os.path.join(REPO, "README.md")
    secret_line = open(readme, encoding="utf-8").readline().strip()
    out = _run(f"print(open({readme!r}).read())", tool)
    _assert_error(out, secret_line)
    out = _run(f"import os\nprint(os.listdir({REPO!r}))", tool)
    _assert_error(out, "rollout")
    out = _run("print(open('/proc/1/environ').read())", tool)  # no /proc: other processes' state is not visible
    _assert_error(out)


@needs_ns
def test_writing_outside_the_work_dir_is_contained(tool, tmp_path):
    target = tmp_path / "written_by_sandbox"
    out = _run(f"open({str(target)!r}, 'w').write('x')\nprint('wrote')", tool)
    _assert_error(out)
    assert not target.exists()
    out = _run(f"open({os.path.join(REPO, 'HACKED')!r}, 'w').write('x')", tool)
    _assert_error(out)
    assert not os.path.exists(os.path.join(REPO, "HACKED"))
    out = _run("open('/usr/evil', 'w').write('x')", tool)  # the system directories are read-only binds
    _assert_error(out)
    assert not os.path.exists("/usr/evil")


@needs_ns
def test_opening_a_socket_reaches_nothing(tool):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    try:
        out = _run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                   "s.sendall(b'stolen')\nprint('sent')", tool)
        _assert_error(out, "sent")
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()


def test_environment_secrets_are_not_visible(tool, monkeypatch):
    monkeypatch.setenv("DSRL_TEST_SECRET", "hunter2-secret-value")
    out = _run("import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ').read() "
               "if os.path.exists('/proc/self/environ') else '')", tool)
    assert out.status == "ok" and "hunter2-secret-value" not in out.text and "DSRL_TEST_SECRET" not in out.text


@pytest.mark.parametrize("code", ["import os\nwhile True:\n    os.fork()",
                                  "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                                  "        pass"])
def test_fork_bomb_is_contained(tool, code):
    t0 = time.monotonic()
    out = _run(code, tool)
    _assert_error(out)
    assert time.monotonic() - t0 < tool.limits.wall_s + 3
    if tool.isolation in ("namespace", "uid"):  # nothing of the call's uid is left
        assert not [u for u in range(1_900_000_000, 1_900_000_000 + 64) if _uid_processes(u)]


def test_infinite_loop_times_out(tool):
    t0 = time.monotonic()
    out = _run("while True:\n    pass", tool)
    assert out.status == "timeout" and out.text.startswith("Error:")
    assert time.monotonic() - t0 < tool.limits.wall_s + 3


@pytest.fixture(params=sorted(set(NS_LEVELS) | {"process"}))
def any_level_tool(request):
    return _tool(request.param)


def test_detached_daemon_is_killed(any_level_tool):
    """A child that leaves the session and outlives the program is killed with it, also without a PID namespace
    (the launcher is a child subreaper)."""
    tool = any_level_tool
    marker = f"dsrl-daemon-{os.getpid()}-{time.monotonic_ns()}"
    code = ("import os, sys\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
            "print('parent exits')")
    out = _run(code, tool)
    assert out.status == "ok" and "parent exits" in out.text
    deadline = time.monotonic() + 3
    while _leftover(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _leftover(marker)


def test_100mb_print_is_cut_at_the_byte_cap(tool):
    t0 = time.monotonic()
    out = _run("import sys\nsys.stdout.write('x' * 100_000_000)", tool)
    _assert_error(out)
    assert "more than 4096 bytes" in out.text and len(out.text) < 2000
    assert time.monotonic() - t0 < 5


def test_memory_and_file_size_limits(tool):
    _assert_error(_run("x = bytearray(2 * 2**30)", tool))
    _assert_error(_run("open('big', 'wb').write(b'0' * (64 << 20))", tool))


def test_model_code_never_runs_in_this_process(tool, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("exec/eval called in the trainer process")

    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "eval", refuse)
    out = _run("print(sum(range(10)))", tool)
    assert out.status == "ok" and out.text.strip() == "45"


def test_hostile_batch_leaves_the_rollout_going(tool):
    # the hostile calls get 4 s (the busy loop's timeout is all this test waits for); the benign call starts beside a
    # busy loop and a fork bomb on two loaded cores, so it gets its own tool with room to start (it is judged on its
    # answer, not on its speed)
    limits = dict(memory_mb=512, max_processes=16, max_output_bytes=4096, isolation=tool.isolation,
                  min_isolation="process")
    hostile = PythonTool(timeout_s=4.0, cpu_s=4, **limits)
    benign = PythonTool(timeout_s=60.0, cpu_s=30, **limits)
    codes = ["while True: pass", "import os\nwhile True: os.fork()", "print('y' * 10**8)", "raise SystemExit(3)"]
    calls = [ToolCall("python", {"code": c}) for c in codes] + [ToolCall("benign", {"code": "print(6 * 7)"})]
    outs = run_tool_calls(calls, {"python": hostile, "benign": benign})
    assert outs[0].status == "timeout" and outs[1].status in ("error", "timeout")  # a fork bomb may hit either
    assert outs[2].status == outs[3].status == "error" and all(o.text.startswith("Error:") for o in outs[:4])
    assert outs[4].status == "ok" and outs[4].text.strip() == "42"


def test_process_level_blocks_sockets_in_python():
    res = run_python("import socket\nsocket.socket()", SandboxLimits(wall_s=5), isolation="process")
    assert res.status == "error" and "network access is disabled" in res.stderr


def test_min_isolation_refuses_a_weaker_level():
    tool = PythonTool(isolation="process", min_isolation="userns")
    with pytest.raises(RuntimeError, match=r"'process', below min_isolation='userns'"):
        tool.check()
    with pytest.raises(ValueError, match="unknown sandbox isolation level"):
        PythonTool(min_isolation="chroot")
    assert ISOLATION_LEVELS.index(LEVEL) == int(_tool(LEVEL).metrics()["tool/python/isolation_level"])


def test_isolation_probe_that_times_out_is_retried_and_a_failed_probe_is_named_in_the_refusal(monkeypatch):
    """A busy machine must not silently lower the detected isolation: a probe that runs out of time is tried again
    with a longer limit, and when a level still fails, the python tool's refusal says how it failed."""
    from rollout.tools import python_tool, sandbox
    from rollout.tools.sandbox import SandboxResult

    calls = []

    def fake_run(code, limits, isolation):
        calls.append((isolation, limits.wall_s))
        if len(calls) == 1:  # the first probe of the strongest level times out; its retry works
            return SandboxResult(status="timeout", stdout="", stderr="", exit_code=None, seconds=limits.wall_s,
                                 isolation=isolation)
        return SandboxResult(status="ok", stdout="42\n", stderr="", exit_code=0, seconds=0.2, isolation=isolation)

    monkeypatch.setattr(sandbox, "run_python", fake_run)
    monkeypatch.setattr(sandbox, "_DETECTED", [])
    monkeypatch.setattr(sandbox, "_FAILURES", {})
    top = "namespace" if os.geteuid() == 0 else "userns"
    assert sandbox.detect_isolation() == top
    assert calls == [(top, 20), (top, 120)]

    def failing(code, limits, isolation):
        return SandboxResult(status="sandbox_error", stdout="", stderr="sandbox setup failed: EPERM unshare\n",
                             exit_code=None, seconds=0.1, isolation=isolation)

    monkeypatch.setattr(sandbox, "run_python", failing)
    monkeypatch.setattr(sandbox, "_DETECTED", [])
    monkeypatch.setattr(sandbox, "_FAILURES", {})
    assert sandbox.detect_isolation() == "process"
    with pytest.raises(RuntimeError, match=rf"probes of the stronger levels: {top}: sandbox_error after 0.1 s: "
                                           r"sandbox setup failed: EPERM unshare"):
        python_tool.PythonTool(min_isolation="userns").check()


def test_uid_leases_are_machine_wide(tmp_path):
    """Each process has its own pool; two pools (as two rollout workers) never hold one uid at once, a lease ends
    with its release, and a uid held by another process is skipped until that process dies."""
    import itertools

    from rollout.tools.sandbox import _UID_BASE, _UidPool

    a, b = _UidPool(str(tmp_path)), _UidPool(str(tmp_path))
    a._next = b._next = iter(range(10))  # both start their search at the same uid
    held = [a.acquire() for _ in range(3)]
    other = b.acquire()
    assert other not in held and len(set(held)) == 3
    a.release(held[0])
    b._next = iter(range(10))
    assert b.acquire() == held[0]
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"),
        str(tmp_path / f"{other + 1}.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        c = _UidPool(str(tmp_path))
        c._next = iter(range(10))
        assert c.acquire() not in set(held) | {other, other + 1}
    finally:
        holder.kill()
        holder.wait()
    d = _UidPool(str(tmp_path))  # the holder died: its uid is free again
    d._next = itertools.count(other + 1 - _UID_BASE)
    assert d.acquire() == other + 1


@needs_ns
def test_two_processes_sandboxing_at_once_do_not_kill_each_others_code(monkeypatch):
    """A second process's call ends (and cleans up its uid) while the first one's code still runs: the first
    call must finish normally. Both processes start their uid search at the same place."""
    import itertools

    from rollout.tools import sandbox

    monkeypatch.setattr(sandbox._UIDS, "_next", itertools.count(0))
    slow = subprocess.Popen([sys.executable, "-c", (
        "import itertools\nfrom rollout.tools import sandbox\nsandbox._UIDS._next = itertools.count(0)\n"
        "from rollout.tools.sandbox import run_python, SandboxLimits\nprint('start', flush=True)\n"
        "r = run_python('import time; time.sleep(4); print(7)', SandboxLimits(wall_s=30, cpu_s=10), "
        "isolation='namespace')\nprint(r.status, r.stdout.strip())")],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert slow.stdout.readline().strip() == "start"
    time.sleep(1.5)  # its code is running now
    assert run_python("print(1)", SandboxLimits(wall_s=30, cpu_s=10), isolation="namespace").status == "ok"
    out, _ = slow.communicate(timeout=60)
    assert out.split() == ["ok", "7"], out
