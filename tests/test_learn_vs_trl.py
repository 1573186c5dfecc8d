"""tools/bench/learn_vs_trl.py and its parts: the 700/300 row split, the wall-clock marks (trainer.hf_exports, the
TRL callback with a fake trainer state), ours' command against the config, the TRL config and reward, the runner
that stops a side at its last mark, the evaluator on a tiny random model with a fake checkpoint schedule, the
report/plot from synthetic results and the merge of the files of several calls or GPU sessions."""
import json
import os
import sys

import pytest

from tools.bench import learn_eval, learn_report, learn_vs_trl, learn_vs_trl_child
from trainer import hf_exports


class _Clock:
    """A fake epoch clock: ``now`` seconds, set by the test."""

    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


# ---------------------------------------------------------------------------------------------- the row split
def _svamp_source(folder, rows=1000):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "test.jsonl"), "w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps({"Body": f"Tom has {i} apples.", "Question": f"How many after {i}?",
                                "Answer": float(i), "Equation": f"( {i} + 0 )"}) + "\n")


def test_split_is_first_700_train_last_300_held_out(tmp_path):
    from tools.data_preprocess import svamp

    _svamp_source(tmp_path / "src")
    assert svamp.convert(str(tmp_path / "src"), str(tmp_path / "out")) == {"train": 700, "test": 300}
    train, test = str(tmp_path / "out" / "train.parquet"), str(tmp_path / "out" / "test.parquet")
    assert learn_vs_trl.check_split(train, test) == {"train_rows": 700, "test_rows": 300, "shared_questions": 0}
    qa, qb = learn_vs_trl._questions(train), learn_vs_trl._questions(test)
    assert qa[0].startswith("Tom has 0 apples.") and qa[-1].startswith("Tom has 699 apples.")
    assert qb[0].startswith("Tom has 700 apples.") and qb[-1].startswith("Tom has 999 apples.")
    with pytest.raises(ValueError, match="repeats 700 questions"):
        learn_vs_trl.check_split(train, train)
    with pytest.raises(ValueError, match="expected 700 / 200"):
        learn_vs_trl.check_split(train, test, (700, 200))
    assert learn_vs_trl.check_split(train, test, None)["test_rows"] == 300


def test_marks_divide_the_budget():
    assert learn_vs_trl.marks(720, 120) == [120.0, 240.0, 360.0, 480.0, 600.0, 720.0]
    for budget, every in ((100, 30), (60, 120), (60, 0)):
        with pytest.raises(ValueError, match="--every-s"):
            learn_vs_trl.marks(budget, every)


# ---------------------------------------------------------------------------------------------- wall-clock marks
def test_wall_clock_marks_take_each_mark_once_and_skip_passed_ones():
    clock = _Clock(1000.0)
    m = hf_exports.WallClockMarks(60, start=1000.0, clock=clock)
    for now, due in ((1059.9, None), (1060.0, 60.0), (1100.0, 60.0)):
        clock.now = now
        assert m.due() == due
    m.take(60.0)
    clock.now = 1119.0
    assert m.due() is None
    clock.now = 1250.0  # one long step passed 120 and 180: one export, named after the last mark passed
    assert m.due() == 240.0 and m.elapsed() == 250.0
    m.take(240.0)
    clock.now = 1299.0
    assert m.due() is None
    with pytest.raises(ValueError, match="every_s"):
        hf_exports.WallClockMarks(0)


def test_marks_default_to_the_process_start():
    import time

    m = hf_exports.WallClockMarks(10)
    assert 0 < m.elapsed() < 24 * 3600 and m.start <= time.time()  # this process started before now
    assert abs(m.start - hf_exports.process_start_time()) < 1e-6


def test_timed_exports_from_config_and_manifest(tmp_path):
    assert hf_exports.TimedHFExports.from_config({"export_hf_freq_s": -1, "output_dir": "x"}) is None
    assert hf_exports.TimedHFExports.from_config({"output_dir": "x"}) is None
    ex = hf_exports.TimedHFExports.from_config({"export_hf_freq_s": 30, "output_dir": str(tmp_path)})
    clock = _Clock()
    ex.marks = hf_exports.WallClockMarks(30, start=0.0, clock=clock)
    made = []
    clock.now = 29.0
    assert not ex.due() and ex.export(made.append, 1) is None
    clock.now = 31.5
    entry = ex.export(made.append, 4)
    assert made == [str(tmp_path / "hf_exports" / "t000030s")]
    assert entry["mark_s"] == 30.0 and entry["elapsed_s"] == 31.5 and entry["global_step"] == 4
    clock.now = 95.0
    ex.export(made.append, 9)
    got = hf_exports.read_entries(str(tmp_path / "hf_exports"))
    assert [(e["mark_s"], e["global_step"]) for e in got] == [(30.0, 4), (90.0, 9)]
    with open(tmp_path / "hf_exports" / "exports.jsonl", "a") as f:
        f.write('{"mark_s": 1')  # a line cut short by a killed process
    assert len(hf_exports.read_entries(str(tmp_path / "hf_exports"))) == 2


