"""Shared helpers of the log-prob equivalence tests (tests/test_kernels.py, tests/test_boundary_kwargs.py, the CUDA-graph
GPU tests)."""
from __future__ import annotations

import contextlib
import copy

import torch

from trainer.forward import forward_log_probs


def lp_ent_grads(m, ids, mask, pos, response_length, temperature=0.7, **kw):
    """Log-probs and entropy ``(batch, response_length)`` of ``m`` and the parameter gradients of
    ``sum(lp) + 0.3 * sum(entropy)`` over the VALID response positions (``mask[:, -response_length:]``)."""
    m.zero_grad()
    lp, ent = forward_log_probs(m, ids, mask, pos, response_length, temperature=temperature,
                                calculate_entropy=True, **kw)
    valid = mask[:, -response_length:].to(device=lp.device, dtype=lp.dtype)
    ((lp * valid).sum() + 0.3 * (ent * valid).sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def assert_same(got, want, valid=None, atol=1e-5, grad_rtol=1e-4):
    """``got`` equals ``want`` (both from :func:`lp_ent_grads`): log-probs and entropy at ``valid`` (all positions
    if None) within ``atol``, the same parameters with gradients, each within ``atol`` / ``grad_rtol``."""
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a if valid is None else a[valid], b if valid is None else b[valid], atol=atol,
                                   rtol=0)
    assert got[2].keys() == want[2].keys()
    for n in want[2]:
        torch.testing.assert_close(got[2][n], want[2][n], atol=atol, rtol=grad_rtol, msg=n)


@contextlib.contextmanager
def compiled_pair(base):
    """``(eager, compiled, counters)``: two copies of ``base``, the second with its decoder layers compiled by
    ``apply_kernel_options(..., use_torch_compile)`` (log-prob math left eager), and torch._dynamo's counters,
    cleared before and dynamo reset after."""
    from torch._dynamo.utils import counters

    from trainer.forward import use_compiled_log_probs
    from trainer.workers.kernels import apply_kernel_options

    eager, compiled = copy.deepcopy(base), copy.deepcopy(base)
    torch._dynamo.reset()
    counters.clear()
    try:
        apply_kernel_options(compiled, {"use_torch_compile": True})
        use_compiled_log_probs(False)
        yield eager, compiled, counters
    finally:
        use_compiled_log_probs(False)
        torch._dynamo.reset()


def shape_varied_batches(vocab: int = 512):
    """Four host micro-batches ``(input_ids, attention_mask, position_ids)`` of different shapes (rows, width, left
    padding), two in the same CUDA-graph bucket; token ids in ``[1, vocab)``."""
    out = []
    for i, (b, w) in enumerate(((3, 40), (4, 33), (3, 41), (3, 40))):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(1, vocab, (b, w), generator=g)
        mask = torch.ones_like(ids)
        for r in range(b):
            mask[r, :int(torch.randint(0, 12, (1,), generator=g))] = 0
        out.append((ids, mask, (mask.cumsum(1) - 1).clamp(min=0)))
    return out
