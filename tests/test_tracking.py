"""Tracking: metrics.jsonl always written; wandb works offline without network or API key."""
import json
import os

import pytest

from trainer.tracking import Tracking, set_aside_earlier_run


def test_jsonl_and_console(tmp_path, capsys):
    t = Tracking("p", "e", ["console"], str(tmp_path), total_steps=2)
    t.log({"critic/score/mean": 0.5, "val/x/acc": 0.25, "nan_metric": float("nan")}, step=1)
    t.log({"critic/score/mean": 0.75}, step=2)
    t.close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["critic/score/mean"] == 0.75
    assert rows[0]["nan_metric"] == "nan"


def test_unknown_backend_is_named(tmp_path):
    with pytest.raises(ValueError, match="tensorboard"):
        Tracking("p", "e", ["console", "tensorboard"], str(tmp_path))


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = Tracking("proj", "exp", ["wandb"], str(tmp_path), config={"a": 1})
    t.log({"critic/score/mean": 1.0}, step=1)
    t.close()
    assert os.environ.get("WANDB_MODE") == "offline"
    assert any(name.startswith("offline-run") for name in os.listdir(tmp_path / "wandb"))


def test_resume_and_rerun_leave_no_duplicate_steps(tmp_path):
    t = Tracking("p", "e", [], str(tmp_path), start_step=0)
    for step in range(1, 5):
        t.log({"x": float(step)}, step=step)
    t.close()
    t = Tracking("p", "e", [], str(tmp_path), start_step=2)     # resumed from the checkpoint of step 2
    t.log({"x": 30.0}, step=3)
    t.close()
    steps = [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2, 3]
    Tracking("p", "e", [], str(tmp_path), start_step=0).close()  # a fresh run into the same folder
    assert open(tmp_path / "metrics.jsonl").read() == ""


def test_fresh_run_sets_aside_an_earlier_runs_outputs(tmp_path, caplog):
    """A second run into the same output_dir keeps the first run's metrics, samples and HF export."""
    os.makedirs(tmp_path / "hf_actor")
    (tmp_path / "hf_actor" / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "val_generations.jsonl").write_text("")  # empty: left in place
    os.makedirs(tmp_path / "checkpoints" / "global_step_1")
    with caplog.at_level("WARNING"):
        assert set_aside_earlier_run(str(tmp_path)).startswith(str(tmp_path / "earlier_runs"))
    (earlier,) = os.listdir(tmp_path / "earlier_runs")
    dest = tmp_path / "earlier_runs" / earlier
    assert sorted(os.listdir(dest)) == ["hf_actor", "metrics.jsonl"]
    assert (dest / "hf_actor" / "config.json").read_text() == "{}"
    assert "metrics.jsonl, hf_actor: moved to" in caplog.text
    assert os.path.isdir(tmp_path / "checkpoints" / "global_step_1") and not os.path.exists(tmp_path / "hf_actor")
    assert set_aside_earlier_run(str(tmp_path)) is None  # nothing written since: nothing moved
    assert len(os.listdir(tmp_path / "earlier_runs")) == 1
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    set_aside_earlier_run(str(tmp_path))  # the same second: a second folder, none replaced
    assert len(os.listdir(tmp_path / "earlier_runs")) == 2
