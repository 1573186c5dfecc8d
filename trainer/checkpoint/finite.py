"""Finiteness of a trained role's state, checked in the workers after a checkpoint is loaded and before one is saved.

A checkpoint file damaged in place (bytes overwritten, same size) is still a complete zip archive, so the file checks
of :mod:`trainer.checkpoint.verify` pass it and DeepSpeed loads it; its tensors then hold NaN/inf (``0xff`` bytes
read as NaN), which the next optimizer step spreads into the weights. So:

* after each rank loads its checkpoint (:func:`check_loaded_state`), its model parameters (a ZeRO-3 rank: its
  partition), the fp32 master weights its optimizer updates and every optimizer state tensor (``exp_avg``,
  ``exp_avg_sq``, ...) must be finite; otherwise the resume stops in one line naming the step folder, the role, the
  rank and the state, with the newest complete earlier step to resume from (:class:`DamagedCheckpoint`);
* before a save (:func:`check_state_before_save`), the same state must be finite on every rank of every role,
  otherwise nothing is saved and the tracker keeps naming the last good step (:class:`NonFiniteWeights`).

A damaged pickle (bytes overwritten inside a file's ``data.pkl``) fails earlier, in ``torch.load`` itself
(``UnpicklingError``, ``EOFError``, a ``RuntimeError`` of the zip reader): :func:`reading_checkpoint`, around a
rank's load of a role folder, raises such a failure of a ``torch.load`` as :class:`DamagedCheckpoint` too, naming
the file and the error's first line (without torch's advice to load with ``weights_only=False``: these files are
read as weights only on purpose). Failures outside ``torch.load`` (a shape mismatch, a collective) pass as they came.

``resume_mode=auto`` does not step back past a damaged step by itself: the damage is only seen once the workers
hold the loaded state, after the resume was planned (data loader position, run length); the one line names the
earlier step to pass as ``trainer.resume_mode``.

Each kind of tensor is checked in one fused pass (``torch._foreach_norm`` with ``ord=inf``: the largest ``|x|``,
NaN propagates; finite values cannot overflow it, unlike an L2 norm), without copying the state. The ranks of a
role agree through one ``all_gather_object`` of their findings, so that every rank raises the same line.

The driver turns these worker errors into the errors ``trainer/main.py`` prints as one line
(:func:`one_line_errors`): a damaged checkpoint is a :class:`trainer.config_checks.ConfigError` (exit 2, like the
other refused resumes), non-finite weights at a save a :class:`trainer.workers.step_guard.TrainingDiverged`.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

import torch

__all__ = ["DamagedCheckpoint", "NonFiniteWeights", "nonfinite_state", "check_loaded_state",
           "check_state_before_save", "one_line_errors", "reading_checkpoint"]

PARAMS, MASTER = "model parameters", "fp32 master weights"


class DamagedCheckpoint(ValueError):
    """A loaded checkpoint holds non-finite values (one line naming the step folder, role, rank and state)."""


class NonFiniteWeights(RuntimeError):
    """A role's state is not finite when a checkpoint is due (one line naming the step and the role)."""


def nonfinite_state(engine: Any) -> str | None:
    """The first kind of this rank's state of ``engine`` (a DeepSpeed engine or
    :class:`trainer.megatron.engine.MegatronEngine`) that holds a NaN or inf: ``"model parameters"``, ``"fp32 master
    weights"`` (the tensors the optimizer updates, when they are not the parameters) or ``"optimizer state
    (<key>)"`` (``exp_avg``, ``exp_avg_sq``, ...); None when everything is finite."""
    params = [getattr(p, "ds_tensor", p) for p in engine.module.parameters()]  # ZeRO-3: this rank's partition
    kinds: dict[str, list[torch.Tensor]] = {PARAMS: params}
    seen = {id(p) for p in engine.module.parameters()} | {id(t) for t in params}
    for opt in _base_optimizers(getattr(engine, "optimizer", None)):
        state = getattr(opt, "state", None) or {}
        kinds.setdefault(MASTER, []).extend(t for t in state if torch.is_tensor(t) and id(t) not in seen)
        for entry in state.values():
            for key, value in (entry.items() if isinstance(entry, dict) else ()):
                if torch.is_tensor(value) and value.is_floating_point():
                    kinds.setdefault(f"optimizer state ({key})", []).append(value)
    return next((kind for kind, tensors in kinds.items() if not _all_finite(tensors)), None)


def check_loaded_state(engine: Any, role: str, role_dir: str) -> None:
    """After every rank of ``role`` loaded ``role_dir`` (``.../global_step_<N>/<role>``): raise
    :class:`DamagedCheckpoint` on every rank when any rank's state is not finite (:func:`nonfinite_state`); every
    rank must call it."""
    bad = _gather(nonfinite_state(engine))
    if bad:
        r, kind = bad
        raise _damaged(role, r, role_dir, f"holds non-finite values in its {kind}")


