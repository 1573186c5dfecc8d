"""One run at a time in an output folder: the driver holds ``<output_dir>/.run.lock`` with ``fcntl.flock`` for its
lifetime (:func:`hold_output_dir`), so that a second run into a folder a live run writes to is refused before it
moves or writes anything there. The kernel drops the lock when the holding process ends, however it ends (a
``SIGKILL`` included), so a lock file left by a dead run never blocks; the file stays (it holds the pid of the last
run that held it)."""
from __future__ import annotations

import fcntl
import os

__all__ = ["LOCK_FILE", "hold_output_dir", "hold_run_dir"]

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


def hold_run_dir(hydra_cfg) -> None:
    """:func:`hold_output_dir` for the composed config's ``trainer.output_dir`` before any check runs, when it is a
    folder or not there yet (else the checks name the bad value): Hydra's ``main.log`` lies in that folder, and the
    checks' warnings would otherwise be appended to a live run's log before the refusal.

    Raises:
        ConfigError: as :func:`hold_output_dir`.
    """
    from omegaconf import OmegaConf

    try:
        out = OmegaConf.select(hydra_cfg, "trainer.output_dir", throw_on_resolution_failure=False)
    except Exception:  # noqa: BLE001 - an unreadable value is the checks' to report
        return
    if isinstance(out, str) and out and (os.path.isdir(out) or not os.path.exists(out)):
        hold_output_dir(out)
