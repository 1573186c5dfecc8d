"""Ulysses SP on real gloo process groups (2 and 4 spawned CPU processes), fp32.

For Llama, Qwen2, Qwen3 and Mistral tiny configs (2 layers, hidden 64; GQA with fewer KV heads than SP ranks,
MQA, a sliding window) and packed batches of uneven lengths whose token count is not a multiple of sp:

* per-token log-probs and entropies at SP=2 (dp=2) and SP=4 (dp=1) equal the unsharded padded forward (atol 1e-5);
* parameter gradients, averaged over ALL ranks (what DeepSpeed's ZeRO does when its DP group is the whole world)
  with the gather's x sp scale, equal the DP-mean of the unsharded gradients (atol 1e-5); with grad_scale=1 they
  are 1/sp of it (negative control);
* critic values (``forward_values``) agree too; an int-patched model takes its group from ``activate()``;
* the same with the CUDA-graph shape buckets (rows padded with fake sequences) at SP=2;
* host-packed rows of a compiled model with the group bound at patch time take the traceable all-to-alls
  (functional collectives when compiling), which torch.compile traces into the layers with no graph break (SP=2,
  inductor on CPU); the shape-bucket case runs that path eagerly.
Each rank records failures instead of raising so that no rank leaves a collective early.
"""
import copy
import json
import os
import tempfile
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import (AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig, MistralConfig,
                          Qwen2Config, Qwen3Config)

from patches.ulysses import UlyssesGroup, apply_ulysses_patch, build_dp_sp_groups, mark_layers_compiled, patch_info
import patches.ulysses as ulysses_mod
from trainer.forward import forward_log_probs, forward_values
from tests.e2e_utils import free_port

ATOL = 1e-5
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
              head_dim=8, tie_word_embeddings=False)
MODELS = {
    "llama": lambda: LlamaConfig(num_key_value_heads=4, **COMMON),
    "qwen2": lambda: Qwen2Config(num_key_value_heads=2, **COMMON),  # nk=2 < sp=4: interleaved kv repeat
    "qwen3": lambda: Qwen3Config(num_key_value_heads=1, **COMMON),  # MQA
    "mistral": lambda: MistralConfig(num_key_value_heads=2, sliding_window=5, **COMMON),
}
P, R = 6, 5
HOST_PACKED = ("qwen2", "mistral")


def make_batch(seed):
    """(B=3, P+R) left-padded prompts + right-padded responses; nnz = 23 (not a multiple of 2 or 4)."""
    g = torch.Generator().manual_seed(seed)
    plen, rlen = [[6, 3, 4], [2, 6, 5]][seed], [[5, 2, 3], [4, 5, 1]][seed]
    ids = torch.randint(1, 96, (3, P + R), generator=g)
    mask = torch.zeros(3, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(plen, rlen)):
        mask[i, P - p:P + r] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    w = torch.randn(3, R, 2, generator=g)
    return ids, mask, pos, mask[:, P:].float(), w


def loss_fn(lp, ent, resp_mask, w):
    return ((lp * w[..., 0] + ent * w[..., 1]) * resp_mask).sum()


