"""The learning comparison's guard against a policy that gives one answer to every question: the evaluator's
answer spread and one-answer baseline, the report's lines, and ``--strict-format`` on both sides."""
import json

import pytest

from tests.test_learn_vs_trl import JOB, _synthetic_doc
from tools.bench import learn_eval, learn_merge, learn_report, learn_vs_trl, learn_vs_trl_child

SPAM = "#### 1\n" * 30


def test_answer_stats_see_one_answer_repeated_for_every_question():
    got = learn_eval.answer_stats([SPAM, SPAM, SPAM, "#### 2", "no answer"])
    assert got == {"top_answer": "1", "top_answer_share": 0.6, "distinct_answers": 2, "multi_marker": 0.6}
    assert learn_eval.answer_stats(["#### 12.0", "#### 12", "x"])["top_answer"] == "12"  # one number, two spellings
    assert learn_eval.answer_stats([])["top_answer"] is None


def test_constant_baseline_is_the_most_common_true_answer():
    got = learn_eval.constant_baseline(["1", "2", "1", "12.0", "12", "7"])
    assert got == {"n": 6, "answer": "1", "acc": pytest.approx(2 / 6)}  # a tie goes to the first seen
    assert learn_eval.constant_baseline(["x"]) == {"n": 1, "answer": None, "acc": 0.0}


def test_strict_format_scores_the_repeated_answer_zero_in_the_evaluator():
    loose = learn_eval.score_texts([SPAM, "3 + 4 = 7\n#### 7"], ["1", "7"])
    strict = learn_eval.score_texts([SPAM, "3 + 4 = 7\n#### 7"], ["1", "7"], strict_format=True)
    assert loose["acc"] == 1.0 and strict["acc"] == 0.5 and strict["format"] == 0.5


def test_strict_format_reaches_both_sides_and_the_evaluator(tmp_path):
    job = dict(JOB, strict_format=True)
    assert "reward_model.scorer_kwargs.strict_format=true" in learn_vs_trl.ours_command(job, 1, "/o")
    assert not any("strict_format" in o for o in learn_vs_trl.ours_command(JOB, 1, "/o"))
    trl = learn_vs_trl_child.make_format_reward(0.1, strict_format=True)
    assert trl([SPAM, "so\n#### 5"], ground_truth=["1", "4"]) == [0.0, 0.1]
    doc = dict(job=dict(job, test="/d/test.parquet", gsm8k=None, model="/m"), runs=[])

    class Args:
        eval_engine, eval_gpu_util, eval_max_prompt_len = "hf", 0.5, 1024
    assert learn_vs_trl.eval_job(doc, str(tmp_path), Args)["strict_format"] is True


def test_strict_format_option_validates_in_the_trainer_config():
    from hydra import compose, initialize_config_dir

    from trainer.launch import check_overrides, resolve_config, validate
    from trainer.overrides import CONFIG_DIR

    overrides = check_overrides(learn_vs_trl.ours_command(dict(JOB, strict_format=True), 1, "/tmp/w/o")[2:],
                                CONFIG_DIR)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=overrides))
    validate(cfg)
    assert cfg["reward_model"]["scorer_kwargs"]["strict_format"] is True


def test_a_file_without_strict_format_merges_with_one_that_has_it_off():
    old = dict(JOB)
    old.pop("strict_format", None)
    assert learn_merge.job_differences(old, dict(JOB, strict_format=False)) == []
    assert learn_merge.job_differences(old, dict(JOB, strict_format=True)) == ["strict_format"]


def _collapsed_doc():
    doc = _synthetic_doc(trl_acc=(0.02, 0.04, 0.06), ours_acc=(0.05, 0.06, 0.07))
    doc["eval"]["sets"] = {"svamp": {"n": 300, "answer": "1", "acc": 0.0833}}
    for key, res in doc["eval"]["results"].items():
        if key != "base":
            res["svamp"].update(top_answer="1" if key.startswith("ours") else "2", top_answer_share=0.97,
                                acc_beyond_top=0.0)
    return doc


def test_report_draws_the_one_answer_baseline_and_the_answer_table(tmp_path):
    text = learn_report.markdown(_collapsed_doc())
    assert 'One answer for every held-out question ("1", the most common true answer) scores 8.33%' in text
    assert "Neither side's best mean accuracy is above it" in text  # best 8.0% <= 8.33%
    assert "| 2 | s1: 2 (97.00; 0.00) / s2: 2 (97.00; 0.00) | s1: 1 (97.00; 0.00) / s2: 1 (97.00; 0.00) |" in text
    plain = learn_report.markdown(_synthetic_doc())
    assert "One answer" not in plain and "Most common answer" not in plain  # older files: no such lines
    above = _collapsed_doc()
    above["eval"]["sets"]["svamp"]["acc"] = 0.05
    assert "Neither side" not in learn_report.markdown(above)
    pytest.importorskip("matplotlib")
    assert learn_report.plot(_collapsed_doc(), str(tmp_path / "p.png"))


