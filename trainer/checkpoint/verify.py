"""Cheap readability checks of a saved checkpoint, run before anything loads it (the resume check before the workers
start, :func:`trainer.resume_checks.check_resume_checkpoint`; ``resume_mode=auto``'s choice of a step,
:func:`trainer.checkpoint.resume.resolve_resume_path`; and ``tools/export_hf.py``), so that a truncated or
half-deleted checkpoint stops in one line naming the file instead of a traceback from inside a worker.

Every file ``torch.save`` writes is a zip archive whose directory sits at its end: a file cut short (a copy that
stopped, a full disk) has none, which :func:`zipfile.is_zipfile` sees by reading the last bytes only. The archive
also records the CRC-32 of every member (``torch.utils.serialization.config.save.compute_crc32``, on by default),
which ``torch.load`` does not check: a file whose bytes changed after the save, same size (a bad disk, a copy
damaged in place), loads silently, and finite wrong values pass every later check. :func:`damaged_member` reads each
member through :mod:`zipfile`, which compares the CRC-32 (files in parallel; about 1.5 GB/s per thread on one CPU
core), so such a file is named before anything loads it too; a member saved without a CRC-32 (recorded as 0) is not
judged. Each file is read once per size and modification time in a process.

A DeepSpeed role folder saved by W ranks (:class:`trainer.checkpoint.deepspeed_manager.DeepSpeedCheckpointManager`,
deepspeed 0.19's ``save_checkpoint``) holds, besides ``latest`` and the tag folder it names:

- ``<tag>/mp_rank_00_model_states.pt`` (ZeRO 0-2: rank 0 writes the module, LR scheduler and client state), or
  ``<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt`` for every rank r < W (ZeRO-3: each rank's partition);
- ``<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` for every rank r < W, when the optimizer is
  partitioned (ZeRO >= 1, or bf16 at ZeRO-0: each rank's optimizer shard);
- ``rng_rank_<r>.pt`` for every rank r < W (the trainer's per-rank RNG states: a resume needs them, an export
  does not).

W is read from what is there, not from the file count: the highest rank index any per-rank file names, plus one,
or the ranks of the run that saved the step (``trainer.nnodes x trainer.n_gpus_per_node`` in its ``data.pt``) when
larger, so that one deleted file of rank 1 is named as missing instead of the folder reading as saved by fewer ranks.
A kind of file that is gone for every rank at once (all optimizer shards) is not seen by name; DeepSpeed reports it.
"""
from __future__ import annotations

import functools
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor

__all__ = ["TRAINER_STATE_FILE", "IncompleteCheckpoint", "unreadable_files", "damaged_member", "saved_ranks",
           "saved_world",
           "expected_files", "verify_deepspeed_role", "verify_step_folder"]

#: the trainer state of a step folder (data loader, global step, run config), written after every role
TRAINER_STATE_FILE = "data.pt"
_SHARD_RE = re.compile(r"^(?P<kind>(?:bf16_)?zero_pp_rank_)(?P<rank>\d+)(?P<rest>_mp_rank_\d+_(?:optim|model)_states\.pt)$")
_RNG_RE = re.compile(r"^rng_rank_(\d+)\.pt$")
_MODEL_ROLES = ("actor", "critic", "reward")  # role folders that hold a model: DeepSpeed's latest or meta.pt
_ADVICE = ("use an earlier global_step_<N> (to resume: trainer.resume_mode=<its path>; trainer.resume_mode=auto "
           "takes the newest complete one), or restore the file")


class IncompleteCheckpoint(ValueError):
    """A file or folder of a checkpoint is missing or cut short (a save that did not finish, files deleted or copied
    in part). ``problem`` names it; ``str()`` adds what to do."""

    def __init__(self, problem: str):
        self.problem = problem
        super().__init__(f"{problem}; {_ADVICE}")


def unreadable_files(folder: str) -> list[str]:
    """The ``*.pt`` files under ``folder`` (recursively) that are not complete ``torch.save`` archives."""
    bad = []
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(root, name)
            if name.endswith(".pt") and not zipfile.is_zipfile(path):
                bad.append(path)
    return sorted(bad)


