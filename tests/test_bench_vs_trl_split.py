"""tools/bench/vs_trl.py records our side's step split: the engine's weight sync, wake-up and sleep taken out of
``gen``, the seconds inside the stages, the compile counters and the memory per rollout state; and a side stopped
at its time limit keeps the steps it wrote."""
import json
import os
import sys

import pytest

from tools.bench import vs_trl, vs_trl_report


def _line(step_s, gen=1.0, sync=0.1, wake=(0.02, 0.03, 0.01), sleep=0.05, records=0.0):
    return {"timing_s/step": step_s, "timing_s/gen": gen, "timing_s/reward": 0.05, "timing_s/adv": 0.01,
            "timing_s/update_actor": 0.4, "response_length/mean": 200.0, "prompt_length/mean": 100.0,
            "response_length/max": 240.0,
            "perf/rollout_s/before_wake": wake[0], "perf/rollout_s/weights_awake": wake[1],
            "perf/rollout_s/weights_synced": sync, "perf/rollout_s/kv_awake": wake[2],
            "perf/rollout_s/generated": 0.6, "perf/rollout_s/asleep": sleep, "perf/worker_s/gen": 0.9,
            "perf/worker_s/update_actor": 0.35, "perf/rollout/dynamo_graphs": 0.0,
            "perf/rollout/cudagraph_records": records, "perf/old_log_prob_pass": 0.0,
            "perf/hf_kv_awake_gib": 3.0, "perf/hf_asleep_gib": 1.5 + records}


def test_engine_stages_are_taken_out_of_gen():
    (s,) = vs_trl_report.ours_steps([_line(2.0)], rows=128)
    split = s["split_s"]
    assert split["weight_sync"] == pytest.approx(0.1) and split["sleep"] == pytest.approx(0.05)
    assert split["wake_up"] == pytest.approx(0.06)
    assert split["gen"] == pytest.approx(1.0 - 0.1 - 0.05 - 0.06)
    assert sum(split.values()) == pytest.approx(1.0 + 0.05 + 0.01 + 0.4)  # nothing counted twice
    assert "old_log_prob" not in split  # the run skipped the pass: no timer, no stage
    assert s["detail_s"] == {"gen_engine": 0.6, "worker_gen": 0.9, "worker_update": 0.35,
                             "gen_engine_per_decode_step": pytest.approx(0.6 / 240)}
    assert s["counters"] == {"dynamo_graphs": 0.0, "cudagraph_records": 0.0, "old_log_prob_pass": 0.0}
    assert s["device_used_gib"] == {"kv_awake": 3.0, "asleep": 1.5}


def test_a_run_without_engine_timers_keeps_gen_whole():
    line = {k: v for k, v in _line(2.0).items() if not k.startswith("perf/rollout_s/")}
    (s,) = vs_trl_report.ours_steps([line], rows=8)
    assert s["split_s"]["gen"] == 1.0 and not {"weight_sync", "wake_up", "sleep"} & set(s["split_s"])


def test_summary_keeps_details_counters_and_memory():
    steps = vs_trl_report.ours_steps([_line(30.0, records=12.0), _line(2.0, sleep=0.07), _line(2.2, sleep=0.03)], 8)
    r = vs_trl_report.summarize("ours_hf", steps, 8, 60.0)
    assert r["split_s"]["sleep"] == pytest.approx(0.05)  # timed steps only
    assert r["detail_s"]["gen_engine"] == pytest.approx(0.6) and r["detail_s"]["worker_update"] == pytest.approx(0.35)
    assert [c["cudagraph_records"] for c in r["counters_per_step"]] == [12.0, 0.0, 0.0]
    assert r["device_used_gib"]["asleep"] == 13.5  # the largest of every step, step 1 included
    assert len(r["step_splits"]) == 3 and r["step_splits"][0]["gen"] == pytest.approx(1.0 - 0.21)
    doc = dict(job={}, results=[dict(r, framework="ours", engine="hf")])
    md = vs_trl_report.markdown(doc)
    assert "| side (inside the stages, s) | gen_engine | gen_engine_per_decode_step | worker_gen | worker_update |" in md


