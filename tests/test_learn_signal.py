"""The training signal between wall-clock marks of tools/bench/learn_vs_trl.py (tools/bench/learn_signal.py)."""
import json
import math

from tests.test_learn_vs_trl import _synthetic_doc
from tools.bench import learn_report, learn_signal


def _ours_run(tmp_path, rows):
    with open(tmp_path / "metrics.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return dict(side="ours", seed=1, out_dir=str(tmp_path))


def test_step_rows_reads_ours_metrics_and_trl_steps(tmp_path):
    run = _ours_run(tmp_path, [
        {"step": 1, "critic/score/mean": 0.5, "critic/frac_reward_zero_std": 0.25, "actor/entropy": 2.0,
         "response_length/mean": 100.0, "other": 3},
        {"step": 2, "critic/score/mean": 0.7},  # a step that logged less keeps what it logged
        {"no_step": 1},
    ])
    assert learn_signal.step_rows(run) == [
        {"step": 1, "reward": 0.5, "frac_reward_zero_std": 0.25, "entropy": 2.0, "response_length": 100.0},
        {"step": 2, "reward": 0.7}]
    trl = dict(side="trl", seed=1, trl={"steps": [
        {"step": 1, "reward": 0.1, "completion_length": 50.0, "frac_reward_zero_std": 1.0, "entropy": None}]})
    assert learn_signal.step_rows(trl) == [
        {"step": 1, "reward": 0.1, "frac_reward_zero_std": 1.0, "response_length": 50.0}]
    assert learn_signal.step_rows(dict(side="ours", seed=1, out_dir=str(tmp_path / "none"))) == []
    assert learn_signal.step_rows(dict(side="trl", seed=1)) == []


def test_signal_by_mark_averages_the_steps_between_saves():
    steps = [{"step": s, "reward": float(s), "entropy": math.nan if s == 5 else 1.0} for s in range(1, 8)]
    exports = [{"mark_s": 120.0, "global_step": 5}, {"mark_s": 60.0, "global_step": 2},
               {"mark_s": 180.0, "global_step": 5}]  # out of order; a mark with no new step
    got = learn_signal.signal_by_mark(steps, exports)
    assert [g["mark_s"] for g in got] == [60.0, 120.0, 180.0]
    assert got[0] == {"mark_s": 60.0, "steps": 2, "reward": 1.5, "entropy": 1.0}
    assert got[1] == {"mark_s": 120.0, "steps": 3, "reward": 4.0, "entropy": 1.0}  # NaN entropy of step 5 left out
    assert got[2] == {"mark_s": 180.0, "steps": 0}


def test_report_has_the_signal_table_per_seed_and_none_without_it():
    sig = lambda flat, steps: [{"mark_s": 60.0, "steps": steps, "frac_reward_zero_std": flat, "entropy": 0.5,
                                "reward": 0.125}]
    doc = {"runs": [dict(side="trl", seed=1, signal=sig(0.9, 10)), dict(side="ours", seed=1, signal=sig(0.5, 20)),
                    dict(side="ours", seed=2, signal=sig(0.75, 21))]}
    lines = learn_signal.signal_lines(doc)
    assert lines[-1] == "| 1 | 10 | 20/21 | 0.90 | 0.50/0.75 | 0.50 | 0.50/0.50 | 0.125 | 0.125/0.125 |"
    assert learn_signal.signal_lines({"runs": [dict(side="ours", seed=1)]}) == []
    assert learn_signal.signal_lines({}) == []


def test_markdown_report_carries_the_signal_table():
    doc = _synthetic_doc()
    assert "Training signal between marks" not in learn_report.markdown(doc)
    doc["runs"][0]["signal"] = [{"mark_s": 60.0, "steps": 3, "reward": 0.5}]
    text = learn_report.markdown(doc)
    assert "Training signal between marks" in text and text.index("Training signal") < text.index("GSM8K test")


def test_step_rows_skips_a_cut_line_keeps_the_last_of_a_repeated_step_and_ignores_booleans(tmp_path):
    run = _ours_run(tmp_path, [{"step": 2, "critic/score/mean": 0.25}, {"step": 1, "critic/score/mean": 0.5},
                               {"step": 2, "critic/score/mean": 0.75, "actor/entropy": True}])
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 3, "critic/sc')  # the last line of a killed process
    assert learn_signal.step_rows(run) == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75}]
    assert learn_signal.step_rows(dict(side="ours", seed=1)) == []  # no folder: nothing read from here


def test_signal_cells_are_per_seed_in_seed_order_with_gaps_marked():
    sig = lambda **kw: [{"mark_s": 60.0, "steps": 5, **kw}]
    doc = {"runs": [dict(side="ours", seed=3, signal=sig(reward=0.3, entropy=0.5)),
                    dict(side="ours", seed=2, signal=sig(reward=0.2)),
                    dict(side="ours", seed=1, signal=[{"mark_s": 120.0, "steps": 4, "reward": 0.1}])]}
    rows = learn_signal.signal_lines(doc)[-2:]
    assert rows[0] == "| 1 | - | -/5/5 | - | -/-/- | - | -/-/0.50 | - | -/0.200/0.300 |"
    assert rows[1] == "| 2 | - | 4/-/- | - | -/-/- | - | -/-/- | - | 0.100/-/- |"