def damaged_member(path: str) -> str | None:
    """The first member of the ``torch.save`` archive ``path`` whose bytes differ from the CRC-32 recorded when it
    was written (the member's name, e.g. ``archive/data/3``), or None when every member with a recorded CRC-32
    matches. Reads the whole file; the answer is kept per ``(path, size, modification time)``.

    Raises:
        OSError: the file cannot be read. ``path`` must be a zip archive (see :func:`unreadable_files`).
    """
    st = os.stat(path)
    return _damaged_member(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _damaged_member(path: str, size: int, mtime_ns: int) -> str | None:
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.CRC == 0 and info.file_size:  # saved with compute_crc32 off: nothing to compare
                continue
            try:
                with archive.open(info) as member:
                    while member.read(1 << 24):
                        pass
            except zipfile.BadZipFile:
                return info.filename
    return None


def _damaged_files(folder: str) -> list[tuple[str, str]]:
    """``(file, member)`` for each complete ``*.pt`` archive under ``folder`` with a member that fails its CRC-32
    (:func:`damaged_member`), sorted by file."""
    paths = sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
                   if name.endswith(".pt") and zipfile.is_zipfile(os.path.join(root, name)))
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(len(paths), 1))) as pool:
        members = list(pool.map(damaged_member, paths))
    return [(path, member) for path, member in zip(paths, members) if member is not None]


def saved_ranks(role_dir: str, tag: str | None = None) -> int:
    """The number of ranks that saved a DeepSpeed role folder as its file names show: the highest rank index of its
    per-rank files (``rng_rank_<r>.pt``, ``<tag>/*zero_pp_rank_<r>_*``) plus one (0 when there is none)."""
    tag = tag if tag is not None else _read_tag(role_dir)
    folder = os.path.join(role_dir, tag)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    ranks = [int(m["rank"]) for m in map(_SHARD_RE.match, names) if m]
    ranks += [int(m.group(1)) for m in map(_RNG_RE.match, os.listdir(role_dir)) if m]
    return max(ranks, default=-1) + 1


