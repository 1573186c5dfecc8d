"""The rendezvous port of a worker group is picked when rank 0 is created and bound by its store only after the
model has loaded. A port that was merely found free was taken in between by another process (Ray opens many
outgoing connections) and the start-up failed with ``EADDRINUSE``; rank 0 now holds it until it binds."""
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
        cpus_per_worker = 1

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
