"""trainer.placement.init_ray: which Ray the driver joins."""
from __future__ import annotations

import pytest

from trainer import placement


@pytest.fixture
def fake_ray(monkeypatch):
    calls = []
    monkeypatch.setattr(placement.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(placement.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr("trainer.interrupt.reinstall_handlers", lambda: None)
    return calls


def test_without_ray_address_a_new_local_ray_starts_and_no_ray_start_cluster_is_joined(fake_ray, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    placement.init_ray("cpu")
    assert fake_ray[0]["address"] == "local"  # a bare ray.init() would join the last `ray start` cluster
    assert fake_ray[0]["runtime_env"]["env_vars"]["DS_ACCELERATOR"] == "cpu"


def test_ray_address_is_joined_after_its_probe(fake_ray, monkeypatch):
    probed = []
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6391")
    monkeypatch.setattr(placement, "probe_ray_address", probed.append)
    placement.init_ray("cuda")
    assert probed == ["10.0.0.1:6391"] and fake_ray[0]["address"] == "10.0.0.1:6391"


def test_the_workers_warning_filter_hides_that_warning_only():
    """PYTHONWARNINGS of the workers: DeepSpeed's deprecated torch collective is not printed once per rank; other
    FutureWarnings still are."""
    import subprocess
    import sys

    from trainer.placement import WORKER_WARNING_FILTER

    code = ("import warnings\n"
            "warnings.warn('`torch.distributed.all_gather_into_tensor` is deprecated. Please use x', FutureWarning)\n"
            "warnings.warn('something else is deprecated', FutureWarning)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONWARNINGS": WORKER_WARNING_FILTER, "PATH": "/usr/bin:/bin"}, check=True)
    assert "all_gather_into_tensor" not in out.stderr and "something else is deprecated" in out.stderr


def test_startup_split_names_each_part_of_the_start_up_in_seconds(monkeypatch):
    """The "workers ready" line splits the time since the process started at Ray's start and the workers' start."""
    import trainer.hf_exports as hf_exports
    from trainer.placement import startup_split

    monkeypatch.setattr(hf_exports, "process_start_time", lambda: 1000.0)
    text = startup_split(1012.5, 1030.0, now=1046.25)
    assert text == ("46.2 s after the process started (before Ray 12.5 s, Ray and the placement group 17.5 s, the "
                    "workers' start-up 16.2 s)")


def test_startup_split_lists_the_workers_parts_in_order(monkeypatch):
    """The workers' start-up is followed by its parts (processes, then the first actor rank's models); after a
    restart the time counts from the restart, not from the process start."""
    import trainer.hf_exports as hf_exports
    from trainer.placement import startup_split

    monkeypatch.setattr(hf_exports, "process_start_time", lambda: 1000.0)
    text = startup_split(1012.5, 1030.0, now=1046.25, parts={"processes": 7.04, "actor": 5.0, "rollout engine": 1.25})
    assert text.endswith("the workers' start-up 16.2 s: processes 7.0 s, actor 5.0 s, rollout engine 1.2 s)")
    again = startup_split(1012.5, 1030.0, now=1046.25, restart=True)
    assert again == ("33.8 s after the restart began (Ray and the placement group 17.5 s, the workers' start-up "
                     "16.2 s)")


def test_init_models_times_every_role_in_turn(monkeypatch):
    """Each role's build is a part (named by the role, or by the parts its rank 0 reports), after the processes."""
    import trainer.placement as placement

    clock = iter([10.0, 12.0, 13.0, 16.0])  # processes started; actor from 12.0 (its own parts); critic 13 to 16
    monkeypatch.setattr(placement.time, "perf_counter", lambda: next(clock))

    class Client:
        def __init__(self, info):
            self.info = info

        def init_model(self):
            return [self.info]

    infos, parts = placement.init_models([("actor", Client({"startup_s": {"distributed": 0.2, "actor": 0.3}})),
                                          ("critic", Client({}))], t0=9.0)
    assert parts == {"processes": 1.0, "distributed": 0.2, "actor": 0.3, "critic": 3.0}
    assert infos == {"actor": [{"startup_s": {"distributed": 0.2, "actor": 0.3}}], "critic": [{}]}


def test_startup_clock_times_each_part_from_the_previous_mark(monkeypatch):
    from trainer.workers import base

    ticks = iter([10.0, 10.5, 13.0, 13.25])
    monkeypatch.setattr(base.time, "perf_counter", lambda: next(ticks))
    clock = base.StartupClock()
    for name in ("imports", "actor", "rollout engine"):
        clock.mark(name)
    assert clock.parts == {"imports": 0.5, "actor": 2.5, "rollout engine": 0.25}
