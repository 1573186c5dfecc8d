"""The Megatron strategy skips a step whose gradient norm is not finite (P25): the CPU path through the real
``update_actor`` with a finite loss of NaN gradient (``sqrt(0 * loss)``), and the megatron-core optimizer path
(GPU) through :func:`trainer.megatron.engine.megatron_guarded_step` with an optimizer that behaves as
megatron-core's bf16 optimizer does (its ``step()`` has no inf/NaN check without an fp16 loss scaler).
"""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.test_megatron_worker import _config, _train_batch  # noqa: E402
from trainer.workers import update  # noqa: E402


@pytest.fixture(scope="module")
def megatron_worker(tmp_path_factory):
    from megatron.core import parallel_state as ps

    from trainer.workers.megatron_actor import MegatronActorRefWorker

    mg = MegatronActorRefWorker(_config(str(tmp_path_factory.mktemp("mg")), "megatron"), 0, 1)
    mg.init_model()
    yield mg
    ps.destroy_model_parallel()
    if torch.distributed.is_initialized():
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()


def test_p25_megatron_cpu_update_skips_nan_gradient(megatron_worker, monkeypatch):
    mg = megatron_worker
    real = update._actor_loss

    def nan_grad_loss(*args, **kwargs):
        loss, m = real(*args, **kwargs)
        return (0 * loss).sqrt(), m                      # value 0 (finite), gradient NaN

    before = {k: v.clone() for k, v in mg.hf_state_dict().items()}
    lr_before = mg.actor.engine.get_lr()[0]
    monkeypatch.setattr(update, "_actor_loss", nan_grad_loss)
    m = mg.update_actor(_train_batch(mg, seed=1))
    assert m["actor/skipped_steps"] == [1.0] and m["actor/consecutive_skipped_steps"] == [1.0]
    after = mg.hf_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert mg.actor.engine.get_lr()[0] == lr_before
    monkeypatch.setattr(update, "_actor_loss", real)
    m = mg.update_actor(_train_batch(mg, seed=2))
    assert m["actor/skipped_steps"] == [0.0] and m["actor/consecutive_skipped_steps"] == [0.0]
    assert any(not torch.equal(before[k], v) for k, v in mg.hf_state_dict().items())


class _Bf16LikeMegatronOptimizer:
    """The documented ``MegatronOptimizer`` calls on plain CPU tensors; ``step()`` is megatron-core's bf16 behaviour
    (prepare, clip by the norm, step: no inf/NaN check, a NaN norm makes clipping a no-op and the step applies)."""

    def __init__(self, params, clip_grad):
        self.params, self.config = list(params), SimpleNamespace(clip_grad=clip_grad)
        self.param_groups = [{"lr": 0.1}]
        self.clipped_by: list[float] = []

    def prepare_grads(self):
        return False

    def get_parameters(self):
        return self.params

    def get_grad_norm(self):
        return float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in self.params])))

    @torch.no_grad()
    def step_with_ready_grads(self):
        for p in self.params:
            p.sub_(0.1 * p.grad)
        return True

    def step(self):
        self.prepare_grads()
        norm = self.get_grad_norm()
        self.step_with_ready_grads()
        return True, norm, None

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def test_p25_megatron_optimizer_path_checks_the_norm_before_the_step(monkeypatch):
    import megatron.core.distributed as mcd
    import megatron.core.optimizer.clip_grads as clip_grads

    from trainer.megatron.engine import MegatronEngine

    monkeypatch.setattr(mcd, "finalize_model_grads", lambda models: None)  # one process: nothing to reduce
    clipped = []
    monkeypatch.setattr(clip_grads, "clip_grad_by_total_norm_fp32",
                        lambda params, max_norm, total_norm: clipped.append((max_norm, total_norm)))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    sched = SimpleNamespace(steps=0)
    sched.step = lambda: setattr(sched, "steps", sched.steps + 1)
    engine = MegatronEngine(model, 1, optimizer=_Bf16LikeMegatronOptimizer(model.parameters(), clip_grad=1.0),
                            lr_scheduler=sched, megatron_optimizer=True)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(3, 4)
    engine.backward((0 * model(x).pow(2).mean()).sqrt())
    engine.step()
    assert not engine.was_step_applied() and engine.skipped_steps == 1 and sched.steps == 0 and not clipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())       # the NaN gradient was dropped
    engine.backward(model(x).pow(2).mean())
    engine.step()
    assert engine.was_step_applied() and sched.steps == 1
    assert clipped == [(1.0, engine.get_global_grad_norm())]
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