def test_a_resumed_runs_timed_exports_continue_after_the_earlier_marks_and_write_over_no_export(tmp_path):
    root = tmp_path / "hf_exports"

    def write(folder):
        os.makedirs(folder)
        (tmp_path / "hf_exports" / os.path.basename(folder) / "model.safetensors").write_text(folder)

    first = hf_exports.TimedHFExports(hf_exports.WallClockMarks(20, start=0.0, clock=_Clock(21.0)), str(root))
    first.export(write, 1)
    os.makedirs(root / "t000040s")  # an export of the earlier process whose line was never written
    clock = _Clock(22.0)  # the resumed process counts from its own start
    resumed = hf_exports.TimedHFExports(hf_exports.WallClockMarks(20, start=0.0, clock=clock), str(root))
    entry = resumed.export(write, 3)
    clock.now = 41.0
    resumed.export(write, 4)
    assert (root / "t000020s" / "model.safetensors").read_text() == str(root / "t000020s")  # the step 1 export
    got = [(e["mark_s"], e["global_step"], os.path.basename(e["path"])) for e in hf_exports.read_entries(str(root))]
    assert got == [(20.0, 1, "t000020s"), (60.0, 3, "t000060s"), (80.0, 4, "t000080s")] and entry["mark_s"] == 60.0
    assert hf_exports.export_dir(str(root), 1.5).endswith("t000001.500s")  # marks of a fraction of a second differ


def test_export_hf_freq_s_is_checked_before_start_up():
    from hydra import compose, initialize_config_dir

    from trainer.config_checks import ConfigError
    from trainer.config_validate import validate
    from trainer.launch import resolve_config
    from trainer.overrides import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=["++trainer.export_hf_freq_s=abc"]))
        validate(resolve_config(compose(config_name="ppo_trainer", overrides=["trainer.export_hf_freq_s=120"])))
    with pytest.raises(ConfigError, match="trainer.export_hf_freq_s='abc'; expected a number"):
        validate(cfg)


def _trainer_state(step):
    from transformers import TrainerControl, TrainerState

    st = TrainerState()
    st.global_step = step
    return st, TrainerControl()


def test_trl_callback_saves_at_wall_clock_marks_and_stops_after_the_last(tmp_path):
    clock = _Clock(500.0)
    marks = hf_exports.WallClockMarks(60, start=500.0, clock=clock)
    saved = []

    def save(model, tok, path):
        os.makedirs(path)
        saved.append((model, tok, os.path.basename(path)))
    root = str(tmp_path / "hf_exports")
    cb = learn_vs_trl_child.wall_clock_saver(marks, root, final_mark_s=240, save=save)
    for now, step in ((530, 1), (565, 2), (590, 3), (700, 4), (745, 5)):
        clock.now = now
        state, control = _trainer_state(step)
        out = cb.on_step_end(None, state, control, model="M", processing_class="T")
        assert out.should_training_stop == (step == 5)
    assert saved == [("M", "T", "t000060s"), ("M", "T", "t000180s"), ("M", "T", "t000240s")]
    entries = hf_exports.read_entries(root)
    assert [(e["mark_s"], e["elapsed_s"], e["global_step"]) for e in entries] == [
        (60.0, 65.0, 2), (180.0, 200.0, 4), (240.0, 245.0, 5)]
    assert entries[0]["path"] == os.path.join(root, "t000060s")


def test_trl_callback_default_save_writes_a_loadable_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = _tiny_model()
    marks = hf_exports.WallClockMarks(1, start=0.0, clock=_Clock(1.0))
    cb = learn_vs_trl_child.wall_clock_saver(marks, str(tmp_path), final_mark_s=1)
    state, control = _trainer_state(1)
    assert cb.on_step_end(None, state, control, model=model, processing_class=tok).should_training_stop
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "t000001s")).config.hidden_size == 64


# ---------------------------------------------------------------------------------------------- what each side gets
JOB = dict(model="/m", train="/d/train.parquet", test="/d/test.parquet", batch=32, n=8, micro=64, response_len=256,
           max_prompt_len=256, lr=5e-5, kl_coef=0.001, format_score=0.1, budget_s=720.0, every_s=120,
           device="cuda", cpus=4, max_steps=1000, ours_engine="hf", ours_vllm_gpu_util=0.3, trl_vllm_gpu_util=0.3,
           trl_vllm_sleep=False, ours_overrides=[], seed=1, out_dir="/tmp/w")


