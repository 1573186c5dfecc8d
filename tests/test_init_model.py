"""The embedded tiny model (``<trainer.output_dir>/init_model``) is reused only when it was built from this run's
settings: ``trainer.seed``, ``actor_rollout_ref.model.tiny.*``, ``data.warm_start_steps`` and
``data.synthetic_task``, recorded in ``init_model/build_settings.json``. Found by a tester: a second run into the same
folder with another of these values silently trained the first run's model, so the same command gave different
results depending on what the folder held. Now a fresh run builds its own (the earlier one is set aside with the
earlier run's outputs once every check has passed) and a resume is refused, naming the changed keys."""
import hashlib
import json
import os

import pytest

from trainer.config_checks import ConfigError
from trainer.run_folder import BUILD_RECORD

WARM = ("data=synthetic_tool", "data.warm_start_steps=2")  # a task with a warm start, kept short


def _cfg(out, *overrides):
    from hydra import compose, initialize_config_dir

    from tests.e2e_utils import ROOT
    from trainer.launch import resolve_config

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return resolve_config(compose("ppo_trainer", overrides=[f"trainer.output_dir={out}", *overrides]))


def _prepare(out, *overrides, resuming=False):
    """``prepare_embedded`` of the run with ``overrides``; returns its config (the model paths filled in)."""
    from trainer.embedded_assets import prepare_embedded

    cfg = _cfg(out, *overrides)
    prepare_embedded(cfg, resuming=resuming)
    return cfg


