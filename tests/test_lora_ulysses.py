"""Ulysses SP with LoRA adapters (2 gloo ranks on CPU, fp32): the trainer patches the attention of the HF model,
then peft wraps its linear layers (``ModelRole.build``). At SP=2 the per-token log-probs and entropies of the
adapted model, its reference (adapters disabled) and the adapters' gradients equal the SP=1 (unsharded) forward, on
both the host-packed path (the trainer's) and the device path."""
import copy

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from patches.ulysses import apply_ulysses_patch, build_dp_sp_groups
from tests.e2e_utils import run_gloo_ranks
from tests.test_patches_ulysses_dist import ATOL, MODELS, R, loss_fn, make_batch
from trainer.forward import forward_log_probs
from trainer.workers.lora import LoraSettings, apply_lora, reference_mode

SETTINGS = LoraSettings(rank=4, alpha=8.0, target_modules="all-linear")


def lora_of(model):
    """``model`` with adapters whose ``B`` is random (peft starts it at zero, which would hide a wrong adapter)."""
    model = apply_lora(model, SETTINGS, seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def unsharded(model, seed):
    """SP=1 log-probs, entropies, reference log-probs and adapter gradients of ``model`` (a copy) on batch ``seed``."""
    m = copy.deepcopy(model)
    ids, mask, pos, rm, w = make_batch(seed)
    lp, ent = forward_log_probs(m, ids, mask, pos, R, temperature=0.7, calculate_entropy=True, use_remove_padding=False)
    loss_fn(lp, ent, rm, w).backward()
    with torch.no_grad(), reference_mode(m):
        ref, _ = forward_log_probs(m, ids, mask, pos, R, temperature=0.7, use_remove_padding=False)
    return lp.detach(), ent.detach(), ref, {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}


def check(name, mesh, world, host, errors):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(MODELS[name](), attn_implementation="sdpa", dtype=torch.float32)
    refs = [unsharded(lora_of(copy.deepcopy(base)), d) for d in range(mesh.dp_size)]
    ref_grads = {n: sum(r[3][n] for r in refs) / mesh.dp_size for n in refs[0][3]}
    model = lora_of(apply_ulysses_patch(copy.deepcopy(base), mesh.sp))  # the trainer's order: patch, then peft
    ids, mask, pos, rm, w = make_batch(mesh.dp_rank)
    device = "cpu" if host else None
    lp, ent = forward_log_probs(model, ids, mask, pos, R, temperature=0.7, calculate_entropy=True, device=device)
    loss_fn(lp, ent, rm, w).backward()
    with torch.no_grad(), reference_mode(model):
        ref_lp, _ = forward_log_probs(model, ids, mask, pos, R, temperature=0.7, device=device)
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    for g in grads.values():  # DeepSpeed's average over its DP group = the whole world (dp * sp ranks)
        dist.all_reduce(g)
        g /= world
    ok = rm.bool()
    want_lp, want_ent, want_ref, _ = refs[mesh.dp_rank]
    try:
        torch.testing.assert_close(lp[ok], want_lp[ok], atol=ATOL, rtol=0)
        torch.testing.assert_close(ent[ok], want_ent[ok], atol=ATOL, rtol=0)
        torch.testing.assert_close(ref_lp[ok], want_ref[ok], atol=ATOL, rtol=0)
        assert (ref_lp[ok] - lp[ok]).abs().max() > 1e-3, "the adapters change nothing: the test would not see them"
        assert grads.keys() == ref_grads.keys() and all("lora_" in n for n in grads)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref_grads[n], atol=ATOL, rtol=0, msg=lambda m: f"{n}: {m}")
    except AssertionError as e:
        errors.append(f"{name} host={host}: {e}")


def ranks(rank, world, errors):
    mesh = build_dp_sp_groups(world, 2, rank)
    check("qwen2", mesh, world, True, errors)   # host-packed (the trainer's path)
    check("llama", mesh, world, False, errors)  # device path


def test_sp2_with_lora_adapters_equals_sp1():
    errors = run_gloo_ranks(2, ranks, __name__)
    assert not errors, "\n".join(errors)
