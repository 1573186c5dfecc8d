"""CUDA-graph compile (``actor_rollout_ref.model.torch_compile_mode=reduce-overhead``) on a GPU: the same log-probs,
entropy and accumulated gradients as eager over micro-batches of different shapes, plain and under DeepSpeed
ZeRO-2 (trainer.workers.kernels, the bucket padding of trainer.forward)."""
import copy
import os

import pytest
import torch

from tests.logprob_utils import shape_varied_batches

from patches.ulysses import apply_ulysses_patch
from trainer.forward import forward_log_probs, use_compiled_log_probs
from trainer.workers.kernels import apply_kernel_options, keep_graph_grads

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GRAPHS = {"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"}


def _model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    return apply_ulysses_patch(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).cuda(), 1)


@pytest.fixture
def fresh_dynamo():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    use_compiled_log_probs(False)
    torch._dynamo.reset()


@needs_cuda
def test_cuda_graph_compile_matches_eager_with_gradient_accumulation(fresh_dynamo):
    base = _model()
    eager, graphed = copy.deepcopy(base), copy.deepcopy(base)
    assert apply_kernel_options(graphed, GRAPHS)[0].startswith("torch.compile(2 layers, mode reduce-overhead")
    keep_graph_grads(graphed)  # a plain loop (no DeepSpeed hooks): autograd would adopt the graphs' grad outputs
    for step in range(2):
        for m in (eager, graphed):
            m.zero_grad(set_to_none=True)
        for ids, mask, pos in shape_varied_batches():  # gradients accumulate over 4 micro-batches
            valid = mask[:, -8:].bool().cuda()
            got = []
            for m in (eager, graphed):
                use_compiled_log_probs(m is graphed)
                lp, ent = forward_log_probs(m, ids, mask, pos, 8, temperature=0.9, calculate_entropy=True,
                                            device="cuda")
                ((lp * valid).sum() + 0.3 * (ent * valid).sum()).backward()
                got.append((lp.detach()[valid], ent.detach()[valid]))
            for a, b in zip(*got):
                torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        for (n, p), q in zip(eager.named_parameters(), graphed.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-3, msg=n)
        with torch.no_grad():  # an optimizer-like in-place update: graphs must read the new weights
            for p, q in zip(eager.parameters(), graphed.parameters()):
                p.add_(p.grad, alpha=-1e-2)
                q.add_(q.grad, alpha=-1e-2)
    assert fresh_dynamo["inductor"]["cudagraph_skips"] == 0, dict(fresh_dynamo["inductor"])
    assert sum(fresh_dynamo["graph_break"].values()) == 0, dict(fresh_dynamo["graph_break"])


@needs_cuda
@pytest.mark.parametrize("zero", [{}, {"overlap_comm": True}], ids=["default", "overlap_comm"])
def test_cuda_graph_compile_under_deepspeed_zero2_matches_eager(fresh_dynamo, zero, request):
    """Two optimizer steps of 2 accumulated micro-batches each through DeepSpeed ZeRO-2 (fp32, one rank, the
    trainer's DeepSpeed config; the trainer accumulates: every ``backward`` adds, every ``step`` steps), no gradient
    hooks of ours (DeepSpeed's copy each gradient out of the graphs' memory). SGD, so that the weights after the
    steps are linear in the accumulated gradients (Adam's first steps are sign-like and would turn rounding noise in
    near-zero gradients into lr-sized differences): they equal eager's, and they moved."""
    import deepspeed
    from trainer.workers.base import DistributedWorker, free_port

    request.getfixturevalue("cuda_deepspeed_accelerator")  # the model on the GPU in a whole-suite run

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    from trainer.config import DeepSpeedConfig, WorkerRuntime
    from trainer.config.packaged import packaged_section

    ds = packaged_section(DeepSpeedConfig, "deepspeed", ["deepspeed=zero2"], bf16=False,
                          ds_config={"zero_optimization": zero})
    w = DistributedWorker(WorkerRuntime(deepspeed=ds, seed=1, cpus_per_worker=1), rank=0, world_size=1, master_addr=os.environ["MASTER_ADDR"],
                          master_port=int(os.environ["MASTER_PORT"]), device="cuda")
    w.init_distributed()
    base = _model()
    engines = []
    for graphs in (False, True):
        m = copy.deepcopy(base)
        if graphs:
            apply_kernel_options(m, GRAPHS)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        engines.append(deepspeed.initialize(model=m, optimizer=opt, config=w.ds_config(train=True))[0])
    for i, (ids, mask, pos) in enumerate(shape_varied_batches()):
        valid = mask[:, -8:].bool().cuda()
        for e, graphs in zip(engines, (False, True)):
            use_compiled_log_probs(graphs)
            lp, _ = forward_log_probs(e, ids, mask, pos, 8, device="cuda")
            e.backward(-(lp * valid).sum() / valid.sum() / 2, scale_wrt_gas=False)
            if i % 2:
                e.step()
    moved = 0.0
    for (n, p), q, b in zip(engines[0].module.named_parameters(), engines[1].module.parameters(), base.parameters()):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-4, msg=n)
        moved = max(moved, (p - b).abs().max().item())
    assert moved > 1e-3, moved
    assert fresh_dynamo["inductor"]["cudagraph_skips"] == 0, dict(fresh_dynamo["inductor"])