def test_ours_command_keys_exist_and_validate():
    from hydra import compose, initialize_config_dir

    from trainer.launch import check_overrides, resolve_config, validate
    from trainer.overrides import CONFIG_DIR

    cmd = learn_vs_trl.ours_command(JOB, 2, "/tmp/w/ours_s2")
    assert cmd[1].endswith("trainer/main.py")
    for o in ("reward=format", "rollout=hf", "data=svamp", "trainer.export_hf_freq_s=120", "trainer.seed=2",
              "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
              "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.optim.lr=5e-05",
              "reward_model.scorer_kwargs.format_score=0.1", "trainer.output_dir=/tmp/w/ours_s2"):
        assert o in cmd, o
    overrides = cmd[2:]
    check_overrides(overrides, CONFIG_DIR)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=overrides))
    validate(cfg)
    assert cfg["reward_model"]["scorer"] == "format_gsm8k" and cfg["trainer"]["export_hf_freq_s"] == 120
    v = learn_vs_trl.ours_command(dict(JOB, ours_engine="vllm", kl_coef=0.0), 1, "/o")
    assert "rollout=vllm" in v and "actor_rollout_ref.rollout.gpu_memory_utilization=0.3" in v
    assert "actor_rollout_ref.actor.use_kl_loss=false" in v


def test_format_reward_is_the_project_scorer():
    fn = learn_vs_trl_child.make_format_reward(0.1)
    assert fn.__name__ == "format_reward"  # TRL names its reward columns after it
    got = fn(["so #### 5", [{"role": "assistant", "content": "#### 4"}], "five"], ground_truth=["5", "5", "5"],
             data_source=["svamp"] * 3)
    assert got == [1.0, 0.1, 0.0]


def test_learn_config_kwargs():
    kw = learn_vs_trl_child.learn_config_kwargs(JOB)
    assert kw["use_vllm"] and kw["vllm_mode"] == "colocate" and kw["vllm_enable_sleep_mode"] is False
    assert kw["beta"] == 0.001 and kw["gradient_checkpointing"] is False
    assert kw["vllm_importance_sampling_correction"] is False and kw["max_steps"] == 1000
    assert kw["gradient_accumulation_steps"] == 4 and kw["per_device_train_batch_size"] == 64
    assert kw["learning_rate"] == 5e-5 and kw["lr_scheduler_type"] == "constant" and kw["num_generations"] == 8
    assert kw["vllm_max_model_length"] == 512 and "generation_kwargs" not in kw
    cpu = learn_vs_trl_child.learn_config_kwargs(dict(JOB, device="cpu"))
    assert not cpu.get("use_vllm") and "vllm_importance_sampling_correction" not in cpu


def test_learn_config_kwargs_are_grpo_config_fields(tmp_path):
    trl = pytest.importorskip("trl", reason="TRL is not installed here (the GPU machine has trl 1.16)")
    import dataclasses

    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    kw = learn_vs_trl_child.learn_config_kwargs(dict(JOB, out_dir=str(tmp_path)))
    assert set(kw) <= fields, set(kw) - fields
    cfg = trl.GRPOConfig(**dict(kw, bf16=False, use_cpu=True))  # this machine has no GPU
    assert cfg.steps_per_generation == 4 and cfg.generation_batch_size == 256 and cfg.beta == 0.001


# ---------------------------------------------------------------------------------------------- the runner
_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from trainer.hf_exports import append_entry
for mark in (1, 2):
    time.sleep(0.3)
    append_entry({exports!r}, dict(mark_s=float(mark), elapsed_s=mark + 0.1, global_step=mark, path="p", export_s=0))