def _fake_trainer(metrics_path: str, lines: list[dict], then_sleep: bool) -> list[str]:
    """A command that writes ``lines`` to ``metrics_path`` like trainer/main.py, then hangs or exits."""
    code = (f"import json, os, time\nos.makedirs(os.path.dirname({metrics_path!r}), exist_ok=True)\n"
            f"with open({metrics_path!r}, 'w') as f:\n"
            f"    for m in {lines!r}: f.write(json.dumps(m) + '\\n')\n"
            + ("time.sleep(60)\n" if then_sleep else ""))
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("written,ok", [(2, True), (0, False)])
def test_a_side_stopped_at_its_limit_keeps_the_steps_it_wrote(tmp_path, monkeypatch, written, ok):
    job = dict(batch=2, n=4, steps=4, out_dir=str(tmp_path))
    path = os.path.join(str(tmp_path), "ours_hf", "metrics.jsonl")
    lines = [_line(9.0), _line(2.0)][:written]
    monkeypatch.setattr(vs_trl, "ours_command", lambda j, engine: _fake_trainer(path, lines, then_sleep=True))
    monkeypatch.setattr(vs_trl, "SIGINT_GRACE_S", 0.5)  # (15 s in a real run; a test may run with SIGINT ignored)
    if not ok:
        with pytest.raises(vs_trl.SideTimeout):
            vs_trl._run_ours_side("ours_hf", job, str(tmp_path), 2)
        return
    steps, extra, wall = vs_trl._run_ours_side("ours_hf", job, str(tmp_path), 2)
    assert len(steps) == 2 and wall == 2.0
    assert extra["note"] == "stopped at its time limit (2 s) before its last step: 2 of 4 steps written, those kept"


def test_a_side_that_ends_early_says_how_many_steps_it_wrote(tmp_path, monkeypatch):
    job = dict(batch=2, n=4, steps=4, out_dir=str(tmp_path))
    path = os.path.join(str(tmp_path), "ours_hf", "metrics.jsonl")
    monkeypatch.setattr(vs_trl, "ours_command", lambda j, e: _fake_trainer(path, [_line(9.0)], then_sleep=False))
    steps, extra, _ = vs_trl._run_ours_side("ours_hf", job, str(tmp_path), 30)
    assert len(steps) == 1 and extra["note"] == "exited: 1 of 4 steps written, those kept"
    with open(path, encoding="utf-8") as f:
        assert json.loads(f.readline())["timing_s/step"] == 9.0


def test_profiled_steps_are_left_out_of_the_means_and_keep_their_profile():
    prof = dict(_line(9.0), **{"perf/profiled": 1.0, "perf/profile/gen_wall_s": 1.4, "perf/profile/gen_device_s": 0.3})
    steps = vs_trl_report.ours_steps([_line(30.0), _line(2.0), prof, _line(2.4)], 8)
    assert [s["profiled"] for s in steps] == [False, False, True, False]
    r = vs_trl_report.summarize("ours_hf", steps, 8, 60.0)
    assert r["timed_steps"] == 2 and r["mean_step_s"] == pytest.approx(2.2)
    assert r["profile_s"] == {"3": {"gen_wall_s": 1.4, "gen_device_s": 0.3}}
    assert vs_trl.side_env("ours_hf", {}, profile_steps="3") == {"DSRL_PROFILE_STEPS": "3"}
    assert vs_trl.side_env("trl", {}, profile_steps="3") == {}


def test_the_trainers_own_update_mfu_is_averaged_over_timed_steps_and_shown():
    lines = [dict(_line(30.0), **{"perf/mfu/actor": 0.05}), dict(_line(2.0), **{"perf/mfu/actor": 0.30}),
             dict(_line(2.2), **{"perf/mfu/actor": 0.34})]
    r = vs_trl_report.summarize("ours_hf", vs_trl_report.ours_steps(lines, 8), 8, 60.0)
    assert r["trainer_mfu"] == pytest.approx(0.32)  # step 1 (compilation) left out
    r["update_mfu"] = 0.25
    md = vs_trl_report.markdown(dict(job={}, results=[dict(r, framework="ours", engine="hf")]))
    assert "| 25.0% (trainer 32.0%) |" in md
    no_mfu = vs_trl_report.summarize("ours_hf", vs_trl_report.ours_steps([_line(2.0)], 8), 8, 6.0)
    assert "trainer_mfu" not in no_mfu
