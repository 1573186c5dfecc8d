"""tools/bench/vs_trl.py and its parts: the sides, what each side is given (TRL's GRPOConfig, our overrides, the
environment), the TRL stage timers, the random-weight model folder, the summary/table/plot, and the --tiny run
(slow)."""
import json
import os
import sys

import pytest

from tests.e2e_utils import run_tool
from tools.bench import vs_trl, vs_trl_child, vs_trl_report
from tools.bench.common import DeviceMemorySampler

JOB = dict(model="m", data="d/train.parquet", batch=16, n=8, micro=32, response_len=256, max_prompt_len=200, lr=2e-6,
           steps=5, seed=3, device="cuda", out_dir="/tmp/w", trl_vllm_gpu_util=0.25, ours_vllm_gpu_util=0.4)


# ---------------------------------------------------------------------------------------------- sides, commands
def test_resolve_sides():
    assert vs_trl.resolve_sides(None) == ["trl", "ours_hf"]
    assert vs_trl.resolve_sides(None, trl_vllm=True, engine="vllm") == ["trl_vllm", "ours_vllm"]
    assert vs_trl.resolve_sides(None, engine="hf,vllm") == ["trl", "ours_hf", "ours_vllm"]
    assert vs_trl.resolve_sides("trl,trl_vllm,ours_hf,ours_vllm") == ["trl", "trl_vllm", "ours_hf", "ours_vllm"]
    for bad, kw in (("trl,mine", {}), ("trl,trl", {}), ("trl", {"engine": "vllm"}), (None, {"engine": "sglang"})):
        with pytest.raises(ValueError):
            vs_trl.resolve_sides(bad, **kw)


