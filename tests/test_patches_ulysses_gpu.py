"""CUDA kernels of patches/varlen.py against the SDPA reference, and a patched model on CUDA (bf16)."""
import copy

import pytest
import torch

from patches.packing import cu_seqlens_from_position_ids
from patches.ulysses import apply_ulysses_patch
from patches.varlen import available_kernels, pick_kernel, varlen_attention

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _inputs():
    torch.manual_seed(0)
    pos = torch.cat([torch.arange(n) for n in (37, 5, 64, 1, 21)]).cuda()
    cu, mx = cu_seqlens_from_position_ids(pos)
    t = pos.numel()
    q = torch.randn(t, 8, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(t, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, cu, mx


@needs_cuda
@pytest.mark.parametrize("kernel", ["torch_varlen", "flash_attn"])
@pytest.mark.parametrize("window", [None, 7])
def test_cuda_kernel_matches_sdpa_reference(kernel, window):
    if kernel == "flash_attn" and kernel not in available_kernels():
        pytest.skip("flash_attn not installed")
    if kernel == "torch_varlen" and kernel not in available_kernels():
        pytest.skip("torch.nn.attention.varlen not available")
    q, k, v, cu, mx = _inputs()
    ref = varlen_attention(q.float(), k.float(), v.float(), cu, mx, kernel="sdpa", sliding_window=window)
    out = varlen_attention(q, k, v, cu, mx, kernel=kernel, sliding_window=window)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)
    # backward runs and agrees with the reference
    qg = q.detach().requires_grad_()
    varlen_attention(qg, k, v, cu, mx, kernel=kernel, sliding_window=window).float().sum().backward()
    qr = q.detach().float().requires_grad_()
    varlen_attention(qr, k.float(), v.float(), cu, mx, kernel="sdpa", sliding_window=window).sum().backward()
    torch.testing.assert_close(qg.grad.float(), qr.grad, atol=5e-2, rtol=0)


@needs_cuda
def test_patched_model_on_cuda_matches_padded_forward():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from trainer.forward import forward_log_probs
    cfg = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).cuda()
    ids = torch.randint(1, 256, (4, 48), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :10] = 0
    mask[1, 40:] = 0
    mask[2, :3] = 0
    mask[2, 30:] = 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    ref, _ = forward_log_probs(base, ids, mask, pos, 16, use_remove_padding=False)
    patched = apply_ulysses_patch(copy.deepcopy(base))
    assert pick_kernel(torch.zeros(1, device="cuda", dtype=torch.bfloat16)) in ("flash_attn", "torch_varlen")
    lp, _ = forward_log_probs(patched, ids, mask, pos, 16)
    ok = mask[:, -16:].bool()
    torch.testing.assert_close(lp[ok], ref[ok], atol=5e-2, rtol=0)


@needs_cuda
def test_host_packed_forward_and_backward_make_no_host_sync():
    """Issue #9: the actor's micro-batch (inputs on the CPU, device given) packs on the host, primes the patch's
    sequence boundaries and copies through pinned memory, so the forward + log-prob + backward never waits for the
    GPU (torch's sync debug mode raises on any synchronising call). Not yet run on a GPU when written."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from trainer.forward import forward_log_probs

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = apply_ulysses_patch(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda())
    ids = torch.randint(1, 96, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    forward_log_probs(model, ids, mask, pos, 5, device="cuda")[0].sum().backward()  # warm-up (lazy inits)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        lp, _ = forward_log_probs(model, ids, mask, pos, 5, temperature=0.7, device="cuda")
        lp.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert lp.shape == (3, 5) and lp.device.type == "cuda"


@needs_cuda
def test_boundary_kwargs_path_on_cuda_matches_padded_forward_eager_and_compiled():
    """The traceable attention path (model patched for a fixed SP size 1, host-packed input with ``device``: the
    boundaries reach the varlen kernel as keyword arguments) on CUDA, eager and with ``torch.compile`` of the layers,
    against the unpatched model's padded SDPA forward (bf16, atol 5e-2 as above). Not yet run on a GPU when written."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    import patches.ulysses as ulysses_mod
    from trainer.forward import forward_log_probs, use_compiled_log_probs
    from trainer.workers.kernels import apply_kernel_options

    cfg = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).cuda()
    ids = torch.randint(1, 256, (4, 48))
    mask = torch.ones_like(ids)
    mask[0, :10] = 0
    mask[1, 40:] = 0
    mask[2, :3] = 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    ref, _ = forward_log_probs(base, ids.cuda(), mask.cuda(), pos.cuda(), 16, use_remove_padding=False)
    eager = apply_ulysses_patch(copy.deepcopy(base), 1)
    compiled = apply_ulysses_patch(copy.deepcopy(base), 1)
    torch._dynamo.reset()
    apply_kernel_options(compiled, {"use_torch_compile": True})
    calls = []
    orig = ulysses_mod._attention_eager
    ulysses_mod._attention_eager = lambda *a, **k: calls.append(1) or orig(*a, **k)
    try:
        lp_e, _ = forward_log_probs(eager, ids, mask, pos, 16, device="cuda")
        lp_c, _ = forward_log_probs(compiled, ids, mask, pos, 16, device="cuda")
    finally:
        ulysses_mod._attention_eager = orig
        use_compiled_log_probs(False)
        torch._dynamo.reset()
    assert not calls  # the general path was not used
    ok = mask[:, -16:].bool().cuda()
    torch.testing.assert_close(lp_e[ok], ref[ok], atol=5e-2, rtol=0)
    torch.testing.assert_close(lp_c[ok], ref[ok], atol=5e-2, rtol=0)
