"""``trainer.single_process=true``: the actor's one worker in the driver process (trainer/local_workers.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.e2e_utils import ROOT, SHORT, read_metrics, run_main
from trainer.local_workers import WORKER_ENV_KEYS, LocalWorkerGroup
from trainer.single_process_checks import check_single_process, single_process_problem
from trainer.placement import WorkerFailure
from trainer.protocol import DataProto


def _cfg(**trainer) -> dict:
    t = {"single_process": True, "nnodes": 1, "n_gpus_per_node": 1, "strategy": "deepspeed",
         "rollout_placement": "colocated", "max_restarts": 0, **trainer}
    return {"trainer": t, "algorithm": {"adv_estimator": "grpo", "use_prime": False}, "critic": {"enable": None}}


def test_one_actor_worker_runs():
    assert single_process_problem(_cfg()) is None
    assert single_process_problem(_cfg(single_process=False, n_gpus_per_node=8)) is None  # off: nothing to check


@pytest.mark.parametrize("change, words", [
    (dict(n_gpus_per_node=2), "trainer.n_gpus_per_node=2 asks for 2"),
    (dict(nnodes=2), "trainer.nnodes=2"),
    (dict(strategy="megatron"), "trainer.strategy=megatron"),
    (dict(rollout_placement="separate"), "trainer.rollout_placement=separate"),
    (dict(max_restarts=2), "trainer.max_restarts=2"),
])
def test_what_one_process_cannot_run_is_refused(change, words):
    problem = single_process_problem(_cfg(**change))
    assert problem is not None and words in problem and "trainer.single_process" in problem
    assert "\n" not in problem


def test_every_problem_is_named_together():
    from trainer.config_checks import ConfigErrors

    cfg = _cfg(max_restarts=1)
    cfg["algorithm"]["adv_estimator"] = "gae"
    with pytest.raises(ConfigErrors) as info:
        check_single_process(cfg)
    assert len(info.value.messages) == 2 and "a critic" in str(info.value) and "max_restarts=1" in str(info.value)


def test_other_roles_are_refused():
    gae = _cfg()
    gae["algorithm"]["adv_estimator"] = "gae"
    assert "a critic" in single_process_problem(gae)
    prime = _cfg()
    prime["algorithm"]["use_prime"] = True
    assert "PRIME's reward model" in single_process_problem(prime)
    from trainer.config_checks import ConfigError

    with pytest.raises(ConfigError, match="a critic"):
        check_single_process(gae)


class _Worker:
    """A worker class with the constructor signature of trainer.workers.base.DistributedWorker."""

    def __init__(self, config, rank, world_size, master_addr, master_port, device, role):
        if config == "broken":
            raise ValueError("cannot build")
        self.args = (config, rank, world_size, device, role)
        self.kept = torch.zeros(3)

    def get_master_addr_port(self):
        return "127.0.0.1", 1234

    def init_model(self):
        return {"num_params": 3, "startup_s": {"actor": 0.5}}

    def edit(self, data: DataProto) -> DataProto:
        data.batch["x"].add_(1)  # a worker editing what it was given
        return data

    def buffer(self) -> torch.Tensor:
        return self.kept  # a buffer the worker keeps and changes later

    def fail(self):
        raise KeyError("no such column")


def test_calls_are_copies_as_through_ray():
    g = LocalWorkerGroup(_Worker, "actor", "cfg", "cpu")
    assert g.worker.args == ("cfg", 0, 1, "cpu", "actor")
    assert (g.world_size, g.dp_size, g.sp_size, g.pids) == (1, 1, 1, [os.getpid()])
    data = DataProto.from_dict({"x": torch.zeros(2, 3)})
    out = g.dispatch_dp("edit", data)
    assert torch.equal(out.batch["x"], torch.ones(2, 3))
    assert torch.equal(data.batch["x"], torch.zeros(2, 3))  # the driver's rows are unchanged
    held = g.run_all("buffer")[0]
    g.worker.kept.fill_(7)
    assert torch.equal(held, torch.zeros(3))  # the result does not follow the worker's buffer
    assert g.submit_all("edit", data).done()
    assert torch.equal(g.submit_all("edit", data).result().batch["x"], torch.ones(2, 3))
    assert g.run_all("init_model") == [{"num_params": 3, "startup_s": {"actor": 0.5}}]


def test_a_worker_error_is_a_named_worker_failure():
    g = LocalWorkerGroup(_Worker, "actor", "cfg", "cpu")
    with pytest.raises(WorkerFailure, match="actor rank 0 raised in fail: KeyError") as info:
        g.run_all("fail")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(WorkerFailure, match="raised in __init__: ValueError: cannot build"):
        LocalWorkerGroup(_Worker, "actor", "broken", "cpu")


def test_a_damaged_checkpoint_is_one_line_in_one_process():
    from trainer.checkpoint.finite import DamagedCheckpoint, one_line_errors
    from trainer.config_checks import ConfigError

    class Damaged(_Worker):
        def load_checkpoint(self, role_dir):
            raise DamagedCheckpoint(f"actor rank 0: the checkpoint {role_dir} is damaged")

    g = LocalWorkerGroup(Damaged, "actor", "cfg", "cpu")
    with pytest.raises(ConfigError, match="is damaged"):
        with one_line_errors():
            g.run_all("load_checkpoint", "/x/global_step_1/actor")


def test_embedded_run_in_one_process(tmp_path):
    proc = run_main(str(tmp_path), *SHORT, "trainer.n_gpus_per_node=1", "trainer.single_process=true",
                    timeout=300)
    log = proc.stdout + proc.stderr
    assert "before the worker" in log and "no Ray, the worker's start-up" in log
    assert "ray::" not in log and "Ray and the placement group" not in log and "before Ray" not in log
    assert "Loading weights" not in log and "gcc " not in log  # as in a Ray worker: no bars, no probe commands
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2]


def test_ray_address_is_not_joined(tmp_path):
    # nothing answers there: with Ray the run would be refused at once; one process never asks
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"trainer.output_dir={tmp_path}",
                           *SHORT, "trainer.total_training_steps=1", "trainer.n_gpus_per_node=1",
                           "trainer.single_process=true", "trainer.ray_timeout_s=5"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": "127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RAY_ADDRESS=127.0.0.1:9: not used with trainer.single_process=true" in proc.stdout + proc.stderr
    assert "trainer.ray_timeout_s=5: no effect with trainer.single_process=true" in proc.stdout + proc.stderr


def test_no_timeout_warning_for_no_bound():
    from trainer.single_process_checks import single_process_warnings

    cfg = _cfg(ray_timeout_s=None)
    assert not any("ray_timeout_s" in w for w in single_process_warnings(cfg))


def test_the_process_gets_its_settings_back():
    import warnings

    before = ({k: os.environ.get(k) for k in WORKER_ENV_KEYS}, torch.get_num_threads(), list(warnings.filters))

    class Threads(_Worker):
        def __init__(self, *args):
            super().__init__(*args)
            os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"})
            torch.set_num_threads(1)

    g = LocalWorkerGroup(Threads, "actor", "cfg", "cpu")
    assert os.environ["DS_ACCELERATOR"] == "cpu" and os.environ["WORLD_SIZE"] == "1"
    g.shutdown()
    assert ({k: os.environ.get(k) for k in WORKER_ENV_KEYS}, torch.get_num_threads(), list(warnings.filters)) == before
    assert g.worker is None
    g.shutdown()  # twice: nothing more to give back


def test_the_workers_seeding_leaves_the_callers_random_stream_as_it_was():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    g = LocalWorkerGroup(_Worker, "actor", "cfg", "cpu")
    torch.manual_seed(123)  # what a worker's seeding (trainer.seed + rank) does to this process
    g.shutdown()
    assert torch.equal(torch.rand(3), want)


def test_a_failed_constructor_gives_the_settings_back():
    before = {k: os.environ.get(k) for k in WORKER_ENV_KEYS}, torch.get_num_threads()
    with pytest.raises(WorkerFailure, match="cannot build"):
        LocalWorkerGroup(_Worker, "actor", "broken", "cpu")
    assert ({k: os.environ.get(k) for k in WORKER_ENV_KEYS}, torch.get_num_threads()) == before


def test_progress_bars_and_log_level_come_back_as_they_were(monkeypatch):
    import logging

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()  # a caller's own choice: transformers' bars on, the hub's off (set after:
    disable_progress_bars()           # transformers' switch sets the hub's too), compiler lines at DEBUG
    logging.getLogger("compilers").setLevel(logging.DEBUG)
    try:
        g = LocalWorkerGroup(_Worker, "actor", "cfg", "cpu")
        assert not hf_logging.is_progress_bar_enabled()  # off while the worker runs, as in a Ray worker
        g.shutdown()
        assert are_progress_bars_disabled() and hf_logging.is_progress_bar_enabled()
        assert logging.getLogger("compilers").level == logging.DEBUG
    finally:
        enable_progress_bars()
        logging.getLogger("compilers").setLevel(logging.NOTSET)


def test_engines_are_destroyed_at_shutdown():
    destroyed = []

    class Engine:
        def destroy(self):
            destroyed.append(self)

    class WithEngines(_Worker):
        def __init__(self, *args):
            super().__init__(*args)
            self.actor, self.ref = type("R", (), {"engine": Engine()})(), None

    g = LocalWorkerGroup(WithEngines, "actor", "cfg", "cpu")
    g.shutdown()
    assert len(destroyed) == 1 and g.worker is None


def test_two_runs_in_one_process(tmp_path):
    # the second run's DeepSpeed engine uses the process group the first one made; no engine outlives its run
    code = f"""
