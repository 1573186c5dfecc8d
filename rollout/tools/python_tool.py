"""The ``python`` tool: model-written code runs in :mod:`rollout.tools.sandbox`, its printed output is the answer.

Isolation: the tool uses the strongest level :func:`rollout.tools.sandbox.detect_isolation` finds and refuses to
start (:meth:`PythonTool.check`) when that is weaker than ``min_isolation`` (default ``userns``: separate mount
and network namespaces, so neither the project's files, ``/etc/passwd`` nor the network are reachable). On a
machine that only offers ``uid`` (a root trainer without namespaces: world-readable host files such as
``/etc/passwd`` stay readable, sockets are blocked in Python only) or ``process`` (the trainer's own uid: its
files are readable) the user must lower ``min_isolation`` explicitly. The level in force is reported as the
metric ``tool/python/isolation_level`` (index in ``ISOLATION_LEVELS``: 0 process, 1 uid, 2 userns, 3 namespace).
"""
from __future__ import annotations

from rollout.tools.base import Tool, ToolError, ToolTimeoutError
from rollout.tools.sandbox import (ISOLATION_LEVELS, SandboxLimits, SandboxResult, detect_isolation,
                                   isolation_failures, isolation_rank, run_python)

__all__ = ["PythonTool"]

_STDERR_TAIL = 2000  # characters of stderr (the traceback's end) returned on an error


class PythonTool(Tool):
    """``python(code: str) -> str``: run ``code`` in the sandbox; the answer is what it printed.

    Args:
        timeout_s: wall-clock seconds of one run (the sandbox's ``wall_s``); the tool-call timeout is 5 s more
            (start-up and clean-up).
        cpu_s, memory_mb, max_processes, max_file_mb, max_open_files, max_output_bytes, tmpfs_mb: the
            :class:`rollout.tools.sandbox.SandboxLimits` of each run.
        min_isolation: weakest acceptable level of :data:`rollout.tools.sandbox.ISOLATION_LEVELS`.
        isolation: force a level instead of detecting one (it must still be >= ``min_isolation``).

    Raises:
        ValueError: a limit out of range or an unknown level.
    """

    name = "python"
    description = ("Run a Python 3 program in a sandbox without network access and return what it prints "
                   "(stdout). Use print() to show results.")
    parameters = {"type": "object",
                  "properties": {"code": {"type": "string", "description": "the complete Python program"}},
                  "required": ["code"]}

    def __init__(self, timeout_s: float = 10.0, cpu_s: int | None = None, memory_mb: int = 1024,
                 max_processes: int = 32, max_file_mb: int = 16, max_open_files: int = 64,
                 max_output_bytes: int = 65536, tmpfs_mb: int = 64, min_isolation: str = "userns",
                 isolation: str | None = None) -> None:
        if not float(timeout_s) > 0:  # the sandbox's wall_s; named as the tool's option
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.limits = SandboxLimits(wall_s=float(timeout_s), cpu_s=int(cpu_s or max(1, round(timeout_s))),
                                    memory_mb=memory_mb, max_processes=max_processes, max_file_mb=max_file_mb,
                                    max_open_files=max_open_files, max_output_bytes=max_output_bytes,
                                    tmpfs_mb=tmpfs_mb)
        isolation_rank(min_isolation)
        if isolation is not None:
            isolation_rank(isolation)
        self.min_isolation = min_isolation
        self.isolation = isolation
        super().__init__(timeout_s=float(timeout_s) + 5.0)

    def check(self) -> None:
        """Detect the isolation level (runs a probe once) and refuse a level below ``min_isolation``.

        Raises:
            RuntimeError: naming the level found, the one required and the key that lowers the requirement.
        """
        level = self.isolation or detect_isolation()
        if isolation_rank(level) < isolation_rank(self.min_isolation):
            failed = "; ".join(f"{k}: {v}" for k, v in isolation_failures().items())
            raise RuntimeError(
                f"python tool: the strongest sandbox isolation on this machine is {level!r}, below "
                f"min_isolation={self.min_isolation!r} (levels, weakest first: {list(ISOLATION_LEVELS)}"
                + (f"; probes of the stronger levels: {failed}" if failed else "") + "); run "
                "as root or enable unprivileged user namespaces, or accept the weaker level with the tool "
                f"entry {{class_name: python, config: {{min_isolation: {level}}}}}")
        self.isolation = level

    def metrics(self) -> dict[str, float]:
        """``tool/python/isolation_level``: the index of the level in force (see the module docstring); over several
        workers the step logs the smallest, the weakest level any of them ran."""
        return {"tool/python/isolation_level": float(isolation_rank(self.isolation or detect_isolation()))}

    def call(self, args: dict) -> str:
        """Run ``args["code"]``; returns stdout (plus stderr when there is some).

        Raises:
            ToolTimeoutError: the wall-clock limit was reached.
            ToolError: the program failed (its output and the end of the traceback are the message), printed
                more than ``max_output_bytes``, or the sandbox could not start.
        """
        if self.isolation is None:
            self.check()
        return _answer(run_python(args["code"], self.limits, isolation=self.isolation), self.limits)


def _answer(res: SandboxResult, limits: SandboxLimits) -> str:
    """The model-facing text of a sandbox result; failures raise ToolError / ToolTimeoutError."""
    err = res.stderr[-_STDERR_TAIL:]
    if res.status == "ok":
        text = res.stdout if not err else f"{res.stdout}\n[stderr]\n{err}"
        return text if text.strip() else "(the program printed nothing; use print() to show results)"
    if res.status == "timeout":
        raise ToolTimeoutError(f"the program ran longer than {limits.wall_s:g} s and was stopped")
    if res.status == "output_limit":
        raise ToolError(f"the program printed more than {limits.max_output_bytes} bytes and was stopped; "
                        f"first part: {res.stdout[:500]}")
    if res.status == "sandbox_error":
        raise ToolError(f"the sandbox could not start: {err.strip()}")
    detail = err.strip() or f"exit code {res.exit_code}"
    if res.exit_code is not None and res.exit_code > 128:
        detail += f" (killed by signal {res.exit_code - 128}: CPU-time or memory limit)"
    raise ToolError(f"{res.stdout}{detail}" if res.stdout else detail)
