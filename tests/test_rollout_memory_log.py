"""rollout_mode records the GPU memory in use after each wake/sleep stage (faked device counter on CPU)."""
import itertools

import torch

from rollout import memory
from rollout.context import rollout_mode


class _Engine:
    def __init__(self):
        self.calls = []

    def wake_up(self, tags=None):
        self.calls.append(("wake", tuple(tags)))

    def load_weights(self, pairs):
        self.calls.append(("load", len(list(pairs))))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))


def test_memory_log_stages_in_order(monkeypatch):
    ticks = itertools.count(1)
    monkeypatch.setattr(memory, "device_used_gib", lambda: float(next(ticks)))
    monkeypatch.setattr(memory, "empty_cache", lambda: None)
    log, eng = {}, _Engine()
    with rollout_mode(eng, lambda: [("w", torch.zeros(2))], 1024, memory_log=log):
        pass
    assert list(log) == ["before_wake", "weights_awake", "weights_synced", "kv_awake", "generated", "asleep"]
    assert list(log.values()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert eng.calls == [("wake", ("weights",)), ("load", 1), ("wake", ("kv_cache",)), ("sleep", 1)]


def test_timing_log_has_every_stage(monkeypatch):
    monkeypatch.setattr(memory, "empty_cache", lambda: None)
    secs = {}
    with rollout_mode(_Engine(), lambda: [("w", torch.zeros(2))], 1024, timing_log=secs):
        pass
    assert list(secs) == ["before_wake", "weights_awake", "weights_synced", "kv_awake", "generated", "asleep"]
    assert all(v >= 0 for v in secs.values())


def test_no_cuda_records_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    log = {}
    memory.record_device_used(log, "x")
    assert log == {} and memory.device_used_gib() is None
