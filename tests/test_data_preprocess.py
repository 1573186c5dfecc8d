"""The preprocessing tools read a split from a local copy (--src) or by Hub name through ``datasets``."""
import json

import datasets
import pandas as pd

from tools.data_preprocess import gsm8k, svamp


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
