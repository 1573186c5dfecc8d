"""One run at a time in an output folder: the driver holds ``<output_dir>/.run.lock`` with ``fcntl.flock`` for its
lifetime (:func:`hold_output_dir`), so that a second run into a folder a live run writes to is refused before it
moves or writes anything there. The kernel drops the lock when the holding process ends, however it ends (a
``SIGKILL`` included), so a lock file left by a dead run never blocks; the file stays (it holds the pid of the last
run that held it)."""
from __future__ import annotations

import fcntl
import os

__all__ = ["LOCK_FILE", "hold_output_dir"]

LOCK_FILE = ".run.lock"
_held: dict[str, int] = {}  # realpath of an output folder -> the descriptor this process locks it with


def hold_output_dir(output_dir: str, key: str = "trainer.output_dir") -> None:
    """Lock ``output_dir`` (created when absent) for this process until it exits; a folder this process holds
    already is kept as it is.

    Raises:
        ConfigError: another live process holds it: one line naming ``key``, the folder and that run's pid.
    """
    real = os.path.realpath(output_dir)
    if real in _held:
        return
    os.makedirs(real, exist_ok=True)
    fd = os.open(os.path.join(real, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        other = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        from trainer.config_checks import ConfigError

        raise ConfigError(f"{key}={output_dir!r} is in use by another run (pid {other}) that is still writing to it; "
                          f"expected a folder no live run writes to: wait for that run to end, stop it, or give "
                          f"another {key}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[real] = fd
