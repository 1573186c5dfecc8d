"""Separate rollout placement and the async loop (``trainer.rollout_placement``, ``trainer.async.staleness``), without
Ray: the weight group's bucketed broadcast, the rollout's weight versions and checkpoint, the pipeline's schedule
(which weights make which batch, when weights are pushed, what a checkpoint keeps), a dead rollout worker named,
the placement's shares and bundles, and every refused setting as one line before anything starts."""
import os
import threading
import time
import types

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.e2e_utils import ROOT, free_port
from trainer.async_rollout import OffPolicyPipeline, wait_calls
from trainer.config_checks import ConfigError
from trainer.hooks.base import StepContext
from trainer.protocol import DataProto
from trainer.rollout_placement import RolloutPlacement, check_rollout_placement, resolve_async_defaults
from trainer.workers.rollout import WeightVersions
from trainer.workers.weight_sync import WeightGroup, broadcast_bucket, receive_bucket, weights_layout


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


# ---- the weight group ---------------------------------------------------------------------------------------------
def test_buckets_broadcast_bit_exact_over_gloo_to_every_rollout_rank():
    g = torch.Generator().manual_seed(0)
    buckets = [[("a.weight", torch.randn(3, 4, generator=g)), ("a.bias", torch.randn(4, generator=g))],
               [("b", torch.randn(2, 2, generator=g).to(torch.bfloat16)), ("c", torch.arange(5))]]
    layout = weights_layout(buckets)
    assert [p["dtype"] for p in layout[1]] == ["bfloat16", "int64"]  # one flat tensor per dtype of a bucket
    port, got, sent = free_port(), {}, []

    def rank(r):
        group = WeightGroup("127.0.0.1", port, r, 3, "gloo", timeout_s=60)
        if r == 0:
            sent.append(sum(broadcast_bucket(group, b) for b in buckets))
        else:
            got[r] = [pair for lay in layout for pair in receive_bucket(group, lay)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    flat = [pair for b in buckets for pair in b]
    assert sent == [sum(t.numel() * t.element_size() for _, t in flat)]
    for r in (1, 2):
        assert [n for n, _ in got[r]] == [n for n, _ in flat]
        assert all(torch.equal(a, b) and a.dtype == b.dtype for (_, a), (_, b) in zip(got[r], flat))
        assert got[r][0][1].untyped_storage().data_ptr() != got[r][1][1].untyped_storage().data_ptr()  # own copies


def test_weight_group_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend 'mpi'"):
        WeightGroup("127.0.0.1", free_port(), 0, 1, "mpi", timeout_s=5)


# ---- the rollout worker's weight versions -------------------------------------------------------------------------
def test_weight_versions_wait_release_and_round_trip_through_a_checkpoint(tmp_path):
    store = WeightVersions(timeout_s=10)
    t = threading.Timer(0.2, store.put, args=(3, [("w", torch.ones(2))]))
    t.start()
    assert torch.equal(store.get(3)[0][1], torch.ones(2))  # waited for the receive thread
    store.put(4, [("w", torch.full((2,), 2.0))])
    store.release_below(4)
    assert store.versions() == [4]
    store.save(str(tmp_path / "rollout"))
    other = WeightVersions(timeout_s=0.1)
    other.load(str(tmp_path / "rollout"))
    assert other.versions() == [4] and torch.equal(other.get(4)[0][1], torch.full((2,), 2.0))
    with pytest.raises(TimeoutError, match="weights version 5 did not arrive.*held: \\[4\\]"):
        other.get(5)
    other.load(str(tmp_path / "no_such_role"))  # a colocated run's checkpoint: nothing held
    assert other.versions() == []


def test_rollout_worker_generates_with_the_version_its_prompts_name():
    from rollout.base import RolloutOutput
    from rollout.generator import Generation
    from trainer.workers.rollout import RolloutWorker

    loads = []
    w = RolloutWorker.__new__(RolloutWorker)
    w.rank, w.loaded_version, w.versions = 0, None, WeightVersions(timeout_s=5)
    from trainer.config import RolloutConfig
    from trainer.config.packaged import packaged_section

    w.rollout_cfg = packaged_section(RolloutConfig, "actor_rollout_ref.rollout", ["data.max_response_length=3"], n=2,
                                     update_weights_bucket_megabytes=1)
    w.engine = types.SimpleNamespace(load_weights=lambda b: loads.append([n for n, _ in b]))

    def generate(prompt_ids, sampling, mm):
        rows = len(prompt_ids) * sampling.n
        out = RolloutOutput(torch.full((rows, 3), 5), torch.ones(rows, 3, dtype=torch.long), torch.zeros(rows, 3))
        return Generation(out, out.response_mask)

    w.generator = types.SimpleNamespace(generate=generate)
    for v in (0, 1):
        w.versions.put(v, [(f"v{v}", torch.zeros(1))])
    prompts = DataProto.from_dict({"input_ids": torch.tensor([[0, 7], [8, 9]]),
                                   "attention_mask": torch.tensor([[0, 1], [1, 1]])}, meta={"seed": 3})
    for v in (0, 0, 1):
        prompts.meta["weights_version"] = v
        rows = w.generate_sequences(prompts)
    assert loads == [["v0"], ["v1"]]  # loaded once per version change
    assert len(rows) == 4 and rows.meta["weights_version"] == 1
    start, end = rows.meta["rollout_gen_window"]
    assert 0 < start <= end <= time.time()


# ---- the pipeline's schedule --------------------------------------------------------------------------------------
class _Loader:
    def __init__(self, position=0):
        self.position = position

    def next_batch(self):
        self.position += 1
        return DataProto.from_dict({"input_ids": torch.full((2, 1), self.position)}), 0

    def state_dict(self):
        return {"epoch": 0, "position": self.position}


class _Rollout:
    """Generates at once; records what each batch was asked with."""

    def __init__(self, held=()):
        self.held, self.made, self.version_for = set(held), {}, None

    def submit(self, prompts):  # as trainer.roles.RolloutGroup.submit
        if "weights_version" not in prompts.meta:
            prompts.meta["weights_version"] = self.version_for(prompts)
        step = int(prompts["uid"][0].split("-")[0]) if "uid" in prompts else "other"
        self.made[step] = (prompts.meta["weights_version"], int(prompts["input_ids"][0, 0]), prompts.meta.get("seed"))
        rows = DataProto.from_dict({"input_ids": prompts["input_ids"]},
                                   meta={**prompts.meta, "rollout_gen_window": (1.0, 2.0)})
        return types.SimpleNamespace(result=lambda: rows)

    def held_versions(self):
        return sorted(self.held)

    def release_below(self, v):
        self.held = {h for h in self.held if h >= v}


class _Weights:
    def __init__(self, trainer, rollout):
        self.tr, self.rollout, self.newest, self.pushes = trainer, rollout, -1, []

    def push(self, version, keep_from):
        assert version == self.tr.trained  # only the actor's current weights exist
        self.pushes.append((version, keep_from, set(self.rollout.made)))
        self.rollout.held.add(version)
        self.rollout.release_below(keep_from)
        self.newest = version


def _trainer(total, rollout, loader):
    from trainer.config import TrainerConfig
    from trainer.config.packaged import packaged_section
    from trainer.ppo_trainer import RayPPOTrainer

    tr = types.SimpleNamespace(cfg={"trainer": {"seed": 1, "ray_timeout_s": 0}}, device="cpu", loader=loader,
                               roles=types.SimpleNamespace(rollout=rollout, actor=None), global_step=0, trained=0,
                               last_step=lambda: total)
    tr.trainer_cfg = packaged_section(TrainerConfig, "trainer", seed=1)
    tr.tag_prompts = types.MethodType(RayPPOTrainer.tag_prompts, tr)
    return tr


def _run(pipe, tr, steps):
    """Drive ``steps`` like RayPPOTrainer.fit; returns each step's metrics and, after each, the saved loader state
    and the versions the rollout keeps."""
    out = {}
    for k in steps:
        tr.global_step = k
        pipe.next_batch(k, {})
        step = StepContext(k, 1, None, None)
        rows = pipe.collect(step)
        assert rows.meta["weights_version"] == step.metrics["async/weights_version"]
        assert pipe.rollout.submit(DataProto.from_dict({"input_ids": torch.zeros(1, 1, dtype=torch.long)})) \
            .result().meta["weights_version"] == rows.meta["weights_version"]  # e.g. ReMax: the batch's weights
        tr.trained = k
        pipe.step_done(k, (0.0, 1.5))
        out[k] = (step.metrics, pipe.loader_state(), sorted(pipe.rollout.held))
    return out


@pytest.mark.parametrize("s", [0, 1, 2])
def test_batch_k_is_made_with_the_weights_of_step_k_minus_1_minus_s(s):
    rollout, loader = _Rollout(), _Loader()
    tr = _trainer(6, rollout, loader)
    weights = _Weights(tr, rollout)
    pipe = OffPolicyPipeline(tr, RolloutPlacement("separate", 1.0, s), weights=weights)
    out = _run(pipe, tr, range(1, 7))
    for k in range(1, 7):
        assert rollout.made[k][:2] == (max(0, k - 1 - s), k)           # weights version, k-th loader batch
        assert out[k][0]["async/staleness"] == min(s, k - 1)
        assert out[k][1]["position"] == k                              # a checkpoint resumes after batch k
        assert out[k][2] == list(range(max(0, k - s), k))              # the versions of steps k+1 .. k+s
    # each version is pushed once, at the next step's start (before the first batch that needs it starts)
    assert [p[0] for p in weights.pushes] == list(range(6))
    for version, _, started in weights.pushes:
        assert (1 if version == 0 else version + 1 + s) not in started  # the first batch made with it
    assert out[1][0]["async/gen_overlap_s"] == 0.0  # no previous step


def test_overlap_is_the_generation_time_inside_the_previous_steps_training():
    rollout = _Rollout()
    tr = _trainer(3, rollout, _Loader())
    pipe = OffPolicyPipeline(tr, RolloutPlacement("separate", 1.0, 1), weights=_Weights(tr, rollout))
    _run(pipe, tr, [1])
    pipe.last_train = (1.2, 1.5)  # step 1 trained from 1.2 to 1.5; batch 2 was generated from 1.0 to 2.0
    tr.global_step = 2
    pipe.next_batch(2, {})
    step = StepContext(2, 1, None, None)
    pipe.collect(step)
    assert step.metrics["async/gen_overlap_s"] == pytest.approx(0.3)
    assert step.metrics["async/gen_s"] == 1.0


def test_resume_regenerates_the_batches_in_flight_with_the_same_weights_and_seeds():
    full_rollout = _Rollout()
    full = _trainer(6, full_rollout, _Loader())
    _run(OffPolicyPipeline(full, RolloutPlacement("separate", 1.0, 2), weights=_Weights(full, full_rollout)), full,
         range(1, 7))
    part_rollout = _Rollout()
    part = _trainer(6, part_rollout, _Loader())
    saved = _run(OffPolicyPipeline(part, RolloutPlacement("separate", 1.0, 2), weights=_Weights(part, part_rollout)),
                 part, range(1, 4))[3]
    resumed_rollout = _Rollout(held=saved[2])                          # the rollout role's checkpoint
    resumed = _trainer(6, resumed_rollout, _Loader(saved[1]["position"]))
    resumed.trained = 3
    pipe = OffPolicyPipeline(resumed, RolloutPlacement("separate", 1.0, 2),
                             weights=_Weights(resumed, resumed_rollout))
    out = _run(pipe, resumed, range(4, 7))
    assert {k: resumed_rollout.made[k] for k in range(4, 7)} == {k: full_rollout.made[k] for k in range(4, 7)}
    assert [out[k][0]["async/staleness"] for k in range(4, 7)] == [2.0, 2.0, 2.0]
    # a checkpoint without the rollout's versions (a colocated run's): the batches in flight use the step-3 weights
    fresh = _Rollout()
    tr = _trainer(6, fresh, _Loader(3))
    tr.trained = 3
    out = _run(OffPolicyPipeline(tr, RolloutPlacement("separate", 1.0, 2), weights=_Weights(tr, fresh)), tr,
               range(4, 7))
    assert [fresh.made[k][0] for k in range(4, 7)] == [3, 3, 3]
    assert [out[k][0]["async/staleness"] for k in range(4, 7)] == [0.0, 1.0, 2.0]


def test_validation_generates_with_the_weights_just_trained():
    rollout = _Rollout()
    tr = _trainer(4, rollout, _Loader())
    weights = _Weights(tr, rollout)
    pipe = OffPolicyPipeline(tr, RolloutPlacement("separate", 1.0, 1), weights=weights)
    _run(pipe, tr, range(1, 3))
    val = DataProto.from_dict({"input_ids": torch.zeros(1, 1, dtype=torch.long)}, meta={"validate": True})
    assert rollout.submit(val).result().meta["weights_version"] == 2 and weights.newest == 2
    assert rollout.held == {1, 2}  # the batch of step 3 (in flight) still has its version


# ---- a dead rollout worker ----------------------------------------------------------------------------------------
def test_a_dead_rollout_worker_is_named_before_the_actor_whose_broadcast_failed(monkeypatch):
    import trainer.async_rollout as async_rollout
    import trainer.placement as placement
    from tests.test_placement_failure_order import _ActorDied, _fake_ray, _TaskRaised
    from trainer.placement import PendingCall, WorkerDied, WorkerGroup

    outcomes = {"a0": _TaskRaised("RuntimeError: Connection closed by peer"), "r0": _ActorDied("rollout died")}
    fake = _fake_ray(outcomes, ["a0", "r0"])
    monkeypatch.setattr(placement, "ray", fake)
    monkeypatch.setattr(async_rollout, "ray", fake)

    def group(role):
        g = WorkerGroup.__new__(WorkerGroup)
        g.role, g.world_size, g.timeout_s = role, 1, None
        return g

    calls = [PendingCall(group("actor"), "push_weights", ["a0"]),
             PendingCall(group("rollout"), "receive_weights", ["r0"])]
    with pytest.raises(WorkerDied, match="^rollout rank 0 died during receive_weights: rollout died"):
        wait_calls(calls, None)
    with pytest.raises(WorkerDied, match="^rollout rank 0 died during generate_sequences"):
        PendingCall(group("rollout"), "generate_sequences", ["r0"]).result()


# ---- placement ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_gpus, world, shares, bundles", [(1, 2, {"actor": 1.0, "rollout": 1.0}, 2),
                                                            (0.25, 2, {"actor": 0.75, "rollout": 0.25}, 0)])