def saved_world(step_dir: str) -> int | None:
    """The number of ranks of the run that saved ``step_dir`` (``trainer.nnodes x trainer.n_gpus_per_node`` of the
    config its ``data.pt`` keeps); None when it keeps none.

    Raises:
        IncompleteCheckpoint: ``data.pt`` is missing, cut short or cannot be read.
    """
    state = os.path.join(step_dir, TRAINER_STATE_FILE)
    if not os.path.isfile(state):
        raise IncompleteCheckpoint(f"{state!r} is missing: {step_dir!r} is an incomplete checkpoint (the trainer "
                                   "state is written last)")
    if not zipfile.is_zipfile(state):
        raise IncompleteCheckpoint(f"{state!r} is not a complete torch checkpoint file (cut short or corrupted)")
    _no_damaged_member(state)  # before torch.load reads a pickle whose bytes changed
    import torch

    try:
        saved = torch.load(state, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read the archive is the same fault for the user
        first = str(exc).split("\n")[0]
        if "weights_only" in first or "Weights only" in first:  # not torch's advice to load it unsafely
            first = "its pickle does not parse as weights"
        raise IncompleteCheckpoint(f"{state!r} cannot be read ({type(exc).__name__}: {first})") from None
    trainer = (saved.get("config") or {}).get("trainer") if isinstance(saved, dict) else None
    try:
        return int(trainer["nnodes"]) * int(trainer["n_gpus_per_node"])
    except (KeyError, TypeError, ValueError):
        return None


def expected_files(role_dir: str, tag: str, world: int | None = None, rng: bool = True) -> tuple[int, list[str]]:
    """``(W, files)``: the ranks W that saved the DeepSpeed role folder ``role_dir`` (:func:`saved_ranks`, or
    ``world`` when larger: the ranks of the run that saved it) and every file, relative to ``role_dir``, a save by
    W ranks writes there (the module docstring lists them; ``rng=False``: without the RNG files)."""
    ranks = max(saved_ranks(role_dir, tag), world or 0, 1)
    folder = os.path.join(role_dir, tag)
    kinds = sorted({(m["kind"], m["rest"]) for m in map(_SHARD_RE.match, os.listdir(folder)) if m})
    files = [os.path.join(tag, f"{kind}{r}{rest}") for kind, rest in kinds for r in range(ranks)]
    if not any(rest.endswith("_model_states.pt") for _, rest in kinds):  # ZeRO 0-2: rank 0's one file
        files.insert(0, os.path.join(tag, "mp_rank_00_model_states.pt"))
    return ranks, files + ([f"rng_rank_{r}.pt" for r in range(ranks)] if rng else [])


def _read_tag(role_dir: str) -> str:
    latest = os.path.join(role_dir, "latest")
    if not os.path.isfile(latest):
        raise IncompleteCheckpoint(f"{latest!r} is missing: {role_dir!r} is not a complete DeepSpeed checkpoint")
    with open(latest, encoding="utf-8") as f:
        return f.read().strip()


def verify_deepspeed_role(role_dir: str, tag: str | None = None, world: int | None = None, rng: bool = False) -> int:
    """A DeepSpeed role folder (``global_step_<N>/actor``) holds its ``latest`` tag file, the tag's folder with a
    ``*model_states.pt`` file, every per-rank file of :func:`expected_files` (``world``: the ranks of the run that
    saved it, when known; ``rng``: each rank's RNG file too, which a resume restores and an export does not read),
    and only complete ``*.pt`` archives. Returns the number of ranks that saved it.

    Raises:
        IncompleteCheckpoint: (a ValueError) naming the folder or file that is missing or cut short.
    """
    tag = tag if tag is not None else _read_tag(role_dir)
    folder = os.path.join(role_dir, tag)
    states = [n for n in os.listdir(folder) if n.endswith("model_states.pt")] if os.path.isdir(folder) else []
    if not states:
        raise IncompleteCheckpoint(f"{folder!r} holds no *model_states.pt file: the checkpoint is incomplete (a "
                                   "save that did not finish, or files deleted)")
    ranks, files = expected_files(role_dir, tag, world, rng)
    missing = [os.path.join(role_dir, f) for f in files if not os.path.isfile(os.path.join(role_dir, f))]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise IncompleteCheckpoint(f"{missing[0]!r}{more} is missing (the checkpoint is incomplete: {role_dir!r} "
                                   f"was saved by {ranks} ranks, each writing its own files)")
    _no_unreadable(role_dir)
    return ranks


def verify_step_folder(step_dir: str, roles: list[str], world: int | None = None) -> None:
    """A step folder (``global_step_<N>``) has its trainer state and a folder for each of ``roles`` (the roles this
    run loads), every DeepSpeed role folder in it passes :func:`verify_deepspeed_role` (at the ranks of the run
    that saved the step, read from its ``data.pt``), and every ``*.pt`` file in it is complete. With ``world``, the
    DeepSpeed folders of ``roles`` were saved by that many ranks (DeepSpeed restores its partitions at the world
    size that saved them). An ``actor``, ``critic`` or ``reward`` folder with neither DeepSpeed's ``latest`` nor
    Megatron's ``meta.pt`` is incomplete. ``roles=[]`` and no ``world`` check completeness only (``resume_mode=auto``'s choice).

    Raises:
        IncompleteCheckpoint: (a ValueError) naming the file or folder that is missing or cut short.
        ValueError: a role folder this run loads is missing, or the step was saved at another world size.
    """
    saved = saved_world(step_dir)
    for role in roles:
        if not os.path.isdir(os.path.join(step_dir, role)):
            present = sorted(n for n in os.listdir(step_dir) if os.path.isdir(os.path.join(step_dir, n)))
            raise ValueError(f"{step_dir!r} has no {role}/ folder (it holds {present}): it was written by a run "
                             f"without this role; resume with the settings that wrote it, or start a new run from "
                             "its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")
    for name in sorted(os.listdir(step_dir)):
        role_dir = os.path.join(step_dir, name)
        if name in _MODEL_ROLES and os.path.isdir(role_dir) and \
                not any(os.path.isfile(os.path.join(role_dir, f)) for f in ("latest", "meta.pt")):
            raise IncompleteCheckpoint(f"{role_dir!r} holds neither a DeepSpeed (latest) nor a Megatron (meta.pt) "
                                       "checkpoint: the checkpoint is incomplete (a save that did not finish, or "
                                       "files deleted)")
        if os.path.isfile(os.path.join(role_dir, "latest")):
            ranks = verify_deepspeed_role(role_dir, world=saved, rng=True)
            if world is not None and name in roles and ranks != world:
                raise ValueError(f"{role_dir!r} was saved by {ranks} ranks but this run has {world} "
                                 "(trainer.nnodes x trainer.n_gpus_per_node); resume with the same number of "
                                 "workers, or start a new run from its HF export (tools/export_hf.py)")
    _no_unreadable(step_dir)


def _no_unreadable(folder: str) -> None:
    bad = unreadable_files(folder)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise IncompleteCheckpoint(f"{bad[0]!r}{more} is not a complete torch checkpoint file (cut short or "
                                   "corrupted)")
    damaged = _damaged_files(folder)
    if damaged:
        (path, member), more = damaged[0], f" (and {len(damaged) - 1} more files)" if len(damaged) > 1 else ""
        raise IncompleteCheckpoint(_damaged_line(path, member, more))


def _damaged_line(path: str, member: str, more: str = "") -> str:
    return (f"{path!r}{more} is damaged: its member {member!r} does not match the CRC-32 recorded when it was saved "
            "(bytes changed since the save)")


def _no_damaged_member(path: str) -> None:
    member = damaged_member(path)
    if member is not None:
        raise IncompleteCheckpoint(_damaged_line(path, member))
