"""Cheap readability checks of a saved checkpoint, run before anything loads it (the resume check before the workers
start, :func:`trainer.resume_checks.check_resume_checkpoint`, and ``tools/export_hf.py``), so that a truncated or
half-deleted checkpoint stops in one line naming the file instead of a traceback from inside a worker.

Every file ``torch.save`` writes is a zip archive whose directory sits at its end: a file cut short (a copy that
stopped, a full disk) has none, which :func:`zipfile.is_zipfile` sees by reading the last bytes only.
"""
from __future__ import annotations

import os
import zipfile

from trainer.checkpoint.base import TRAINER_STATE_FILE

__all__ = ["unreadable_files", "saved_ranks", "verify_deepspeed_role", "verify_step_folder"]


def unreadable_files(folder: str) -> list[str]:
    """The ``*.pt`` files under ``folder`` (recursively) that are not complete ``torch.save`` archives."""
    bad = []
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(root, name)
            if name.endswith(".pt") and not zipfile.is_zipfile(path):
                bad.append(path)
    return sorted(bad)


def verify_deepspeed_role(role_dir: str, tag: str | None = None) -> None:
    """A DeepSpeed role folder (``global_step_<N>/actor``) holds its ``latest`` tag file, the tag's folder with a
    ``*model_states.pt`` file, and only complete ``*.pt`` archives.

    Raises:
        ValueError: naming the folder or file that is missing or cut short.
    """
    latest = os.path.join(role_dir, "latest")
    if tag is None:
        if not os.path.isfile(latest):
            raise ValueError(f"{latest!r} is missing: {role_dir!r} is not a complete DeepSpeed checkpoint")
        with open(latest, encoding="utf-8") as f:
            tag = f.read().strip()
    folder = os.path.join(role_dir, tag)
    states = [n for n in os.listdir(folder) if n.endswith("model_states.pt")] if os.path.isdir(folder) else []
    if not states:
        raise ValueError(f"{folder!r} holds no *model_states.pt file: the checkpoint is incomplete (a save that "
                         "did not finish, or files deleted)")
    _no_unreadable(role_dir)


def saved_ranks(role_dir: str) -> int:
    """The number of ranks that saved a DeepSpeed role folder (each writes its ``rng_rank_<r>.pt``)."""
    return sum(1 for n in os.listdir(role_dir) if n.startswith("rng_rank_") and n.endswith(".pt"))


def verify_step_folder(step_dir: str, roles: list[str], world: int | None = None) -> None:
    """A step folder (``global_step_<N>``) has its trainer state and a folder for each of ``roles`` (the roles this
    run loads), every DeepSpeed role folder in it passes :func:`verify_deepspeed_role`, and every ``*.pt`` file in
    it is complete. With ``world``, the DeepSpeed folders of ``roles`` were saved by that many ranks (DeepSpeed
    restores its partitions at the world size that saved them).

    Raises:
        ValueError: naming what is missing, cut short or saved at another world size.
    """
    state = os.path.join(step_dir, TRAINER_STATE_FILE)
    if not os.path.isfile(state):
        raise ValueError(f"{state!r} is missing: {step_dir!r} is an incomplete checkpoint (the trainer state is "
                         "written last); resume from an older global_step_<N>")
    for role in roles:
        if not os.path.isdir(os.path.join(step_dir, role)):
            present = sorted(n for n in os.listdir(step_dir) if os.path.isdir(os.path.join(step_dir, n)))
            raise ValueError(f"{step_dir!r} has no {role}/ folder (it holds {present}): it was written by a run "
                             f"without this role; resume with the settings that wrote it, or start a new run from "
                             "its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")
    for name in sorted(os.listdir(step_dir)):
        role_dir = os.path.join(step_dir, name)
        if os.path.isfile(os.path.join(role_dir, "latest")):
            verify_deepspeed_role(role_dir)
            ranks = saved_ranks(role_dir)
            if world is not None and name in roles and ranks and ranks != world:
                raise ValueError(f"{role_dir!r} was saved by {ranks} ranks but this run has {world} "
                                 "(trainer.nnodes x trainer.n_gpus_per_node); resume with the same number of "
                                 "workers, or start a new run from its HF export (tools/export_hf.py)")
    _no_unreadable(step_dir)


def _no_unreadable(folder: str) -> None:
    bad = unreadable_files(folder)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ValueError(f"{bad[0]!r}{more} is not a complete torch checkpoint file (cut short or corrupted); "
                         "resume from another global_step_<N>, or save it again")
