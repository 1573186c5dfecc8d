"""A DeepSpeed-engine-shaped wrapper around a megatron-core GPTModel, so that the shared worker code
(``trainer.workers.model_utils.forward_batch_log_probs``, ``trainer.workers.update.ppo_update``) drives the
Megatron actor without a second training loop.

What the shared code calls on ``role.engine`` and what :class:`MegatronEngine` does:

========================================  ==============================================================
call                                      MegatronEngine
========================================  ==============================================================
``engine(input_ids=, attention_mask=,``   ``trainer.megatron.model.forward_logits`` (left-aligned rows,
``position_ids=, use_cache=)``            logits ``(B, L, vocab)`` with TP-gathered vocab) as ``.logits``
``backward(loss, scale_wrt_gas=False)``   ``loss.backward()`` (megatron DDP hooks fill its grad buffers)
``step()``                                GPU: :func:`megatron_guarded_step` (norm, then clip and step);
                                          CPU: DP all-reduce (mean), TP-aware norm and clip, torch
                                          optimizer step; both only when the norm is finite; then the LR
                                          scheduler steps and gradients are zeroed
``was_step_applied()``                    the last ``step`` changed the weights
``get_global_grad_norm()``                gradient norm before clipping of the last ``step``
``zero_optimization_stage()``             0 (a skipped step only zeroes the gradients)
``get_lr()``, ``zero_grad()``,            as DeepSpeed's
``train()``, ``eval()``, ``module``
========================================  ==============================================================

Gradient scale: the shared loss is multiplied by the data-parallel size (``core_algos.agg_loss``) because
DeepSpeed averages gradients over data-parallel ranks; megatron's DDP averages them too
(``gradient_scaling_factor = 1/dp``), and the CPU path averages explicitly, so the step is the same.
"""
from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from trainer.megatron.model import forward_logits, run_with_cpu_as_current_device


_CPU_TP_COMPAT = False


def install_cpu_tp_compat() -> None:
    """CPU only (tests): megatron-core's tensor-parallel gathers/scatters (``tensor_parallel.mappings``) allocate
    their output on ``torch.cuda.current_device()``; run them with the current device mapped to ``cpu``.
    Idempotent; a no-op when CUDA is available. Complements ``trainer.megatron.model.install_cpu_compat``.
    """
    global _CPU_TP_COMPAT
    if _CPU_TP_COMPAT or torch.cuda.is_available():
        return
    import megatron.core.tensor_parallel.mappings as mappings

    on_cpu = run_with_cpu_as_current_device
    for name in ("_gather_along_last_dim", "_gather_along_first_dim", "_reduce_scatter_along_first_dim",
                 "_reduce_scatter_along_last_dim"):
        if hasattr(mappings, name):
            setattr(mappings, name, on_cpu(getattr(mappings, name)))
    _CPU_TP_COMPAT = True


def unwrap(module: Any) -> torch.nn.Module:
    """The innermost module under megatron's ``DistributedDataParallel`` / ``Float16Module`` wrappers."""
    while hasattr(module, "module") and isinstance(module.module, torch.nn.Module):
        module = module.module
    return module


class ShadowLRScheduler:
    """Drives the learning rate of an optimizer that is not a ``torch.optim.Optimizer`` (Megatron's) with a torch
    scheduler run on a one-parameter shadow optimizer, so that both strategies share one LR schedule.

    Args:
        optimizer: anything with ``param_groups`` (list of dicts with ``lr``).
        shadow_scheduler: a torch LR scheduler whose optimizer is the shadow (e.g. from
            ``DistributedWorker.build_optimizer`` on a dummy module).
    """

    def __init__(self, optimizer: Any, shadow_scheduler: Any):
        self.optimizer, self.shadow = optimizer, shadow_scheduler
        self._apply()

    def _apply(self) -> None:
        lr = self.shadow.optimizer.param_groups[0]["lr"]
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def step(self) -> None:
        with warnings.catch_warnings():  # the shadow optimizer never steps ("scheduler.step() before optimizer")
            warnings.simplefilter("ignore", UserWarning)
            self.shadow.step()
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return self.shadow.state_dict()

    def load_state_dict(self, state: dict) -> None:
        from trainer.checkpoint.base import rate_at_restored_step

        self.shadow.load_state_dict(state)
        rate_at_restored_step(self.shadow)  # the restored position's rate of this run's schedule
        self._apply()


