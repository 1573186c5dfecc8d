"""Malformed data rows and files: the error names the file and what is wrong in it. Found by trying them: a jsonl
file with a broken line stopped with "DatasetGenerationError: An error occurred while generating the dataset" (the
row was only in a log line above), and rows whose chat messages lacked a ``content`` (or ``role``) were trained on
as empty prompts without a word."""
import json

import pytest

from tests.test_reliability_data import _jsonl, _row, tok  # noqa: F401  (the tokenizer fixture)
from trainer.dataset import DataError, PromptDataset


def test_a_broken_jsonl_line_names_the_file_and_the_row(tmp_path, tok):  # noqa: F811
    p = tmp_path / "broken.jsonl"
    p.write_text("".join(json.dumps(_row()) + "\n" for _ in range(10)) + '{"prompt": [ broken\n')
    with pytest.raises(DataError) as info:
        PromptDataset(str(p), tok, max_prompt_length=16)
    message = str(info.value)
    assert "broken.jsonl" in message and "row 10" in message and "An error occurred" not in message, message


@pytest.mark.parametrize("messages", [[{"role": "user"}], [{"content": "last of 1 ?"}], ["last of 1 ?"],
                                      [{"role": "user", "content": None}],
                                      [{"role": "system", "content": "x"}, {"role": "user"}]])
def test_a_chat_message_without_role_or_content_is_skipped_and_counted(tmp_path, tok, messages):  # noqa: F811
    bad = {**_row(), "prompt": messages}
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", [_row(), bad, _row()]), tok, max_prompt_length=16)
    assert len(ds) == 2 and ds.num_invalid == 1
    with pytest.raises(DataError, match="lacking its role or content"):
        PromptDataset(_jsonl(tmp_path / "all_bad.jsonl", [bad]), tok, max_prompt_length=16)


def test_well_formed_messages_are_kept(tmp_path, tok):  # noqa: F811
    chat = [{"role": "system", "content": "x"}, {"role": "user", "content": "last of 2 ?"}]
    rows = [_row(), {**_row(), "prompt": chat}, {**_row(), "prompt": "last of 3 ?"}]
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, max_prompt_length=32)
    assert len(ds) == 3 and ds.num_invalid == 0
