"""Crash-safe file operations of the checkpoint writers: a file or folder is either the old or the new version,
never a partial one (temp file or folder in the same place + ``os.replace``), and the collective barrier between
the ranks' writes.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch

__all__ = ["atomic_write_text", "atomic_torch_save", "barrier", "replace_dir", "umask_mode", "give_umask_modes"]


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666`` less the process's umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def give_umask_modes(path: str) -> None:
    """Give ``path`` (a file, or every file under a folder) the mode :func:`umask_mode` says: ``tempfile.mkstemp``
    and safetensors (0.8) create files readable by their owner alone (0600), so a teammate or a serving process of
    another user could read a model folder's config and tokenizer but not its weights. Files this process cannot
    change are left as they are."""
    mode = umask_mode()
    files = [path] if os.path.isfile(path) else [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
    for f in files:
        try:
            if os.stat(f).st_mode & 0o777 != mode:
                os.chmod(f, mode)
        except OSError:
            pass


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder + ``os.replace``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())  # mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(folder)


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save(obj, path)`` through a temp file + ``os.replace``: ``path`` is old or new, never partial."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".pt", dir=folder)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.chmod(tmp, umask_mode())  # mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def barrier() -> None:
    """``torch.distributed.barrier()`` when a process group exists; a no-op in a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def replace_dir(tmp: str, path: str) -> None:
    """Move a completely written folder ``tmp`` to ``path``, replacing an older ``path`` (one rank calls it).

    The old folder is moved aside first and deleted only after the new one is in place, so a crash leaves
    either the old or the new checkpoint under ``path`` (or the old one under ``path + ".old"``).
    """
    old = path + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