def test_report_from_adds_the_baseline_of_an_older_file_from_the_held_out_file(tmp_path):
    test = tmp_path / "test.parquet"
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"ground_truth": gt}}
            for i, gt in enumerate(["1", "2", "1"])]
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(test))
    doc = _synthetic_doc()
    assert learn_vs_trl.add_constant_baseline(doc, str(test)) is False  # 3 rows, the job held out 300
    doc["job"]["test_rows"] = 3
    assert learn_vs_trl.add_constant_baseline(doc, str(test)) is True
    assert doc["eval"]["sets"]["svamp"] == {"n": 3, "answer": "1", "acc": pytest.approx(2 / 3), "from": str(test)}
    assert learn_vs_trl.add_constant_baseline(doc, str(test)) is False  # already there
    other = dict(doc, eval=dict(doc["eval"], sets={}), job=dict(doc["job"], test="/d/held_out.parquet"))
    assert learn_vs_trl.add_constant_baseline(other, str(test)) is False  # not the job's held-out file
    src = tmp_path / "in.json"
    src.write_text(json.dumps(dict(_synthetic_doc(), job=dict(_synthetic_doc()["job"], test_rows=3))))
    learn_vs_trl.main(["--report-from", str(src), "--test", str(test), "--out", str(tmp_path / "o.json")])
    assert 'One answer for every held-out question ("1"' in (tmp_path / "o.md").read_text()


def test_answer_table_names_seeds_and_marks_runs_without_the_fields():
    doc = _collapsed_doc()
    for key, res in doc["eval"]["results"].items():
        if key.startswith("trl_s2"):
            for name in ("top_answer", "top_answer_share"):
                res["svamp"].pop(name)  # as from an older evaluator's file
    doc["eval"]["results"]["ours_s1_t000120"]["svamp"]["top_answer"] = None
    text = learn_report.markdown(doc)
    assert "| 2 | s1: 2 (97.00; 0.00) / s2: - | s1: none (97.00; 0.00) / s2: 1 (97.00; 0.00) |" in text


def test_multi_marker_counts_answer_markers_only():
    assert learn_eval.answer_stats(["#### Step 1\n#### 7", "#### 7"])["multi_marker"] == 0.0
    assert learn_eval.answer_stats(["#### 3\n#### 7"])["multi_marker"] == 1.0


def test_a_non_finite_accuracy_is_left_out_of_the_report(tmp_path):
    doc = _synthetic_doc()
    doc["eval"]["results"]["ours_s1_t000120"]["svamp"]["acc"] = float("nan")
    rows = learn_report.mark_table(doc)
    assert rows[1]["ours"]["acc"]["values"] == [pytest.approx(0.06)]  # seed 2 only
    assert learn_report.targets(rows)["ours_best_acc"] is not None


def test_report_from_one_missing_file_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: --report-from .*nope\.json: FileNotFoundError"):
        learn_vs_trl.main(["--report-from", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o.json")])


def test_merged_files_keep_the_baseline_of_any_file(tmp_path):
    from tests.test_learn_vs_trl import _session_doc, _write

    old, new = _session_doc(1), _session_doc(2)
    new["eval"]["sets"] = {"svamp": {"n": 300, "answer": "1", "acc": 0.0833}}
    doc = learn_merge.merge_docs([_write(tmp_path, "a.json", old), _write(tmp_path, "b.json", new)], evaluated=True)
    assert learn_report.constant_baseline_of(doc)["answer"] == "1"


def test_a_stale_evaluation_file_is_never_taken_for_a_new_one(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps({"engine": "STALE", "results": {"base": {}}, "errors": {}}))
    doc = dict(job=dict(JOB, test="/d/test.parquet", gsm8k=None, model=str(tmp_path / "no_model")), runs=[])

    class Args:
        eval_engine, eval_gpu_util, eval_max_prompt_len = "hf", 0.5, 1024
    out = learn_vs_trl.run_eval(doc, str(tmp_path), Args, 60)
    assert out.get("engine") != "STALE" and out["rc"] != 0


def test_accuracy_beyond_the_top_answer_is_zero_for_a_one_answer_policy():
    truths = ["1", "1", "2", "3"]
    spam = learn_eval.score_texts([SPAM] * 4, truths)
    assert spam["acc"] == 0.5 and spam["top_answer"] == "1" and spam["acc_beyond_top"] == 0.0
    assert learn_eval.score_texts(["a", "b"], ["x", "y"])["acc_beyond_top"] == 0.0  # no answer given at all
    solver = learn_eval.score_texts(["#### 1", "#### 5", "#### 2", "#### 3"], truths)
    assert solver["acc"] == 0.75 and solver["acc_beyond_top"] == 1.0  # top answer "1": questions 2 and 3 remain