def test_side_env():
    assert vs_trl.side_env("trl", {}) == {} and vs_trl.side_env("ours_hf", {}) == {}
    assert vs_trl.side_env("ours_vllm", {}) == {"VLLM_USE_FLASHINFER_SAMPLER": "0",
                                                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env = vs_trl.side_env("trl_vllm", {"MASTER_PORT": "1234"})
    assert env["RANK"] == env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "1234"  # the caller's value wins
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_ours_command_matches_job(monkeypatch):
    cmd = vs_trl.ours_command(JOB)
    assert cmd[1].endswith("trainer/main.py")
    for o in ["data=gsm8k", "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8",
              "actor_rollout_ref.actor.ppo_mini_batch_size=16",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
              "data.max_response_length=256", "data.max_prompt_length=200", "actor_rollout_ref.actor.optim.lr=2e-06",
              "trainer.n_gpus_per_node=1", "trainer.device=cuda", "trainer.total_training_steps=5", "algorithm=grpo",
              "rollout=hf", "actor_rollout_ref.actor.use_kl_loss=false", "trainer.output_dir=/tmp/w/ours_hf"]:
        assert o in cmd, o
    assert not any("gpu_memory_utilization" in o for o in cmd)
    assert "data=synthetic" in vs_trl.ours_command(dict(JOB, data="x/train.jsonl"))
    v = vs_trl.ours_command(JOB, "vllm")
    assert "rollout=vllm" in v and "rollout=hf" not in v and "trainer.output_dir=/tmp/w/ours_vllm" in v
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.4" in v
    extra = ["actor_rollout_ref.model.torch_compile_mode=reduce-overhead", "rollout=hf"]
    assert vs_trl.ours_command(dict(JOB, ours_overrides=extra), "vllm")[-2:] == extra  # last: Hydra's value wins


def test_ours_ignore_eos_only_when_the_config_has_the_key(monkeypatch):
    job = dict(JOB, ignore_eos=True)
    has = vs_trl.ours_ignore_eos_key("hf")
    assert ("actor_rollout_ref.rollout.ignore_eos=true" in vs_trl.ours_command(job)) == has
    monkeypatch.setattr(vs_trl, "ours_ignore_eos_key", lambda engine: True)
    assert "actor_rollout_ref.rollout.ignore_eos=true" in vs_trl.ours_command(job, "vllm")
    assert "actor_rollout_ref.rollout.ignore_eos=true" not in vs_trl.ours_command(JOB, "vllm")


def test_trl_config_kwargs_transformers_and_vllm():
    kw = vs_trl_child.trl_config_kwargs(dict(JOB, trl_cache_implementation="static"))
    assert kw["per_device_train_batch_size"] == 32 and kw["gradient_accumulation_steps"] == 4
    assert kw["num_generations"] == 8 and kw["max_completion_length"] == 256 and kw["beta"] == 0.0
    assert kw["loss_type"] == "dapo" and kw["scale_rewards"] == "group" and kw["bf16"] and not kw["use_cpu"]
    assert kw["cache_implementation"] == "static" and "use_vllm" not in kw and "generation_kwargs" not in kw
    v = vs_trl_child.trl_config_kwargs(dict(JOB, use_vllm=True))
    assert v["use_vllm"] is True and v["vllm_mode"] == "colocate" and v["vllm_enable_sleep_mode"] is True
    assert v["vllm_gpu_memory_utilization"] == 0.25 and v["vllm_max_model_length"] == 456
    assert "cache_implementation" not in v
    assert vs_trl_child.trl_config_kwargs(dict(JOB, use_vllm=True, ignore_eos=True))["generation_kwargs"] == {
        "min_tokens": 256}
    assert vs_trl_child.trl_config_kwargs(dict(JOB, ignore_eos=True))["generation_kwargs"] == {"min_new_tokens": 256}
    with pytest.raises(ValueError, match="micro"):
        vs_trl_child.trl_config_kwargs(dict(JOB, micro=48))


def test_trl_config_kwargs_are_grpo_config_fields(tmp_path):
    trl = pytest.importorskip("trl")
    import dataclasses

    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    for job in (dict(JOB, device="cpu"), dict(JOB, device="cpu", use_vllm=True, ignore_eos=True)):
        kw = vs_trl_child.trl_config_kwargs(dict(job, out_dir=str(tmp_path)))
        assert set(kw) <= fields, set(kw) - fields
        cfg = trl.GRPOConfig(**kw)
        assert cfg.gradient_accumulation_steps == 4 and cfg.steps_per_generation == 4
    assert cfg.use_vllm and cfg.vllm_mode == "colocate" and cfg.vllm_enable_sleep_mode
    assert cfg.generation_kwargs == {"min_tokens": 256}


def test_project_reward_adapter():
    r = vs_trl_child.project_reward(["so #### 72", [{"role": "assistant", "content": "#### 71"}], "the answer is 3"],
                                    ground_truth=["72", "72", "3"],
                                    data_source=["openai/gsm8k", "openai/gsm8k", "synthetic/digits"])
    assert r == [1.0, 0.0, 1.0]


# ---------------------------------------------------------------------------------------------- TRL stage timers
class _Tick:
    """A fake perf_counter: each call returns the next integer second."""

    def __init__(self):
        self.t = 0

    def __call__(self):
        self.t += 1
        return float(self.t)


def test_stage_clock_subtracts_nested_stages(monkeypatch):
    monkeypatch.setattr(vs_trl_child.time, "perf_counter", _Tick())
    clock = vs_trl_child.StageClock()

    class Obj:
        def outer(self):
            return self.inner() + 1

        def inner(self):
            return 1

        def untimed(self):
            return 0
    o = Obj()
    clock.wrap(o, "inner", "inner")
    clock.wrap(o, "outer", lambda: "outer")
    assert o.outer() == 2
    # outer: push t=1, inner push t=2, pop t=3 (1 s), outer pop t=4 (3 s, 1 of them nested)
    assert clock.totals == {"inner": 1.0, "outer": 2.0}
    clock.wrap(o, "untimed", lambda: None)  # a None stage is not timed
    assert o.untimed() == 0
    assert clock.totals == {"inner": 1.0, "outer": 2.0}
    with pytest.raises(RuntimeError):
        clock.pop()


def test_instrument_maps_trl_methods_to_stages(monkeypatch):
    import torch

    monkeypatch.setattr(vs_trl_child.time, "perf_counter", _Tick())
    calls = []

    class LLM:
        def wake_up(self, tags=None):
            calls.append(("wake", tags))

        def sleep(self, level=1):
            calls.append(("sleep", level))

    class VG:
        llm = LLM()

        def sync_weights(self):
            self.llm.wake_up(["weights"])

    class FakeTrainer:
        ref_model = object()
        vllm_generation = VG()
        model = object()

        def _generate_single_turn(self, prompt_ids, *a):
            self.vllm_generation.sync_weights()
            self.vllm_generation.llm.wake_up(["kv_cache"])
            self.vllm_generation.llm.sleep(2)
            return [[5] * 3 for _ in prompt_ids], None

        def _calculate_rewards(self, *a):
            return [0.0]

        def _get_per_token_logps_and_entropies(self, model, *a, **k):
            return None

        def _generate_and_score_completions(self, prompts):
            self._generate_single_turn(prompts)
            self._calculate_rewards()
            with torch.no_grad():
                self._get_per_token_logps_and_entropies(self.model)
                self._get_per_token_logps_and_entropies(self.ref_model)

        def training_step(self, prompts):
            self._generate_and_score_completions(prompts)
            self._get_per_token_logps_and_entropies(self.model)  # with gradients: the loss, part of "update"

    tr = FakeTrainer()
    clock, counts = vs_trl_child.StageClock(), {"prompt_tokens": 0, "gen_tokens": 0, "rows": 0}
    vs_trl_child._instrument(tr, clock, counts)
    tr.training_step([[1, 2], [1, 2, 3, 4]])
    assert counts == {"prompt_tokens": 6, "gen_tokens": 6, "rows": 2}
    assert set(clock.totals) == {"update", "adv", "gen", "weight_sync", "wake_up", "sleep", "reward",
                                 "old_log_prob", "ref"}
    assert all(v > 0 for v in clock.totals.values())
    assert [c[0] for c in calls] == ["wake", "wake", "sleep"]


# ---------------------------------------------------------------------------------------------- random model
def test_random_model_folder_loads_with_from_pretrained(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tools.bench.random_model import build_random_model
    from trainer import embedded

    tok_dir = str(tmp_path / "tok")
    tok = embedded.build_tokenizer(tok_dir)
    out = str(tmp_path / "rand")
    rec = build_random_model("tiny", tok_dir, out, seed=2)
    assert rec["reused"] is False and rec["vocab_size"] == len(tok) and rec["config"] == "tiny"
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.vocab_size == len(tok) and cfg.eos_token_id == tok.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert sum(p.numel() for p in model.parameters()) == rec["parameters"]
    assert len(AutoTokenizer.from_pretrained(out)) == len(tok)
    assert build_random_model("tiny", tok_dir, out, seed=2)["reused"] is True
    assert build_random_model("tiny", tok_dir, out, seed=3)["reused"] is False  # another seed: rebuilt
    with pytest.raises(ValueError, match="qwen2-1.5b"):
        build_random_model("gpt5", tok_dir, out)


def test_random_config_aliases():
    from tools.bench.random_model import config_name

    assert config_name("smollm2") == "smollm2-135m" and config_name("qwen2-1.5b") == "qwen2-1.5b"


# ---------------------------------------------------------------------------------------------- summary, report
def _metrics(step_s, gen=2.0, upd=1.0):
    return {"timing_s/step": step_s, "timing_s/gen": gen, "timing_s/old_log_prob": 0.5, "timing_s/reward": 0.1,
            "timing_s/adv": 0.01, "timing_s/update_actor": upd, "timing_s/testing": 9.0,
            "response_length/mean": 100.0, "prompt_length/mean": 50.0, "critic/score/mean": 0.25,
            "perf/max_memory_allocated_gb/gen": 3.0, "perf/max_memory_allocated_gb/update_actor": 5.0,
            "perf/max_memory_reserved_gb/update_actor": 6.0}


def test_ours_steps_from_metrics():
    steps = vs_trl_report.ours_steps([{"val/x": 1}, _metrics(10.0), _metrics(4.0)], rows=8)
    assert len(steps) == 2
    s = steps[1]
    assert s["step_s"] == 4.0 and s["gen_tokens"] == 800.0 and s["prompt_tokens"] == 400.0 and s["rows"] == 8
    assert s["split_s"] == {"gen": 2.0, "old_log_prob": 0.5, "reward": 0.1, "adv": 0.01, "update": 1.0}
    assert s["peak_torch_allocated_gib"] == 5.0 and s["peak_torch_reserved_gib"] == 6.0 and s["reward"] == 0.25


def test_summarize_leaves_out_first_step_and_splits():
    steps = vs_trl_report.ours_steps([_metrics(10.0), _metrics(4.0, gen=2.0), _metrics(6.0, gen=4.0)], rows=8)
    r = vs_trl_report.summarize("ours_hf", steps, 8, 30.0)
    assert r["mean_step_s"] == 5.0 and r["samples_per_s"] == pytest.approx(8 / 5) and r["first_step_s"] == 10.0
    assert r["timed_steps"] == 2 and r["steps"] == 3 and r["rows_per_step"] == 8
    assert r["gen_tokens_per_s"] == pytest.approx(800 / 5) and r["trained_tokens_per_s"] == pytest.approx(1200 / 5)
    assert r["response_len_mean"] == 100.0
    assert r["split_s"]["gen"] == 3.0 and r["split_s"]["other"] == pytest.approx(5.0 - (3.0 + 0.5 + 0.1 + 0.01 + 1))
    one = vs_trl_report.summarize("x", steps[:1], 8, 1.0)
    assert one["timed_steps"] == 1 and one["mean_step_s"] == 10.0
    with pytest.raises(ValueError, match="no step records"):
        vs_trl_report.summarize("x", [], 8, 1.0)


def test_update_mfu_matches_compute_mfu():
    from tools.bench.common import hf_config
    from trainer.metric_utils import compute_mfu

    cfg = hf_config("qwen2-1.5b")
    row = dict(split_s={"update": 2.0}, trained_tokens_per_step=8 * 150.0, rows_per_step=8)
    assert vs_trl_report.update_mfu(cfg, row) == pytest.approx(compute_mfu(cfg, 1200, [150] * 8, 2.0, 1, 989e12))
    assert vs_trl_report.update_mfu(cfg, dict(row, split_s={})) is None


def _doc():
    trl_steps = [dict(step_s=s, gen_tokens=1000, prompt_tokens=500, rows=8,
                      split_s={"gen": s / 2, "weight_sync": 0.1, "wake_up": 0.05, "sleep": 0.05,
                               "old_log_prob": 0.2, "update": s / 4}) for s in (9.0, 4.0, 4.0)]
    trl = dict(vs_trl_report.summarize("trl_vllm", trl_steps, 8, 50.0), framework="trl", engine="vllm",
               peak_gpu_used_gib=40.0, update_mfu=0.2)
    ours = dict(vs_trl_report.summarize("ours_hf", vs_trl_report.ours_steps(
        [_metrics(9.0), _metrics(2.0), _metrics(2.0)], 8), 8, 60.0), framework="ours", engine="hf",
        peak_gpu_used_gib=20.0, update_mfu=None)
    failed = dict(side="ours_vllm", framework="ours", engine="vllm", error="trainer/main.py exited 1; log x")
    return dict(job=dict(model="/tmp/smol_hf", batch=1, n=8, response_len=256), results=[trl, ours, failed])


def test_ratios_markdown_and_plot(tmp_path):
    doc = _doc()
    doc["ratios"] = vs_trl_report.ratios(doc["results"])
    assert doc["ratios"] == {"ours_hf/trl_vllm": pytest.approx(2.0)}
    md = vs_trl_report.markdown(doc)
    assert "| trl_vllm | vllm | 2 |" in md and "| ours_vllm | vllm | failed: trainer/main.py exited 1" in md
    assert "| side | gen | weight_sync | wake_up | sleep | old_log_prob | reward | adv | update | other |" in md
    assert "ours_hf/trl_vllm samples/s: **2.00x**" in md and "20.0%" in md
    pytest.importorskip("matplotlib")
    png = vs_trl_report.plot_split(doc, str(tmp_path / "split.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_from_json_writes_table_and_plot(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(_doc()))
    out = tmp_path / "again.json"
    vs_trl.main(["--report-from", str(src), "--out", str(out)])
    assert json.loads(out.read_text())["ratios"] == {"ours_hf/trl_vllm": pytest.approx(2.0)}
    assert "ours_hf" in (tmp_path / "again.md").read_text()


# ---------------------------------------------------------------------------------------------- process, memory
def test_run_stops_a_side_at_its_timeout(tmp_path, monkeypatch):
    import time

    log = str(tmp_path / "side.log")
    monkeypatch.setattr(vs_trl, "SIGINT_GRACE_S", 0.5)  # (15 s in a real run)
    # a side that ignores SIGINT is killed once the grace after SIGINT is over
    hang = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1 s"):
        vs_trl._run([sys.executable, "-c", hang], log, 1)
    assert time.monotonic() - t0 < 30
    with pytest.raises(RuntimeError, match="exited 3"):
        vs_trl._run([sys.executable, "-c", "raise SystemExit(3)"], log, 30)
    assert vs_trl._run([sys.executable, "-c", "import os; print(os.environ['X_SIDE'])"], log, 30,
                       {"X_SIDE": "v"}) > 0
    assert open(log).read().strip() == "v"


def test_memory_sampler_without_a_gpu_tool_reports_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with DeviceMemorySampler() as m:
        pass
    assert m.source is None and m.peak_gib is None and m.baseline_gib is None


def test_memory_sampler_keeps_the_peak(monkeypatch):
    import time

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr("shutil.which", lambda name: None)
    m = DeviceMemorySampler(interval_s=0.005)
    values = iter([1.0, 5.0, 3.0] + [2.0] * 10000)
    m._read = lambda: next(values)
    with m:
        time.sleep(0.2)
    assert m.baseline_gib == 1.0 and m.peak_gib == 5.0


# ---------------------------------------------------------------------------------------------- CLI
def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        vs_trl.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--trl-cache-implementation" in out and "--sides" in out and "--random-config" in out


@pytest.mark.parametrize("argv,msg", [
    (["--sides", "trl,nope"], "--sides"),
    (["--sides", "ours_hf", "--engine", "vllm"], "not both"),
    (["--sides", "ours_hf", "--micro", "48"], "must divide"),
    (["--sides", "ours_hf", "--vllm-gpu-util", "1.5"], "--vllm-gpu-util"),
    (["--sides", "ours_vllm", "--device", "cpu"], "vllm"),
    (["--sides", "ours_hf", "--random-config", "gpt5"], "--random-config"),
    (["--sides", "ours_hf", "--ours-override", "trainer.seed"], "KEY=VALUE"),
])
def test_bad_input_is_refused_before_any_side(tmp_path, argv, msg):
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=msg):
        vs_trl.main(argv + ["--model", str(model), "--data", str(data), "--out", str(tmp_path / "o.json")])
    assert not (tmp_path / "o.json").exists()


@pytest.mark.slow
def test_tiny_both_frameworks_random_config(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "vt.json"
    doc = run_tool("tools/bench/vs_trl.py", "--tiny", "--random-config", "tiny", "--response-len", "6",
                   out=str(out), timeout=900)
    trl, ours = doc["results"]
    assert trl["side"] == "trl" and ours["side"] == "ours_hf" and trl["steps"] == ours["steps"] == 3
    assert doc["ratios"]["ours_hf/trl"] == pytest.approx(ours["samples_per_s"] / trl["samples_per_s"])
    assert trl["samples_per_s"] == pytest.approx(16 / trl["mean_step_s"])
    assert trl["response_len_mean"] == 6.0  # min_new_tokens: every TRL response has the full length
    assert 0 < ours["response_len_mean"] <= 6.0
    for r in (trl, ours):
        assert {"gen", "update", "other"} <= set(r["split_s"]) and r["gen_tokens_per_s"] > 0
    assert doc["job"]["random_model"]["config"] == "tiny" and os.path.exists(str(out)[:-5] + ".md")


def test_budget_leaves_sides_unstarted_and_says_so(tmp_path):
    from tools.bench.random_model import build_random_model
    from trainer import embedded

    embedded.build_tokenizer(str(tmp_path / "tok"))
    build_random_model("tiny", str(tmp_path / "tok"), str(tmp_path / "m"))
    train, _ = embedded.write_task(str(tmp_path / "data"), train_rows=8, val_rows=1)
    out = tmp_path / "o.json"
    doc = vs_trl.main(["--model", str(tmp_path / "m"), "--data", train, "--sides", "ours_hf", "--budget-s", "5",
                       "--device", "cpu", "--out", str(out)])
    (row,) = doc["results"]
    assert row["side"] == "ours_hf" and row["error"].startswith("not run:") and "of --budget-s 5" in row["error"]
    assert json.loads(out.read_text())["results"][0]["error"].startswith("not run")


def test_a_side_stopped_in_shut_down_after_its_last_step_keeps_its_steps(tmp_path, monkeypatch):
    """A process that wrote every step and then outlived its time limit (slow shut-down) still counts, with a note;
    one that had not written them is a failed side."""
    import sys

    from tools.bench.vs_trl import SideTimeout, _run_finished

    monkeypatch.setattr(vs_trl, "SIGINT_GRACE_S", 0.5)  # (15 s in a real run; a test may run with SIGINT ignored)
    cmd = [sys.executable, "-c", "import time; print('steps done', flush=True); time.sleep(60)"]
    wall, note = _run_finished(cmd, str(tmp_path / "a.log"), 1, None, lambda: True)
    assert wall == 1.0 and "shutting down" in note
    with pytest.raises(SideTimeout, match="timed out after 1 s"):
        _run_finished(cmd, str(tmp_path / "b.log"), 1, None, lambda: False)
    assert _run_finished([sys.executable, "-c", "pass"], str(tmp_path / "c.log"), 30, None, lambda: False)[1] is None
