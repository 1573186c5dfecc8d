"""Ulysses patch on one process: case P01 (single-process emulation of sp=4), head checks, layout, varlen kernel."""
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from patches.packing import cu_seqlens_from_position_ids
from patches.ulysses import (ULYSSES_ATTN_IMPL, UlyssesGroup, apply_ulysses_patch, dp_sp_rank_layout,
                             repeat_kv_interleaved, validate_ulysses_config)
from patches.varlen import varlen_attention


def _emulated_ulysses(q, k, v, sp, expand):
    """q (1,S,Hq,D), k/v (1,S,Hk,D). Each 'rank' holds S/sp tokens; the all-to-all is emulated with chunk/cat."""
    S, nk = q.shape[1], k.shape[2]
    if nk < sp:
        k, v = expand(k, sp // nk), expand(v, sp // nk)
    # rank r holds seq chunk r of all heads; all-to-all: rank j receives head-chunk j of every seq chunk
    seq_chunks = [t.chunk(sp, dim=1) for t in (q, k, v)]
    outs = []
    for j in range(sp):  # "rank" j after the all-to-all: full sequence, head chunk j
        qj, kj, vj = (torch.cat([c.chunk(sp, dim=2)[j] for c in chunks], dim=1) for chunks in seq_chunks)
        rep = qj.shape[2] // kj.shape[2]
        kj, vj = kj.repeat_interleave(rep, dim=2), vj.repeat_interleave(rep, dim=2)
        outs.append(F.scaled_dot_product_attention(qj.transpose(1, 2), kj.transpose(1, 2), vj.transpose(1, 2),
                                                   is_causal=True).transpose(1, 2))
    # inverse all-to-all: rank r gets seq chunk r of every head chunk; concatenate back to the full (1,S,Hq,D)
    return torch.cat([torch.cat([o.chunk(sp, dim=1)[r] for o in outs], dim=2) for r in range(sp)], dim=1)


def test_p01_gqa_fewer_kv_heads_than_sp():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 8, 4), torch.randn(1, 8, 2, 4), torch.randn(1, 8, 2, 4)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(4, 2).transpose(1, 2),
                                         v.repeat_interleave(4, 2).transpose(1, 2), is_causal=True).transpose(1, 2)
    interleaved = lambda t, n: repeat_kv_interleaved(t, n, dim=2)  # the patch's own repeat
    out = _emulated_ulysses(q, k, v, 4, interleaved)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    # negative control: tiling ([a, b, a, b]) gives ranks 1 and 2 the wrong kv head
    tiled = _emulated_ulysses(q, k, v, 4, lambda t, n: t.repeat(1, 1, n, 1))
    assert (tiled - ref).abs().max() > 1e-2
    assert repeat_kv_interleaved(torch.tensor([[1, 2]]), 2).tolist() == [[1, 1, 2, 2]]


def _tiny(nq, nk, **kw):
    cfg = LlamaConfig(vocab_size=64, hidden_size=8 * nq, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=nq, num_key_value_heads=nk, head_dim=8, **kw)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def test_p01_head_checks_raise_at_patch_time():
    with pytest.raises(ValueError, match=r"num_attention_heads \(6\).*\(4\)"):
        apply_ulysses_patch(_tiny(6, 6), 4)
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\).*\(2\)"):
        apply_ulysses_patch(_tiny(6, 3), 2)
    with pytest.raises(ValueError, match=r"\(28\).*\(8\)"):
        validate_ulysses_config(28, 4, 8)
    for nq, nk, sp in [(8, 2, 4), (32, 4, 8), (8, 8, 4), (8, 1, 8), (28, 4, 4), (6, 3, 1)]:
        validate_ulysses_config(nq, nk, sp)
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        validate_ulysses_config(8, 8, 0)


def test_dp_sp_layout_and_group_checks():
    assert dp_sp_rank_layout(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert dp_sp_rank_layout(4, 4) == ([[0, 1, 2, 3]], [[0], [1], [2], [3]])
    with pytest.raises(ValueError, match="multiple"):
        dp_sp_rank_layout(6, 4)
    with pytest.raises(ValueError, match="process group"):
        UlyssesGroup(None, 2, 0)
    with pytest.raises(ValueError, match="rank"):
        UlyssesGroup(None, 1, 1)
    assert UlyssesGroup().scale == 1.0


def test_varlen_kernel_matches_per_sequence_sdpa_with_window():
    torch.manual_seed(0)
    pos = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1, 2, 0])
    cu, mx = cu_seqlens_from_position_ids(pos)
    q, k, v = torch.randn(10, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8)
    for window in (None, 3):
        out = varlen_attention(q, k, v, cu, mx, kernel="sdpa", sliding_window=window)
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            n = e - s
            i = torch.arange(n)
            m = i[:, None] >= i[None, :]
            if window:
                m &= (i[:, None] - i[None, :]) < window
            ref = F.scaled_dot_product_attention(q[s:e].transpose(0, 1), k[s:e].repeat_interleave(2, 1).transpose(0, 1),
                                                 v[s:e].repeat_interleave(2, 1).transpose(0, 1), attn_mask=m)
            torch.testing.assert_close(out[s:e], ref.transpose(0, 1), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="unknown"):
        varlen_attention(q, k, v, cu, mx, kernel="nope")
    with pytest.raises(ValueError, match="flash_attn"):
        varlen_attention(q, k, v, cu, mx, kernel="flash_attn")  # CPU fp32: not usable, says so


def test_patch_sp1_packed_equals_padded_and_sets_impl():
    torch.manual_seed(0)
    m = _tiny(4, 2).eval()
    apply_ulysses_patch(m)
    assert m.config._attn_implementation == ULYSSES_ATTN_IMPL
    assert not any("ulysses" in k for k in m.state_dict())
    ids = torch.randint(1, 64, (2, 6))
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        packed = m(input_ids=ids[mask.bool()][None], position_ids=pos[mask.bool()][None]).logits[0]
    torch.testing.assert_close(packed, padded[mask.bool()], atol=1e-5, rtol=0)
