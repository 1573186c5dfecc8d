"""The fused Ulysses all-to-alls on real gloo process groups (2 and 4 spawned CPU processes), float64.

``traceable_qkv_seq_to_heads`` (q, k, v in ONE all-to-all) and its inverse ``traceable_heads_to_seq`` against

* the unsharded tensors: rank r gets every token of heads ``[r*H/sp, (r+1)*H/sp)``, and back; the gradients of a
  loss summed over the ranks are those of the same loss on the full tensors (exact for pure data movement);
* three separate ``all_to_all_seq_to_heads`` calls and one ``all_to_all_heads_to_seq``: the same tensors and the
  same gradients, bit for bit (full tensors), for MHA and GQA (Hk < Hq), from non-contiguous inputs (q/k/v as
  ``(1, H, S, D)`` transposed, as the attention receives them);
* the count of ``dist.all_to_all_single`` calls: 1 for q, k, v in the forward and 1 in the backward (3 and 3 for
  the separate calls);
* ``torch.compile(fullgraph=True)`` of an attention-like function: 2 functional all-to-alls in the forward graph
  (q/k/v, output) and 2 in the backward graph, against 4 and 4 with separate calls; same values and gradients as
  eager.
Each rank records failures instead of raising so that no rank leaves a collective early.
"""
import json
import os
import tempfile
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from patches.sequence_parallel import (UlyssesGroup, all_to_all_heads_to_seq, all_to_all_seq_to_heads,
                                       traceable_heads_to_seq, traceable_qkv_seq_to_heads)
from tests.e2e_utils import free_port

L, D = 5, 3  # tokens per rank, head dim
CASES = [(8, 8), (8, 4), (12, 4)]  # (Hq, Hk): MHA and GQA (Hk < Hq), every count divisible by 2 and 4


def _full(sp, hq, hk, seed):
    """Tensors every rank builds alike: q/k/v (S, H, D), the output grad weights, and the loss weights."""
    g = torch.Generator().manual_seed(seed)
    S = L * sp
    r = lambda h: torch.randn(S, h, D, generator=g, dtype=torch.float64)
    return dict(q=r(hq), k=r(hk), v=r(hk), wq=r(hq), wk=r(hk), wv=r(hk), wy=r(hq))


def _leaves(full, rank):
    """This rank's sequence part of q, k, v as leaves (1, H, L, D), and the (L, H, D) transposed views."""
    seq = slice(rank * L, (rank + 1) * L)
    leaves = [full[n][seq].transpose(0, 1).unsqueeze(0).clone().requires_grad_() for n in "qkv"]
    return leaves, [t[0].transpose(0, 1) for t in leaves]


def _attn_like(q, k, v, to_seq):
    """A head-wise stand-in for attention on (S, H/sp, D): mixes q, k and v per head (GQA: kv heads repeated)."""
    g = q.shape[1] // k.shape[1]
    return to_seq(q * k.repeat_interleave(g, 1) + v.repeat_interleave(g, 1).flip(0))


class _CountA2A:
    """Counts ``torch.distributed.all_to_all_single`` calls (monkeypatched; restored on exit)."""

    def __enter__(self):
        self.n, self.real = 0, dist.all_to_all_single

        def counted(*a, **k):
            self.n += 1
            return self.real(*a, **k)

        dist.all_to_all_single = counted
        return self

    def __exit__(self, *exc):
        dist.all_to_all_single = self.real


