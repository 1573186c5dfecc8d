"""The preprocessing tools read a split from a local copy (--src) or by Hub name through ``datasets``."""
import json
import os

import datasets
import pandas as pd
import pytest

from rewards.registry import get_scorer
from tools.data_preprocess import common, gsm8k, math500, svamp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


GSM = [{"question": "1+1?", "answer": "one and one\n#### 2"}, {"question": "big?", "answer": "#### 1,000"}]
SV = [{"Body": f"b{i}", "Question": f"q{i}?", "Answer": float(i), "Equation": "x"} for i in range(3)]


def test_gsm8k_from_a_local_copy_and_from_the_hub(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        _jsonl(src / f"{split}.jsonl", GSM)
    assert gsm8k.convert(str(src), str(tmp_path / "a")) == {"train": 2, "test": 2}
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None: asked.append(
        (name, config, split)) or datasets.Dataset.from_list(GSM))
    assert gsm8k.convert(None, str(tmp_path / "b")) == {"train": 2, "test": 2}
    assert asked == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    for d in ("a", "b"):
        df = pd.read_parquet(tmp_path / d / "test.parquet")
        assert [r["ground_truth"] for r in df["reward_model"]] == ["2", "1000"]


def test_svamp_local_rule_and_hub_splits(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    _jsonl(src / "test.jsonl", SV)
    monkeypatch.setattr(svamp, "TRAIN_ROWS", 2)
    assert svamp.convert(str(src), str(tmp_path / "a")) == {"train": 2, "test": 1}
    hub = {"train": SV[:1], "test": SV[1:]}
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None:
                        datasets.Dataset.from_list(hub[split]) if name == "ChilleD/SVAMP" else None)
    assert svamp.convert(None, str(tmp_path / "b")) == {"train": 1, "test": 2}
    df = pd.read_parquet(tmp_path / "b" / "train.parquet")
    assert df["prompt"][0][0]["content"].startswith("b0 q0?") and df["reward_model"][0]["ground_truth"] == "0"


MATH_FIXTURE = os.path.join(os.path.dirname(__file__), "data", "math_tiny")


def _math_rows(path):
    df = pd.read_parquet(path)
    return [(r["data_source"], r["reward_model"]["ground_truth"], r["prompt"][0]["content"], r["extra_info"])
            for _, r in df.iterrows()]


def test_math500_local_copy_answers_and_held_out_problems(tmp_path):
    counts = math500.convert(MATH_FIXTURE, str(tmp_path))
    # train: one row without a boxed answer and one MATH-500 problem are left out
    assert counts == {"train": 3, "train_no_answer": 1, "train_in_test": 1, "test": 3, "test_no_answer": 0}
    train, test = _math_rows(tmp_path / "train.parquet"), _math_rows(tmp_path / "test.parquet")
    assert [t[1] for t in train] == ["9", "2", "5"]  # last box wins; "\boxed 5" form
    assert [t[1] for t in test] == ["\\frac{1}{2}", "\\left( 2, \\frac{\\pi}{2} \\right)", "7"]  # answer field, \fbox
    assert {t[0] for t in train} == {"lighteval/MATH"} and {t[0] for t in test} == {"HuggingFaceH4/MATH-500"}
    for source, truth, prompt, extra in train + test:
        assert prompt.endswith("output the final answer within \\boxed{}.")
        # the math scorer gives the reference solution full marks against the written ground truth
        assert get_scorer(source)(extra["solution"], truth) == 1.0
    assert test[0][3]["unique_id"] == "test/prealgebra/made-up-1.json" and train[0][3]["type"] == "Algebra"


def test_math500_from_the_hub_by_name(tmp_path, monkeypatch):
    local = {split: common.read_jsonl(os.path.join(MATH_FIXTURE, f"{split}.jsonl")) for split in ("train", "test")}
    asked = []

    def load(name, config=None, split=None):
        asked.append((name, config, split))
        return datasets.Dataset.from_list(local[split])
    monkeypatch.setattr(datasets, "load_dataset", load)
    assert math500.convert(None, str(tmp_path / "hub"))["train"] == 3
    assert asked == [("HuggingFaceH4/MATH-500", None, "test"), ("DigitalLearningGmbH/MATH-lighteval", None, "train")]
    math500.convert(MATH_FIXTURE, str(tmp_path / "local"))
    for split in ("train", "test"):
        assert _math_rows(tmp_path / "hub" / f"{split}.parquet") == _math_rows(tmp_path / "local" / f"{split}.parquet")


