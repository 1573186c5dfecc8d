"""The rendezvous port of a worker group is picked when rank 0 is created and bound by its store only after the
model has loaded. A port that was merely found free was taken in between by another process (Ray opens many
outgoing connections) and the start-up failed with ``EADDRINUSE``; rank 0 now holds it until it binds. The other
ranks start beside rank 0 and receive its address before they join."""
import errno
import socket

import pytest

from trainer.workers.base import release_port, reserve_port


def _bind(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", port))
    return s


def test_a_reserved_port_cannot_be_taken_until_it_is_released():
    port = reserve_port()
    with pytest.raises(OSError) as info:
        _bind(port)
    assert info.value.errno == errno.EADDRINUSE
    release_port(port)
    s = _bind(port)  # the owner's store binds it now
    s.listen()
    s.close()
    release_port(port)  # releasing twice, or a port never held here, does nothing
    release_port(None)


def test_reserved_ports_differ():
    ports = [reserve_port() for _ in range(20)]
    try:
        assert len(set(ports)) == 20
    finally:
        for p in ports:
            release_port(p)


def test_rank_zero_holds_its_rendezvous_port_until_init_distributed(monkeypatch):
    import deepspeed
    import torch

    from trainer.workers.base import DistributedWorker

    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "DS_ACCELERATOR"):
        monkeypatch.setenv(var, "")  # the worker sets them for its process: put back afterwards
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)

    class _Cfg:
        cpus_per_worker, seed = 1, 0

    seen = {}

    def fake_init(**kwargs):  # the store binds here: the port must be free at this moment, and not before
        s = _bind(w.master_port)
        s.close()
        seen["bound"] = True

    w = DistributedWorker(_Cfg(), rank=0, world_size=1)
    with pytest.raises(OSError):
        _bind(w.master_port)
    monkeypatch.setattr(deepspeed, "init_distributed", fake_init)
    w.init_distributed()
    assert seen == {"bound": True}


def test_a_rank_above_zero_created_without_the_address_picks_none_and_receives_rank_zeros(monkeypatch):
    import os

    import torch

    from trainer.workers.base import DistributedWorker

    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "DS_ACCELERATOR"):
        monkeypatch.setenv(var, "")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)

    class _Cfg:
        cpus_per_worker, seed = 1, 0

    w = DistributedWorker(_Cfg(), rank=1, world_size=2)
    assert w.get_master_addr_port() == (None, None) and os.environ["MASTER_PORT"] == ""  # no port held here
    assert os.environ["RANK"] == "1" and os.environ["WORLD_SIZE"] == "2"
    w.set_master_addr_port("10.0.0.7", 29511)
    assert w.get_master_addr_port() == ("10.0.0.7", 29511)
    assert os.environ["MASTER_ADDR"] == "10.0.0.7" and os.environ["MASTER_PORT"] == "29511"


def test_a_worker_group_starts_every_rank_before_it_waits_for_rank_zero(monkeypatch):
    """The ranks' processes start side by side (each imports torch and DeepSpeed for seconds): every rank is created
    before the group waits for rank 0's rendezvous address, which the other ranks then receive; with ``wait=False``
    nothing is waited for until ``wait_started``."""
    import types

    import trainer.placement as placement

    events = []

    class _Actor:
        def __init__(self, rank):
            self.rank = rank

        def __getattr__(self, method):
            return types.SimpleNamespace(remote=lambda *args: (method, self.rank, args))

    class _Remote:
        def options(self, **kwargs):
            return self

        def remote(self, config, rank, world, addr, port, device, role):
            events.append(("create", rank, addr, port))
            return _Actor(rank)

    replies = {"get_master_addr_port": ("10.0.0.7", 29511), "set_master_addr_port": None}

    def get(ref):
        method, rank, args = ref
        events.append((method, rank, args))
        return replies.get(method, {"pid": 100 + rank, "node_id": "n" * 12, "node_ip": "10.0.0.7"})

    def wait(refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    fake = types.SimpleNamespace(remote=lambda cls: _Remote(), get=get, wait=wait)
    monkeypatch.setattr(placement, "ray", fake)
    monkeypatch.setattr(placement, "PlacementGroupSchedulingStrategy", lambda **kwargs: None)
    g = placement.WorkerGroup(object, "actor", None, 3, None, "cpu", 1, wait=False)
    assert events == [("create", r, None, None) for r in range(3)]   # all started, nothing waited for
    g.wait_started()
    assert events[3] == ("get_master_addr_port", 0, ())
    assert sorted(e[1:] for e in events if e[0] == "set_master_addr_port") == [(1, ("10.0.0.7", 29511)),
                                                                               (2, ("10.0.0.7", 29511))]
    assert g.pids == [100, 101, 102] and g.master_addr == "10.0.0.7:29511"
    events.clear()
    g.wait_started()  # once only
    assert events == []
