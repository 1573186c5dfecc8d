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
