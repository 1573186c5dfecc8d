"""Checkpoint layout, tracker, retention, RNG and trainer-state helpers shared by every backend (the crash-safe
writes they use: :mod:`trainer.checkpoint.atomic`).

Layout on disk (verl's)::

    <default_local_dir>/
        latest_checkpointed_iteration.txt     # integer step, written LAST, atomically
        global_step_<N>/
            actor/                            # written by the actor's CheckpointManager
            critic/                           # written by the critic's CheckpointManager (GAE only)
            data.pt                           # dataloader state + global step + config (trainer)

Save order used by the trainer: each role's ``manager.save(step, <step_dir>/<role>)`` ->
:func:`save_trainer_state` -> :func:`write_tracker` -> :func:`apply_retention`. :func:`commit_checkpoint`
does the last two. A crash anywhere before the tracker is written leaves the previous checkpoint as the one
:func:`find_latest_checkpoint` returns, and retention never runs before the new checkpoint is complete
(verl deleted the old checkpoint first, its issue #4873).

A step folder counts as *complete* when its ``data.pt`` exists (written after every role, atomically);
``resume_mode=auto`` also requires every file of it (:func:`trainer.checkpoint.verify.verify_step_folder`).
"""

from __future__ import annotations

import abc
import logging
import os
import random
import re
import shutil
from typing import Any

import numpy as np
import torch

from trainer.checkpoint.atomic import atomic_torch_save, atomic_write_text
from trainer.checkpoint.verify import TRAINER_STATE_FILE, IncompleteCheckpoint, verify_step_folder

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR_PREFIX = "global_step_"
_STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")


class CheckpointManager(abc.ABC):
    """Interface of one role's checkpoint manager (DeepSpeed, Megatron, ...).

    A manager saves and restores everything one role owns: model, optimizer, LR scheduler and the
    per-rank RNG states. The trainer owns the step folder, ``data.pt`` and the tracker.
    """

    @abc.abstractmethod
    def save(self, step: int, path: str) -> None:
        """Save the role's state for global step ``step`` into folder ``path`` (``.../global_step_N/actor``).

        Must be atomic: if it raises, a previous checkpoint at ``path`` (if any) is left intact.
        Every rank of the role must call it.
        """

    @abc.abstractmethod
    def load(self, path: str) -> dict:
        """Restore the role's state from ``path``; returns the client state saved with it (a dict)."""

    def latest(self, root: str) -> str | None:
        """The newest complete step folder under ``root`` (see :func:`find_latest_checkpoint`)."""
        return find_latest_checkpoint(root)


# ----------------------------------------------------------------------------------------------- paths


def step_dir(root: str, step: int) -> str:
    """``<root>/global_step_<step>``. Raises ValueError if ``step`` is not an int >= 0."""
    _check_step(step)
    return os.path.join(root, f"{STEP_DIR_PREFIX}{step}")


def parse_step(path: str) -> int:
    """The ``N`` of the last ``global_step_<N>`` component of ``path``.

    Raises:
        ValueError: no path component is exactly ``global_step_<N>`` (the message names ``path``).
    """
    parts = [p for p in os.path.normpath(path).split(os.sep) if p]
    for part in reversed(parts):
        m = _STEP_DIR_RE.match(part)
        if m:
            return int(m.group(1))
    raise ValueError(f"checkpoint path {path!r} has no 'global_step_<N>' component; expected e.g. "
                     f"'<default_local_dir>/global_step_10'")


def _check_step(step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"global step must be an int >= 0, got {step!r}")


# --------------------------------------------------------------------------------------------- tracker


def write_tracker(root: str, step: int) -> None:
    """Atomically write ``step`` into ``<root>/latest_checkpointed_iteration.txt``.

    Call it LAST, after every role and ``data.pt`` are saved (rank 0 / the controller only).
    Raises ValueError for a bad ``step``.
    """
    _check_step(step)
    atomic_write_text(os.path.join(root, TRACKER_FILE), f"{int(step)}\n")


def read_tracker(root: str) -> int | None:
    """The step in the tracker file, or None if there is no tracker. Raises ValueError if it is not an int."""
    path = os.path.join(root, TRACKER_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"tracker {path!r} holds {text!r}; expected an integer global step") from None


