"""DSRL_PROFILE_STEPS: the marked steps' worker calls run under torch.profiler and write a table and a trace per
call and rank; the call's wall and device seconds come back with its result; unmarked calls are left alone."""
import gzip
import json
import os

import pytest
import torch

from trainer.protocol import DataProto
from trainer.workers.profiling import PROFILE_KEY, profile_meta, profile_steps, profiled


class _Worker:
    rank, device = 1, torch.device("cpu")

    @profiled("gen")
    def generate(self, data):
        return DataProto.from_dict({"x": data["x"] @ data["x"].T}, meta=dict(data.meta))

    @profiled("update_actor")
    def update(self, data):
        return {"actor/pg_loss": [float((data["x"] ** 2).sum())]}


def test_marked_calls_write_a_table_and_a_trace_and_report_their_seconds(tmp_path):
    out = str(tmp_path / "step_2")
    data = DataProto.from_dict({"x": torch.randn(8, 16)}, meta={PROFILE_KEY: out})
    rows = _Worker().generate(data)
    metrics = _Worker().update(data)
    assert rows.meta["perf/profile/gen_wall_s"] > 0 and rows.meta["perf/profile/gen_device_s"] == 0.0  # no GPU
    assert len(metrics["perf/profile/update_actor_wall_s"]) == 1 and metrics["actor/pg_loss"]
    for stage in ("gen", "update_actor"):
        with open(os.path.join(out, f"{stage}_rank1.txt"), encoding="utf-8") as f:
            assert "Self CPU" in f.read()
        with gzip.open(os.path.join(out, f"{stage}_rank1.json.gz"), "rt", encoding="utf-8") as f:
            assert json.load(f)["traceEvents"]


def test_unmarked_calls_are_not_profiled(tmp_path):
    data = DataProto.from_dict({"x": torch.randn(2, 3)})
    assert not any(k.startswith("perf/profile") for k in _Worker().generate(data).meta)
    assert set(_Worker().update(data)) == {"actor/pg_loss"}


def test_steps_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DSRL_PROFILE_STEPS", "3, 5")
    assert profile_steps() == {3, 5} and profile_meta(4, str(tmp_path)) == {}
    assert profile_meta(5, str(tmp_path)) == {PROFILE_KEY: str(tmp_path / "profile" / "step_5"), "perf/profiled": 1.0}
    monkeypatch.delenv("DSRL_PROFILE_STEPS")
    assert profile_steps() == set()
    with pytest.raises(ValueError, match="DSRL_PROFILE_STEPS"):
        profile_steps("2,x")
