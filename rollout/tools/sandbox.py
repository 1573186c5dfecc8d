"""Run model-written Python in a separate, isolated, resource-limited process.

:func:`run_python` starts ``python -I rollout/tools/_sandbox_child.py`` (the launcher) in a new session with an
environment of a few fixed variables (nothing of the trainer's environment), sends it the code and the limits on
stdin, and reads its stdout/stderr up to a byte cap. The launcher isolates itself, forks, applies the limits and
``execve``'s a fresh interpreter on the code (see that module for the exact steps). The trainer's process never
``eval``'s or ``exec``'s the code.

Isolation levels (:data:`ISOLATION_LEVELS`, weakest first; :func:`detect_isolation` finds the strongest that
works on this machine by running a probe once):

=============  ===========================================================  ==========================================
level          what the code runs under                                     ``open('/etc/passwd').read()`` returns
=============  ===========================================================  ==========================================
``namespace``  root trainer: new mount/network/PID/IPC/UTS namespaces,      ``FileNotFoundError``: the root directory
               tmpfs root with read-only binds of the interpreter and       is a fresh tmpfs without ``/etc``; the
               system libraries only, per-call unprivileged uid, no         project, ``/root``, ``/home`` and ``/proc``
               network interfaces but a down loopback.                      are not there either.
``userns``     non-root trainer with unprivileged user namespaces: the      ``FileNotFoundError``, as above.
               same, as uid 1000 inside a new user namespace (the kernel
               exempts a root trainer's namespaces from ``RLIMIT_NPROC``;
               the PID namespace still ends a fork bomb at the timeout).
``uid``        root trainer without namespaces: per-call unprivileged       The host's file: world-readable files
               uid, working directory on the host, sockets blocked in       (``/etc/passwd``, a project checkout with
               Python only (``ctypes`` gets around that).                   mode 644) stay readable. Not acceptable
                                                                            for code from an untrusted policy.
``process``    resource limits and a clean environment only; the code       The host's file, and anything else the
               has the trainer's uid and can read its files.                trainer's user can read. Not acceptable.
=============  ===========================================================  ==========================================

Every level applies ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL one second later), ``RLIMIT_AS`` (memory),
``RLIMIT_NPROC`` (fork bombs), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE`` and ``RLIMIT_CORE=0``, a wall-clock timeout
after which the launcher is told to kill the code (SIGTERM to the launcher, which SIGKILLs its child: with a PID
namespace that ends every process in it; without one the launcher, a child subreaper, kills what is left), then
SIGKILL to the whole process group and, under a per-call uid, to every process of that uid. In the namespace
levels the code sees, read-only, ``/usr``, ``/bin``, ``/lib*``, ``/etc/ld.so.cache`` and the interpreter's
prefixes (``sys.base_prefix``, ``sys.prefix``, site-packages), plus its own tmpfs; nothing else of the host. Output beyond ``max_output_bytes`` is not read: the code is stopped and the result
says so.
"""
from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["ISOLATION_LEVELS", "SandboxLimits", "SandboxResult", "run_python", "detect_isolation",
           "isolation_rank"]

ISOLATION_LEVELS = ("process", "uid", "userns", "namespace")
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_child.py")
_SETUP_FAILED = 111
_UID_BASE = 1_900_000_000  # per-call uids: far above any account a distribution creates
_UID_SLOTS = 4096
_SYSTEM_BINDS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")


def isolation_rank(level: str) -> int:
    """Position of ``level`` in :data:`ISOLATION_LEVELS` (0 = weakest). Raises ValueError for another name."""
    if level not in ISOLATION_LEVELS:
        raise ValueError(f"unknown sandbox isolation level {level!r}; expected one of {list(ISOLATION_LEVELS)}")
    return ISOLATION_LEVELS.index(level)