time.sleep(600)
"""


def test_runner_stops_a_side_once_its_last_mark_is_saved(tmp_path):
    root = str(tmp_path / "hf_exports")
    code = _CHILD.format(root=learn_vs_trl.ROOT, exports=root)
    res = learn_vs_trl.run_until_final_mark([sys.executable, "-c", code], str(tmp_path / "a.log"), {}, root, 2.0,
                                            limit_s=120, poll_s=0.1)
    assert res["stop"] == "last mark saved" and res["wall_s"] < 60 and res["rc"] is not None
    res = learn_vs_trl.run_until_final_mark([sys.executable, "-c", "import time; time.sleep(600)"],
                                            str(tmp_path / "b.log"), {}, str(tmp_path / "none"), 2.0, limit_s=1,
                                            poll_s=0.1)
    assert res["stop"] == "time limit" and res["rc"] is not None


# ---------------------------------------------------------------------------------------------- the evaluator
def _tiny_model(seed=1):
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import embedded

    tok = embedded.build_tokenizer()
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(embedded.tiny_model_config(len(tok))), tok


def test_score_texts_strict_accuracy_and_format():
    got = learn_eval.score_texts(["#### 3", "#### 4", "3", "x #### 3.0"], ["3", "3", "3", "3"])
    assert got == {"n": 4, "acc": 0.5, "format": 0.75, "score": (1 + 0.1 + 0 + 1) / 4, "top_answer": "3",
                   "top_answer_share": 0.5, "distinct_answers": 2, "multi_marker": 0.0, "acc_beyond_top": None}


def test_evaluator_scores_a_fake_checkpoint_schedule_on_a_tiny_model(tmp_path):
    from trainer import embedded

    base_model, tok = _tiny_model(1)
    base = str(tmp_path / "base")
    base_model.save_pretrained(base)
    tok.save_pretrained(base)
    same = str(tmp_path / "run" / "t000060s")
    base_model.save_pretrained(same)  # the schedule's first mark: weights unchanged
    other = str(tmp_path / "run" / "t000120s")
    _tiny_model(7)[0].save_pretrained(other)
    data, _ = embedded.write_task(str(tmp_path / "data"), train_rows=6, val_rows=2)
    job = dict(model=base, engine="hf", max_new_tokens=4, max_prompt_len=32, format_score=0.1,
               sets={"svamp": {"path": data, "max_rows": 5}},
               checkpoints={"base": base, "ours_s1_t000060": same, "ours_s1_t000120": other,
                            "ours_s1_t000180": str(tmp_path / "missing")},
               plan=[["base", "svamp"], ["ours_s1_t000060", "svamp"], ["ours_s1_t000120", "svamp"],
                     ["ours_s1_t000180", "svamp"]], out=str(tmp_path / "eval.json"))
    doc = learn_eval.evaluate(job)
    assert doc["engine"] == "hf"
    r = doc["results"]
    assert set(r) == {"base", "ours_s1_t000060", "ours_s1_t000120"}
    for res in (v["svamp"] for v in r.values()):
        assert res["n"] == 5 and 0 <= res["acc"] <= res["format"] <= 1 and 0 < res["response_tokens"] <= 4
    assert r["base"]["svamp"]["samples"] == r["ours_s1_t000060"]["svamp"]["samples"]  # same weights, same answers
    assert "FileNotFoundError" in doc["errors"]["ours_s1_t000180/svamp"]
    with open(job["out"]) as f:
        assert json.load(f)["results"].keys() == r.keys()


def test_eval_job_plan_orders_marks_and_adds_gsm8k_before_after():
    doc = _synthetic_doc()
    doc["job"]["gsm8k"] = "/d/gsm8k.parquet"

    class A:
        eval_engine, eval_gpu_util, eval_max_prompt_len = "auto", 0.5, 1024
    ej = learn_vs_trl.eval_job(doc, "/w", A)
    assert ej["plan"][:2] == [["base", "svamp"], ["base", "gsm8k"]]
    svamp = [c for c, s in ej["plan"][2:] if s == "svamp"]
    assert svamp[:4] == ["ours_s1_t000120", "ours_s2_t000120", "trl_s1_t000120", "trl_s2_t000120"]
    assert [c for c, s in ej["plan"][2:] if s == "gsm8k"] == ["trl_s1_t000360", "ours_s1_t000360",
                                                             "trl_s2_t000360", "ours_s2_t000360"]
    assert ej["checkpoints"]["trl_s2_t000240"] == "/w/trl_s2/t000240s"


# ---------------------------------------------------------------------------------------------- report and plot
def _synthetic_doc(trl_acc=(0.02, 0.04, 0.06), ours_acc=(0.05, 0.06, 0.07)):
    runs, results = [], {"base": {"svamp": dict(acc=0.01, format=0.2, n=300), "gsm8k": dict(acc=0.02, format=0.3,
                                                                                              n=1319)}}
    for seed in (1, 2):
        for side, accs in (("trl", trl_acc), ("ours", ours_acc)):
            ex = []
            for k, acc in enumerate(accs):
                mark = 120.0 * (k + 1)
                ex.append(dict(mark_s=mark, elapsed_s=mark + 3, global_step=5 * (k + 1),
                               path=f"/w/{side}_s{seed}/t{int(mark):06d}s", export_s=1.0))
                results[learn_report.ckpt_id(side, seed, mark)] = {
                    "svamp": dict(acc=acc + 0.01 * (seed - 1), format=0.5 + 0.1 * k, n=300)}
            results[learn_report.ckpt_id(side, seed, 360.0)]["gsm8k"] = dict(acc=0.03, format=0.6, n=1319)
            runs.append(dict(side=side, seed=seed, exports=ex, stop="last mark saved", wall_s=380.0))
    job = dict(marks_s=[120.0, 240.0, 360.0], seeds=[1, 2], batch=32, n=8, lr=5e-5, response_len=256,
               budget_s=360.0, test_rows=300, model="/m", test="/d/test.parquet", format_score=0.1)
    return dict(job=job, runs=runs, eval=dict(engine="vllm", results=results, errors={}))


def test_mark_table_and_targets():
    rows = learn_report.mark_table(_synthetic_doc())
    assert [r["mark_s"] for r in rows] == [0.0, 120.0, 240.0, 360.0]
    assert rows[0]["trl"]["acc"]["mean"] == rows[0]["ours"]["acc"]["mean"] == 0.01
    r = rows[1]
    assert r["trl"]["acc"]["values"] == [0.02, 0.03] and r["trl"]["acc"]["spread"] == pytest.approx(0.005)
    assert r["ours"]["acc"]["mean"] == pytest.approx(0.055) and r["ok"]
    tg = learn_report.targets(rows)
    assert tg["every_mark"] and tg["marks_checked"] == 3
    assert tg["trl_best_mark_s"] == 360.0 and tg["ours_reaches_trl_best_at_s"] == 240.0
    assert tg["half_time"] is False  # 240 s > 360 s / 2
    fast = learn_report.targets(learn_report.mark_table(_synthetic_doc(ours_acc=(0.08, 0.08, 0.09))))
    assert fast["half_time"] and fast["ours_reaches_trl_best_at_s"] == 120.0
    slow = learn_report.targets(learn_report.mark_table(_synthetic_doc(ours_acc=(0.05, 0.02, 0.07))))
    assert not slow["every_mark"] and slow["marks_failed"] == [240.0]


def test_run_values_fall_back_to_the_last_earlier_checkpoint_or_the_base():
    doc = _synthetic_doc()
    run = dict(doc["runs"][0], exports=[e for e in doc["runs"][0]["exports"] if e["mark_s"] == 240.0])
    got = learn_report.run_values(run, doc["eval"]["results"], [120.0, 240.0, 360.0])
    assert got[120.0]["acc"] == 0.01 and got[240.0]["acc"] == 0.04 and got[360.0]["acc"] == 0.04


def test_report_from_synthetic_json_writes_table_and_plot(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(_synthetic_doc()))
    out = str(tmp_path / "learn.json")
    learn_vs_trl.main(["--report-from", str(src), "--out", out])
    text = (tmp_path / "learn.md").read_text()
    assert "| 2 | 2.50 (2.00/3.00) | 5.50 (5.00/6.00) |" in text
    assert "At every mark ours >= TRL - spread: **met**" in text and "half-time target **not met**" in text
    assert "| base | 2.00 | 30.00 | 1319 |" in text and "| trl seed 1, 6 min (step 15) | 3.00 |" in text
    with open(out) as f:
        assert json.load(f)["targets"]["every_mark"] is True
    pytest.importorskip("matplotlib")
    assert (tmp_path / "learn.png").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("argv,msg", [
    (["--every-s", "70", "--budget-s", "100"], "--every-s 70 must be > 0 and divide --budget-s 100"),
    (["--sides", "trl,mine"], "--sides 'trl,mine'"),
    (["--seeds", "1,x"], "--seeds '1,x'"),
    (["--micro", "7"], "--micro (7) must divide batch*n (256)"),
])
def test_bad_input_is_refused_before_any_run(tmp_path, argv, msg, capsys):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "t.parquet").write_text("")
    base = ["--model", str(model), "--train", str(tmp_path / "t.parquet"), "--test", str(tmp_path / "t.parquet"),
            "--sides", "ours", "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit) as info:
        learn_vs_trl.main(base + argv)
    assert msg in str(info.value)


@pytest.mark.slow
@pytest.mark.bench
def test_ours_side_on_the_cpu_saves_at_its_marks_and_is_scored(tmp_path):
    """The whole tool with ours alone (the embedded tiny model, CPU): trainer.export_hf_freq_s writes the marks, the
    runner stops the trainer after the last one, the evaluator scores the base model and each checkpoint."""
    from trainer import embedded

    model, tok = _tiny_model()
    base = str(tmp_path / "base")
    model.save_pretrained(base)
    tok.save_pretrained(base)
    train, _ = embedded.write_task(str(tmp_path / "data"), train_rows=64, val_rows=2)
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in embedded.make_rows(4, 5, min_digits=3, max_digits=3)))
    out = str(tmp_path / "learn.json")
    doc = learn_vs_trl.main(["--model", base, "--train", train, "--test", str(held), "--expect-rows", "none",
                             "--gsm8k", str(held), "--sides", "ours", "--seeds", "1", "--budget-s", "30",
                             "--every-s", "15", "--batch", "4", "--n", "2", "--micro", "8", "--response-len", "4",
                             "--max-prompt-len", "32", "--device", "cpu", "--out", out])
    run = doc["runs"][0]
    assert run["stop"] == "last mark saved" and not run.get("error"), run
    assert [e["mark_s"] for e in run["exports"]][-1] == 30.0 and run["exports"][-1]["global_step"] >= 1
    sig = run["signal"]  # the training metrics the trainer logged, per save
    assert [x["mark_s"] for x in sig] == [e["mark_s"] for e in run["exports"]]
    assert sum(x["steps"] for x in sig) == run["exports"][-1]["global_step"]
    assert all(k in sig[0] for k in ("reward", "frac_reward_zero_std", "entropy", "response_length")), sig[0]
    res = doc["eval"]["results"]
    assert res["base"]["svamp"]["n"] == 4 and res["base"]["gsm8k"]["n"] == 4
    assert "gsm8k" in res["ours_s1_t000030"] and not doc["eval"]["errors"]
    assert (tmp_path / "learn.md").exists()


def test_merge_docs_joins_runs_of_calls_with_the_same_job(tmp_path):
    full = _synthetic_doc()
    paths = []
    for side, seed in (("trl", 1), ("ours", 1), ("ours", 2)):
        d = dict(full, runs=[r for r in full["runs"] if (r["side"], r["seed"]) == (side, seed)],
                 job=dict(full["job"], seeds=[seed], sides=[side]))
        paths.append(str(tmp_path / f"{side}{seed}.json"))
        with open(paths[-1], "w") as f:
            json.dump(d, f)
    doc = learn_vs_trl.merge_docs(paths)
    assert [(r["side"], r["seed"]) for r in doc["runs"]] == [("trl", 1), ("ours", 1), ("ours", 2)]
    assert doc["job"]["seeds"] == [1, 2] and doc["job"]["sides"] == ["trl", "ours"] and "eval" not in doc
    other = dict(full, job=dict(full["job"], lr=1e-4))
    with open(tmp_path / "other.json", "w") as f:
        json.dump(other, f)
    with pytest.raises(SystemExit, match="differs .* in lr"):
        learn_vs_trl.merge_docs([paths[0], str(tmp_path / "other.json")])


# ---------------------------------------------------------------------------------------------- sessions combined
def _session_doc(seed, base_acc=0.01, **job):
    """An evaluated document of one GPU session: seed ``seed`` of both sides, its own folders and base score."""
    full = _synthetic_doc()
    keep = {"base"} | {learn_report.ckpt_id(r["side"], seed, e["mark_s"]) for r in full["runs"] if r["seed"] == seed
                        for e in r["exports"]}
    results = {k: v for k, v in full["eval"]["results"].items() if k in keep}
    results["base"] = dict(results["base"], svamp=dict(results["base"]["svamp"], acc=base_acc))
    where = f"/tmp/session{seed}"
    job = {**dict(full["job"], seeds=[seed], sides=["trl", "ours"], model=f"{where}/smol_hf",
                  test=f"{where}/data/svamp/test.parquet", gsm8k=f"{where}/data/gsm8k/test.parquet"), **job}
    return dict(meta=dict(date=f"2026-12-0{seed}T10:00:00+00:00", device=f"NVIDIA H{seed}00", command=f"run {seed}"),
                job=job, runs=[r for r in full["runs"] if r["seed"] == seed],
                eval=dict(engine="vllm", results=results, errors={f"trl_s{seed}_t000360/gsm8k": "boom"}, rc=0))


def _write(tmp_path, name, doc):
    path = str(tmp_path / name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def test_report_from_combines_evaluated_files_of_two_sessions(tmp_path, capsys):
    a, b = _write(tmp_path, "s1.json", _session_doc(1)), _write(tmp_path, "s2.json", _session_doc(2))
    out = str(tmp_path / "learn.json")
    doc = learn_vs_trl.main(["--report-from", f"{a},{b}", "--out", out])
    assert [(r["side"], r["seed"], r["file"]) for r in doc["runs"]] == [("trl", 1, a), ("ours", 1, a),
                                                                        ("trl", 2, b), ("ours", 2, b)]
    assert doc["job"]["seeds"] == [1, 2] and doc["job"]["model"] == "/tmp/session1/smol_hf"
    assert set(doc["eval"]["results"]) == set(_synthetic_doc()["eval"]["results"])  # the union of both sessions
    assert set(doc["eval"]["errors"]) == {"trl_s1_t000360/gsm8k", "trl_s2_t000360/gsm8k"}
    assert doc["meta_by_file"][b]["device"] == "NVIDIA H200" and doc["eval"]["by_file"][a]["engine"] == "vllm"
    assert "base_spread" not in doc["eval"] and "differs" not in capsys.readouterr().out
    text = (tmp_path / "learn.md").read_text()
    assert "| 2 | 2.50 (2.00/3.00) | 5.50 (5.00/6.00) |" in text  # both seeds in one row, as from one session
    assert f"| {b} | trl seed 2, ours seed 2 | 2026-12-02T10:00:00+00:00 | NVIDIA H200 | vllm | `run 2` |" in text
    with open(out) as f:
        assert json.load(f)["targets"]["every_mark"] is True
    one = learn_vs_trl.main(["--report-from", a, "--out", str(tmp_path / "one.json")])  # one file: as before
    assert "meta_by_file" not in one and "file" not in one["runs"][0]
    assert "Combined" not in (tmp_path / "one.md").read_text()


def test_each_run_keeps_the_tool_call_that_trained_it_through_both_merges(tmp_path):
    """The loan script trains each side in its own call (``--sides ours``, then ``--sides trl``) and merges the two
    files before the evaluation: the merged document's meta is the first call's, so the TRL run's file row showed
    ours' command."""
    full = _session_doc(1)
    paths = []
    for side in ("ours", "trl"):
        d = dict(full, runs=[r for r in full["runs"] if r["side"] == side], meta=dict(full["meta"], command=f"--sides {side}"))
        d.pop("eval")
        paths.append(_write(tmp_path, f"{side}.json", d))
    merged = learn_vs_trl.merge_docs(paths)
    assert {r["side"]: r["invocation"] for r in merged["runs"]} == {"ours": "--sides ours", "trl": "--sides trl"}
    assert merged["meta"]["command"] == "--sides ours"
    evaluated = _write(tmp_path, "learn1.json", dict(merged, eval=full["eval"]))
    other = _write(tmp_path, "s2.json", _session_doc(2))
    learn_vs_trl.main(["--report-from", f"{evaluated}:trl,{other}", "--out", str(tmp_path / "learn.json")])
    text = (tmp_path / "learn.md").read_text()
    assert f"| {evaluated} | trl seed 1 | 2026-12-01T10:00:00+00:00 | NVIDIA H100 | vllm | `--sides trl` |" in text
    assert f"| {other} | trl seed 2, ours seed 2 | 2026-12-02T10:00:00+00:00 | NVIDIA H200 | vllm | `run 2` |" in text