def find_latest_checkpoint(root: str | None) -> str | None:
    """``<root>/global_step_<N>`` named by the tracker; else the newest complete step folder; else None.

    The tracker is written last, so it normally names the newest complete checkpoint. When it names a folder that
    no longer exists (deleted by hand), is missing while complete step folders exist (its write was lost), or holds
    no integer (empty, or other text), the newest complete folder (``data.pt`` present,
    :func:`is_complete_checkpoint`) is returned with a warning, so that ``resume_mode=auto`` never trains from
    scratch over existing checkpoints. None when ``root`` does not exist or holds no complete checkpoint.
    """
    if not root or not os.path.isdir(root):
        return None
    try:
        step, unreadable = read_tracker(root), None
    except ValueError as exc:
        step, unreadable = None, str(exc)
    if step is not None:
        path = step_dir(root, step)
        if os.path.isdir(path):
            return path
    complete = [p for _, p in list_checkpoints(root) if is_complete_checkpoint(p)]
    using = f"using the newest complete checkpoint {complete[-1]}" if complete else "no complete checkpoint exists"
    if step is not None:
        log_once(logging.WARNING, "checkpoint tracker in %s names step %d but %s does not exist; %s", root, step,
                 step_dir(root, step), using)
    elif unreadable is not None:
        log_once(logging.WARNING, "checkpoint %s; %s", unreadable, using)
    elif complete:
        log_once(logging.WARNING, "no checkpoint tracker in %s; %s", root, using)
    return complete[-1] if complete else None


_logged: set[str] = set()  # the lines log_once logged in this process


def log_once(level: int, msg: str, *args, log: logging.Logger | None = None) -> None:
    """Log ``msg % args`` on ``log`` (this module's logger by default) at ``level`` unless this process logged the
    same line already: the resume's checkpoint is looked up several times per run (the config checks, the trainer,
    the failure line), and each finding is one line."""
    line = msg % args if args else msg
    if line not in _logged:
        _logged.add(line)
        (log or logger).log(level, "%s", line)


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """All ``global_step_<N>`` folders under ``root`` as ``(N, path)``, ordered by N as a number.

    ``global_step_10`` comes after ``global_step_9``. Temporary folders (``global_step_3.tmp``) and other
    names are skipped. An absent ``root`` gives ``[]``.
    """
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_DIR_RE.match(name)
        path = os.path.join(root, name)
        if m and os.path.isdir(path):
            out.append((int(m.group(1)), path))
    return sorted(out)


def is_complete_checkpoint(path: str) -> bool:
    """True when the step folder holds ``data.pt`` (the trainer writes it after every role)."""
    return os.path.isfile(os.path.join(path, TRAINER_STATE_FILE))


def apply_retention(root: str, max_keep: int | None) -> list[str]:
    """Delete old step folders so that at most ``max_keep`` complete checkpoints remain.

    Call only AFTER the newest checkpoint is complete and the tracker names it. Rules:
    - ``max_keep`` None or 0 keeps everything (verl's ``max_ckpt_to_keep``);
    - the checkpoint the tracker names and every folder newer than it are never deleted;
    - among complete checkpoints up to the tracker's step, the ``max_keep`` newest are kept;
    - incomplete folders (failed saves) older than the tracker's step are deleted.
    Without a tracker nothing is deleted (there is no proof that any checkpoint is good).

    Returns:
        The deleted paths, oldest first.
    Raises:
        ValueError: ``max_keep`` is negative or not an int.
    """
    if max_keep is None or max_keep == 0:
        return []
    if isinstance(max_keep, bool) or not isinstance(max_keep, (int, np.integer)) or max_keep < 0:
        raise ValueError(f"max_keep must be None or an int >= 0, got {max_keep!r}")
    latest = read_tracker(root)
    if latest is None or not os.path.isdir(step_dir(root, latest)):
        return []
    ckpts = [(s, p) for s, p in list_checkpoints(root) if s <= latest]
    complete = [(s, p) for s, p in ckpts if is_complete_checkpoint(p) or s == latest]
    keep = {p for _, p in complete[-max_keep:]} | {step_dir(root, latest)}
    deleted = []
    for s, p in ckpts:
        if p not in keep:
            shutil.rmtree(p, ignore_errors=True)
            deleted.append(p)
    # stale temporaries of failed saves older than the latest good one
    for name in os.listdir(root):
        m = re.match(r"^global_step_(\d+)\.tmp$", name)
        if m and int(m.group(1)) < latest:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if deleted:
        logger.info("checkpoint retention (max_keep=%d) deleted %s", max_keep, deleted)
    return deleted


