"""The sandbox's launcher, run as a separate Python process by :func:`rollout.tools.sandbox.run_python`.

It reads one JSON spec from stdin, isolates itself, forks, and in the child applies the resource limits, drops
privileges and ``execve``'s a fresh interpreter on the model-written code. The launcher itself (the parent of
that child) waits, forwards the exit status (``128 + signal`` for a signal) and, on SIGTERM from the trainer,
kills the child with SIGKILL; as a child subreaper it then kills and reaps whatever the code left running. Only the standard library is used; the code never runs in this process.

Isolation levels (``spec["level"]``), strongest first:

* ``namespace`` (needs root): new mount, network, PID, IPC and UTS namespaces; a size-limited tmpfs becomes the
  root directory (``chroot``) holding read-only, ``nosuid`` bind mounts of the interpreter and system libraries
  only, ``/dev/{null,zero,random,urandom}`` and the writable working directory ``/work``; the code runs as a
  per-call unprivileged uid/gid with no supplementary groups and ``no_new_privs``.
* ``userns``: the same namespaces inside a new user namespace (for a non-root trainer where unprivileged user
  namespaces are enabled); the code runs as uid 1000 inside it (the trainer's uid outside), without
  capabilities after ``execve``.
* ``uid`` (root without namespaces): per-call unprivileged uid, working directory on the host; network blocked in
  Python only.
* ``process``: resource limits and a clean environment only; network blocked in Python only.

Exit status 111 with a ``sandbox setup failed:`` line on stderr means the isolation could not be set up.
"""
import ctypes
import json
import os
import resource
import signal
import sys
import time

SETUP_FAILED = 111
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
INNER_UID = 1000
DEVICES = ("null", "zero", "random", "urandom")
# Replaces the socket constructors before the code runs (levels without a network namespace). Python-level only:
# code that reaches the C library directly (ctypes) is not stopped by it.
SOCKET_BLOCK = (
    "import socket as _s, _socket as _cs, runpy as _r\n"
    "class _NoSocket(_s.socket):\n"
    "    def __init__(self, *a, **k):\n"
    "        raise PermissionError('network access is disabled in this sandbox')\n"
    "def _no(*a, **k):\n"
    "    raise PermissionError('network access is disabled in this sandbox')\n"
    "_s.socket = _cs.socket = _NoSocket\n"
    "_s.create_connection = _s.socketpair = _s.fromfd = _s.create_server = _no\n"
    "del _s, _cs, _NoSocket, _no\n"
    "_r.run_path('main.py', run_name='__main__')\n"
)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = [None if v is None else v.encode() for v in (src, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _bind_ro(src: str, root: str) -> None:
    """Bind ``src`` (a directory or file) at the same path under ``root``, read-only, nosuid, nodev."""
    dst = root + src
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _copy_symlink(path: str, root: str) -> None:
    os.makedirs(os.path.dirname(root + path), exist_ok=True)
    os.symlink(os.readlink(path), root + path)


def _build_root(spec: dict) -> None:
    """Mount the tmpfs root at ``spec["root"]``, fill it, chroot into it and enter ``/work``."""
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(spec['tmpfs_bytes'])},mode=0755")
    for path in spec["binds"]:
        if os.path.islink(path):
            _copy_symlink(path, root)
        elif os.path.exists(path):
            _bind_ro(path, root)
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in DEVICES:
        open(f"{root}/dev/{dev}", "a").close()
        _mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
    for d, mode in (("/work", 0o700), ("/tmp", 0o1777)):
        os.makedirs(root + d, exist_ok=True)
        os.chmod(root + d, mode)
        if spec.get("uid") is not None:
            os.chown(root + d, spec["uid"], spec["uid"])
    os.chdir(root)
    os.chroot(".")
    os.chdir("/work")


def _enter_user_namespace(flags: int) -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | flags), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{INNER_UID} {uid} 1")
    _write("/proc/self/gid_map", f"{INNER_UID} {gid} 1")


def _set_limits(lim: dict) -> None:
    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, key in (("RLIMIT_AS", "memory_bytes"), ("RLIMIT_NPROC", "max_processes"),
                      ("RLIMIT_FSIZE", "max_file_bytes"), ("RLIMIT_NOFILE", "max_open_files")):
        value = int(lim[key])
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(spec: dict) -> None:
    """The forked child: filesystem, limits, privileges, then ``execve`` of the code. Never returns."""
    level = spec["level"]
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if level in ("namespace", "userns"):
        _build_root(spec)
    else:
        os.chdir(spec["root"])
    _set_limits(spec["limits"])
    if spec.get("uid") is not None:
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    with open("main.py", "w", encoding="utf-8") as f:
        f.write(spec["code"])
    python = spec["python"]
    argv = [python, "-I", "-B", "main.py"] if level in ("namespace", "userns") else \
        [python, "-I", "-B", "-c", SOCKET_BLOCK]
    os.execve(python, argv, spec["env"])


def main() -> None:
    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    level = spec["level"]
    try:
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if level == "namespace":
            _check(_libc.unshare(flags), "unshare")
        elif level == "userns":
            _enter_user_namespace(flags)
        pid = os.fork()
    except OSError as exc:
        sys.stderr.write(f"sandbox setup failed: {exc}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    if pid == 0:
        try:
            _child(spec)
        except BaseException as exc:  # anything before execve is a setup failure, reported as such
            os.write(2, f"sandbox setup failed: {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    _, status = os.waitpid(pid, 0)
    _reap_descendants()
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _reap_descendants(budget_s: float = 2.0) -> None:
    """SIGKILL and reap every process left below the launcher (orphans come to it: it is a child subreaper), for
    the levels without a PID namespace; gives up after ``budget_s`` (the trainer then kills the group)."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        for kid in _children():
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.005)
        except ChildProcessError:
            return


if __name__ == "__main__":
    main()