@dataclass
class SandboxLimits:
    """Limits of one run.

    Attributes:
        wall_s: wall-clock seconds before the code is killed (> 0).
        cpu_s: CPU seconds (``RLIMIT_CPU``, integer >= 1).
        memory_mb: address space in MiB (``RLIMIT_AS``); the interpreter itself needs about 30.
        max_processes: processes and threads (``RLIMIT_NPROC``), per call under a per-call uid or user namespace.
        max_file_mb: largest file the code may write, MiB (``RLIMIT_FSIZE``).
        max_open_files: ``RLIMIT_NOFILE``.
        max_output_bytes: stdout + stderr bytes read; more stops the code.
        tmpfs_mb: size of the root tmpfs (namespace levels): all files the code writes together.

    Raises:
        ValueError: a value out of range (named).
    """

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 65536
    tmpfs_mb: int = 64

    def __post_init__(self) -> None:
        if not self.wall_s > 0:
            raise ValueError(f"SandboxLimits.wall_s must be > 0, got {self.wall_s}")
        for name in ("cpu_s", "memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_output_bytes",
                     "tmpfs_mb"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class SandboxResult:
    """Outcome of one run.

    Attributes:
        status: ``"ok"`` (exit code 0), ``"error"`` (non-zero exit or a signal, e.g. CPU or memory limit),
            ``"timeout"`` (wall clock), ``"output_limit"`` (more than ``max_output_bytes``) or
            ``"sandbox_error"`` (the isolation could not be set up).
        stdout, stderr: decoded output (UTF-8, undecodable bytes replaced), together at most the byte cap.
        exit_code: the code's exit code, ``128 + signal`` when a signal ended it, None when it was killed.
        seconds: wall-clock seconds of the run.
        isolation: the level it ran under.
    """

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    seconds: float
    isolation: str


class _UidPool:
    """Per-call uids: no two running calls on this machine share one, so their processes can neither signal each
    other nor share an ``RLIMIT_NPROC`` count, and all processes of a finished call can be found (and killed) by
    uid. Every process that runs sandboxed code (each rollout worker, each test process) has its own pool, so a
    uid is leased machine-wide: an exclusive ``flock`` on ``<tmp>/dsrl-sandbox-uids/<uid>.lock``, held for the
    call and dropped by the kernel when the holder dies. Without it two workers picked the same uid and one's
    clean-up killed the other's running code."""

    def __init__(self, lock_dir: str | None = None) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # uid -> fd of its lock file
        self._next = itertools.count(os.getpid())  # processes start their search at different uids
        self._dir = lock_dir or os.path.join(tempfile.gettempdir(), "dsrl-sandbox-uids")

    def acquire(self) -> int:
        """A uid no other call on this machine holds. Raises RuntimeError when all ``_UID_SLOTS`` are held."""
        import fcntl

        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        with self._lock:
            for _ in range(_UID_SLOTS):
                uid = _UID_BASE + next(self._next) % _UID_SLOTS
                if uid in self._held:
                    continue
                fd = os.open(os.path.join(self._dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise RuntimeError(f"more than {_UID_SLOTS} sandbox runs at once on this machine")

    def release(self, uid: int) -> None:
        """End the lease of ``uid`` (after its processes were killed)."""
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the lock file drops the flock


_UIDS = _UidPool()
_DETECTED: list[str] = []
_FAILURES: dict[str, str] = {}
_DETECT_LOCK = threading.Lock()


def _bind_paths() -> list[str]:
    """Read-only binds of the namespace levels: system library dirs and the interpreter's prefixes."""
    paths = list(_SYSTEM_BINDS)
    for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
              os.path.dirname(sys.executable), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]):
        p = os.path.abspath(p)
        if p != "/" and not any(p == q or p.startswith(q.rstrip("/") + "/") for q in paths):
            paths.append(p)
    return paths


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return pids


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` until none is left (a fork bomb may race for a few rounds)."""
    for _ in range(100):
        pids = _uid_processes(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def _stop(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGTERM to the launcher (it SIGKILLs the code), then SIGKILL to its group and to the call's uid."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=0.5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        _kill_uid(uid)
    proc.wait()


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read both pipes until EOF, the deadline or the byte cap; returns (stdout, stderr, reason or None)."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    reason, exited_at = None, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if proc.poll() is not None:  # a leftover grandchild may hold the pipes: give it a moment, no more
                exited_at = exited_at or now
                if now - exited_at > 0.2:
                    break
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = cap - sum(len(b) for b in bufs.values())
                bufs[key.fd] += chunk[:max(room, 0)]
                if len(chunk) > room:
                    reason = "output_limit"
                    break
            if reason:
                break
    finally:
        sel.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), reason


def _spec(code: str, level: str, root: str, uid: int | None, limits: SandboxLimits) -> dict:
    nproc = int(limits.max_processes)
    if level == "process":  # RLIMIT_NPROC counts all of the trainer user's processes there
        nproc += len(_uid_processes(os.getuid()))
    ns = level in ("namespace", "userns")
    return {"code": code, "level": level, "root": root, "uid": uid, "python": sys.executable,
            "binds": _bind_paths() if ns else [], "env": _env("/work" if ns else root),
            "tmpfs_bytes": int(limits.tmpfs_mb) << 20,
            "limits": {"cpu_s": int(limits.cpu_s), "memory_bytes": int(limits.memory_mb) << 20,
                       "max_processes": nproc, "max_file_bytes": int(limits.max_file_mb) << 20,
                       "max_open_files": int(limits.max_open_files)}}


def run_python(code: str, limits: SandboxLimits | None = None, isolation: str | None = None) -> SandboxResult:
    """Run ``code`` (Python source) in the sandbox and return its output.

    Args:
        code: the program; its stdout is the usual result.
        limits: :class:`SandboxLimits` (defaults when None).
        isolation: one of :data:`ISOLATION_LEVELS`; None uses :func:`detect_isolation`.

    Returns:
        :class:`SandboxResult`. Failures of the code (exceptions, limits, timeouts, too much output, a refused
        isolation) are results, never exceptions.

    Raises:
        ValueError: an unknown isolation level, or ``uid``/``namespace`` without root.
    """
    limits = limits or SandboxLimits()
    level = isolation or detect_isolation()
    isolation_rank(level)
    if level in ("uid", "namespace") and os.geteuid() != 0:
        raise ValueError(f"sandbox isolation {level!r} needs the trainer to run as root")
    uid = _UIDS.acquire() if level in ("uid", "namespace") else None
    base = tempfile.mkdtemp(prefix="dsrl-sandbox-")
    t0 = time.monotonic()
    try:
        if level == "uid":
            os.chown(base, uid, uid)
        proc = subprocess.Popen([sys.executable, "-I", "-S", _LAUNCHER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(base), cwd=base,
                                start_new_session=True, close_fds=True)
        try:
            proc.stdin.write(json.dumps(_spec(code, level, base, uid, limits)).encode("utf-8"))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            out, err, reason = _read_capped(proc, t0 + float(limits.wall_s), int(limits.max_output_bytes))
        finally:
            _stop(proc, uid)
            proc.stdout.close()
            proc.stderr.close()
        code_rc = proc.returncode
        if reason is None and code_rc == _SETUP_FAILED and b"sandbox setup failed:" in err:
            reason = "sandbox_error"
        status = reason or ("ok" if code_rc == 0 else "error")
        return SandboxResult(status=status, stdout=out.decode("utf-8", "replace"),
                             stderr=err.decode("utf-8", "replace"), exit_code=None if reason else code_rc,
                             seconds=time.monotonic() - t0, isolation=level)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if uid is not None:
            _UIDS.release(uid)


def detect_isolation() -> str:
    """The strongest level of :data:`ISOLATION_LEVELS` that runs a probe program here (cached per process).

    ``namespace`` and ``uid`` are tried only as root, ``userns`` only as non-root; ``process`` always works. A probe
    that runs out of time (a busy machine) is tried once more with a longer limit before its level is given up; why
    each stronger level failed is kept for error messages (:func:`isolation_failures`).
    """
    with _DETECT_LOCK:
        if _DETECTED:
            return _DETECTED[0]
        root = os.geteuid() == 0
        candidates = ("namespace", "uid") if root else ("userns",)
        for level in candidates:
            for probe in (SandboxLimits(wall_s=20, cpu_s=10), SandboxLimits(wall_s=120, cpu_s=60)):
                res = run_python("print(6 * 7)", probe, isolation=level)
                if res.status != "timeout":
                    break
            if res.status == "ok" and res.stdout.strip() == "42":
                _DETECTED.append(level)
                break
            tail = (res.stderr.strip().splitlines() or [""])[-1][:200]
            _FAILURES[level] = f"{res.status} after {res.seconds:.1f} s" + (f": {tail}" if tail else "")
        else:
            _DETECTED.append("process")
        return _DETECTED[0]


def isolation_failures() -> dict[str, str]:
    """Why each level stronger than the detected one failed its probe (level -> status, seconds, last stderr line);
    empty before :func:`detect_isolation` has run or when the strongest candidate worked."""
    return dict(_FAILURES)
