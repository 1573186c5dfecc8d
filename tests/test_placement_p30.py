"""A world size the machine or the Ray cluster cannot place stops before any worker starts (P30): one line naming
the request (workers x CPUs per worker, GPUs, nodes) and what was found; the local Ray is never started with more
CPUs than the machine has."""
import os
import socket
import time

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.resources import PlacementError, ResourceRequest, check_request, machine_resources

CPUS = int(machine_resources("cpu")[0]["CPU"])


def _local(out, *overrides):
    """``trainer/main.py`` with no ``RAY_ADDRESS`` (a run that would start its own Ray), forked from the session's
    pre-imported driver (:func:`tests.e2e_shared.run_main_forked`: 4 s of imports less)."""
    return run_cli(out, *overrides, forked=True, env={"RAY_ADDRESS": None})


def _req(**kw):
    base = {"device": "cpu", "nnodes": 1, "n_gpus_per_node": 2, "cpus_per_worker": 1}
    return ResourceRequest.from_config({**base, **kw})


def _batch(world):
    return [f"data.train_batch_size={world}", f"actor_rollout_ref.actor.ppo_mini_batch_size={world}",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]


@pytest.mark.skipif(CPUS >= 64, reason="the machine has 64 CPUs or more")
def test_p30_cpu_world_larger_than_the_machine_stops_before_ray_starts(tmp_path):
    t0 = time.monotonic()
    proc = _local(str(tmp_path / "out"), "trainer.device=cpu", "trainer.n_gpus_per_node=64", *_batch(64))
    line = assert_one_line_error(proc, "64 workers x 1 CPUs", f"this machine has {CPUS} CPUs")
    assert "= 64 CPUs requested" in line
    assert time.monotonic() - t0 < 60
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert not os.path.exists(tmp_path / "out" / "init_model")          # nothing was built


def test_p30_cpus_per_worker_times_workers_beyond_the_machine(tmp_path):
    proc = _local(str(tmp_path / "out"), "trainer.device=cpu", f"trainer.cpus_per_worker={CPUS}")
    assert_one_line_error(proc, f"2 workers x {CPUS} CPUs", f"= {2 * CPUS} CPUs requested",
                          f"this machine has {CPUS} CPUs")


def test_p30_more_nodes_than_a_local_machine_has(tmp_path):
    proc = _local(str(tmp_path / "out"), "trainer.device=cpu", "trainer.nnodes=2", "trainer.n_gpus_per_node=1")
    assert_one_line_error(proc, "trainer.nnodes=2 nodes of 1 workers", "this machine has 1 node(s)")


def test_p30_ray_address_that_does_not_answer(tmp_path):
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = run_cli(str(tmp_path / "out"), forked=True, env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert_one_line_error(proc, f"RAY_ADDRESS='127.0.0.1:{port}' does not answer")
    assert time.monotonic() - t0 < 60


def test_check_request_against_nodes_and_free_resources():
    nodes = [{"CPU": 4.0, "GPU": 2.0, "ip": "10.0.0.1"}, {"CPU": 1.0, "GPU": 4.0, "ip": "10.0.0.2"}]
    check_request(_req(device="cuda", nnodes=1, n_gpus_per_node=2), nodes, "the cluster")
    with pytest.raises(PlacementError, match=r"^3 GPUs requested .* but the cluster has 2 free GPU"):
        check_request(_req(device="cuda", nnodes=1, n_gpus_per_node=3), nodes, "the cluster",
                      free={"CPU": 8.0, "GPU": 2.0})       # 3 GPUs exist, one is in use
    with pytest.raises(PlacementError, match=r"trainer.nnodes=2 nodes of 2 workers \(2 CPUs, 2 GPUs each\) "
                                             r"requested, but the cluster has 2 node\(s\), 1 of them big enough "
                                             r"\(10.0.0.1: 4 CPUs, 2 GPUs; 10.0.0.2: 1 CPUs, 4 GPUs\)"):
        check_request(_req(device="cuda", nnodes=2, n_gpus_per_node=2), nodes, "the cluster")
    with pytest.raises(PlacementError, match=r"^6 workers x 2 CPUs .* = 12 CPUs requested, but the cluster has 5 CPUs"):
        check_request(_req(nnodes=2, n_gpus_per_node=3, cpus_per_worker=2), nodes, "the cluster")
    check_request(_req(nnodes=1, n_gpus_per_node=2, cpus_per_worker=2), nodes, "the cluster")


@pytest.mark.parametrize("key,value", [("cpus_per_worker", 0), ("n_gpus_per_node", -1), ("nnodes", 1.5)])
def test_non_positive_or_fractional_counts_are_refused(key, value):
    with pytest.raises(PlacementError, match=rf"^trainer.{key}={value}; expected an integer >= 1"):
        _req(**{key: value})
