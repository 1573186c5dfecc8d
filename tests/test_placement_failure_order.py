"""trainer.placement.WorkerGroup._get with a fake Ray: when one rank's call raises (e.g. its collective failed with
gloo's "Connection reset by peer") and a peer's process died, the failure names the dead rank (the root cause),
whichever of the two Ray reports first; a plain error with no dead peer is reported as raised."""
import types

import pytest

import trainer.placement as placement
from trainer.placement import WorkerFailure, WorkerGroup


class _ActorDied(Exception):
    pass


class _TaskRaised(Exception):
    pass


def _fake_ray(outcomes, order):
    """outcomes: ref -> value or exception instance; order: refs in the order ray.wait hands them out."""
    def wait(refs, num_returns=1, timeout=None):
        ready = [r for r in order if r in refs][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(ref):
        v = outcomes[ref]
        if isinstance(v, Exception):
            raise v
        return v

    return types.SimpleNamespace(wait=wait, get=get, exceptions=types.SimpleNamespace(
        RayActorError=_ActorDied, RayTaskError=_TaskRaised))


def _group():
    g = WorkerGroup.__new__(WorkerGroup)
    g.role, g.world_size = "actor", 3
    return g


@pytest.mark.parametrize("order", [["r1", "r0", "r2"], ["r0", "r1", "r2"], ["r0", "r2", "r1"]])
def test_a_dead_rank_is_named_before_a_peer_whose_collective_failed(monkeypatch, order):
    outcomes = {"r0": _TaskRaised("RuntimeError: Connection reset by peer"), "r1": _ActorDied("worker died"),
                "r2": _TaskRaised("RuntimeError: Connection reset by peer")}
    monkeypatch.setattr(placement, "ray", _fake_ray(outcomes, order))
    with pytest.raises(WorkerFailure, match=r"^actor rank 1 died during update_actor: worker died"):
        _group()._get(["r0", "r1", "r2"], "update_actor", [0, 1, 2])


def test_an_error_with_no_dead_peer_is_reported_as_raised(monkeypatch):
    outcomes = {"r0": 1, "r1": _TaskRaised("ValueError: bad batch"), "r2": 2}
    monkeypatch.setattr(placement, "ray", _fake_ray(outcomes, ["r1", "r0", "r2"]))
    with pytest.raises(WorkerFailure, match=r"^actor rank 1 raised in update_actor: ValueError: bad batch"):
        _group()._get(["r0", "r1", "r2"], "update_actor", [0, 1, 2])
    monkeypatch.setattr(placement, "ray", _fake_ray({"r0": 1, "r1": 2, "r2": 3}, ["r2", "r0", "r1"]))
    assert _group()._get(["r0", "r1", "r2"], "m", [0, 1, 2]) == [1, 2, 3]


class _ObjectLost(Exception):
    pass


def test_a_peer_error_that_is_not_a_death_leaves_the_raising_rank_reported(monkeypatch):
    # e.g. ray.exceptions.ObjectLostError on a peer's result: neither RayTaskError nor RayActorError
    outcomes = {"r0": _TaskRaised("ValueError: bad batch"), "r1": _ObjectLost("object lost"), "r2": 2}
    monkeypatch.setattr(placement, "ray", _fake_ray(outcomes, ["r0", "r1", "r2"]))
    with pytest.raises(WorkerFailure, match=r"^actor rank 0 raised in update_actor: ValueError: bad batch"):
        _group()._get(["r0", "r1", "r2"], "update_actor", [0, 1, 2])


def test_the_grace_wait_ends_at_the_callers_deadline(monkeypatch):
    fake = _fake_ray({"r0": _TaskRaised("ValueError: bad batch"), "r1": 1}, ["r0", "r1"])
    waits = []
    real_wait = fake.wait
    fake.wait = lambda refs, num_returns=1, timeout=None: (waits.append(timeout), real_wait(refs, num_returns))[1]
    monkeypatch.setattr(placement, "ray", fake)
    with pytest.raises(WorkerFailure, match=r"^actor rank 0 raised"):
        _group()._get(["r0", "r1"], "update_actor", [0, 1], timeout_s=2.0)
    assert len(waits) == 2 and 0 < waits[1] <= 2.0  # not PEER_DEATH_GRACE_S (10 s) past the deadline


def test_a_run_failure_is_one_line_with_the_checkpoint_to_resume_from(tmp_path, monkeypatch, capsys):
    """trainer/main.py's report of a dead worker: the first line of the error (Ray's report of the death follows it)
    and the last checkpoint of the run's folder; a message that names its checkpoint already is kept as it is."""
    import trainer.main as main
    from trainer import interrupt
    from trainer.placement import WorkerDied
    from trainer.ppo_trainer import TrainingDiverged

    step = tmp_path / "checkpoints" / "global_step_4"
    step.mkdir(parents=True)
    monkeypatch.setattr("trainer.checkpoint.base.find_latest_checkpoint", lambda root: str(step))
    monkeypatch.setitem(interrupt._STATE, "checkpoint_root", str(tmp_path / "checkpoints"))
    main.report_run_failure(WorkerDied("actor rank 1 died during update_actor: The actor died unexpectedly.\n"
                                       "\tclass_name: ActorRolloutRefWorker\n\tpid: 123"))
    diverged = "actor: 3 optimizer steps in a row were skipped; stopping at step 3. Last checkpoint: /x/global_step_2"
    main.report_run_failure(TrainingDiverged(diverged))
    main.report_run_failure(WorkerDied("actor rank 1 died during save_checkpoint: The actor died unexpectedly."))
    assert capsys.readouterr().err.splitlines() == [
        f"error: actor rank 1 died during update_actor: The actor died unexpectedly; last checkpoint: {step}",
        f"error: {diverged}",  # a call named "save_checkpoint: ..." is no checkpoint named
        f"error: actor rank 1 died during save_checkpoint: The actor died unexpectedly; last checkpoint: {step}"]