@contextlib.contextmanager
def reading_checkpoint(role: str, rank: int, role_dir: str) -> Iterator[None]:
    """Around this rank's load of ``role_dir`` (``.../global_step_<N>/<role>``): an exception raised inside a
    ``torch.load`` of one of its files (a damaged pickle: ``UnpicklingError``, ``EOFError``, the zip reader's
    ``RuntimeError``, ...) is raised as :class:`DamagedCheckpoint`, one line naming the step folder, the role, the
    rank, the file, the exception type and its first line, and the newest complete earlier step. Anything raised
    outside ``torch.load`` (and running out of memory inside it) passes as it came."""
    real_load, failed = torch.load, {}

    def recording_load(f, *args, **kwargs):
        try:
            return real_load(f, *args, **kwargs)
        except Exception as exc:
            if threading.current_thread() is owner and not isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
                failed.setdefault(id(exc), (exc, f))
            raise

    owner = threading.current_thread()
    torch.load = recording_load
    try:
        yield
    except Exception as exc:
        hit = failed.get(id(exc))
        if hit is None or hit[0] is not exc:
            raise
        name = hit[1]
        if isinstance(name, (str, os.PathLike)):
            name = os.path.relpath(os.path.abspath(name), os.path.abspath(role_dir))
            where = f"its file {name} does not load"
        else:
            where = "a file does not load"
        raise _damaged(role, rank, role_dir, f"is unreadable: {where} ({type(exc).__name__}: "
                                             f"{_first_line(exc)})") from None
    finally:
        torch.load = real_load


def check_state_before_save(engine: Any, role: str, step_dir: str) -> None:
    """Before ``step_dir`` (``.../global_step_<N>``) is saved: raise :class:`NonFiniteWeights` on every rank of
    ``role`` when any rank's state is not finite (nothing of the step is written yet); every rank must call it."""
    bad = _gather(nonfinite_state(engine))
    if bad:
        r, kind = bad
        root, name = os.path.split(os.path.abspath(step_dir))
        from trainer.checkpoint.base import find_latest_checkpoint

        raise NonFiniteWeights(f"{role}: the {kind} of rank {r} are not finite after step "
                               f"{name.removeprefix('global_step_')}; its checkpoint is not saved (last checkpoint: "
                               f"{find_latest_checkpoint(root)}, resume there with trainer.resume_mode=auto)")


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Around a worker group call: a :class:`DamagedCheckpoint` raised in a worker is raised here as a
    :class:`trainer.config_checks.ConfigError`, a :class:`NonFiniteWeights` as a
    :class:`trainer.workers.step_guard.TrainingDiverged`, each with the worker's line (``trainer/main.py`` prints them as
    one line); any other failure is raised as it came."""
    from trainer.worker_errors import WorkerFailure

    try:
        yield
    except WorkerFailure as exc:
        cause = getattr(exc.__cause__, "cause", exc.__cause__)  # Ray's RayTaskError, or the exception itself
        if isinstance(cause, DamagedCheckpoint):
            from trainer.config_checks import ConfigError

            raise ConfigError(str(cause)) from None
        if isinstance(cause, NonFiniteWeights):
            from trainer.workers.step_guard import TrainingDiverged

            raise TrainingDiverged(str(cause)) from None
        raise


def _damaged(role: str, rank: int, role_dir: str, problem: str) -> DamagedCheckpoint:
    """The one line of a damaged checkpoint: ``<role> rank <r>: the checkpoint <step folder> <problem>; it is
    damaged: <what to do instead>``."""
    step_dir = os.path.dirname(os.path.abspath(role_dir))
    return DamagedCheckpoint(f"{role} rank {rank}: the checkpoint {step_dir} {problem}; it is damaged: "
                             f"{_earlier_advice(step_dir)}")


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message that says what failed: for torch's weights-only refusal (whose first
    lines advise loading with ``weights_only=False``), the unpickler's own error at its end."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text[text.index(marker):]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else repr(exc)


def _earlier_advice(step_dir: str) -> str:
    """What to do instead of resuming from the damaged ``step_dir``: its newest complete earlier step, or afresh."""
    from trainer.checkpoint.base import parse_step
    from trainer.checkpoint.resume import newest_complete_before

    earlier = newest_complete_before(os.path.dirname(step_dir), parse_step(step_dir))
    start = "start afresh with trainer.resume_mode=disable"
    return f"resume from an earlier step with trainer.resume_mode={earlier}, or {start}" if earlier else \
        f"restore its files, or {start}"


def _gather(finding: str | None) -> tuple[int, str] | None:
    """``(rank, finding)`` of the lowest rank whose finding is not None (every rank gets the same), or None."""
    dist = torch.distributed
    found = [finding]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, finding)
    return next(((r, f) for r, f in enumerate(found) if f is not None), None)


def _base_optimizers(opt: Any) -> list[Any]:
    """The optimizers that hold state inside ``opt``: DeepSpeed's ZeRO / bf16 wrappers and Megatron's keep theirs
    in ``.optimizer``, Megatron's chained optimizer a list in ``.chained_optimizers``."""
    out, todo = [], [opt]
    while todo:
        o = todo.pop()
        if o is None:
            continue
        if getattr(o, "chained_optimizers", None):
            todo.extend(o.chained_optimizers)
        elif getattr(o, "optimizer", None) is not None and getattr(o, "optimizer") is not o:
            todo.append(o.optimizer)
        else:
            out.append(o)
    return out


@torch.no_grad()
def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Every element of ``tensors`` is finite: one ``_foreach_norm(ord=inf)`` per device and dtype, no copies."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel() and t.is_floating_point():
            groups.setdefault((t.device, t.dtype), []).append(t.detach())
    return all(bool(torch.isfinite(torch.stack(torch._foreach_norm(ts, float("inf")))).all())
               for ts in groups.values())