def test_roles_place_the_rollout_on_bundles_of_its_own_or_a_share_of_the_first(monkeypatch, n_gpus, world, shares,
                                                                                bundles):
    import trainer.placement as placement
    from trainer.roles import Roles, actor_role, rollout_role

    made, received = {}, {}

    class FakeGroup:
        def __init__(self, cls, role, pg, world_size, config, device, cpus, share=1.0, sp_size=1, bundle_offset=0,
                     timeout_s=None, wait=True):
            made[role] = (world_size, share, bundle_offset)
            received[role] = type(config).__name__

        def wait_started(self):
            pass

        def run_all(self, method):
            return [{}]

    monkeypatch.setattr(placement, "WorkerGroup", FakeGroup)
    cfg = _cfg("trainer.rollout_placement=separate", f"actor_rollout_ref.rollout.n_gpus={n_gpus}",
               "trainer.total_training_steps=2")  # a planned run: the workers' configs are built at start
    roles = Roles([actor_role(cfg), rollout_role(cfg, world)])
    roles.start(None, world, cfg, "cpu", 1)
    assert {r: m[1] for r, m in made.items()} == shares
    assert received == {"actor": "ActorWorkerConfig", "rollout": "RolloutWorkerConfig"}  # never the whole config
    assert made["rollout"] == (1, shares["rollout"], bundles) and made["actor"][0] == world
    assert RolloutPlacement.from_config(cfg).rollout_bundles == (1 if n_gpus >= 1 else 0)
    assert rollout_role(_cfg(), world) is None


