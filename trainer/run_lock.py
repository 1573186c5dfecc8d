"""One run at a time in an output folder: the driver holds ``<output_dir>/.run.lock`` with ``fcntl.flock`` for its
lifetime (:func:`hold_output_dir`), so that a second run into a folder a live run writes to is refused before it
moves or writes anything there. The kernel drops the lock when the holding process ends, however it ends (a
``SIGKILL`` included), so a lock file left by a dead run never blocks; the file stays (it holds the pid of the last
run that held it). A folder inside a live run's locked folder is refused the same way (a run whose checkpoints
would land among another run's outputs)."""
from __future__ import annotations

import fcntl
import os

__all__ = ["LOCK_FILE", "hold_checkpoint_dir", "hold_output_dir", "hold_run_dir", "hold_run_folders"]

LOCK_FILE = ".run.lock"
_held: dict[str, int] = {}  # realpath of an output folder -> the descriptor this process locks it with


def hold_output_dir(output_dir: str, key: str = "trainer.output_dir") -> None:
    """Lock ``output_dir`` (created when absent) for this process until it exits; a folder this process holds
    already is kept as it is.

    Raises:
        ConfigError: another live process holds it, or a folder above it: one line naming ``key``, the folder, the
            held folder above it if any and that run's pid (with ``alone`` set: it is reported without the other
            checks' lines, which would be about that run's files).
    """
    real = os.path.realpath(output_dir)
    if real in _held:
        return
    _refuse_inside_a_live_run(real, output_dir, key)
    os.makedirs(real, exist_ok=True)
    fd = os.open(os.path.join(real, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        other = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise _in_use(f"{key}={output_dir!r} is in use by another run (pid {other}) that is still writing to it",
                      key) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[real] = fd


def _in_use(what: str, key: str):
    from trainer.config_checks import ConfigError

    exc = ConfigError(f"{what}; expected a folder no live run writes to: wait for that run to end, stop it, or give "
                      f"another {key}")
    exc.alone = True  # the other checks would judge the live run's files: this line is the whole answer
    return exc


def _refuse_inside_a_live_run(real: str, given: str, key: str) -> None:
    """Raise when a folder above ``real`` (a realpath) holds the lock file of a live run other than this process.

    Raises:
        ConfigError: one line naming ``key``, ``given``, the live run's folder and its pid.
    """
    parent = os.path.dirname(real)
    while parent and parent not in _held:
        other = _live_holder(parent)
        if other is not None:
            raise _in_use(f"{key}={given!r} lies inside {parent!r}, the folder of another run (pid {other}) "
                          f"that is still writing to it", key)
        if parent == os.path.dirname(parent):
            break
        parent = os.path.dirname(parent)


def _live_holder(folder: str) -> str | None:
    """The pid (as its lock file records it, or ``"unknown"``) of a live process other than this one that holds
    ``folder``'s lock file; None when nobody holds it (no file, or a dead run's)."""
    lock = os.path.join(folder, LOCK_FILE)
    if folder in _held or not os.path.isfile(lock):
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)


def hold_run_dir(hydra_cfg) -> None:
    """:func:`hold_output_dir` for the composed config's ``trainer.output_dir`` before any check runs, when it is a
    folder or not there yet (else the checks name the bad value): Hydra's ``main.log`` lies in that folder, and the
    checks' warnings would otherwise be appended to a live run's log before the refusal.

    Raises:
        ConfigError: as :func:`hold_output_dir`.
    """
    out = _composed_folder(hydra_cfg, "trainer.output_dir")
    if out is not None:
        hold_output_dir(out)
        ckpt = _composed_folder(hydra_cfg, "trainer.default_local_dir")
        if ckpt is not None:
            hold_checkpoint_dir(out, ckpt)


def _composed_folder(hydra_cfg, key: str) -> str | None:
    """The composed config's ``key`` when it is a folder or not there yet; None for anything else (the checks name
    a bad value)."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(hydra_cfg, key, throw_on_resolution_failure=False)
    except Exception:  # noqa: BLE001 - an unreadable value is the checks' to report
        return None
    ok = isinstance(value, str) and value and (os.path.isdir(value) or not os.path.exists(value))
    return value if ok else None


def hold_checkpoint_dir(output_dir: str, checkpoint_dir: str) -> None:
    """:func:`hold_output_dir` for ``trainer.default_local_dir`` when it lies outside ``output_dir``: two live runs
    with different output folders never save into one checkpoint folder. Inside it (the default), the output
    folder's lock covers it, and it, or a folder between it and ``output_dir``, must not be another live run's
    checkpoint or output folder (a run with its own output folder saving into this one's ``checkpoints``: this
    run's set-aside of earlier checkpoints would move that run's steps away).

    Raises:
        ConfigError: another live process holds ``checkpoint_dir`` (as its checkpoint or output folder), or a
            folder between it and ``output_dir``: one line naming ``trainer.default_local_dir``, the folder and
            that run's pid.
    """
    if not checkpoint_dir:
        return
    out, real = os.path.realpath(output_dir), os.path.realpath(checkpoint_dir)
    if real != out and not real.startswith(out + os.sep):
        hold_output_dir(checkpoint_dir, "trainer.default_local_dir")
        return
    folder = real
    while folder != out:
        other = _live_holder(folder)
        if other is not None:
            where = "" if folder == real else f" (its folder {folder!r})"
            raise _in_use(f"trainer.default_local_dir={checkpoint_dir!r} is in use by another run (pid {other}) that "
                          f"is still writing to it{where}", "trainer.default_local_dir")
        folder = os.path.dirname(folder)


def hold_run_folders(trainer_cfg: dict) -> None:
    """:func:`hold_output_dir` for the resolved ``trainer.output_dir`` and :func:`hold_checkpoint_dir` for its
    ``trainer.default_local_dir``.

    Raises:
        ConfigError: as :func:`hold_output_dir`, naming the key of the folder a live run holds.
    """
    hold_output_dir(trainer_cfg["output_dir"])
    hold_checkpoint_dir(trainer_cfg["output_dir"], trainer_cfg["default_local_dir"])
