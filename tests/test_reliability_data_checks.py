"""Data mistakes that were trained on silently or reported in contradicting or unclear words: a prompt column holding
the JSON text of chat messages (trained on as literal text, no chat template), a missing ``data.val_files`` while
no validation runs (warned as unused and then refused as missing), and ``data.max_rows`` leaving fewer rows than a
batch (the message did not name it)."""
import json
import logging
import os

import pytest

from tests.test_reliability_data import _jsonl, _row, tok  # noqa: F401  (the tokenizer fixture)
from trainer.data_rows import json_messages_text
from trainer.dataset import DataError, PromptDataset, PromptLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_b11_a_prompt_holding_json_text_of_messages_is_refused_naming_the_row(tmp_path, tok):  # noqa: F811
    text = json.dumps([{"role": "user", "content": "last of 6 ?"}])
    path = _jsonl(tmp_path / "d.jsonl", [{**_row(), "prompt": "last of 6 ?"}, {**_row(), "prompt": text}])
    with pytest.raises(DataError) as info:
        PromptDataset(path, tok, max_prompt_length=64)
    line = str(info.value)
    assert len(line.splitlines()) == 1 and "row 1 of" in line and "JSON text of chat messages" in line
    assert "store the messages as a list" in line


@pytest.mark.parametrize("prompt,expected", [
    ('[{"role": "user", "content": "hi"}]', True), ('  [{"role": "system", "content": ""}]', True),
    ("last of 6 ?", False), ("[1, 2, 3]", False), ("[not json", False), ("[]", False),
    ('[{"role": "user"}]', False)])
def test_b11_which_strings_are_json_messages(prompt, expected):
    assert json_messages_text(prompt) is expected


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    from trainer.launch import resolve_config

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return resolve_config(compose(config_name="ppo_trainer", overrides=list(overrides)))


def test_d17_a_missing_val_file_without_validation_is_only_warned(tmp_path, caplog):
    from trainer.config_checks import ConfigError
    from trainer.config_preflight import _check_data_files

    train = _jsonl(tmp_path / "t.jsonl", [_row()])
    with caplog.at_level(logging.WARNING):
        cfg = _cfg(f"data.train_files={train}", "data.val_files=/nonexistent.jsonl", "trainer.test_freq=-1")
    assert any("data.val_files" in r.getMessage() and "no validation runs" in r.getMessage() for r in caplog.records)
    _check_data_files(cfg)  # unused: not read, so not refused
    with pytest.raises(ConfigError, match="data.val_files: file '/nonexistent.jsonl' does not exist"):
        _check_data_files(_cfg(f"data.train_files={train}", "data.val_files=/nonexistent.jsonl", "trainer.test_freq=1"))


def test_d17_the_held_out_set_is_not_read_when_no_validation_runs(tmp_path, tok):  # noqa: F811
    from trainer.config.data import DataConfig
    from trainer.launch import build_data

    train = _jsonl(tmp_path / "t.jsonl", [_row() for _ in range(40)])
    cfg = _cfg(f"data.train_files={train}", "data.val_files=/nonexistent.jsonl", "trainer.test_freq=-1")
    loader, val_ds = build_data(cfg, DataConfig.from_dict(cfg["data"], "data"), tok)
    assert val_ds is None and len(loader.dataset) == 40


def test_d20_fewer_rows_than_a_batch_names_max_rows_when_it_cut_them(tmp_path, tok):  # noqa: F811
    path = _jsonl(tmp_path / "d.jsonl", [_row() for _ in range(20)])
    cut = PromptDataset(path, tok, max_prompt_length=64, max_rows=10)
    with pytest.raises(DataError, match=r"10 usable rows \(data.max_rows=10 kept only the first rows\), fewer than "
                                        r"one batch \(data.train_batch_size=16\); raise data.max_rows"):
        PromptLoader(cut, 16, 0)
    whole = PromptDataset(path, tok, max_prompt_length=64, max_rows=30)
    with pytest.raises(DataError) as info:
        PromptLoader(whole, 32, 0)
    assert "max_rows" not in str(info.value)  # it cut nothing