import gc, sys
sys.path.insert(0, {ROOT!r})
from hydra import compose, initialize_config_dir
from trainer.launch import run
import deepspeed, torch
for k in range(2):
    with initialize_config_dir(config_dir={os.path.join(ROOT, "configs")!r}, version_base="1.3"):
        cfg = compose(config_name="ppo_trainer", overrides=[f"trainer.output_dir={tmp_path}/run{{k}}", *{SHORT!r},
                      "trainer.n_gpus_per_node=1", "trainer.single_process=true"])
    state = torch.get_rng_state()
    run(cfg)
    print("rng kept", torch.equal(state, torch.get_rng_state()))
    gc.collect()
    print("engines", sum(isinstance(o, deepspeed.DeepSpeedEngine) for o in gc.get_objects()))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("engines 0") == 2, proc.stdout[-2000:]
    assert proc.stdout.count("rng kept True") == 2, proc.stdout[-2000:]  # the caller's random stream (model built)
    steps = [[{k: v for k, v in r.items() if not k.startswith(("timing", "perf/", "reward/time_s"))}
              for r in read_metrics(str(tmp_path / f"run{k}")) if "actor/pg_loss" in r] for k in range(2)]
    assert [r["step"] for r in steps[0]] == [1, 2] and steps[0] == steps[1]  # one seed, the same run


def test_cpu_accelerator_where_the_driver_picked_another(monkeypatch):
    import deepspeed.accelerator as acc
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    from trainer.local_workers import worker_environment

    picked = []

    class Cuda:
        def device_name(self, *args):
            return "cuda"

    monkeypatch.setattr(acc, "get_accelerator", lambda: Cuda())
    monkeypatch.setattr(acc, "set_accelerator", picked.append)
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    worker_environment("cpu")
    assert len(picked) == 1 and isinstance(picked[0], CPU_Accelerator)


def test_refused_before_start_up(tmp_path):
    proc = run_main(str(tmp_path), *SHORT, "trainer.n_gpus_per_node=2", "trainer.single_process=true",
                    timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: trainer.single_process=true runs one worker in this process" in proc.stderr
    assert "workers ready" not in proc.stdout + proc.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
