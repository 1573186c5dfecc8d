"""trainer/checkpoint/finite.py: a loaded checkpoint whose tensors are not finite is refused in one line, and a save of
non-finite weights is refused before anything is written (DeepSpeed on CPU, one gloo process, ZeRO 0-3)."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

deepspeed = pytest.importorskip("deepspeed")
transformers = pytest.importorskip("transformers")

from trainer.checkpoint.base import commit_checkpoint, read_tracker, save_trainer_state, step_dir  # noqa: E402
from trainer.checkpoint.deepspeed_manager import DeepSpeedCheckpointManager, load_deepspeed_file  # noqa: E402
from trainer.checkpoint.finite import (DamagedCheckpoint, NonFiniteWeights, _all_finite,  # noqa: E402
                                       check_loaded_state, check_state_before_save, nonfinite_state, one_line_errors)

from tests.e2e_utils import one_process_group  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def dist_group():
    """One-process gloo group for DeepSpeed (reused if another test already made one)."""
    one_process_group()
    yield


def engine(stage, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = transformers.get_constant_schedule(opt)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": stage}, "bf16": {"enabled": False}, "steps_per_print": 10**9}
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
    return eng


def train_step(eng):
    loss = eng(torch.randn(2, 4)).pow(2).mean()
    eng.backward(loss)
    eng.step()


def base_state(eng):
    return getattr(eng.optimizer, "optimizer", eng.optimizer).state


def test_huge_finite_values_and_bf16_are_finite_nan_and_inf_are_not():
    assert _all_finite([torch.full((4,), 3e38), torch.ones(3, dtype=torch.bfloat16), torch.empty(0)])  # L2: inf
    assert not _all_finite([torch.ones(3), torch.tensor([1.0, float("nan"), 2.0])])
    assert not _all_finite([torch.tensor([-float("inf")], dtype=torch.bfloat16)])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_kind_of_state_is_named_when_it_holds_a_nan(stage):
    eng = engine(stage)
    train_step(eng)
    assert nonfinite_state(eng) is None
    state = base_state(eng)
    masters = list(state)
    saved = next(iter(state.values()))["exp_avg_sq"].clone()
    next(iter(state.values()))["exp_avg_sq"][0] = float("nan")
    assert nonfinite_state(eng) == "optimizer state (exp_avg_sq)"
    next(iter(state.values()))["exp_avg_sq"].copy_(saved)
    next(iter(state.values()))["exp_avg"][-1] = float("inf")
    assert nonfinite_state(eng) == "optimizer state (exp_avg)"
    next(iter(state.values()))["exp_avg"].zero_()
    params = [getattr(p, "ds_tensor", p) for p in eng.module.parameters()]
    if stage > 0:  # ZeRO keeps fp32 partitions of its own; at stage 0 the optimizer updates the parameters
        assert all(id(m) not in {id(p) for p in params} for m in masters)
        with torch.no_grad():
            masters[0].view(-1)[0] = float("inf")
        assert nonfinite_state(eng) == "fp32 master weights"
        with torch.no_grad():
            masters[0].view(-1)[0] = 0.0
    with torch.no_grad():
        params[-1].view(-1)[0] = float("nan")
    assert nonfinite_state(eng) == "model parameters"


def corrupt_exp_avg_sq(role_dir):
    """Write NaN into the saved exp_avg_sq of the role folder's optimizer file (the 0xff bytes of a damaged copy)."""
    with open(os.path.join(role_dir, "latest")) as f:
        folder = os.path.join(role_dir, f.read().strip())
    name = next(n for n in sorted(os.listdir(folder)) if n.endswith("optim_states.pt"))
    sd = load_deepspeed_file(os.path.join(folder, name))
    base = sd["optimizer_state_dict"]
    base = base.get("base_optimizer_state", base)
    next(iter(base["state"].values()))["exp_avg_sq"].fill_(float("nan"))
    torch.save(sd, os.path.join(folder, name))


def save_two_steps(eng, root):
    """Train and save steps 1 and 2 of ``eng`` under ``root`` (its actor folder, the trainer state, the tracker)."""
    for step in (1, 2):
        train_step(eng)
        DeepSpeedCheckpointManager(eng, rank=0, world_size=1).save(os.path.join(step_dir(root, step), "actor"))
        save_trainer_state(step_dir(root, step), {}, step, {})
        commit_checkpoint(root, step)