def test_rollout_group_pads_to_its_workers_and_cuts_back(monkeypatch):
    from trainer.roles import RolloutGroup

    class FakeWG:
        world_size = 2

        def submit_all(self, method, data):
            assert len(data) % 2 == 0
            return types.SimpleNamespace(result=lambda: data.repeat(3), done=lambda: True)

    group = RolloutGroup(FakeWG())
    group.version_for = lambda p: 7
    prompts = DataProto.from_dict({"input_ids": torch.arange(3)[:, None]})
    rows = group.generate_sequences(prompts)
    assert rows["input_ids"].flatten().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and prompts.meta["weights_version"] == 7


def test_separate_placement_counts_its_bundles_against_the_machine():
    from trainer.resources import PlacementError, ResourceRequest, check_request

    req = ResourceRequest.from_config({"device": "cpu", "nnodes": 1, "n_gpus_per_node": 2, "cpus_per_worker": 1},
                                      rollout_bundles=1)
    with pytest.raises(PlacementError, match=r"^3 workers x 1 CPUs \(trainer.nnodes=1 x trainer.n_gpus_per_node=2 "
                                             r"\+ 1 rollout workers .*= 3 CPUs requested, but this machine has 2 CPUs"):
        check_request(req, [{"CPU": 2.0, "GPU": 0.0}], "this machine")
    gpu = ResourceRequest("cuda", 1, 1, 1, rollout_bundles=1)
    with pytest.raises(PlacementError, match="^2 GPUs requested"):
        check_request(gpu, [{"CPU": 8.0, "GPU": 1.0}], "this machine")