def test_report_from_refuses_a_differing_job_key(tmp_path):
    a = _write(tmp_path, "s1.json", _session_doc(1))
    b = _write(tmp_path, "s2.json", _session_doc(2, lr=1e-4, test="/x/held_out.parquet"))
    with pytest.raises(SystemExit, match=r"--report-from .*s2\.json: its job differs from .*s1\.json's in lr, test$"):
        learn_vs_trl.main(["--report-from", f"{a},{b}", "--out", str(tmp_path / "o.json")])


def test_report_from_refuses_a_run_in_two_files(tmp_path):
    a, b = _write(tmp_path, "s1.json", _session_doc(1)), _write(tmp_path, "s1_again.json", _session_doc(1))
    with pytest.raises(SystemExit, match=r"s1_again\.json: trl seed 1 is also in .*s1\.json"):
        learn_vs_trl.main(["--report-from", f"{a},{b}", "--out", str(tmp_path / "o.json")])


def test_report_from_keeps_the_first_base_and_reports_a_differing_one(tmp_path, capsys):
    a = _write(tmp_path, "s1.json", _session_doc(1))
    b = _write(tmp_path, "s2.json", _session_doc(2, base_acc=0.02))
    doc = learn_vs_trl.main(["--report-from", f"{a},{b}", "--out", str(tmp_path / "learn.json")])
    assert doc["eval"]["results"]["base"]["svamp"]["acc"] == 0.01 and doc["table"][0]["trl"]["acc"]["mean"] == 0.01
    assert doc["eval"]["base_spread"] == {"svamp": {"acc": [0.01, 0.02], "files": [a, b]}}  # gsm8k agreed
    note = [line for line in capsys.readouterr().out.splitlines() if "differs between files" in line]
    assert note == [f"note: the base model's accuracy differs between files (svamp: 1.00% in {a}, 2.00% in {b}); "
                    f"the report uses {a}'s"]
    assert f"svamp accuracy differs between the files' sessions: 1.00 ({a}), 2.00 ({b})" in \
        (tmp_path / "learn.md").read_text()