def commit_checkpoint(root: str, step: int, max_keep: int | None = None) -> list[str]:
    """Finish a save: check ``data.pt`` exists, write the tracker, then apply retention.

    Returns the deleted paths. Raises FileNotFoundError if ``global_step_<step>/data.pt`` is missing
    (the save is not complete and the tracker must not name it).
    """
    path = step_dir(root, step)
    if not is_complete_checkpoint(path):
        raise FileNotFoundError(f"cannot commit checkpoint {path!r}: {TRAINER_STATE_FILE} is missing "
                                f"(call save_trainer_state after every role has saved)")
    write_tracker(root, step)
    return apply_retention(root, max_keep)


# ------------------------------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict:
    """RNG states of this process as weights_only-loadable plain types.

    Returns:
        ``{"python": random.getstate() (tuple), "numpy": (str, list[int] of 624 uint32, int, int, float),
        "torch_cpu": uint8 tensor, "torch_cuda": uint8 tensor of the current device or None}``.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state()
    return {
        "python": random.getstate(),
        "numpy": (str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": cuda,
    }


def restore_rng_state(state: dict) -> None:
    """Restore states captured by :func:`capture_rng_state`.

    Raises KeyError naming the missing key. A saved CUDA state on a machine without CUDA is skipped with a
    warning (CPU and python/numpy states are still restored).
    """
    for key in ("python", "numpy", "torch_cpu"):
        if key not in state:
            raise KeyError(f"RNG state lacks {key!r}; has {sorted(state)}")
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch_cpu"])
    cuda = state.get("torch_cuda")
    if cuda is not None:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda)
        else:
            logger.warning("checkpoint holds a CUDA RNG state but CUDA is not available; not restored")


def rate_at_restored_step(scheduler: Any) -> None:
    """After a torch ``LambdaLR`` scheduler's state was restored (a resume): set its optimizer's rates to this run's
    schedule at the restored position (``base_lr x lr_lambda(last_epoch)``), so that the first resumed step trains at
    the new schedule's rate when the schedule changed (another length or ``lr_scheduler_type``); the saved rates
    were the old schedule's. The same rates as saved when the schedule is unchanged. Other schedulers are left as
    they are."""
    from torch.optim.lr_scheduler import LambdaLR

    if not isinstance(scheduler, LambdaLR):
        return
    rates = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = rate
    scheduler._last_lr = rates


# --------------------------------------------------------------------------------------- trainer state


def _plain(obj: Any, where: str) -> Any:
    """Convert OmegaConf containers to plain python; reject objects weights_only cannot load."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if type(obj).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, dict):
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        conv = [_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return conv if isinstance(obj, list) else tuple(conv)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{where} has a {type(obj).__name__}; trainer state must hold plain python types, "
                    f"tensors or OmegaConf containers so that torch.load(weights_only=True) can read it")


def save_trainer_state(step_dir_path: str, dataloader_state: dict | None, global_step: int,
                       config_dict: Any = None) -> str:
    """Write ``<step_dir>/data.pt`` atomically: ``{"dataloader": ..., "global_step": int, "config": ...}``.

    Args:
        step_dir_path: ``<default_local_dir>/global_step_<N>``; its step must equal ``global_step``.
        dataloader_state: ``StatefulDataLoader.state_dict()`` (or None).
        global_step: the step just finished (int >= 0).
        config_dict: the resolved run config (plain dict or OmegaConf container).
    Returns:
        The path of ``data.pt``.
    Raises:
        ValueError: bad step or a folder name that disagrees with ``global_step``.
        TypeError: a value that ``torch.load(weights_only=True)`` cannot read.
    """
    _check_step(global_step)
    if parse_step(step_dir_path) != global_step:
        raise ValueError(f"step folder {step_dir_path!r} does not match global_step={global_step}")
    state = {
        "dataloader": _plain(dataloader_state, "dataloader_state"),
        "global_step": int(global_step),
        "config": _plain(config_dict, "config_dict"),
    }
    path = os.path.join(step_dir_path, TRAINER_STATE_FILE)
    atomic_torch_save(state, path)
    return path


def load_trainer_state(step_dir_path: str) -> dict:
    """Read ``<step_dir>/data.pt`` with ``weights_only=True``; keys ``dataloader``, ``global_step``, ``config``.

    Raises FileNotFoundError naming the missing file.
    """
    path = os.path.join(step_dir_path, TRAINER_STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"trainer state {path!r} not found (incomplete checkpoint?)")
    return torch.load(path, map_location="cpu", weights_only=True)