def reference(model, seed):
    m = copy.deepcopy(model)
    ids, mask, pos, rm, w = make_batch(seed)
    lp, ent = forward_log_probs(m, ids, mask, pos, R, temperature=0.7, calculate_entropy=True, use_remove_padding=False)
    loss_fn(lp, ent, rm, w).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def check_lm(name, mesh, world, errors, grad_scale=None, static=0, compiled=False):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(MODELS[name](), attn_implementation="sdpa", dtype=torch.float32)
    refs = [reference(base, d) for d in range(mesh.dp_size)]
    ref_grads = {n: sum(r[2][n] for r in refs) / mesh.dp_size for n in refs[0][2]}
    sp = mesh.sp if grad_scale is None else UlyssesGroup(mesh.sp.group, mesh.sp.size, mesh.sp.rank, grad_scale)
    model = apply_ulysses_patch(copy.deepcopy(base), sp)
    if static:  # shape buckets (CUDA graphs' padding), host path only: bucket of `static` tokens, lcm with sp
        from trainer.workers.kernels import mark_static_shapes

        mark_static_shapes(model, static)
        mark_layers_compiled(model)  # as apply_kernel_options does: the traced path, run eagerly here
    if compiled:  # the trainer's use_torch_compile: each decoder layer compiled (inductor), SP all-to-alls traced
        from torch._dynamo.utils import counters

        from trainer.workers.kernels import apply_kernel_options

        counters.clear()
        apply_kernel_options(model, {"use_torch_compile": True})
    ids, mask, pos, rm, w = make_batch(mesh.dp_rank)
    # qwen2 and mistral take the trainer's path (device given: packing and sequence boundaries computed on the host,
    # passed to the attention as keyword arguments, so the attention never all-gathers positions and, with the
    # group bound at patch time, runs the traceable all-to-alls); llama and qwen3 the device path (eager all-to-alls)
    host = name in HOST_PACKED
    gathers, traced, in_eager = [], [], [False]
    real, real_traced, real_eager = (ulysses_mod._all_gather_nograd, ulysses_mod.traceable_qkv_seq_to_heads,
                                     ulysses_mod._attention_eager)
    # count the all-gathers of integer tensors (positions); the log-prob/entropy gathers are float
    ulysses_mod._all_gather_nograd = lambda x, *a, **k: gathers.extend([1] if not x.is_floating_point() else []) \
        or real(x, *a, **k)

    def eager(*a, **k):  # the eager path (_attention_eager) uses the same all-to-alls: not counted as traced
        in_eager[0] = True
        try:
            return real_eager(*a, **k)
        finally:
            in_eager[0] = False

    if not compiled:  # (a compiled layer would trace the counting wrappers)
        ulysses_mod.traceable_qkv_seq_to_heads = lambda *a: traced.extend([] if in_eager[0] else [1]) or \
            real_traced(*a)
        ulysses_mod._attention_eager = eager
    try:
        lp, ent = forward_log_probs(model, ids, mask, pos, R, temperature=0.7, calculate_entropy=True,
                                    device="cpu" if host else None)
    finally:
        ulysses_mod._all_gather_nograd, ulysses_mod.traceable_qkv_seq_to_heads = real, real_traced
        ulysses_mod._attention_eager = real_eager
    loss_fn(lp, ent, rm, w).backward()
    for p in model.parameters():  # DeepSpeed's average over its DP group = the whole world (dp * sp ranks)
        dist.all_reduce(p.grad)
        p.grad /= world
    tag = f"{name} sp={sp.size} scale={sp.scale}" + (f" static={static}" if static else "") + \
        (" compiled" if compiled else "")
    ok = rm.bool()
    try:
        assert len(gathers) == (0 if host else 1), f"position all-gathers: {len(gathers)} (host-packed: {host})"
        n_layers = model.config.num_hidden_layers
        if compiled:
            breaks = dict(counters["graph_break"])
            assert not breaks, f"graph breaks in the compiled layers: {breaks}"
            assert counters["stats"]["unique_graphs"] >= n_layers, dict(counters["stats"])
        else:  # q, k and v of every layer through ONE traceable all-to-all on the host path of a model marked
            # compiled (SP > 1), none otherwise (eager SP keeps the primed path)
            want = n_layers if host and patch_info(model).compiled and sp.size > 1 else 0
            assert len(traced) == want, f"traceable all-to-alls: {len(traced)}, expected {want}"
        torch.testing.assert_close(lp[ok], refs[mesh.dp_rank][0][ok], atol=ATOL, rtol=0)
        torch.testing.assert_close(ent[ok], refs[mesh.dp_rank][1][ok], atol=ATOL, rtol=0)
        factor = sp.scale / sp.size  # 1 with the right scale; 1/sp for the negative control
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, ref_grads[n] * factor, atol=ATOL, rtol=0, msg=lambda m: f"{n}: {m}")
        if factor != 1:
            diff = max((p.grad - ref_grads[n]).abs().max().item() for n, p in model.named_parameters())
            assert diff > 1e-3, f"negative control: unscaled grads should differ, max diff {diff}"
    except AssertionError as e:
        errors.append(f"{tag}: {e}")


