"""``--report-from`` with files of different budgets: a shorter run of one side (e.g. a new setting of ours, 5
minutes) beside the other side's recorded longer runs. Each run has no value after its own budget; the targets use
every mark of the longer runs (TRL's best over its whole run)."""
import pytest

from tests.test_learn_vs_trl import _session_doc, _write
from tools.bench import learn_report, learn_vs_trl


def _short_ours(seed=2, until=240.0, acc=0.09):
    """An evaluated file of ours alone, run for ``until`` seconds (marks every 120 s), scoring ``acc`` at every mark."""
    doc = _session_doc(seed)
    doc["job"] = dict(doc["job"], budget_s=until, marks_s=[m for m in doc["job"]["marks_s"] if m <= until],
                      sides=["ours"])
    doc["runs"] = [dict(r, exports=[e for e in r["exports"] if e["mark_s"] <= until])
                   for r in doc["runs"] if r["side"] == "ours"]
    results = {}
    for ckpt, by_set in doc["eval"]["results"].items():
        if ckpt.startswith("trl_") or (ckpt != "base" and int(ckpt[-6:]) > until):
            continue
        results[ckpt] = dict(by_set, svamp=dict(by_set["svamp"], acc=acc)) if ckpt != "base" else by_set
    doc["eval"] = dict(doc["eval"], results=results, errors={})
    return doc


def test_a_shorter_run_has_no_value_after_its_budget(tmp_path):
    trl = _write(tmp_path, "trl.json", _session_doc(1))  # TRL 0.02 / 0.04 / 0.06 at 2 / 4 / 6 minutes
    ours = _write(tmp_path, "ours.json", _short_ours())  # ours 0.09 at 2 and 4 minutes, then stopped
    doc = learn_vs_trl.main(["--report-from", f"{trl}:trl,{ours}:ours", "--out", str(tmp_path / "learn.json")])
    assert doc["job"]["budget_s"] == 360.0 and doc["job"]["marks_s"] == [120.0, 240.0, 360.0]
    assert {r["side"]: r["budget_s"] for r in doc["runs"]} == {"trl": 360.0, "ours": 240.0}
    rows = doc["table"]
    assert [r["ours"]["acc"]["mean"] for r in rows[1:]] == [0.09, 0.09, None]  # not its 4-minute state again
    assert [r["ok"] for r in rows[1:]] == [True, True, None]
    tg = doc["targets"]
    assert tg["every_mark"] and tg["marks_checked"] == 2
    assert tg["trl_best_mark_s"] == 360.0 and tg["ours_reaches_trl_best_at_s"] == 120.0 and tg["half_time"]
    text = (tmp_path / "learn.md").read_text()
    assert "| 6 | 6.00 | - | 70.00 | - | - |" in text and "(2 marks checked" in text


def test_half_the_time_is_not_measured_when_ours_stopped_before_it(tmp_path):
    trl = _write(tmp_path, "trl.json", _session_doc(1))  # TRL's best, 0.06, first at 6 minutes
    ours = _write(tmp_path, "ours.json", _short_ours(until=120.0, acc=0.05))  # 2 minutes, below it
    doc = learn_vs_trl.main(["--report-from", f"{trl}:trl,{ours}:ours", "--out", str(tmp_path / "learn.json")])
    assert doc["targets"]["half_time"] is None and doc["targets"]["ours_reaches_trl_best_at_s"] is None
    assert "half-time target not measured" in (tmp_path / "learn.md").read_text()
    longer = _write(tmp_path, "ours4.json", _short_ours(until=240.0, acc=0.05))  # 4 minutes, past half: not met
    doc = learn_vs_trl.main(["--report-from", f"{trl}:trl,{longer}:ours", "--out", str(tmp_path / "l4.json")])
    assert doc["targets"]["half_time"] is False


def test_run_values_stop_at_the_runs_own_budget():
    doc = _session_doc(1)
    run = dict(doc["runs"][0], budget_s=240.0)
    got = learn_report.run_values(run, doc["eval"]["results"], [120.0, 240.0, 360.0])
    assert got[240.0]["acc"] == 0.04 and got[360.0] is None
    assert learn_report.run_values(doc["runs"][0], doc["eval"]["results"], [360.0])[360.0]["acc"] == 0.06


def test_budgets_may_differ_only_between_evaluated_files(tmp_path):
    trl = _write(tmp_path, "trl.json", _session_doc(1))
    short = _short_ours()
    other_spacing = dict(short, job=dict(short["job"], every_s=60))
    ours = _write(tmp_path, "ours.json", other_spacing)
    with pytest.raises(SystemExit, match=r"ours\.json: its job differs from .*trl\.json's in every_s$"):
        learn_vs_trl.main(["--report-from", f"{trl}:trl,{ours}:ours", "--out", str(tmp_path / "o.json")])
    unevaluated = dict(short)
    unevaluated.pop("eval")
    path = _write(tmp_path, "uneval.json", unevaluated)  # one session's files before scoring: one budget
    with pytest.raises(SystemExit, match=r"uneval\.json: its job differs .* in budget_s, gsm8k, marks_s, model, test$"):
        learn_vs_trl.merge_docs([trl, path])