def test_report_from_refuses_an_unevaluated_file(tmp_path):
    a = _write(tmp_path, "s1.json", _session_doc(1))
    b = _write(tmp_path, "s2.json", dict(_session_doc(2), eval=None))
    with pytest.raises(SystemExit, match=r"s2\.json: no evaluation results"):
        learn_vs_trl.main(["--report-from", f"{a},{b}", "--out", str(tmp_path / "o.json")])


def test_eval_from_refuses_a_run_in_two_files_and_compares_paths_whole(tmp_path):
    a, b = _write(tmp_path, "a.json", _session_doc(1)), _write(tmp_path, "b.json", _session_doc(1))
    with pytest.raises(SystemExit, match=r"--eval-from .*b\.json: trl seed 1 is also in"):
        learn_vs_trl.merge_docs([a, b])
    c = _write(tmp_path, "c.json", _session_doc(2))  # same basenames, other folders: one session's files must match
    with pytest.raises(SystemExit, match="in gsm8k, model, test$"):
        learn_vs_trl.merge_docs([a, c])


def test_report_from_sets_one_side_of_a_file_beside_the_other_side_of_another(tmp_path):
    """A new configuration of ours (another file, ours alone) beside TRL's recorded runs of the same seed."""
    old = _write(tmp_path, "old.json", _session_doc(1))
    new_doc = _session_doc(1, ours_overrides=["actor_rollout_ref.model.use_torch_compile=true"])
    new_doc["runs"] = [r for r in new_doc["runs"] if r["side"] == "ours"]
    for ckpt, by_set in new_doc["eval"]["results"].items():  # the new run scores 0.09 at every mark
        if ckpt.startswith("ours_"):
            by_set["svamp"] = dict(by_set["svamp"], acc=0.09)
    new = _write(tmp_path, "new.json", new_doc)
    for both_ours in (f"{old},{new}", f"{old}:ours,{new}"):  # ours of both files: its settings must agree
        with pytest.raises(SystemExit, match=r"new\.json: its job differs from .*old\.json's in ours_overrides$"):
            learn_vs_trl.main(["--report-from", both_ours, "--out", str(tmp_path / "o.json")])
    doc = learn_vs_trl.main(["--report-from", f"{old}:trl,{new}:ours", "--out", str(tmp_path / "learn.json")])
    assert [(r["side"], r["file"]) for r in doc["runs"]] == [("trl", old), ("ours", new)]
    assert doc["job"]["ours_overrides"] == ["actor_rollout_ref.model.use_torch_compile=true"]
    assert [row["ours"]["acc"]["mean"] for row in doc["table"][1:]] == [0.09, 0.09, 0.09]  # new's, not old's
    assert [row["trl"]["acc"]["mean"] for row in doc["table"][1:]] == [0.02, 0.04, 0.06]
    assert set(doc["eval"]["errors"]) == {"trl_s1_t000360/gsm8k"}  # old's; new's trl error left with its trl runs
    assert f"| {new} | ours seed 1 |" in (tmp_path / "learn.md").read_text()


