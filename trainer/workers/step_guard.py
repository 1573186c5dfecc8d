"""The optimizer-step guard of every trained model (actor, critic, PRIME PRM; DeepSpeed and Megatron engines).

An optimizer step is applied only when, on every rank, the loss of each micro-batch and the gradient norm are
finite; otherwise it is skipped on every rank (the weights, optimizer moments and LR schedule stay as they were)
and the caller counts it (``<role>/skipped_steps``, ``<role>/consecutive_skipped_steps``; the trainer stops after
``trainer.max_consecutive_skipped_steps`` in a row).

The gradient norm is checked BEFORE the optimizer step, by whoever holds the gradient at that moment:

* gradients in ``param.grad`` (DeepSpeed ZeRO-0 and ZeRO-1, which reduce them inside ``step()``; the Megatron
  CPU path): :func:`optimizer_step` computes this rank's L2 norm of them and the ranks agree through one
  all-reduce. The reduced gradient is the mean of the ranks' gradients, so its norm is at most the largest local
  norm (triangle inequality): finite local norms on every rank mean a finite norm of the applied gradient. A norm
  beyond the range of the gradient dtype counts as not finite.
* gradients in ZeRO-2/3 partitions (reduced during backward): DeepSpeed's ZeRO optimizer computes the global norm
  of the reduced partitions before its inner optimizer step and skips the step when it is not finite
  (``DeepSpeedZeroOptimizer.step``); ``deepspeed.ds_config`` settings that turn this off are refused before
  start-up (:func:`check_ds_config_keeps_norm_check`). After the step, a step reported applied with a
  non-finite (or missing) norm raises instead of training on.
* Megatron's optimizer on GPU: :class:`trainer.megatron.engine.MegatronEngine` reads the norm of the prepared
  gradients before ``step_with_ready_grads``.

A non-finite loss still runs backward on every rank (every rank must join the same collectives), as ``loss * NaN``
so that every gradient it touches is NaN; the skipped step then also clears DeepSpeed's ZeRO gradient buffers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from trainer.workers.batching import global_count

# ``deepspeed.ds_config`` keys whose value turns off DeepSpeed's own norm check of ZeRO-2/3 partitions
_NORM_CHECK_OFF = (("zero_optimization", "compute_grad_norm", False), ("bf16", "check_grad_overflow", False))


class TrainingDiverged(RuntimeError):
    """Too many optimizer steps in a row were skipped because of a non-finite loss or gradient, or a role's state
    is not finite when a checkpoint is due (:mod:`trainer.checkpoint.finite`); one line naming the role."""


@dataclass
class StepOutcome:
    """What :func:`optimizer_step` did.

    Attributes:
        applied: the optimizer step changed the weights.
        grad_norm: the global L2 norm of the gradient before clipping, as the engine reports it (``inf`` for a
            step DeepSpeed skipped; at ZeRO-0 with a plain torch optimizer, the norm of the reduced gradients before
            the step: :func:`_stage0_norm_is_global`);
            None for a step skipped by this guard, or where no norm is kept (ZeRO-0 with torch autocast).
    """

    applied: bool
    grad_norm: float | None


def guarded_backward(engine: Any, loss: torch.Tensor) -> torch.Tensor:
    """``engine.backward`` of a micro-batch loss (already normalised); a non-finite loss is backpropagated as
    ``loss * NaN`` so that every gradient it touches is NaN.

    Args:
        engine: a DeepSpeed engine or :class:`trainer.megatron.engine.MegatronEngine`.
        loss: 0-d tensor.

    Returns:
        0-d bool tensor on the loss's device: the loss was finite (no host sync here; combine the flags of a
        mini-batch with ``&`` and hand them to :func:`optimizer_step`).
    """
    ok = torch.isfinite(loss.detach()).all()
    # not torch.where(ok, loss, nan): its unselected branch would still send 0*NaN into the gradient
    factor = torch.where(ok, 1.0, float("nan")).to(loss.dtype)
    engine.backward(loss * factor, scale_wrt_gas=False)
    return ok


def optimizer_step(engine: Any, losses_finite: torch.Tensor | bool, device: torch.device, kind: str) -> StepOutcome:
    """One guarded optimizer step on the gradients accumulated since the last one (see the module docstring).

    Every rank of the engine's process group must call it (it all-reduces one flag over the default group).

    Args:
        engine: a DeepSpeed engine or :class:`trainer.megatron.engine.MegatronEngine` after the mini-batch's
            backward passes.
        losses_finite: this rank's micro-batch losses were all finite (from :func:`guarded_backward`).
        device: where the flag is all-reduced (the worker's device).
        kind: the role's name in errors (actor, critic, reward_model).

    Raises:
        RuntimeError: the engine applied a step whose gradient norm was not finite or not computed (a DeepSpeed
            configuration whose pre-step norm check is off); the weights may hold NaN from here on.
    """
    local = _local_grad_norm(engine)
    finite = torch.ones((), dtype=torch.bool) if local is None else torch.isfinite(local)
    ok = torch.as_tensor(losses_finite, device=device) & finite.to(device)
    if global_count(0.0 if bool(ok) else 1.0, device) != 0.0:
        _discard_gradients(engine, kind)
        return StepOutcome(applied=False, grad_norm=None)
    engine.step()
    gn = engine.get_global_grad_norm()
    if gn is None and _stage0_norm_is_global(engine):
        gn = 0.0 if local is None else local
    gn = None if gn is None else float(gn)
    applied = bool(engine.was_step_applied())
    if applied and ((gn is not None and not math.isfinite(gn))
                    or (gn is None and engine.zero_optimization_stage() >= 2)):
        raise RuntimeError(f"{kind}: the optimizer applied a step whose gradient norm is {gn} (a DeepSpeed config "
                           "that turns off its gradient norm check?); the weights may no longer be finite")
    return StepOutcome(applied=applied, grad_norm=gn)


def _stage0_norm_is_global(engine: Any) -> bool:
    """Whether the norm of ``param.grad`` before the step is the global gradient norm DeepSpeed would report: a
    DeepSpeed ZeRO-0 engine (its backward all-reduces the gradients over the data-parallel ranks at the accumulation
    boundary; the clip at ``gradient_clipping`` comes in the step) with a plain torch optimizer, which keeps no norm
    for ``engine.get_global_grad_norm()`` as ZeRO-1/2/3 and the bf16/fp16 optimizers do. Not with torch autocast,
    whose gradients are still loss-scaled, nor for a Megatron engine, which reports its own."""
    return (hasattr(engine, "allreduce_gradients") and engine.zero_optimization_stage() == 0
            and not getattr(engine, "torch_autocast_z0_gradscaler", None))


def count_skip(role: Any, outcome: StepOutcome) -> int:
    """1 when the step was skipped, else 0; keeps the role's streak ``role.consecutive_skipped`` (it survives
    across training steps; the trainer stops the run when it reaches ``trainer.max_consecutive_skipped_steps``)."""
    role.consecutive_skipped = 0 if outcome.applied else getattr(role, "consecutive_skipped", 0) + 1
    return 0 if outcome.applied else 1


@torch.no_grad()
def _local_grad_norm(engine: Any) -> torch.Tensor | None:
    """0-d tensor: the L2 norm of the gradients this rank holds in ``param.grad``; None when it holds none."""
    grads = [p.grad for p in engine.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads, 2.0) if grads else None


def _discard_gradients(engine: Any, kind: str) -> None:
    """Drop the accumulated gradients without an optimizer step (every rank does the same)."""
    if engine.zero_optimization_stage() == 0:
        engine.zero_grad()
        return
    # ZeRO keeps reduced gradients in its own buffers, which zero_grad() does not clear (the next step would
    # see them); its overflow path skips the step and clears them. Gradients still in param.grad (ZeRO-1 reduces
    # in step()) are made NaN, so that the reduced gradient is not finite on every rank.
    grads = [p.grad for p in engine.parameters() if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, float("nan"))
    engine.step()
    if engine.was_step_applied():
        raise RuntimeError(f"{kind}: DeepSpeed applied an optimizer step although the loss or gradient norm was "
                           "not finite")


def check_ds_config_keeps_norm_check(ds_config: dict | None) -> None:
    """Refuse a raw DeepSpeed config that turns off the gradient norm check ZeRO-2/3 steps rely on.

    Raises:
        ValueError: naming the key, e.g. ``deepspeed.ds_config.zero_optimization.compute_grad_norm=False``.
    """
    for section, key, off in _NORM_CHECK_OFF:
        entry = (ds_config or {}).get(section) or {}
        value = entry.get(key) if isinstance(entry, dict) else None  # DeepSpeed's own check refuses a non-mapping
        if value is not None and bool(value) == off:
            raise ValueError(f"deepspeed.ds_config.{section}.{key}={value}: DeepSpeed would then apply optimizer "
                             "steps whose gradient norm is not finite (NaN in the weights); remove the key")
