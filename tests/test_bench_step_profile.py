"""tools/bench/step_profile.py: stage split from metrics.jsonl (hand-computed) and the --tiny profiler run."""
import json
import math

import pytest

from tools.bench import step_profile as sp


def _rows():
    # step 1 is warm-up (skipped); steps 2 and 3: step = 10 and 6 s
    return [
        {"step": 1, "timing_s/gen": 100.0, "timing_s/update_actor": 1.0, "timing_s/step": 101.0},
        {"step": 2, "timing_s/gen": 4.0, "timing_s/reward": 1.0, "timing_s/update_actor": 3.0, "timing_s/step": 10.0,
         "timing_per_token_ms/gen": 2.0, "perf/throughput": 100.0, "perf/total_num_tokens": 2000.0,
         "perf/max_memory_allocated_gb/actor": 30.0},
        {"step": 3, "timing_s/gen": 2.0, "timing_s/update_actor": 3.0, "timing_s/step": 6.0,
         "timing_per_token_ms/gen": 4.0, "perf/throughput": 300.0, "perf/total_num_tokens": 1000.0,
         "perf/max_memory_allocated_gb/actor": 34.0},
        {"step": 3, "val/acc": 0.5},  # a validation-only row: ignored
    ]


def test_summarize_steps_hand_computed():
    s = sp.summarize_steps(_rows(), skip_first=1)
    st = {r["stage"]: r for r in s["stages"]}
    assert s["steps_used"] == [2, 3]
    assert st["step"]["mean_s"] == pytest.approx(8.0)
    assert st["gen"]["mean_s"] == pytest.approx(3.0) and st["gen"]["share"] == pytest.approx(3.0 / 8.0)
    assert st["gen"]["per_token_ms"] == pytest.approx(3.0)
    assert st["reward"]["mean_s"] == pytest.approx(0.5)  # missing in step 3 counts as 0
    assert st["update_actor"]["mean_s"] == pytest.approx(3.0)
    assert st["other"]["mean_s"] == pytest.approx(8.0 - 3.0 - 0.5 - 3.0)
    assert "ref" not in st  # never logged
    assert s["tokens_per_s_per_gpu"] == pytest.approx(200.0)
    assert s["tokens_per_step"] == pytest.approx(1500.0)
    assert s["memory"] == {"perf/max_memory_allocated_gb/actor": {"mean": 32.0, "max": 34.0}}


def test_summarize_keeps_single_step_and_rejects_no_steps():
    s = sp.summarize_steps(_rows()[:1], skip_first=1)
    assert s["steps_used"] == [1]
    with pytest.raises(ValueError, match="timing_s/step"):
        sp.summarize_steps([{"step": 1, "val/acc": 1.0}])


def test_read_metrics_names_bad_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:3"):
        sp.read_metrics(str(p))


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        sp.main(["--help"])
    assert e.value.code == 0 and "--metrics" in capsys.readouterr().out


def test_tiny_run_writes_json_and_trace(tmp_path):
    out = tmp_path / "step.json"
    sp.main(["--tiny", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["meta"]["command"] and doc["steps"]["stages"][-1]["stage"] == "step"
    prof = doc["profile"]
    assert prof["model"] == "tiny" and prof["tokens"] == 512 and prof["seconds"] > 0
    assert 0 < len(prof["top_ops"]) <= 15 and all(math.isfinite(r["self_time_ms"]) for r in prof["top_ops"])
    trace = json.loads(open(prof["trace"]).read())
    assert trace["traceEvents"]
