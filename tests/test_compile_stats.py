"""rollout.compile_stats counts the graphs torch.compile makes, so a recompilation during a step shows in its
metrics (CPU: dynamo's eager backend; the CUDA-graph count needs a GPU and reads 0 here)."""
import itertools

import torch

from rollout import compile_stats


def test_a_new_shape_counts_one_graph_and_a_repeat_none():
    fn = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    before = compile_stats.compile_counts()
    fn(torch.ones(3))
    first = compile_stats.count_delta(before, "perf/rollout")
    assert first == {"perf/rollout/dynamo_graphs": 1.0, "perf/rollout/cudagraph_records": 0.0}
    again = compile_stats.compile_counts()
    fn(torch.ones(3))
    assert compile_stats.count_delta(again, "p")["p/dynamo_graphs"] == 0.0
    fn(torch.ones(5))  # another static shape: one more graph
    assert compile_stats.count_delta(again, "p")["p/dynamo_graphs"] == 1.0


def test_counter_value_reads_an_itertools_count_without_advancing_it():
    c = itertools.count(0)
    next(c), next(c)
    assert compile_stats._counter_value(c) == 2 and next(c) == 2
    assert compile_stats._counter_value(object()) is None
