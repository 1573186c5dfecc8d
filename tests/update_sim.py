"""Drive :func:`trainer.workers.update.ppo_update` without models or processes, to check its loss normalisation and
metrics against the full-batch value under every micro-batch split and data-parallel size.

* :class:`FakeEngine` stands in for a DeepSpeed engine: ``backward`` accumulates ``loss.backward()`` into a
  scalar parameter ``w``; ``step`` averages the gradient over the simulated data-parallel ranks (what DeepSpeed's
  all-reduce does) and records it; no weight changes, so every mini-batch sees the same ``w``.
* Data-parallel ranks run as threads; ``global_count`` and ``global_max`` (the collectives of the update loop) are
  replaced by barrier-based sums and maxima over the rank threads, so the counts are the real all-reduced ones.
* The model forward is ``log_prob = w * feat`` per token (``feat`` a data column); the entropy is ``ent`` with
  value exactly ``ent`` and a gradient through ``w``; the critic's values are ``w * feat``.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from trainer.protocol import DataProto

_local = threading.local()


class _Collective:
    """A sum over ``size`` threads (each with ``_local.rank``), like ``dist.all_reduce(SUM)``."""

    def __init__(self, size: int):
        self.size, self.slots = size, [0.0] * size
        self.barrier = threading.Barrier(size, timeout=60)

    def sum(self, value: float) -> float:
        return self._reduce(value, sum)

    def max(self, value: float) -> float:
        return self._reduce(value, max)

    def _reduce(self, value: float, op) -> float:
        if self.size == 1:
            return float(value)
        self.slots[_local.rank] = float(value)
        self.barrier.wait()
        total = float(op(self.slots))
        self.barrier.wait()
        return total


_HOLDER: dict = {}  # the collective of the current run_update, read by the patched global_count


class FakeEngine:
    """The DeepSpeed engine methods ``ppo_update`` calls, around one scalar parameter ``w``."""

    def __init__(self, w: float, collective: _Collective, grads: list):
        self.module = SimpleNamespace(w=torch.tensor(float(w), dtype=torch.float64, requires_grad=True))
        self.collective, self.grads, self.skipped_steps = collective, grads, 0

    def train(self):
        pass

    def backward(self, loss, scale_wrt_gas=False):
        loss.backward()

    def step(self):
        g = self.module.w.grad
        mean = self.collective.sum(0.0 if g is None else float(g)) / self.collective.size
        if _local.rank == 0:
            self.grads.append(mean)
        self.module.w.grad = None

    def zero_grad(self):
        self.module.w.grad = None

    def get_global_grad_norm(self):
        return None

    def parameters(self):
        return [self.module.w]

    def was_step_applied(self):
        return True

    def get_lr(self):
        return [0.0]

    def zero_optimization_stage(self):
        return 0


def fake_forward_micro(role, mb, temperature, calculate_entropy):
    w = role.engine.module.w
    log_prob = w * mb["feat"].double()
    ent = mb["ent"].double() * torch.exp(w - w.detach()) if calculate_entropy else None
    return log_prob, ent


def fake_forward_values(role, mb):
    return role.engine.module.w * mb["feat"].double()


def patch(monkeypatch):
    """Route the update loop's forwards and ``global_count`` to the fakes above."""
    from trainer.workers import model_utils, step_guard, update

    monkeypatch.setattr(model_utils, "forward_micro", fake_forward_micro)
    monkeypatch.setattr(update, "forward_values_micro", fake_forward_values)
    for module in (update, step_guard):  # the update loop's counts and the step guard's finiteness flag
        monkeypatch.setattr(module, "global_count", lambda value, device=None, group=None:
                            _HOLDER["c"].sum(value))
    monkeypatch.setattr(update, "global_max", lambda value, device=None, group=None: _HOLDER["c"].max(value))


def run_update(rows: DataProto, cfg: dict, kind: str, dp: int, n: int = 1, w: float = 0.5,
               response_length: int | None = None) -> tuple[dict, list[float]]:
    """``ppo_update`` over ``rows`` split contiguously over ``dp`` simulated ranks (patch() first); ``cfg``: the
    entries of the actor's (or critic's) section that differ from the packaged defaults.

    Returns ``(metrics, grads)``: the metrics reduced over ranks as the controller does
    (``trainer.metric_utils.reduce_rank_metrics``), and the rank-averaged gradient of ``w`` of each optimizer step.
    """
    from trainer.config import ActorConfig, CriticConfig
    from trainer.config.packaged import packaged_section
    from trainer.metric_utils import reduce_rank_metrics
    from trainer.workers import update

    if kind == "actor":
        section = packaged_section(ActorConfig, "actor_rollout_ref.actor", **cfg)
    else:
        section = packaged_section(CriticConfig, "critic", ["algorithm=gae"], **cfg)

    collective = _Collective(dp)
    _HOLDER["c"] = collective
    grads: list[float] = []
    parts = rows.chunk(dp)
    results: list = [None] * dp
    errors: list = []

    def rank_main(rank: int):
        _local.rank = rank
        try:
            role = SimpleNamespace(engine=FakeEngine(w, collective, grads), dp_size=dp, dp_group=None, sp_size=1,
                                   device=torch.device("cpu"))
            worker = SimpleNamespace(device=torch.device("cpu"))
            results[rank] = update.ppo_update(worker, role, parts[rank], section, n=n, temperature=1.0, kind=kind,
                                              response_length=response_length)
        except BaseException as exc:  # surface in the main thread
            errors.append(exc)
            collective.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(dp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return reduce_rank_metrics(results), grads

