"""Ulysses SP=2 on 2 GPUs (NCCL) with the group bound at patch time: eager (the primed path, eager all-to-alls),
``torch.compile`` of the decoder layers (the all-to-alls as torch's functional collectives,
``patches.sequence_parallel.traceable_qkv_seq_to_heads``, traced: no graph break) and CUDA graphs
(``torch_compile_mode=reduce-overhead``: each layer's forward and backward, NCCL all-to-alls included, recorded
and replayed). Each gives the log-probs, entropy
and gradients (summed over the SP ranks, 4 accumulated micro-batches of different shapes, two optimizer-like
updates) of the unsharded SP=1 eager model, fp32, atol 1e-4. Each rank records failures instead of raising, so
that no rank leaves a collective early."""
import copy
import json
import os
import tempfile
import time
import traceback

import pytest
import torch

from tests.logprob_utils import shape_varied_batches

pytestmark = pytest.mark.gpu
MODES = ("eager", "default", "reduce-overhead")


def _model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def _check(mode, sp, errors):
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from patches.ulysses import UlyssesGroup, apply_ulysses_patch
    from trainer.forward import forward_log_probs, use_compiled_log_probs
    from trainer.workers.kernels import apply_kernel_options, keep_graph_grads

    torch._dynamo.reset()
    counters.clear()
    base = _model().cuda()
    ref = apply_ulysses_patch(copy.deepcopy(base), 1)
    model = apply_ulysses_patch(copy.deepcopy(base), sp)
    if mode != "eager":
        apply_kernel_options(model, {"use_torch_compile": True, "torch_compile_mode": mode})
        keep_graph_grads(model)  # a plain loop: no DeepSpeed hooks copy the gradients out of the graphs' memory
    try:
        for step in range(2):
            for m in (ref, model):
                m.zero_grad(set_to_none=True)
            for ids, mask, pos in shape_varied_batches():
                valid = mask[:, -8:].bool().cuda()
                got = []
                for m, group in ((ref, UlyssesGroup()), (model, sp)):
                    use_compiled_log_probs(m is model and mode != "eager")
                    lp, ent = forward_log_probs(m, ids, mask, pos, 8, temperature=0.9, calculate_entropy=True,
                                                sp=group, device="cuda")
                    ((lp * valid).sum() + 0.3 * (ent * valid).sum()).backward()
                    got.append((lp.detach()[valid], ent.detach()[valid]))
                for a, b in zip(*got):
                    torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
            for p in model.parameters():  # the gather's backward scales by sp: the mean over ranks is the gradient
                dist.all_reduce(p.grad)
                p.grad /= sp.size
            for (n, p), q in zip(ref.named_parameters(), model.parameters()):
                torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-3, msg=lambda m, n=n: f"{n}: {m}")
            with torch.no_grad():  # an optimizer-like in-place update: graphs must read the new weights
                for p, q in zip(ref.parameters(), model.parameters()):
                    p.add_(p.grad, alpha=-1e-2)
                    q.add_(q.grad, alpha=-1e-2)
        if mode != "eager":
            assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
            assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    except AssertionError as e:
        errors.append(f"{mode}: {e}")
    finally:
        use_compiled_log_probs(False)


def _worker(rank, world, port, out_dir):
    import torch.distributed as dist

    from patches.ulysses import UlyssesGroup

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    errors, done = [], {}

    def save():  # after every mode, so that a run stopped by a timeout still tells which modes finished
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(dict(errors=errors, done=done), f)

    try:
        sp = UlyssesGroup(dist.new_group(list(range(world))), world, rank)
        for mode in MODES:
            t0 = time.perf_counter()
            _check(mode, sp, errors)
            done[mode] = round(time.perf_counter() - t0, 1)
            save()
    except Exception:
        errors.append(traceback.format_exc())
    save()
    dist.destroy_process_group()


def run(out_dir: str) -> list[str]:
    """Spawn the 2 ranks; returns their failures (``out_dir/rank{r}.json`` also lists the modes done, seconds)."""
    import torch.multiprocessing as mp

    from trainer.workers.base import free_port

    mp.start_processes(_worker, args=(2, free_port(), out_dir), nprocs=2, join=True, start_method="spawn")
    return [f"rank {r}: {e}" for r in range(2) for e in json.load(open(os.path.join(out_dir, f"rank{r}.json")))["errors"]]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_sp2_functional_all_to_alls_eager_compiled_and_cuda_graphs_match_sp1():
    with tempfile.TemporaryDirectory() as d:
        errors = run(d)
    assert not errors, "\n".join(errors)


if __name__ == "__main__":  # python tests/test_ulysses_graphs_gpu.py OUT_DIR (keeps the per-rank files)
    import sys

    os.makedirs(sys.argv[1], exist_ok=True)
    print("\n".join(run(sys.argv[1])) or "all modes match")