def test_a_merged_file_merged_again_keeps_each_runs_budget_and_file(tmp_path):
    trl = _write(tmp_path, "trl.json", _session_doc(1))
    ours = _write(tmp_path, "ours.json", _short_ours())
    first = str(tmp_path / "merged.json")
    learn_vs_trl.main(["--report-from", f"{trl}:trl,{ours}:ours", "--out", first])
    for sources in (f"{first}:ours,{trl}:trl", first):
        doc = learn_vs_trl.main(["--report-from", sources, "--out", str(tmp_path / "again.json")])
        assert {r["side"]: (r["budget_s"], r["file"]) for r in doc["runs"]} == {"trl": (360.0, trl),
                                                                                "ours": (240.0, ours)}
        assert [r["ours"]["acc"]["mean"] for r in doc["table"][1:]] == [0.09, 0.09, None]
        assert doc["targets"]["marks_checked"] == 2
    assert set(doc["meta_by_file"]) == {trl, ours}  # one file given: the merged file's own record


def test_a_side_whose_runs_have_different_budgets_has_no_mean_after_the_shorter(tmp_path):
    trl = _write(tmp_path, "trl.json", _session_doc(1))
    short = _write(tmp_path, "ours2.json", _short_ours(seed=2, until=240.0, acc=0.09))
    full = _session_doc(1)
    full["runs"] = [r for r in full["runs"] if r["side"] == "ours"]  # ours seed 1, 6 minutes, 0.05 / 0.06 / 0.07
    longer = _write(tmp_path, "ours1.json", full)
    doc = learn_vs_trl.main(["--report-from", f"{trl}:trl,{longer}:ours,{short}:ours",
                             "--out", str(tmp_path / "learn.json")])
    rows = doc["table"]
    assert rows[2]["ours"]["acc"]["values"] == [0.06, 0.09]
    assert rows[3]["ours"]["acc"]["mean"] is None and rows[3]["ok"] is None  # not seed 1 alone as a "mean"


def test_the_base_spread_of_an_earlier_merge_is_not_carried_on(tmp_path, capsys):
    a = _write(tmp_path, "a.json", _session_doc(1))
    b = _write(tmp_path, "b.json", _session_doc(2, base_acc=0.02))
    first = str(tmp_path / "m1.json")
    assert "base_spread" in learn_vs_trl.main(["--report-from", f"{a},{b}", "--out", first])["eval"]
    doc = learn_vs_trl.main(["--report-from", f"{first}:trl", "--out", str(tmp_path / "m2.json")])
    assert "base_spread" not in doc["eval"] and "differs between" not in (tmp_path / "m2.md").read_text()


def test_a_save_after_the_budget_counts_nowhere(tmp_path):
    doc = _session_doc(1)
    doc["job"] = dict(doc["job"], budget_s=240.0, marks_s=[120.0, 240.0])  # the 360 s saves came after the budget
    doc["runs"] = [dict(r, signal=[dict(mark_s=e["mark_s"], steps=5, reward=0.1) for e in r["exports"]])
                   for r in doc["runs"]]
    out = learn_vs_trl.main(["--report-from", _write(tmp_path, "in.json", doc), "--out", str(tmp_path / "o.json")])
    text = (tmp_path / "o.md").read_text()
    assert "6 min" not in text and "| 6 |" not in text  # no GSM8K row of the 6-minute save, no signal row
    assert "| trl seed 1 | 10 | 123 | 2 |" in text  # steps and saves up to the budget
    assert len(out["runs"][0]["exports"]) == 3  # the document itself keeps what the run saved
    job = learn_vs_trl.eval_job(doc, str(tmp_path), learn_vs_trl._parser().parse_args([]))
    assert not any(k.endswith("_t000360") for k in job["checkpoints"])


@pytest.mark.parametrize("seeds", [",", " , ", "1,1", "1,x", "2,-1"])
def test_the_loan_script_refuses_a_bad_seed_list_in_one_line(tmp_path, seeds):
    import os
    import subprocess

    env = dict(os.environ, OUT=str(tmp_path), LEARN_SEED=seeds)
    got = subprocess.run(["bash", "tools/bench/learn_vs_trl_loan.sh"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 2, got.stdout + got.stderr
    assert (tmp_path / "ALLDONE").read_text() == f"LEARN_SEED='{seeds}': expected a comma list of distinct whole " \
                                                 "numbers (e.g. 1,2)\n"