def test_math500_test_split_only_and_bad_split(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "test.jsonl").write_text(open(os.path.join(MATH_FIXTURE, "test.jsonl")).read())
    assert math500.convert(str(src), str(tmp_path / "o"), splits=("test",)) == {"test": 3, "test_no_answer": 0}
    assert not (tmp_path / "o" / "train.parquet").exists()
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        math500.convert(str(src), str(tmp_path / "o"))
    with pytest.raises(SystemExit) as exc:
        math500.main(["--src", str(src), "--splits", "dev", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "unknown split 'dev'" in capsys.readouterr().err


def test_math500_data_config_reads_the_written_files():
    from hydra import compose, initialize_config_dir

    from trainer.launch import resolve_config, validate

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        cfg = compose(config_name="ppo_trainer", overrides=["data=math500"])
    validate(resolve_config(cfg))
    assert (cfg.data.train_files, cfg.data.val_files) == (f"{math500.DEFAULT_OUT}/train.parquet",
                                                          f"{math500.DEFAULT_OUT}/test.parquet")


def test_an_empty_source_split_writes_nothing_and_keeps_the_existing_file(tmp_path, capsys):
    """An empty test.jsonl used to overwrite data/<name>/test.parquet with 0 rows; a missing one gave a traceback."""
    from tools.data_preprocess import math500

    out, src = tmp_path / "out", tmp_path / "src"
    src.mkdir()
    (src / "test.jsonl").write_text("")
    out.mkdir()
    (out / "test.parquet").write_bytes(b"kept")
    with pytest.raises(SystemExit) as info:
        math500.main(["--src", str(src), "--splits", "test", "--out", str(out)])
    assert info.value.code == 2 and (out / "test.parquet").read_bytes() == b"kept"
    assert "no rows to write to" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        math500.main(["--src", str(tmp_path / "missing"), "--out", str(out)])
    assert "test.jsonl' not found" in capsys.readouterr().err


def test_tool_option_writes_prompts_asking_for_the_tool(tmp_path, capsys, monkeypatch):
    from trainer.embedded_tool import tool_instruction

    src = tmp_path / "src"
    src.mkdir()
    # one folder for both: GSM8K reads train/test.jsonl, SVAMP test.jsonl (non-integer answers; 1 train row)
    _jsonl(src / "train.jsonl", GSM)
    _jsonl(src / "test.jsonl", [{**g, **s, "Answer": s["Answer"] + 0.5} for g, s in zip(GSM * 2, SV)])
    monkeypatch.setattr(svamp, "TRAIN_ROWS", 1)
    svamp.main(["--src", str(src), "--out", str(tmp_path / "sv"), "--tool", "python"])
    gsm8k.convert(str(src), str(tmp_path / "gsm"), tool="calculator")
    for out, tool, source in (("sv", "python", "svamp"), ("gsm", "calculator", "openai/gsm8k")):
        df = pd.read_parquet(tmp_path / out / "test.parquet")
        content = df["prompt"][0][0]["content"]
        assert content.endswith(" " + tool_instruction(tool)) and common.INSTRUCTION not in content
        assert df["data_source"][0] == source and df["extra_info"][0]["tool"] == tool
    assert [r["ground_truth"] for r in pd.read_parquet(tmp_path / "sv" / "test.parquet")["reward_model"]] == \
        ["1.5", "2.5"]
    with pytest.raises(SystemExit) as exc:
        gsm8k.main(["--src", str(src), "--out", str(tmp_path / "x"), "--tool", "shell"])
    assert exc.value.code == 2 and "invalid choice: 'shell'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--tool 'shell'"):
        common.tool_rows([], "shell")


def test_svamp_folders_from_different_sources_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(svamp, "TRAIN_ROWS", 2)
    src = tmp_path / "src"
    src.mkdir()
    _jsonl(src / "test.jsonl", SV)
    svamp.convert(str(src), str(tmp_path / "a"))
    svamp.convert(str(src), str(tmp_path / "b"), tool="python")
    svamp.check_same_questions(str(tmp_path / "a"), str(tmp_path / "b"))
    _jsonl(src / "test.jsonl", SV[::-1])
    svamp.convert(str(src), str(tmp_path / "c"))
    with pytest.raises(ValueError, match="hold different questions"):
        svamp.check_same_questions(str(tmp_path / "a"), str(tmp_path / "c"))


GSM_ODD = ["so 5/2\n#### 5/2", "it costs\n#### $5", "#### 1,000", "#### -3", "#### 3.50", "#### 42.",
           "#### 2 first, then\n#### 7", "#### 1,234.5"]


def test_gsm8k_preprocessor_ground_truth_scores_its_own_solution(tmp_path):
    """The ground truth is read as the gsm8k scorer reads an answer: every reference solution scores 1.0 against its
    own ground truth (a fraction kept whole, ``$5`` read, the last ``####`` taken), under the strict scorer."""
    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        _jsonl(src / f"{split}.jsonl", [{"question": f"q{i}?", "answer": a} for i, a in enumerate(GSM_ODD)])
    assert gsm8k.convert(str(src), str(tmp_path / "out")) == {"train": len(GSM_ODD), "test": len(GSM_ODD)}
    df = pd.read_parquet(tmp_path / "out" / "train.parquet")
    truths = [r["ground_truth"] for r in df["reward_model"]]
    assert truths == ["5/2", "5", "1000", "-3", "3.50", "42", "7", "1234.5"]
    strict = get_scorer("gsm8k_strict")
    assert [strict(e["reference"], t) for e, t in zip(df["extra_info"], truths)] == [1.0] * len(GSM_ODD)


@pytest.mark.parametrize("answer", ["#### 10 - 3", "#### 1,2", "#### six", "no marker: 5"])
def test_gsm8k_preprocessor_refuses_an_answer_the_scorer_cannot_read(tmp_path, answer):
    """An answer the scorer reads no number from (an expression, commas that are not thousands separators, a word)
    stops the tool naming the file and the row; nothing is written (before, ``10 - 3`` became the ground truth 10,
    ``1,2`` became 12: the reference solution scored 0 against its own ground truth)."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    _jsonl(src / "train.jsonl", GSM)
    _jsonl(src / "test.jsonl", GSM + [{"question": "odd?", "answer": answer}])
    with pytest.raises(ValueError) as info:
        gsm8k.convert(str(src), str(out))
    msg = str(info.value)
    assert msg.startswith(f"{src / 'test.jsonl'}, row 2 (counted from 0): the answer ends {answer!r}"), msg
    assert not out.exists()
    with pytest.raises(ValueError, match=r"^openai/gsm8k split 'train', row 0 \(counted from 0\)"):
        gsm8k.extract_answer(answer, gsm8k._where(None, "train", 0))