# ---- bad input ----------------------------------------------------------------------------------------------------
BAD = {
    "negative_staleness": (["trainer.async.staleness=-1"], "trainer.async.staleness=-1; expected an integer >= 0"),
    "staleness_not_int": (["trainer.async.staleness=0.5"], "trainer.async.staleness=0.5; expected an integer"),
    "async_colocated": (["trainer.async.staleness=1"],
                        "trainer.async.staleness=1 needs trainer.rollout_placement=separate"),
    "unknown_placement": (["trainer.rollout_placement=remote"],
                          "trainer.rollout_placement='remote'; expected colocated or separate"),
    "n_gpus_not_whole": (["trainer.rollout_placement=separate", "actor_rollout_ref.rollout.n_gpus=1.5"],
                         "actor_rollout_ref.rollout.n_gpus=1.5; expected an integer >= 1"),
    "n_gpus_zero": (["actor_rollout_ref.rollout.n_gpus=0"], "actor_rollout_ref.rollout.n_gpus=0; expected"),
    "lora": (["trainer.rollout_placement=separate", "actor_rollout_ref.model.lora_rank=8"],
             "trainer.rollout_placement=separate does not take actor_rollout_ref.model.lora_rank=8"),
    "megatron": (["trainer.rollout_placement=separate", "trainer.strategy=megatron"],
                 "trainer.rollout_placement=separate does not take trainer.strategy=megatron"),
    "rollout_tp": (["trainer.rollout_placement=separate", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
                   "does not take actor_rollout_ref.rollout.tensor_model_parallel_size=2"),
    "dynamic_sampling": (["trainer.rollout_placement=separate", "trainer.async.staleness=1",
                          "algorithm.filter_groups.enable=true"],
                         "trainer.async.staleness=1 with algorithm.filter_groups.enable=true"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_async_settings_are_one_line_errors(case):
    overrides, needle = BAD[case]
    with pytest.raises(ConfigError) as exc:
        check_rollout_placement(_cfg(*overrides))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_good_settings_pass_and_rollout_is_auto_follows_the_staleness():
    for overrides in ([], ["trainer.rollout_placement=separate"], ["trainer.rollout_placement=separate",
                                                                    "trainer.async.staleness=2",
                                                                    "actor_rollout_ref.rollout.n_gpus=0.5"]):
        check_rollout_placement(_cfg(*overrides))
    on = _cfg("trainer.rollout_placement=separate", "trainer.async.staleness=1")
    off = _cfg("trainer.rollout_placement=separate")
    explicit = _cfg("trainer.rollout_placement=separate", "trainer.async.staleness=1",
                    "algorithm.rollout_correction.rollout_is=null")
    for cfg in (on, off, explicit):
        resolve_async_defaults(cfg)
    assert [c["algorithm"]["rollout_correction"]["rollout_is"] for c in (on, off, explicit)] == ["token", None, None]


def test_colocated_engine_settings_warn_with_separate_placement():
    from trainer.rollout_placement import separate_placement_warnings

    sep = ["trainer.rollout_placement=separate"]
    assert separate_placement_warnings(_cfg(*sep)) == []
    got = separate_placement_warnings(_cfg(*sep, "actor_rollout_ref.rollout.offload_optimizer_during_rollout=true",
                                           "actor_rollout_ref.rollout.sleep_level=2"))
    assert [w.split(":")[0] for w in got] == ["actor_rollout_ref.rollout.offload_optimizer_during_rollout=true",
                                             "actor_rollout_ref.rollout.sleep_level=2"]
    assert separate_placement_warnings(_cfg("actor_rollout_ref.rollout.sleep_level=2")) == []


def test_separate_placement_without_enough_cpus_stops_before_ray_starts(tmp_path):
    from tests.test_reliability_config import assert_one_line_error, run_cli
    from trainer.resources import machine_resources

    cpus = int(machine_resources("cpu")[0]["CPU"])
    proc = run_cli(str(tmp_path / "out"), "trainer.device=cpu", "trainer.rollout_placement=separate",
                   f"trainer.n_gpus_per_node={cpus}", f"data.train_batch_size={4 * cpus}",
                   f"actor_rollout_ref.actor.ppo_mini_batch_size={4 * cpus}", forked=True,
                   env={"RAY_ADDRESS": None})  # forked from the session's driver; no Ray to join: this machine's
    assert_one_line_error(proc, f"+ 1 rollout workers", f"= {cpus + 1} CPUs requested", f"has {cpus} CPUs")
    assert not os.path.exists(tmp_path / "out" / "init_model")
