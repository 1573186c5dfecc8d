"""DataProto.concat's meta rule and the per-stage peak-memory helper."""
import pytest
import torch

from trainer.protocol import DataProto
from trainer.workers.base import stage_peak_memory


def test_concat_takes_max_of_perf_max_keys_and_first_part_otherwise():
    a = DataProto.from_dict({"x": torch.zeros(2, 1)}, meta={"perf/max_memory_allocated_gb/gen": 3.0, "seed": 1,
                                                            "perf/memory_allocated_gb/rollout_start": 1.0})
    b = DataProto.from_dict({"x": torch.ones(1, 1)}, meta={"perf/max_memory_allocated_gb/gen": 5.5, "seed": 2,
                                                           "perf/max_memory_reserved_gb/ref": 7.0,
                                                           "perf/memory_allocated_gb/rollout_start": 9.0})
    out = DataProto.concat([a, b])
    assert out["x"].shape == (3, 1)
    assert out.meta["perf/max_memory_allocated_gb/gen"] == 5.5     # max over ranks
    assert out.meta["perf/max_memory_reserved_gb/ref"] == 7.0      # held by one part only
    assert out.meta["seed"] == 1                                   # other keys: the first part's
    assert out.meta["perf/memory_allocated_gb/rollout_start"] == 1.0


def test_stage_peak_memory_is_empty_off_cuda():
    assert stage_peak_memory(torch.device("cpu"), "gen") == {}


def test_concat_refuses_parts_with_different_non_tensor_columns():
    a = DataProto.from_dict({"x": torch.zeros(2, 1)}, {"uid": ["a", "b"], "ability": ["m", "m"]})
    b = DataProto.from_dict({"x": torch.zeros(1, 1)}, {"uid": ["c"]})
    with pytest.raises(ValueError, match=r"part 1 has non-tensor columns \['uid'\], part 0 has \['ability', 'uid'\]"):
        DataProto.concat([a, b])
    assert list(DataProto.concat([a, a])["uid"]) == ["a", "b", "a", "b"]


def test_multi_turn_call_seconds_are_the_slowest_workers_not_the_first():
    a = DataProto.from_dict({"x": torch.zeros(1, 1)}, meta={"multi_turn/tool_wall_s": 1.5,
                                                            "multi_turn/generate_s": 4.0})
    b = DataProto.from_dict({"x": torch.zeros(1, 1)}, meta={"multi_turn/tool_wall_s": 6.0,
                                                            "multi_turn/generate_s": 2.0})
    out = DataProto.concat([a, b])
    assert out.meta["multi_turn/tool_wall_s"] == 6.0  # the first worker's was 1.5
    assert out.meta["multi_turn/generate_s"] == 4.0


def test_generation_seconds_are_the_slowest_workers_and_the_window_spans_every_worker():
    a = DataProto.from_dict({"x": torch.zeros(1, 1)}, meta={"timing_gen_s": 2.0, "perf/worker_s/gen": 2.0,
                                                            "perf/rollout_s/generate": 1.5,
                                                            "rollout_gen_window": (100.0, 101.5)})
    b = DataProto.from_dict({"x": torch.zeros(1, 1)}, meta={"timing_gen_s": 3.0, "perf/worker_s/gen": 3.0,
                                                            "perf/rollout_s/generate": 2.5,
                                                            "rollout_gen_window": (100.2, 102.7)})
    out = DataProto.concat([a, b])
    assert out.meta["timing_gen_s"] == 3.0 and out.meta["perf/worker_s/gen"] == 3.0
    assert out.meta["perf/rollout_s/generate"] == 2.5
    assert out.meta["rollout_gen_window"] == (100.0, 102.7)


def _worker_result(rows, **meta):
    return DataProto.from_dict({"x": torch.zeros(rows, 1)}, meta=meta)


def test_tool_metrics_of_a_call_over_two_workers_join_every_workers_values():
    """The sandbox level of a call over two workers is the weakest any worker ran, not worker 0's."""
    from trainer.placement import PendingCall

    class Group:  # the worker group's wait, without Ray: each rank's result
        def _get(self, futures, method, ranks):
            return futures

    for levels in ((3.0, 1.0), (1.0, 3.0)):
        w0 = _worker_result(2, **{"tool/python/isolation_level": levels[0], "seed": 1})
        w1 = _worker_result(6, **{"tool/python/isolation_level": levels[1]})
        for joined in (DataProto.concat_workers([w0, w1]),
                       PendingCall(Group(), "generate_sequences", [w0, w1]).result()):
            assert len(joined) == 8 and joined.meta["seed"] == 1
            assert joined.meta["tool/python/isolation_level"] == 1.0


def test_join_tool_metrics_reads_only_tool_keys_held_by_any_call():
    from trainer.protocol import join_tool_metrics

    level = "tool/python/isolation_level"
    assert join_tool_metrics([{level: 2, "perf/max_a": 1.0}, {"seed": 3}, {level: 4}]) == {level: 2.0}
    assert join_tool_metrics([{"perf/max_a": 1.0}]) == {} and join_tool_metrics([]) == {}