@pytest.mark.parametrize("stage", [1, 2])
def test_a_loaded_checkpoint_with_nan_optimizer_state_is_refused_naming_step_role_rank_and_state(tmp_path, stage):
    root = str(tmp_path)
    eng = engine(stage)
    save_two_steps(eng, root)
    role_dir = os.path.join(step_dir(root, 2), "actor")
    corrupt_exp_avg_sq(role_dir)
    new = engine(stage, seed=1)
    DeepSpeedCheckpointManager(new, rank=0, world_size=1).load(role_dir)
    with pytest.raises(DamagedCheckpoint) as err:
        check_loaded_state(new, "actor", role_dir)
    assert str(err.value) == (
        f"actor rank 0: the checkpoint {step_dir(root, 2)} holds non-finite values in its optimizer state "
        f"(exp_avg_sq); it is damaged: resume from an earlier step with trainer.resume_mode={step_dir(root, 1)}, "
        "or start afresh with trainer.resume_mode=disable")
    good = engine(stage, seed=1)
    DeepSpeedCheckpointManager(good, rank=0, world_size=1).load(os.path.join(step_dir(root, 1), "actor"))
    check_loaded_state(good, "actor", os.path.join(step_dir(root, 1), "actor"))  # the earlier step is fine


def test_a_damaged_first_checkpoint_says_to_restore_it_or_start_afresh(tmp_path):
    eng = engine(2)
    train_step(eng)
    role_dir = os.path.join(step_dir(str(tmp_path), 1), "actor")
    with torch.no_grad():
        next(eng.module.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(DamagedCheckpoint, match=r"in its model parameters; it is damaged: restore its files, or start "
                                                r"afresh with trainer.resume_mode=disable$"):
        check_loaded_state(eng, "critic", role_dir)


def test_non_finite_weights_are_not_saved_and_the_tracker_stays(tmp_path):
    root = str(tmp_path)
    eng = engine(2)
    train_step(eng)
    DeepSpeedCheckpointManager(eng, rank=0, world_size=1).save(os.path.join(step_dir(root, 1), "actor"))
    save_trainer_state(step_dir(root, 1), {}, 1, {})
    commit_checkpoint(root, 1)
    check_state_before_save(eng, "actor", step_dir(root, 2))  # finite: nothing raised
    base_state(eng)[next(iter(base_state(eng)))]["exp_avg_sq"][0] = float("nan")
    train_step(eng)  # the NaN moment reaches the weights
    with pytest.raises(NonFiniteWeights) as err:
        check_state_before_save(eng, "actor", step_dir(root, 2))
    assert str(err.value) == (f"actor: the model parameters of rank 0 are not finite after step 2; its checkpoint is "
                              f"not saved (last checkpoint: {step_dir(root, 1)}, resume there with "
                              "trainer.resume_mode=auto)")
    assert read_tracker(root) == 1 and sorted(os.listdir(root)) == ["global_step_1", "latest_checkpointed_iteration.txt"]


class FakeGroup:
    """A worker group whose ``fail`` method raises in rank 1 as Ray reports it (WorkerFailure from RayTaskError)."""

    def __init__(self, role, calls, fail=None, cause=None):
        self.role, self.calls, self.fail, self.cause = role, calls, fail, cause

    def run_all(self, method, *args):
        from ray.exceptions import RayTaskError

        from trainer.placement import WorkerFailure

        self.calls.append((self.role, method))
        if method == self.fail:
            task = RayTaskError(method, "Traceback (most recent call last):\n  ...", self.cause)
            raise WorkerFailure(f"{self.role} rank 1 raised in {method}: {task}") from task
        return [None, None]


def roles_with(critic_group, calls):
    from trainer.roles import GroupClient, Role, Roles

    roles = Roles([Role("actor", lambda: None, GroupClient, lambda c: None, ckpt_dir="actor"),
                   Role("critic", lambda: None, GroupClient, lambda c: None, ckpt_dir="critic")])
    roles.attach("actor", FakeGroup("actor", calls))
    roles.attach("critic", critic_group)
    return roles


def test_a_save_checks_every_role_before_any_writes_and_the_driver_error_is_one_line(tmp_path):
    from trainer.ppo_trainer import TrainingDiverged

    calls = []
    line = "critic: the model parameters of rank 1 are not finite after step 3; its checkpoint is not saved (...)"
    roles = roles_with(FakeGroup("critic", calls, "check_finite_state", NonFiniteWeights(line)), calls)
    with pytest.raises(TrainingDiverged) as err:
        roles.save(str(tmp_path / "global_step_3"))
    assert str(err.value) == line and err.value.__cause__ is None
    assert calls == [("actor", "check_finite_state"), ("critic", "check_finite_state")]  # no save_checkpoint
    calls.clear()
    roles = roles_with(FakeGroup("critic", calls), calls)
    roles.save(str(tmp_path / "global_step_3"))
    assert calls == [("actor", "check_finite_state"), ("critic", "check_finite_state"),
                     ("actor", "save_checkpoint"), ("critic", "save_checkpoint")]


def test_a_damaged_checkpoint_at_load_is_a_one_line_config_error_and_other_failures_pass_through(tmp_path):
    from trainer.config_checks import ConfigError
    from trainer.placement import WorkerFailure

    calls = []
    line = "critic rank 1: the checkpoint /c/global_step_2 holds non-finite values in its model parameters; ..."
    roles = roles_with(FakeGroup("critic", calls, "load_checkpoint", DamagedCheckpoint(line)), calls)
    with pytest.raises(ConfigError) as err:
        roles.load(str(tmp_path))
    assert str(err.value) == line
    roles = roles_with(FakeGroup("critic", calls, "load_checkpoint", ValueError("other")), calls)
    with pytest.raises(WorkerFailure, match="critic rank 1 raised in load_checkpoint"):
        roles.load(str(tmp_path))
    with pytest.raises(KeyError):
        with one_line_errors():
            raise KeyError("not a worker failure")


def damage_pickle(path):
    """Overwrite the start of the ``data.pkl`` member of the zip file ``path`` with 0xff, in place (same size)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        f.seek(info.header_offset + 30 + name_len + extra_len)
        f.write(b"\xff" * min(300, info.file_size))


def test_a_damaged_pickle_is_one_line_naming_step_role_rank_file_and_error_without_weights_only_advice(tmp_path):
    from trainer.workers.base import DistributedWorker

    root = str(tmp_path)
    eng = engine(2)
    save_two_steps(eng, root)
    role_dir = os.path.join(step_dir(root, 2), "actor")
    name = next(n for n in os.listdir(os.path.join(role_dir, "global_step_2")) if n.endswith("optim_states.pt"))
    size = os.path.getsize(os.path.join(role_dir, "global_step_2", name))
    damage_pickle(os.path.join(role_dir, "global_step_2", name))
    assert os.path.getsize(os.path.join(role_dir, "global_step_2", name)) == size
    before = sorted(os.listdir(root))

    class Worker:  # the state DistributedWorker.load_checkpoint reads
        role, rank = "actor", 0

    worker = Worker()
    new = engine(2, seed=1)
    worker.ckpt, worker._trained = DeepSpeedCheckpointManager(new, rank=0, world_size=1), type("T", (), {"engine": new})
    with pytest.raises(DamagedCheckpoint) as err:
        DistributedWorker.load_checkpoint(worker, role_dir)
    line = str(err.value)
    assert "\n" not in line and "weights_only" not in line and err.value.__cause__ is None
    assert line.startswith(f"actor rank 0: the checkpoint {step_dir(root, 2)} is unreadable: its file "
                           f"global_step_2/{name} does not load (UnpicklingError: ")
    assert line.endswith(f"); it is damaged: resume from an earlier step with trainer.resume_mode={step_dir(root, 1)}, "
                         "or start afresh with trainer.resume_mode=disable")
    assert torch.load is not None and torch.load.__name__ == "load"  # the recording wrapper is gone
    assert sorted(os.listdir(root)) == before
    good = engine(2, seed=1)
    worker.ckpt, worker._trained = DeepSpeedCheckpointManager(good, rank=0, world_size=1), type("T", (), {"engine": good})
    DistributedWorker.load_checkpoint(worker, os.path.join(step_dir(root, 1), "actor"))  # the earlier step loads


def test_only_failures_inside_torch_load_are_a_damaged_checkpoint(tmp_path):
    from trainer.checkpoint.finite import reading_checkpoint

    with pytest.raises(RuntimeError, match="size mismatch"):  # e.g. a state dict that does not fit the model
        with reading_checkpoint("actor", 0, str(tmp_path / "global_step_1" / "actor")):
            raise RuntimeError("size mismatch for weight")
    role_dir = tmp_path / "global_step_1" / "critic"
    role_dir.mkdir(parents=True)
    (role_dir / "x.pt").write_bytes(b"PK\x03\x04" + b"\xff" * 100)  # not a zip archive: the zip reader fails
    with pytest.raises(DamagedCheckpoint, match=r"^critic rank 3: the checkpoint .*global_step_1 is unreadable: its "
                                                r"file x\.pt does not load \(RuntimeError: PytorchStreamReader failed "
                                                r"reading zip archive: [^\n]*\); it is damaged: restore its files"):
        with reading_checkpoint("critic", 3, str(role_dir)):
            torch.load(str(role_dir / "x.pt"), weights_only=True)