class MegatronEngine:
    """The actor or reference GPTModel with its optimizer, behind the DeepSpeed-engine calls listed in the module doc.

    Args:
        module: the GPTModel, bare (CPU) or wrapped (``DistributedDataParallel(Float16Module(GPTModel))``, GPU).
        vocab_size: the HF vocabulary (padded vocab columns are dropped from the logits).
        optimizer: None (frozen reference), a torch optimizer (CPU path) or a Megatron optimizer
            (``megatron_optimizer=True``: stepped by :func:`megatron_guarded_step`).
        lr_scheduler: stepped once per applied optimizer step; None for none.
        grad_clip: max global gradient norm (CPU path; the Megatron optimizer clips with its own config).
            ``<= 0`` disables clipping.
        dp_group, dp_size: data-parallel group (gradients averaged over it on the CPU path).
        tp_group, tp_rank: tensor-parallel group; parameters not marked ``tensor_model_parallel`` are counted
            once (on TP rank 0) in the gradient norm.
    """

    def __init__(self, module: torch.nn.Module, vocab_size: int, optimizer: Any = None, lr_scheduler: Any = None,
                 grad_clip: float = 1.0, megatron_optimizer: bool = False, dp_group: Any = None, dp_size: int = 1,
                 tp_group: Any = None, tp_rank: int = 0):
        self.module, self.vocab_size = module, int(vocab_size)
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.grad_clip, self.megatron_optimizer = float(grad_clip), megatron_optimizer
        self.dp_group, self.dp_size, self.tp_group, self.tp_rank = dp_group, int(dp_size), tp_group, int(tp_rank)
        self.skipped_steps = 0
        self._grad_norm: float | None = None
        self._step_applied = False

    # ---- forward --------------------------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None,
                 use_cache: bool = False, **_: Any) -> SimpleNamespace:
        """``SimpleNamespace(logits=(B, L, vocab_size))`` in the model dtype; ``position_ids`` are implied by the
        left-aligned mask (``cumsum(attention_mask) - 1``, the batch convention), so they are not read."""
        return SimpleNamespace(logits=forward_logits(self.module, input_ids, attention_mask, self.vocab_size))

    def train(self) -> "MegatronEngine":
        self.module.train()
        return self

    def eval(self) -> "MegatronEngine":
        self.module.eval()
        return self

    def parameters(self):
        return self.module.parameters()

    # ---- training -------------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        """Accumulate gradients of ``loss`` (a scalar); the caller has already scaled it."""
        if self.optimizer is None:
            raise RuntimeError("backward on a frozen Megatron model (no optimizer)")
        loss.backward()

    def zero_optimization_stage(self) -> int:
        return 0

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups] if self.optimizer is not None else [0.0]

    def get_global_grad_norm(self) -> float | None:
        return self._grad_norm

    def zero_grad(self) -> None:
        if hasattr(self.module, "zero_grad_buffer"):  # megatron DDP keeps gradients in its own buffers
            self.module.zero_grad_buffer()
        if self.optimizer is not None:
            if self.megatron_optimizer:
                self.optimizer.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=True)

    def was_step_applied(self) -> bool:
        """The last :meth:`step` changed the weights (as DeepSpeed's ``engine.was_step_applied``)."""
        return self._step_applied

    def step(self) -> None:
        """One optimizer step on the accumulated gradients, then the LR scheduler, then zeroed gradients.

        The gradient norm is computed before the optimizer step on both paths; a step whose norm is not finite
        is not applied (``was_step_applied()`` is False, ``skipped_steps`` grows, the LR scheduler does not step).
        """
        if self.optimizer is None:
            raise RuntimeError("step on a frozen Megatron model (no optimizer)")
        if self.megatron_optimizer:
            self._grad_norm, ok = megatron_guarded_step(self.module, self.optimizer)
        else:
            params = [p for p in self.module.parameters() if p.requires_grad and p.grad is not None]
            if self.dp_size > 1:
                for p in params:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.dp_group)
                    p.grad.div_(self.dp_size)
            self._grad_norm = clip_grad_norm_tp(params, self.grad_clip, self.tp_group, self.tp_rank)
            ok = math.isfinite(self._grad_norm)
            if ok:
                self.optimizer.step()
        self._step_applied = ok
        if ok:
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        else:
            self.skipped_steps += 1
        self.zero_grad()


