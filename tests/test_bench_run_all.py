"""tools/bench/run_all.py: collection, per-benchmark time limits and skips, with fake benchmark commands (CPU,
seconds); and every command line of the real suite parses with its script's own arguments."""
import argparse
import importlib
import json
import os
import subprocess
import sys
import time

import pytest

from tools.bench import run_all, suite
from tools.bench.suite import Bench, Context

PY = sys.executable


def _ctx(tmp_path, **kw):
    raw = tmp_path / "out" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    return Context(**dict(dict(mode="full", raw_dir=str(raw), python=PY, gpus=1), **kw))


def _logs(tmp_path):
    logs = tmp_path / "out" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return str(logs)


def _py(code):
    """A bench command running ``code`` with the output path as sys.argv[1]."""
    return lambda ctx, out: [[PY, "-c", code, out]]


def _bench(name, code, needs=(), timeout=60, summarize=lambda d: d["rows"], **kw):
    return Bench(name, f"fake {name}", tuple(needs), _py(code), {"full": timeout}, summarize, **kw)


WRITE = "import json, sys; json.dump({'rows': [{'x': 1.5, 'y': 'a'}]}, open(sys.argv[1], 'w'))"


def test_ok_bench_summary_and_whole_json(tmp_path):
    e = run_all.run_bench(_bench("good", WRITE), _ctx(tmp_path), _logs(tmp_path), ["0"])
    assert e["status"] == "ok" and e["reason"] == "" and e["returncode"] == 0
    assert e["summary"] == [{"x": 1.5, "y": "a"}] and e["result"] == {"rows": [{"x": 1.5, "y": "a"}]}
    assert e["log"] == os.path.join("logs", "good.log") and e["output"] == os.path.join("raw", "good.json")
    assert e["seconds"] < 30


def test_nan_in_a_script_json_stays_strict_json(tmp_path):
    code = "import json, sys; json.dump({'rows': [{'x': float('nan'), 'y': float('inf')}]}, open(sys.argv[1], 'w'))"
    e = run_all.run_bench(_bench("nan", code), _ctx(tmp_path), _logs(tmp_path), [])
    assert e["status"] == "ok" and e["summary"] == [{"x": "NaN", "y": "Infinity"}]
    run_all.write_results(dict(meta=dict(date="d", host="h", python="3", installed=[], mode="full", command="c"),
                               benches=[e]), str(tmp_path))

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")
    json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)


def test_failure_reports_exit_code_and_error_line(tmp_path):
    code = "import sys; print('working'); sys.stderr.write('ValueError: bad size 7\\n'); sys.exit(3)"
    e = run_all.run_bench(_bench("bad", code), _ctx(tmp_path), _logs(tmp_path), [])
    assert e["status"] == "failed" and e["returncode"] == 3
    assert e["reason"] == "exit 3: ValueError: bad size 7" and "result" not in e


def test_exit_zero_without_json_is_a_failure(tmp_path):
    e = run_all.run_bench(_bench("silent", "print('no file')"), _ctx(tmp_path), _logs(tmp_path), [])
    assert e["status"] == "failed" and "exit 0 but no JSON" in e["reason"]


