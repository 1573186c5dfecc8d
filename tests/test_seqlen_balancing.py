"""Sequence-length balancing across DP ranks and token-budget micro-batches."""
import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.seqlen_balancing import (get_reverse_idx, get_seqlen_balanced_partitions, log_seqlen_unbalance,
                                      rearrange_micro_batches)
from trainer.workers.base import free_port


def _flat(parts):
    return sorted(i for p in parts for i in p)


def test_balanced_partitions_hand_example():
    # LPT, equal size 4: 10->A, 9->B, 8->B(9<10? no: B has 9 < A 10) ... sums end 26 vs 26
    lens = [10, 9, 8, 7, 6, 5, 4, 3]
    parts = get_seqlen_balanced_partitions(lens, 2, equal_size=True)
    assert parts == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert [sum(lens[i] for i in p) for p in parts] == [26, 26]
    # unequal sizes allowed: one long sequence alone, the short ones together
    assert get_seqlen_balanced_partitions([100, 1, 1, 1], 2, equal_size=False) == [[0], [1, 2, 3]]


def test_balanced_partitions_random_properties():
    rng = random.Random(0)
    for _ in range(50):
        k = rng.randint(1, 6)
        n = k * rng.randint(1, 8)
        lens = [rng.randint(1, 500) for _ in range(n)]
        for equal in (True, False):
            parts = get_seqlen_balanced_partitions(lens, k, equal)
            assert len(parts) == k and all(parts)
            assert _flat(parts) == list(range(n))
            if equal:
                assert all(len(p) == n // k for p in parts)
            sums = [sum(lens[i] for i in p) for p in parts]
            if not equal:  # LPT bound: max - min <= longest sequence
                assert max(sums) - min(sums) <= max(lens)
    with pytest.raises(ValueError, match="divisible"):
        get_seqlen_balanced_partitions([1, 2, 3], 2, True)
    with pytest.raises(ValueError, match="non-empty"):
        get_seqlen_balanced_partitions([1], 2, False)


def test_balance_metrics():
    lens = [10, 9, 8, 7, 6, 5, 4, 3]
    m = log_seqlen_unbalance(lens, get_seqlen_balanced_partitions(lens, 2, True))
    assert m["global_seqlen/min"] == 18 and m["global_seqlen/max"] == 34 and m["global_seqlen/minmax_diff"] == 16
    assert m["global_seqlen/balanced_min"] == 26 and m["global_seqlen/balanced_max"] == 26
    assert m["global_seqlen/mean"] == 26


def test_rearrange_micro_batches_budget_and_oversized():
    lens = [5, 3, 9, 2, 1, 20]
    mbs = rearrange_micro_batches(lens, max_token_len=10)
    # FFD: 20 alone (over budget, kept), 9+1, 5+3+2
    assert mbs == [[0, 1, 3], [2, 4], [5]]
    assert _flat(mbs) == list(range(6))
    rng = random.Random(1)
    for _ in range(50):
        lens = [rng.randint(0, 64) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(16, 128)
        mbs = rearrange_micro_batches(lens, budget)
        assert _flat(mbs) == list(range(len(lens)))
        for mb in mbs:
            assert len(mb) == 1 or sum(lens[i] for i in mb) <= budget
    order = [i for mb in mbs for i in mb]
    rev = get_reverse_idx(order)
    assert [order[rev[i]] for i in range(len(order))] == list(range(len(order)))
    with pytest.raises(ValueError, match="max_token_len"):
        rearrange_micro_batches([1], 0)


def _worker(rank, port, lens_per_rank, budget, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out[rank] = rearrange_micro_batches(lens_per_rank[rank], budget, dp_group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def test_rearrange_micro_batches_dp_ranks_agree_on_count():
    # rank 0 alone needs 1 micro-batch (8 tokens), rank 1 needs 4 (1 does not fit next to a 10) -> both get 4
    lens = [[3, 2, 2, 1], [10, 10, 10, 1]]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_worker, args=(free_port(), lens, 10, out), nprocs=2, join=True, start_method="forkserver")
        res = dict(out)
    assert len(res[0]) == len(res[1]) == 4
    assert res[0] == [[0], [1], [2], [3]]
    assert _flat(res[0]) == [0, 1, 2, 3] and _flat(res[1]) == [0, 1, 2, 3]
    assert all(sum(lens[0][i] for i in mb) <= 10 for mb in res[0])
