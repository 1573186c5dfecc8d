"""Ulysses SP for a vision-language model with the same patch as for text models: a tiny random Qwen2-VL
(``Qwen2VLForConditionalGeneration`` from a config, 2 decoder layers, 1 vision block), fp32, on gloo.

Packed micro-batches of image + text rows (images of different sizes, a text-only row, token counts not a multiple
of the SP size) with M-RoPE positions ``(B, 3, L)`` from the model's own ``get_rope_index``:

* per-token log-probs and entropies at SP=2 (dp=2) and SP=4 (dp=1) equal the unsharded padded forward of
  transformers (which computes its own M-RoPE positions) within 1e-5;
* every parameter gradient, vision tower included, averaged over all ranks with the gather's x sp scale, equals the
  DP-mean of the unsharded gradients within 1e-5 (the vision tower runs replicated on every SP rank);
* the boundaries the attention all-gathers from multi-row position ids ``(4, 1, S/sp)`` are those of row 0.
"""
import copy

import torch
import torch.distributed as dist

from tests.e2e_utils import run_gloo_ranks

IMG, VS, VE, V = 7, 5, 6, 40
P, R = 14, 4
ATOL = 1e-5


def tiny_qwen2_vl(seed=0):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=1,
                         rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=IMG, video_token_id=8, vision_start_token_id=VS, vision_end_token_id=VE,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


def make_batch(model, seed):
    """3 left-padded prompts + right-padded responses: an image row (4 image tokens), a text row, an image row
    opening the sequence (6 tokens); M-RoPE positions (B, 3, L) and the image inputs in row order."""
    g = torch.Generator().manual_seed(seed)
    txt = lambda n: torch.randint(9, V, (n,), generator=g).tolist()  # noqa: E731
    prompts = [[1, VS] + [IMG] * 4 + [VE] + txt(2 + seed), txt(3), [VS] + [IMG] * 6 + [VE] + txt(1)]
    resp = [txt(3), txt(4 - seed), txt(2)]
    ids = torch.zeros(3, P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, resp)):
        ids[i, P - len(p):P], mask[i, P - len(p):P] = torch.tensor(p), 1
        ids[i, P:P + len(r)], mask[i, P:P + len(r)] = torch.tensor(r), 1
    grid = torch.tensor([[1, 4, 4], [1, 4, 6]])
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=g)
    types = (ids == IMG).long()
    rope, _ = model.model.get_rope_index(ids, types, grid, None, attention_mask=mask)
    w = torch.randn(3, R, 2, generator=g)
    return dict(ids=ids, mask=mask, rope=rope.transpose(0, 1), grid=grid, pixels=pixels, types=types,
                resp_mask=mask[:, P:].float(), w=w)


def loss_fn(lp, ent, b):
    return ((lp * b["w"][..., 0] + ent * b["w"][..., 1]) * b["resp_mask"]).sum()


