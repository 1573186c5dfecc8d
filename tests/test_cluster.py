"""Multi-node, simulated on one machine: a Ray cluster of 2 nodes (``ray.cluster_utils.Cluster``, 2 CPUs each,
distinct custom resources) joined through ``RAY_ADDRESS`` by ``trainer/main.py trainer.nnodes=2
trainer.n_gpus_per_node=1`` (CPU bundles).

Checked: each node hosts one rank; the gloo rendezvous address is the rank-0 node's IP as Ray reports it (not
127.0.0.1); every rank writes its own optimizer shard of the checkpoint; a second run resumes from it; more nodes
than the cluster has stop in one line before any worker starts (that run forked from the session's pre-imported
driver, :func:`tests.e2e_shared.run_main_forked`, with ``RAY_ADDRESS`` naming this cluster).
"""
import os
import re

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import SHORT, read_metrics, run_main

pytestmark = pytest.mark.slow
cluster_utils = pytest.importorskip("ray.cluster_utils")

ARGS = [a for a in SHORT if not a.startswith("trainer.total_training_steps")] + [
    "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.export_hf_on_end=false", "trainer.save_freq=1"]


@pytest.fixture(scope="module")
def cluster():
    # 2 logical CPUs per node: room for both workers on either node, so that SPREAD (not a full node) puts them apart
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"sim_node_0": 1}})
    c.add_node(num_cpus=2, resources={"sim_node_1": 1})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _with_address(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)


def test_two_node_run_places_a_rank_on_each_node_and_resumes(cluster, monkeypatch, tmp_path):
    _with_address(cluster, monkeypatch)
    out = str(tmp_path / "mn")
    proc = run_main(out, *ARGS, "trainer.total_training_steps=2", timeout=300)
    text = proc.stdout + proc.stderr
    m = re.search(r"actor nodes: rank 0 on node (\w+) \(([\d.]+)\), rank 1 on node (\w+) \(([\d.]+)\); "
                  r"rendezvous at ([\d.]+):(\d+)", text)
    assert m, text[-5000:]
    node0, ip0, node1, _, master, _ = m.groups()
    nodes = {n.node_id[:12]: n.node_ip_address for n in cluster.list_all_nodes()}
    assert node0 != node1 and {node0, node1} == set(nodes)          # each node hosts a rank
    assert master == ip0 == nodes[node0] and not master.startswith("127.")
    actor = os.path.join(out, "checkpoints", "global_step_2", "actor")
    shards = sorted(f for _, _, files in os.walk(actor) for f in files if "optim_states" in f)
    assert len(shards) == 2 and any("rank_0" in f for f in shards) and any("rank_1" in f for f in shards), shards
    run_main(out, *ARGS, "trainer.total_training_steps=3", "trainer.resume_mode=auto", timeout=300)
    assert [r["step"] for r in read_metrics(out) if "actor/pg_loss" in r] == [1, 2, 3]


def test_more_nodes_than_the_cluster_has_stop_in_one_line(cluster, tmp_path):
    from tests.test_reliability_config import assert_one_line_error

    proc = run_main_forked(str(tmp_path / "out"), "trainer.nnodes=3", "trainer.n_gpus_per_node=1",
                           "data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6", check=False,
                           env={"RAY_ADDRESS": cluster.address})
    assert_one_line_error(proc, "trainer.nnodes=3 nodes of 1 workers", f"RAY_ADDRESS={cluster.address} has 2 node(s)")


def test_lost_node_restarts_on_the_remaining_nodes(cluster, monkeypatch, tmp_path):
    """trainer.max_restarts=1: a node hosting a rank is removed mid-run; the workers are re-created on the two
    nodes left (the placement still fits) and the run finishes from its last checkpoint. Runs last: it changes the
    cluster."""
    from tests.e2e_utils import MainRun

    third = cluster.add_node(num_cpus=2, resources={"sim_node_2": 1})
    cluster.wait_for_nodes()
    run = MainRun(str(tmp_path / "lost"), *ARGS, "trainer.total_training_steps=5", "trainer.max_restarts=1",
                  env={"RAY_ADDRESS": cluster.address})
    run.wait_for(lambda: run.stepped(2), "step 2")
    m = re.search(r"actor nodes: rank 0 on node (\w+) .*, rank 1 on node (\w+) ", run.text())
    workers = {n.node_id[:12]: n for n in cluster.list_all_nodes() if n is not cluster.head_node}
    lost = next(workers[n] for n in m.groups() if n in workers)      # a node with a rank that is not the head
    cluster.remove_node(lost)
    rc = run.finish(timeout=300)
    text = run.text()
    assert rc == 0, text[-5000:]
    assert re.search(r"restart 1 of 1 after: actor rank [01] died during", text), text[-5000:]
    placed = re.findall(r"actor nodes: rank 0 on node (\w+) .*, rank 1 on node (\w+) ", text)
    assert len(placed) == 2 and lost.node_id[:12] not in placed[1] and placed[1][0] != placed[1][1]
    assert [r["step"] for r in read_metrics(run.out) if "actor/pg_loss" in r] == [1, 2, 3, 4, 5]
    del third