@torch.no_grad()
def megatron_guarded_step(model: Any, optimizer: Any) -> tuple[float, bool]:
    """A megatron-core optimizer step that is taken only when the gradient norm is finite.

    megatron-core's own ``optimizer.step()`` looks for inf/NaN only with an fp16 loss scaler; with bf16 or fp32
    it clips by a NaN norm (a no-op) and applies the NaN gradient. Here, through the documented
    ``MegatronOptimizer`` calls: ``finalize_model_grads`` (data-parallel reduction), ``prepare_grads()`` (main
    gradients; True when the fp16 scaler found inf/NaN), ``get_grad_norm()`` (global L2 norm over the
    model-parallel group, and the data-parallel group with the distributed optimizer: every rank gets the same
    value), then, only when it is finite, clipping by that norm with ``clip_grad_by_total_norm_fp32`` (each
    sub-optimizer's ``config.clip_grad``, as ``ChainedOptimizer.step`` does) and ``step_with_ready_grads()``.

    Args:
        model: the megatron ``DistributedDataParallel`` module.
        optimizer: from ``megatron.core.optimizer.get_megatron_optimizer``.

    Returns:
        ``(grad_norm, applied)``: the norm before clipping (``nan``/``inf`` when not finite) and whether the
        weights changed.
    """
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    finalize_model_grads([model])
    found_inf = bool(optimizer.prepare_grads())
    grad_norm = float("inf") if found_inf else float(optimizer.get_grad_norm())
    if not math.isfinite(grad_norm):
        return grad_norm, False
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        params = sub.get_parameters()
        if params and float(sub.config.clip_grad) > 0.0:
            clip_grad_by_total_norm_fp32(params, float(sub.config.clip_grad), grad_norm)
    return grad_norm, bool(optimizer.step_with_ready_grads())


@torch.no_grad()
def clip_grad_norm_tp(params: list[torch.nn.Parameter], max_norm: float, tp_group: Any = None,
                      tp_rank: int = 0) -> float:
    """Global L2 norm of the gradients of a tensor-parallel model, clipped in place to ``max_norm``.

    Norm: ``sqrt(sum over TP ranks of sum(g^2) of sharded params + sum(g^2) of replicated params once)``;
    a parameter is sharded when megatron marked it ``tensor_model_parallel``. Clip coefficient as
    ``torch.nn.utils.clip_grad_norm_``: ``min(1, max_norm / (norm + 1e-6))``; nothing is scaled when the norm
    is not finite or ``max_norm <= 0``.

    Returns: the norm before clipping (float; ``nan``/``inf`` when a gradient is not finite).
    """
    if not params:
        return 0.0
    dev = params[0].grad.device
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for p in params:
        if getattr(p, "tensor_model_parallel", False) or tp_rank == 0:
            total += p.grad.detach().double().pow(2).sum()
    if tp_group is not None and dist.is_initialized() and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=tp_group)
    norm = float(total.sqrt())
    if max_norm > 0 and math.isfinite(norm):
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for p in params:
                p.grad.mul_(coef)
    return norm