def check_exchange(sp, hq, hk, errors):
    rank, group = sp.rank, sp.group
    full = _full(sp.size, hq, hk, seed=hq + 10 * hk)
    heads = lambda h: slice(rank * h // sp.size, (rank + 1) * h // sp.size)
    seq = slice(rank * L, (rank + 1) * L)
    tag = f"sp={sp.size} hq={hq} hk={hk}"
    try:
        # fused: one all-to-all each way
        fl, (q, k, v) = _leaves(full, rank)
        with _CountA2A() as c:
            fused = traceable_qkv_seq_to_heads(q, k, v, group, sp.size)
        assert c.n == 1, f"fused forward all-to-alls: {c.n}"
        loss = sum((t * full[w][:, heads(t.shape[1] * sp.size)]).sum() for t, w in zip(fused, ("wq", "wk", "wv")))
        with _CountA2A() as c:
            loss.backward()
        assert c.n == 1, f"fused backward all-to-alls: {c.n}"
        # separate calls
        sl, sep_in = _leaves(full, rank)
        with _CountA2A() as c:
            sep = [all_to_all_seq_to_heads(t, sp) for t in sep_in]
        assert c.n == 3, f"separate forward all-to-alls: {c.n}"
        sum((t * full[w][:, heads(t.shape[1] * sp.size)]).sum() for t, w in zip(sep, ("wq", "wk", "wv"))).backward()
        for name, f, s, hf in zip("qkv", fused, sep, (hq, hk, hk)):
            assert f.shape == (L * sp.size, hf // sp.size, D), f"{name}: shape {tuple(f.shape)}"
            assert torch.equal(f, full[name][:, heads(hf)]), f"{name}: fused result is not the unsharded heads"
            assert torch.equal(f, s), f"{name}: fused result differs from the separate all-to-all"
        for name, a, b in zip("qkv", fl, sl):
            assert torch.equal(a.grad, b.grad), f"{name}: fused gradient differs from the separate all-to-all"
            want = full["w" + name][seq].transpose(0, 1).unsqueeze(0)  # sum over ranks of sum(x_full * w_full)
            assert torch.equal(a.grad, want), f"{name}: fused gradient is not the unsharded one"

        # inverse: (S, Hq/sp, D) -> (S/sp, Hq, D), alone and after the fused exchange
        o_full = full["wq"] * 0.5 - full["q"]
        o = o_full[:, heads(hq)].clone().requires_grad_()
        with _CountA2A() as c:
            y = traceable_heads_to_seq(o, group, sp.size)
        assert c.n == 1, f"inverse forward all-to-alls: {c.n}"
        assert y.is_contiguous() and torch.equal(y, o_full[seq]), "inverse result is not the unsharded sequence part"
        o2 = o.detach().clone().requires_grad_()
        y2 = all_to_all_heads_to_seq(o2, sp)
        assert torch.equal(y, y2), "inverse differs from all_to_all_heads_to_seq"
        (y * full["wy"][seq]).sum().backward()
        (y2 * full["wy"][seq]).sum().backward()
        assert torch.equal(o.grad, full["wy"][:, heads(hq)]) and torch.equal(o.grad, o2.grad), "inverse gradient"

        # round trip through an attention-like op: fused vs separate vs unsharded
        grads = []
        for mode in ("fused", "separate"):
            leaves, (q, k, v) = _leaves(full, rank)
            if mode == "fused":
                q, k, v = traceable_qkv_seq_to_heads(q, k, v, group, sp.size)
                y = _attn_like(q, k, v, lambda t: traceable_heads_to_seq(t, group, sp.size))
            else:
                q, k, v = (all_to_all_seq_to_heads(t, sp) for t in (q, k, v))
                y = _attn_like(q, k, v, lambda t: all_to_all_heads_to_seq(t, sp))
            (y * full["wy"][seq]).sum().backward()
            grads.append((y.detach(), [t.grad for t in leaves]))
        assert torch.equal(grads[0][0], grads[1][0]), "round trip: fused output differs from separate"
        for name, a, b in zip("qkv", grads[0][1], grads[1][1]):
            assert torch.equal(a, b), f"round trip: {name} gradient differs from separate"
        ref_leaves = [full[n].clone().requires_grad_() for n in "qkv"]
        y_ref = _attn_like(*ref_leaves, lambda t: t)
        (y_ref * full["wy"]).sum().backward()
        torch.testing.assert_close(grads[0][0], y_ref[seq].detach(), atol=1e-12, rtol=0)
        for name, a, b in zip("qkv", grads[0][1], ref_leaves):
            torch.testing.assert_close(a, b.grad[seq].transpose(0, 1).unsqueeze(0), atol=1e-12, rtol=0,
                                       msg=lambda m: f"round trip: {name} gradient vs unsharded: {m}")
    except AssertionError as e:
        errors.append(f"{tag}: {e}")


def check_compiled(sp, hq, hk, errors):
    """torch.compile(fullgraph=True) through AOT autograd (no inductor): count the functional all-to-alls of the
    forward and backward graphs, and compare values and gradients with eager."""
    from torch._dynamo.backends.common import aot_autograd

    rank, group = sp.rank, sp.group
    full = _full(sp.size, hq, hk, seed=7)
    seq = slice(rank * L, (rank + 1) * L)

    def fused(q, k, v, w):
        q, k, v = traceable_qkv_seq_to_heads(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                             group, sp.size)
        return (_attn_like(q, k, v, lambda t: traceable_heads_to_seq(t, group, sp.size)) * w).sum()

    def separate(q, k, v, w):
        q, k, v = (all_to_all_seq_to_heads(t[0].transpose(0, 1), sp) for t in (q, k, v))
        return (_attn_like(q, k, v, lambda t: all_to_all_heads_to_seq(t, sp)) * w).sum()

    tag = f"compiled sp={sp.size} hq={hq} hk={hk}"
    try:
        for fn, want in ((fused, 2), (separate, 4)):
            counts = []

            def counting(gm, example_inputs):
                counts.append(sum("all_to_all_single" in str(n.target) for n in gm.graph.nodes))
                return gm.forward

            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=counting, bw_compiler=counting),
                                     fullgraph=True)
            results = []
            for f in (fn, compiled):
                leaves, _ = _leaves(full, rank)
                loss = f(*leaves, full["wy"][seq])
                loss.backward()
                results.append((loss.detach(), [t.grad for t in leaves]))
            assert counts == [want, want], f"{fn.__name__}: all-to-alls in forward/backward graphs {counts}, " \
                f"expected {[want, want]}"
            torch.testing.assert_close(results[1][0], results[0][0], atol=1e-12, rtol=0)
            for name, a, b in zip("qkv", results[1][1], results[0][1]):
                torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=lambda m: f"{fn.__name__} {name}: {m}")
    except AssertionError as e:
        errors.append(f"{tag}: {e}")