def test_report_from_reads_a_colon_that_names_no_side_as_part_of_the_path(tmp_path):
    path = _write(tmp_path, "learn_2026-12-06T16:55.json", _session_doc(1))
    assert learn_vs_trl.parse_sources(f"{path},{path}:trl, ,", "--report-from") == [(path, None), (path, "trl")]
    doc = learn_vs_trl.main(["--report-from", path, "--out", str(tmp_path / "o.json")])
    assert [r["side"] for r in doc["runs"]] == ["trl", "ours"]
    with pytest.raises(SystemExit, match=r"--report-from ',': expected a comma list of JSON files"):
        learn_vs_trl.main(["--report-from", ",", "--out", "o.json"])


def test_report_from_names_the_file_a_side_setting_was_compared_with(tmp_path):
    a = _write(tmp_path, "a.json", _session_doc(1))
    c = _write(tmp_path, "c.json", _session_doc(2, ours_overrides=["x=1"]))
    b = _write(tmp_path, "b.json", _session_doc(1))  # ours_overrides as a's: compared with c, the first ours
    with pytest.raises(SystemExit, match=r"b\.json: its job differs from .*c\.json's in ours_overrides$"):
        learn_vs_trl.main(["--report-from", f"{a}:trl,{c}:ours,{b}:ours", "--out", str(tmp_path / "o.json")])
    d = _write(tmp_path, "d.json", _session_doc(2, lr=1.0, ours_overrides=["y=2"]))
    with pytest.raises(SystemExit, match=r"d\.json: its job differs from .*a\.json's in lr; from .*c\.json's in "
                                         r"ours_overrides$"):
        learn_vs_trl.main(["--report-from", f"{a}:trl,{c}:ours,{d}", "--out", str(tmp_path / "o.json")])


def test_report_from_refuses_a_side_the_file_lacks(tmp_path):
    doc = _session_doc(1)
    doc["runs"] = [r for r in doc["runs"] if r["side"] == "trl"]
    path = _write(tmp_path, "trl_only.json", doc)
    with pytest.raises(SystemExit, match=r"trl_only\.json:ours: the file holds no ours run \(it holds trl\)$"):
        learn_vs_trl.main(["--report-from", f"{path}:ours", "--out", str(tmp_path / "o.json")])