def test_stale_output_is_not_taken_for_this_run(tmp_path):
    ctx = _ctx(tmp_path)
    with open(ctx.out("stale"), "w") as f:
        json.dump({"rows": []}, f)
    e = run_all.run_bench(_bench("stale", "pass"), ctx, _logs(tmp_path), [])
    assert e["status"] == "failed"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child not yet reaped by its (gone) parent is a zombie: not running
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_timeout_stops_the_whole_process_tree_and_keeps_partial_json(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = ("import json, subprocess, sys, time; json.dump({'rows': [{'part': 1}]}, open(sys.argv[1], 'w'));"
            f"p = subprocess.Popen(['sleep', '120']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    t0 = time.monotonic()
    e = run_all.run_bench(_bench("slow", code, timeout=3), _ctx(tmp_path), _logs(tmp_path), [], grace_s=1)
    assert time.monotonic() - t0 < 30
    assert e["status"] == "timeout" and "3 s limit" in e["reason"] and "JSON it had written is kept" in e["reason"]
    assert e["summary"] == [{"part": 1}]
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild), "the bench's child process outlived the timeout"


def test_timeout_override_and_term_then_kill(tmp_path):
    # ignores SIGTERM: SIGKILL follows after the grace period
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    t0 = time.monotonic()
    e = run_all.run_bench(_bench("stubborn", code, timeout=600), _ctx(tmp_path), _logs(tmp_path), [],
                          timeout_s=1, grace_s=1)
    assert e["status"] == "timeout" and e["timeout_s"] == 1 and time.monotonic() - t0 < 30


def test_commands_share_the_limit_and_stop_at_a_failure(tmp_path):
    marker = tmp_path / "second_ran"
    b = Bench("two", "fake", (), lambda ctx, out: [[PY, "-c", "import sys; sys.exit(1)"],
                                                    [PY, "-c", f"open({str(marker)!r}, 'w')"]],
              {"full": 60}, lambda d: [])
    e = run_all.run_bench(b, _ctx(tmp_path), _logs(tmp_path), [])
    assert e["status"] == "failed" and not marker.exists() and len(e["commands"]) == 2


@pytest.mark.parametrize("needs,ctx_kw,reason", [
    (("cuda",), dict(gpus=0), "no CUDA device visible"),
    (("cuda", "2gpus"), dict(gpus=1), "needs 2 GPUs, found 1"),
    (("vllm",), dict(installed=frozenset({"trl"})), "vLLM is not installed"),
    (("trl",), dict(), "TRL is not installed"),
    (("model",), dict(), "needs --model"),
    (("model",), dict(model_error="--model 'x/y': not a local folder and not fetched"), "not fetched"),
    (("data",), dict(data="/nonexistent/train.parquet"), "--data /nonexistent/train.parquet not found"),
    (("runs",), dict(runs=" "), "no --runs given"),
    ((), dict(mode="quick"), "no quick mode"),
])
def test_skips_state_the_reason_and_run_nothing(tmp_path, needs, ctx_kw, reason):
    marker = tmp_path / "ran"
    b = _bench("needy", f"open({str(marker)!r}, 'w')", needs=needs)
    e = run_all.run_bench(b, _ctx(tmp_path, **ctx_kw), _logs(tmp_path), [])
    assert e["status"] == "skipped" and reason in e["reason"] and not marker.exists()


def test_tiny_mode_ignores_the_gpu_needs(tmp_path):
    b = Bench("cpu", "fake", ("cuda", "2gpus"), _py(WRITE), {"tiny": 60}, lambda d: d["rows"], tiny_needs=("trl",))
    assert "TRL" in suite.skip_reason(b, _ctx(tmp_path, mode="tiny", gpus=0))
    assert suite.skip_reason(b, _ctx(tmp_path, mode="tiny", gpus=0, installed=frozenset({"trl"}))) is None


def test_gpus_narrowed_and_env_passed(tmp_path):
    code = ("import json, os, sys; json.dump({'rows': [{'cvd': os.environ['CUDA_VISIBLE_DEVICES'], "
            "'extra': os.environ['EXTRA_X'], 'root_on_path': os.environ['PYTHONPATH'].split(os.pathsep)[0]}]}, "
            "open(sys.argv[1], 'w'))")
    one = _bench("one", code, env=lambda ctx: {"EXTRA_X": ctx.mode})
    two = _bench("two", code, env=lambda ctx: {"EXTRA_X": "2"}, gpus=2)
    ctx = _ctx(tmp_path, gpus=2)
    [r1] = run_all.run_bench(one, ctx, _logs(tmp_path), ["3", "5"])["summary"]
    [r2] = run_all.run_bench(two, ctx, _logs(tmp_path), ["3", "5"])["summary"]
    assert r1 == {"cvd": "3", "extra": "full", "root_on_path": run_all.ROOT} and r2["cvd"] == "3,5"
    assert run_all.visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "2, 6"}) == ["2", "6"]
    assert run_all.visible_gpus(2, {}) == ["0", "1"]


def test_summary_error_keeps_the_json(tmp_path):
    e = run_all.run_bench(_bench("odd", WRITE, summarize=lambda d: d["missing"]), _ctx(tmp_path), _logs(tmp_path), [])
    assert e["status"] == "ok" and e["summary"] == [] and "KeyError" in e["summary_error"] and e["result"]