def check_values(mesh, errors, int_patch=False):
    torch.manual_seed(0)
    cfg = Qwen2Config(num_key_value_heads=2, num_labels=1, classifier_dropout=0.0, **COMMON)
    base = AutoModelForTokenClassification.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    ids, mask, pos, rm, w = make_batch(mesh.dp_rank)
    ref = forward_values(copy.deepcopy(base), ids, mask, pos, R, use_remove_padding=False)
    model = apply_ulysses_patch(copy.deepcopy(base), mesh.sp.size if int_patch else mesh.sp)
    with mesh.sp.activate():
        v = forward_values(model, ids, mask, pos, R, device="cpu" if int_patch else None)
    try:
        torch.testing.assert_close(v[rm.bool()], ref[rm.bool()], atol=ATOL, rtol=0)
    except AssertionError as e:
        errors.append(f"values sp={mesh.sp.size} int_patch={int_patch}: {e}")


def worker(rank, world, port, out_dir, plan):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    errors = []
    try:
        meshes = {sp: build_dp_sp_groups(world, sp, rank) for sp in plan["sp"]}
        for sp in plan["sp"]:
            for name in plan["models"]:
                check_lm(name, meshes[sp], world, errors, static=plan.get("static", 0),
                         compiled=plan.get("compiled", False))
            if not plan.get("compiled"):
                check_values(meshes[sp], errors, int_patch=plan.get("int_patch", False))
        if plan.get("negative"):
            check_lm("llama", meshes[plan["sp"][0]], world, errors, grad_scale=1.0)
    except Exception:
        errors.append(traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(errors, f)
    dist.destroy_process_group()


def run(world, plan):
    # forkserver: one server process imports torch/transformers/this module once and forks the ranks from it
    # (plain spawn re-imports them in every rank: ~4x slower on a 2-core machine); no OpenMP state is inherited.
    mp.get_context("forkserver").set_forkserver_preload([__name__])
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(world, free_port(), d, plan), nprocs=world, join=True,
                           start_method="forkserver")
        errors = []
        for r in range(world):
            errors += [f"rank {r}: {e}" for e in json.load(open(os.path.join(d, f"rank{r}.json")))]
    return errors


@pytest.fixture(scope="module")
def four_rank_errors():
    return run(4, {"sp": [4, 2], "models": list(MODELS), "negative": True})


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("sp", [4, 2])
def test_sp_log_probs_entropy_and_grads_match_unsharded(four_rank_errors, name, sp):
    mine = [e for e in four_rank_errors if f"{name} sp={sp} scale={float(sp)}" in e or "Traceback" in e]
    assert not mine, "\n".join(mine)


def test_sp_values_match_unsharded(four_rank_errors):
    mine = [e for e in four_rank_errors if "values" in e or "Traceback" in e]
    assert not mine, "\n".join(mine)


def test_grad_scale_one_gives_one_over_sp_of_the_gradient(four_rank_errors):
    mine = [e for e in four_rank_errors if "scale=1.0" in e or "Traceback" in e]
    assert not mine, "\n".join(mine)


def test_two_ranks_sp2_int_patched_model_uses_active_group():
    errors = run(2, {"sp": [2], "models": ["qwen2"], "int_patch": True})
    assert not errors, "\n".join(errors)


def test_two_ranks_sp2_shape_buckets_keep_log_probs_and_grads():
    """The CUDA-graph shape buckets (trainer.workers.kernels.mark_static_shapes) under SP=2: a bucket of 3 tokens
    is combined with the SP size (lcm 6), the fake sequences are sliced across ranks like real ones, and log-probs,
    entropies and gradients still equal the unsharded forward (host-packed models)."""
    errors = run(2, {"sp": [2], "models": list(HOST_PACKED), "static": 3})
    assert not errors, "\n".join(errors)


def test_two_ranks_sp2_compiled_layers_trace_the_all_to_alls():
    """torch.compile of the decoder layers (inductor on CPU) with SP=2 and the group bound at patch time: the
    attention's all-to-alls are torch's functional collectives, traced into each layer's graph with no graph
    break, and log-probs, entropies and gradients still equal the unsharded forward."""
    errors = run(2, {"sp": [2], "models": ["qwen2"], "compiled": True})
    assert not errors, "\n".join(errors)