def worker(rank, world, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    errors = []
    try:
        sp = UlyssesGroup.from_group(dist.group.WORLD)
        for hq, hk in CASES:
            check_exchange(sp, hq, hk, errors)
        check_compiled(sp, 8, 4, errors)
    except Exception:
        errors.append(traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(errors, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_fused_qkv_all_to_all_matches_separate_calls_and_unsharded(world):
    mp.get_context("forkserver").set_forkserver_preload([__name__])
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(world, free_port(), d), nprocs=world, join=True, start_method="forkserver")
        errors = [f"rank {r}: {e}" for r in range(world) for e in json.load(open(os.path.join(d, f"rank{r}.json")))]
    assert not errors, "\n".join(errors)


def test_fused_exchange_raises_on_indivisible_heads_or_sequence():
    """The checks run before any communication (no process group needed)."""
    q, k = torch.zeros(4, 8, 2), torch.zeros(4, 3, 2)
    with pytest.raises(ValueError, match=r"head counts \[8, 3, 3\].*SP size 2"):
        traceable_qkv_seq_to_heads(q, k, k, None, 2)
    with pytest.raises(ValueError, match=r"equal S/sp"):
        traceable_qkv_seq_to_heads(q, torch.zeros(5, 2, 2), torch.zeros(5, 2, 2), None, 2)
    with pytest.raises(ValueError, match=r"sequence length 5 .*SP size 2"):
        traceable_heads_to_seq(torch.zeros(5, 4, 2), None, 2)