def test_collect_hook_writes_the_output(tmp_path):
    def collect(ctx, out, started):
        with open(out, "w") as f:
            json.dump({"rows": [{"collected": True}]}, f)
    b = Bench("col", "fake", (), _py("pass"), {"full": 60}, lambda d: d["rows"], collect=collect)
    e = run_all.run_bench(b, _ctx(tmp_path), _logs(tmp_path), [])
    assert e["status"] == "ok" and e["summary"] == [{"collected": True}]


def test_main_writes_json_and_markdown(tmp_path, monkeypatch, capsys):
    fakes = [_bench("good", WRITE), _bench("bad", "import sys; sys.exit(2)"),
             _bench("gpu2", WRITE, needs=("cuda", "2gpus"))]
    monkeypatch.setattr(suite, "BENCHES", fakes)
    monkeypatch.setattr(run_all, "probe_machine", lambda python: dict(gpus=1, gpu_names=["Fake GPU"],
                                                                      gpu_memory_gib=[80.0], torch="9.9"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "res"
    assert run_all.main(["--out", str(out)]) == 1  # one failed
    doc = json.loads((out / "results.json").read_text())
    assert [(e["name"], e["status"]) for e in doc["benches"]] == [("good", "ok"), ("bad", "failed"),
                                                                   ("gpu2", "skipped")]
    assert doc["meta"]["gpu_names"] == ["Fake GPU"] and doc["meta"]["mode"] == "full"
    assert doc["meta"]["command"] == f"python tools/bench/run_all.py --out {out}"
    md = (out / "results.md").read_text()
    assert "| good | ok |" in md and "| gpu2 | skipped | - | needs 2 GPUs, found 1 |" in md
    assert "| x | y |" in md and "| 1.5 | a |" in md and "Fake GPU (80 GiB)" in md
    assert run_all.main(["--out", str(tmp_path / "res2"), "--only", "good"]) == 0
    with pytest.raises(SystemExit) as exc:
        run_all.main(["--out", str(out), "--only", "good,nope"])
    assert exc.value.code == 2 and "unknown benchmark 'nope'" in capsys.readouterr().err


def test_resolve_model(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        run_all.resolve_model(str(folder))
    (folder / "config.json").write_text("{}")
    assert run_all.resolve_model(str(folder)) == str(folder)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, allow_patterns: f"/cache/{repo_id}")
    assert run_all.resolve_model("org/model") == "/cache/org/model"

    def offline(**kw):
        raise OSError("We couldn't connect to 'https://huggingface.co'\nmore")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match=r"--model 'org/model': not a local folder .*couldn't connect"):
        run_all.resolve_model("org/model")


def test_collect_runs(tmp_path):
    runs = tmp_path / "rl_runs"
    (runs / "gsm8k_grpo").mkdir(parents=True)
    (runs / "save_resume").mkdir()
    rows = [{"step": 1, "timing_s/step": 9.0, "critic/score/mean": 0.1, "val/openai/gsm8k/acc": 0.2},
            {"step": 2, "timing_s/step": 2.0, "critic/score/mean": 0.3},
            {"step": 3, "timing_s/step": 4.0, "critic/score/mean": 0.5, "val/openai/gsm8k/acc": 0.4}]
    rows.append({"step": 4, "timing_s/step": float("nan"), "critic/score/mean": float("nan")})  # not counted
    (runs / "gsm8k_grpo" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    (runs / "gsm8k_grpo" / "console.log").write_text("...\nexit 124\n")
    (runs / "save_resume" / "first.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (runs / "old_batch").mkdir()
    (runs / "old_batch" / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    os.utime(runs / "old_batch" / "metrics.jsonl", (time.time() - 3600,) * 2)
    out = tmp_path / "rl_runs.json"
    suite.collect_runs(str(runs), str(out), since=time.time() - 60)
    got = {r["run"]: r for r in json.loads(out.read_text())["runs"]}
    assert got["gsm8k_grpo"] == dict(run="gsm8k_grpo", exit=124, steps=3, first_score=0.1, last_score=0.5,
                                     val={"val/openai/gsm8k/acc": [0.2, 0.4]}, mean_step_s=3.0)
    assert got["save_resume/first"]["steps"] == 1 and got["save_resume/first"]["exit"] is None
    assert "old_batch" not in got  # an earlier batch in the same folder
    with pytest.raises(FileNotFoundError):
        suite.collect_runs(str(tmp_path / "none"), str(out))


FAKE_TRAINER = """#!/usr/bin/env bash
# stands in for python: trainer/main.py ... trainer.output_dir=DIR writes one step into DIR/metrics.jsonl
for a in "$@"; do case $a in trainer.output_dir=*) d=${a#trainer.output_dir=} ;; esac; done
mkdir -p "$d" && echo '{"step": 1, "timing_s/step": 2.0, "critic/score/mean": 0.25}' > "$d/metrics.jsonl"
echo "args: $*"
"""


def test_rl_runs_script_through_run_all(tmp_path, monkeypatch):
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_TRAINER)
    fake.chmod(0o755)
    model = tmp_path / "smol"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setattr(run_all, "probe_machine", lambda python: dict(gpus=1, gpu_names=["Fake"],
                                                                      gpu_memory_gib=[80.0]))
    out = tmp_path / "res"
    assert run_all.main(["--out", str(out), "--only", "rl_runs", "--runs", "gsm8k_grpo:0 svamp_e:0",
                         "--model", str(model), "--python", str(fake), "--run-timeout", "60"]) == 0
    [e] = json.loads((out / "results.json").read_text())["benches"]
    assert e["status"] == "ok", e
    assert [(r["run"], r["exit"], r["steps"], r["last_score"]) for r in e["summary"]] == [
        ("gsm8k_grpo", 0, 1, 0.25), ("svamp_e", 0, 1, 0.25)]
    log = (out / "raw" / "rl_runs" / "svamp_e" / "console.log").read_text()
    assert f"actor_rollout_ref.model.path={model}" in log and "data=svamp" in log and "max_response_length=512" in log


# ------------------------------------------------------------------------------------------------ the real suite
class _Parsed(Exception):
    pass


def _parse_only(monkeypatch):
    """Make ArgumentParser.parse_args stop the script right after parsing (unknown flags still exit 2)."""
    original = argparse.ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)


def _real_cases():
    cases = []
    for bench in suite.BENCHES:
        for mode in bench.timeout_s:
            cases.append(pytest.param(bench, mode, id=f"{bench.name}-{mode}"))
    return cases


@pytest.mark.parametrize("bench,mode", _real_cases())
def test_real_commands_parse(bench, mode, tmp_path, monkeypatch):
    ctx = _ctx(tmp_path, mode=mode, model=str(tmp_path / "model"), gpus=2, gpu_memory_gib=80.0,
               installed=frozenset({"vllm", "trl"}), runs="gsm8k_grpo:0")
    commands = bench.commands(ctx, ctx.out(bench.name))
    assert bench.timeout(ctx) > 0
    for argv in commands:
        if argv[0] == "bash":
            assert os.path.exists(os.path.join(run_all.ROOT, argv[1]))
            assert subprocess.run(["bash", "-n", argv[1]], cwd=run_all.ROOT).returncode == 0
            continue
        assert argv[0] == PY
        if argv[1] == "trainer/main.py":
            _check_overrides(argv[2:])
            continue
        module = importlib.import_module(argv[1][:-3].replace("/", "."))
        _parse_only(monkeypatch)
        with pytest.raises(_Parsed):
            module.main(argv[2:])
        monkeypatch.undo()


def _check_overrides(overrides):
    from hydra import compose, initialize_config_dir

    from trainer.launch import check_overrides, resolve_config, validate

    config_dir = os.path.join(run_all.ROOT, "configs")
    check_overrides(overrides, config_dir)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        validate(resolve_config(compose(config_name="ppo_trainer", overrides=overrides)))


def test_vllm_memory_fill_follows_the_gpu(tmp_path):
    cmd = suite.BENCHES[[b.name for b in suite.BENCHES].index("vllm_memory")].commands(
        _ctx(tmp_path, model="/m", gpu_memory_gib=79.6), "o.json")[0]
    assert cmd[cmd.index("--fill-gib") + 1] == "40"


def test_vs_trl_sides_follow_what_is_installed(tmp_path):
    assert suite.vs_trl_sides(_ctx(tmp_path, installed=frozenset({"trl"}))) == "trl,ours_hf"
    assert suite.vs_trl_sides(_ctx(tmp_path, installed=frozenset({"trl", "vllm"}))) == \
        "trl,ours_hf,trl_vllm,ours_vllm"