def _digest(folder):
    """Every file of ``folder`` with its bytes' digest."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), folder)] = hashlib.md5(f.read()).hexdigest()
    return out


def _hidden_size(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["hidden_size"]


@pytest.mark.parametrize("first, second, changed", [
    ((), ("trainer.seed=5",), "trainer.seed=5 (init_model: 1)"),
    ((), ("actor_rollout_ref.model.tiny.hidden_size=48",),
     "actor_rollout_ref.model.tiny.hidden_size=48 (init_model: 64)"),
    (WARM, (*WARM, "data.warm_start_steps=3"), "data.warm_start_steps=3 (init_model: 2)"),
    ((), ("+data.synthetic_task=arith_tool",), "data.synthetic_task='arith_tool' (init_model: 'digits')"),
], ids=["seed", "tiny", "warm_start_steps", "synthetic_task"])
def test_a_fresh_run_with_another_setting_builds_its_own_model_and_sets_the_earlier_one_aside(
        tmp_path, caplog, first, second, changed):
    from trainer.run_folder import settle_run_folder

    out = tmp_path / "run"
    init = str(out / "init_model")
    assert _prepare(out, *first)["actor_rollout_ref"]["model"]["path"] == init
    earlier = _digest(init)
    with caplog.at_level("INFO", logger="trainer.run_folder"):
        cfg = _prepare(out, *second)
    (note,) = [r.getMessage() for r in caplog.records if r.name == "trainer.run_folder"]
    assert note.startswith(f"trainer.output_dir: {init} was built from other settings: ") and changed in note
    staged = cfg["actor_rollout_ref"]["model"]["path"]
    assert staged != init and cfg["critic"]["model"]["path"] == staged
    assert _digest(init) == earlier                      # nothing moved before every check passed
    assert _digest(staged) != earlier
    new = _digest(staged)
    settle_run_folder(cfg, True, [], {})                 # every check passed
    (stamp,) = os.listdir(out / "earlier_runs")
    assert _digest(out / "earlier_runs" / stamp / "init_model") == earlier
    assert _digest(init) == new and cfg["actor_rollout_ref"]["model"]["path"] == init
    assert cfg["critic"]["model"]["path"] == init and os.path.samefile(staged, init)  # the workers' path holds
    assert _prepare(out, *second)["actor_rollout_ref"]["model"]["path"] == init       # now the same: reused
    assert _digest(init) == new and os.listdir(out / "earlier_runs") == [stamp]


def test_the_same_settings_reuse_the_model_and_the_record_names_them(tmp_path):
    out = tmp_path / "run"
    _prepare(out, "actor_rollout_ref.model.tiny.hidden_size=48")
    init = out / "init_model"
    with open(init / BUILD_RECORD) as f:
        record = json.load(f)
    assert record["vocab_size"] == 23 and record["settings"]["trainer.seed"] == 1
    assert {k: v for k, v in record["settings"].items() if k.startswith("data.")} == {
        "data.synthetic_task": "digits", "data.warm_start_steps": 0}     # digits has no warm start
    assert record["settings"]["actor_rollout_ref.model.tiny.hidden_size"] == 48
    mtime = os.path.getmtime(init / "model.safetensors")
    cfg = _prepare(out, "actor_rollout_ref.model.tiny.hidden_size=48", "+data.warm_start_steps=7")
    assert cfg["actor_rollout_ref"]["model"]["path"] == str(init)
    assert os.path.getmtime(init / "model.safetensors") == mtime and sorted(os.listdir(out)) == ["data", "init_model"]


def test_a_resume_with_other_settings_is_refused_naming_each_key_and_both_values(tmp_path):
    out = tmp_path / "run"
    _prepare(out)
    init = str(out / "init_model")
    earlier = sorted(os.listdir(out)), _digest(init)
    with pytest.raises(ConfigError) as info:
        _prepare(out, "trainer.seed=5", "actor_rollout_ref.model.tiny.hidden_size=48", resuming=True)
    assert str(info.value) == (
        "trainer.resume_mode: trainer.seed=5 (init_model: 1), actor_rollout_ref.model.tiny.hidden_size=48 "
        f"(init_model: 64): the checkpoint continues the tiny model built into {init} from the recorded values, so the "
        "new ones would be ignored; resume with the recorded values, or trainer.resume_mode=disable for a new run (a "
        "fresh run sets the earlier run's outputs aside)")
    assert (sorted(os.listdir(out)), _digest(init)) == earlier
    assert _prepare(out, resuming=True)["actor_rollout_ref"]["model"]["path"] == init


def test_an_init_model_without_a_record_is_kept_by_a_resume_and_rebuilt_by_a_fresh_run(tmp_path, caplog):
    out = tmp_path / "run"
    _prepare(out, "trainer.seed=5")
    init = str(out / "init_model")
    os.remove(os.path.join(init, BUILD_RECORD))          # a folder made without the record
    earlier = _digest(init)
    with caplog.at_level("INFO", logger="trainer.run_folder"):
        assert _prepare(out, resuming=True)["actor_rollout_ref"]["model"]["path"] == init
        cfg = _prepare(out)
    notes = [r.getMessage() for r in caplog.records if r.name == "trainer.run_folder"]
    assert notes[0] == (f"trainer.resume_mode: {init} has no {BUILD_RECORD} (the settings it was built from), so they "
                        "are not compared with this run's; the resume uses it as it is")
    assert notes[1].startswith(f"trainer.output_dir: {init} has no {BUILD_RECORD} (the settings it was built from), "
                               "so whether it matches this run is unknown; this fresh run builds its own tiny model")
    assert cfg["actor_rollout_ref"]["model"]["path"] != init and _digest(init) == earlier


def test_a_start_that_stops_before_the_set_aside_leaves_init_model_as_it_was(tmp_path):
    """The new model waits in a hidden temporary folder, removed at exit (here: when the next start replaces it)."""
    out = tmp_path / "run"
    _prepare(out)
    earlier = _digest(out / "init_model")
    staged = os.path.dirname(_prepare(out, "trainer.seed=5")["actor_rollout_ref"]["model"]["path"])
    assert os.path.basename(staged).startswith(".init_model-")
    _prepare(out)                                        # the next start: the same settings as the folder's
    assert not os.path.exists(staged) and sorted(os.listdir(out)) == ["data", "init_model"]
    assert _digest(out / "init_model") == earlier


def test_a_fresh_run_trains_the_model_of_its_settings(tmp_path, monkeypatch):
    """The launch in this process, no worker started: the workers are given the new model in its temporary folder;
    once they are placed, the earlier model is set aside with the earlier run's other outputs, and the trainer's
    config (which a restart of the workers and each checkpoint take) names the new ``init_model``."""
    from hydra import compose, initialize_config_dir

    from tests.e2e_utils import ROOT
    from trainer.launch import run
    from trainer.ppo_trainer import RayPPOTrainer

    out = tmp_path / "run"
    _prepare(out)
    (out / "metrics.jsonl").write_text('{"step": 2}\n')
    seen = {}

    def fit(self):
        path = self.cfg["actor_rollout_ref"]["model"]["path"]
        seen.update(path=path, hidden=_hidden_size(path))
        return {"new": 1.0}
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: seen.update(
        workers=self.cfg["actor_rollout_ref"]["model"]["path"], moved=os.path.exists(out / "earlier_runs")))
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        hydra_cfg = compose("ppo_trainer", overrides=[f"trainer.output_dir={out}",
                                                      "actor_rollout_ref.model.tiny.hidden_size=48"])
    monkeypatch.setattr(RayPPOTrainer, "fit", fit)
    assert run(hydra_cfg) == {"new": 1.0}
    assert seen["moved"] is False and os.path.basename(os.path.dirname(seen["workers"])).startswith(".init_model-")
    assert (seen["path"], seen["hidden"]) == (str(out / "init_model"), 48)
    (stamp,) = os.listdir(out / "earlier_runs")
    assert sorted(os.listdir(out / "earlier_runs" / stamp)) == ["init_model", "metrics.jsonl"]
    assert _hidden_size(out / "earlier_runs" / stamp / "init_model") == 64
