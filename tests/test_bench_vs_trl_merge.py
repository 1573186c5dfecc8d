"""tools/bench/vs_trl.py --report-from A.json,B.json: sides of separate calls in one report."""
import json

import pytest

from tools.bench import vs_trl
from tools.bench.vs_trl_merge import merge_vs_docs


def _row(side, framework, step_s):
    return dict(side=side, framework=framework, engine="vllm" if framework == "trl" else "hf", timed_steps=2,
                mean_step_s=step_s, samples_per_s=512 / step_s, gen_tokens_per_step=262144.0,
                gen_tokens_per_s=262144.0 / step_s, trained_tokens_per_step=316344.0,
                trained_tokens_per_s=316344.0 / step_s, split_s={"gen": step_s / 2, "update": step_s / 2})


def _doc(tmp_path, name, rows, **job_changes):
    job = dict(model=f"/tmp/{name}/qwen2_rand", data=f"/x/{name}/train.parquet", batch=64, n=8, micro=8,
               response_len=512, steps=3, out_dir=f"/tmp/vs/{name}", ours_overrides=[],
               random_model=dict(config="qwen2-1.5b", vocab_size=49152, reused=name != "a", tokenizer=f"/{name}/tok"))
    job.update(job_changes)
    doc = dict(meta=dict(device="NVIDIA H100 80GB HBM3", gpus=1, date=f"2026-12-05 {name}"), job=job,
               sides=[r["side"] for r in rows], results=rows, notes=[f"note {name}", "shared note"])
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_sides_of_separate_calls_make_one_report_with_their_ratio(tmp_path):
    a = _doc(tmp_path, "a", [_row("trl_vllm", "trl", 24.0)])
    b = _doc(tmp_path, "b", [_row("ours_hf", "ours", 12.0)], steps=4,
             ours_overrides=["actor_rollout_ref.model.use_torch_compile=true"])
    c = _doc(tmp_path, "c", [_row("ours_hf", "ours", 16.0)])
    doc = vs_trl.main(["--report-from", f"{a},{b},{c}", "--out", str(tmp_path / "m.json")])
    assert doc["sides"] == ["trl_vllm", "ours_hf", "ours_hf@c"]
    assert doc["ratios"] == {"ours_hf/trl_vllm": pytest.approx(2.0), "ours_hf@c/trl_vllm": pytest.approx(1.5)}
    assert [r["file"] for r in doc["results"]] == ["a.json", "b.json", "c.json"]
    assert [p["meta"]["date"] for p in doc["parts"]] == ["2026-12-05 a", "2026-12-05 b", "2026-12-05 c"]
    assert doc["notes"] == ["note a", "shared note", "note b", "note c"]
    assert "| ours_hf@c |" in (tmp_path / "m.md").read_text()


@pytest.mark.parametrize("change, named", [(dict(batch=32), "batch"), (dict(response_len=256), "response_len"),
                                           (dict(random_model=dict(config="smollm2")), "random_model")])
def test_another_job_is_refused_naming_the_keys(tmp_path, change, named):
    a = _doc(tmp_path, "a", [_row("trl_vllm", "trl", 24.0)])
    b = _doc(tmp_path, "b", [_row("ours_hf", "ours", 12.0)], **change)
    with pytest.raises(SystemExit, match=f"ran another job than .*a.json: {named} differ"):
        merge_vs_docs([a, b])


def test_another_card_is_refused(tmp_path):
    a = _doc(tmp_path, "a", [_row("trl_vllm", "trl", 24.0)])
    b = _doc(tmp_path, "b", [_row("ours_hf", "ours", 12.0)])
    doc = json.loads(open(b).read())
    doc["meta"]["device"] = "NVIDIA H200"
    open(b, "w").write(json.dumps(doc))
    with pytest.raises(SystemExit, match="ran on device 'NVIDIA H200'.*different cards do not compare"):
        merge_vs_docs([a, b])


def test_a_file_that_is_not_a_report_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="bad.json: not a vs_trl.py report"):
        merge_vs_docs([str(bad)])
    good = _doc(tmp_path, "a", [_row("trl_vllm", "trl", 24.0)])
    with pytest.raises(SystemExit, match="bad.json: not a vs_trl.py report .expected keys job, results, meta"):
        merge_vs_docs([good, str(bad)])
    with pytest.raises(SystemExit, match="missing.json: FileNotFoundError"):
        merge_vs_docs([str(tmp_path / "missing.json")])