def reference(model, b):
    """transformers' own padded forward (its M-RoPE, its image merge), log-probs at temperature 0.7."""
    from trainer.forward import log_probs_from_logits

    m = copy.deepcopy(model)
    out = m(input_ids=b["ids"], attention_mask=b["mask"], pixel_values=b["pixels"], image_grid_thw=b["grid"],
            mm_token_type_ids=b["types"])
    logits = out.logits[:, P - 1:-1].reshape(3 * R, -1)
    lp, ent = log_probs_from_logits(logits, b["ids"][:, P:].reshape(-1), 0.7, True)
    lp, ent = lp.view(3, R), ent.view(3, R)
    loss_fn(lp, ent, b).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def check_vlm(mesh, world, errors):
    from patches.ulysses import apply_ulysses_patch
    from trainer.forward import forward_log_probs

    base = tiny_qwen2_vl()
    batches = [make_batch(base, d) for d in range(mesh.dp_size)]
    refs = [reference(base, b) for b in batches]
    ref_grads = {n: sum(r[2][n] for r in refs) / mesh.dp_size for n in refs[0][2]}
    model = apply_ulysses_patch(copy.deepcopy(base), mesh.sp)
    b = batches[mesh.dp_rank]
    lp, ent = forward_log_probs(model, b["ids"], b["mask"], b["rope"], R, temperature=0.7, calculate_entropy=True,
                                multi_modal_inputs={"pixel_values": b["pixels"], "image_grid_thw": b["grid"]})
    loss_fn(lp, ent, b).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    ok = b["resp_mask"].bool()
    try:
        assert model.config.vision_config._attn_implementation == "sdpa"  # the vision tower keeps its attention
        torch.testing.assert_close(lp[ok], refs[mesh.dp_rank][0][ok], atol=ATOL, rtol=0)
        torch.testing.assert_close(ent[ok], refs[mesh.dp_rank][1][ok], atol=ATOL, rtol=0)
        vision = [n for n in ref_grads if ".visual." in n and ref_grads[n].abs().sum() > 0]
        assert vision, "no vision-tower gradient in the reference"
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, ref_grads[n], atol=ATOL, rtol=0, msg=lambda m: f"{n}: {m}")
    except AssertionError as e:
        errors.append(f"qwen2-vl sp={mesh.sp.size}: {e}")


def check_multirow_boundaries(mesh, errors):
    """(4, 1, S/sp) positions: the all-gathered boundaries are row 0's, whatever rows 1-3 hold."""
    from patches.packing import cu_seqlens_from_position_ids
    from patches.ulysses import sequence_boundaries

    text = torch.tensor([0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4, 5])  # 3 sequences, 12 tokens (divisible by 2 and 4)
    rows = torch.stack([text, torch.zeros(12, dtype=torch.long), text.flip(0), text * 0 + 3])  # rows 1-3: not text
    n = 12 // mesh.sp.size
    local = rows[:, mesh.sp.rank * n:(mesh.sp.rank + 1) * n].unsqueeze(1)
    cu, mx = sequence_boundaries(local, mesh.sp)
    want, want_mx = cu_seqlens_from_position_ids(text)
    if not (torch.equal(cu, want) and mx == want_mx):
        errors.append(f"multi-row boundaries sp={mesh.sp.size}: {cu.tolist()} != {want.tolist()}")


def body(rank, world, errors):
    """One gloo rank (run by :func:`tests.e2e_utils.run_gloo_ranks`): SP=2 and SP=4 against SP=1."""
    from patches.ulysses import build_dp_sp_groups

    for sp in (2, 4):
        mesh = build_dp_sp_groups(world, sp, rank)
        check_multirow_boundaries(mesh, errors)
        check_vlm(mesh, world, errors)


def test_qwen2_vl_ulysses_sp2_sp4_equal_sp1():
    errors = run_gloo_ranks(4, body, __name__)
    assert not errors, "\n".join(errors)


def test_sp1_packed_forward_equals_transformers_padded_forward():
    """Single process, no SP: the packed path (whole row, M-RoPE rows from the batch) against transformers'."""
    from patches.ulysses import apply_ulysses_patch
    from trainer.forward import forward_log_probs

    base = tiny_qwen2_vl()
    b = make_batch(base, 0)
    ref_lp, ref_ent, _ = reference(base, b)
    model = apply_ulysses_patch(copy.deepcopy(base), 1)
    with torch.no_grad():
        lp, ent = forward_log_probs(model, b["ids"], b["mask"], b["rope"], R, temperature=0.7, calculate_entropy=True,
                                    multi_modal_inputs={"pixel_values": b["pixels"], "image_grid_thw": b["grid"]})
    ok = b["resp_mask"].bool()
    torch.testing.assert_close(lp[ok], ref_lp[ok], atol=ATOL, rtol=0)
    torch.testing.assert_close(ent[ok], ref_ent[ok], atol=ATOL, rtol=0)
