"""Malformed data rows and files: the error names the file and what is wrong in it. Found by trying them: a jsonl
file with a broken line stopped with "DatasetGenerationError: An error occurred while generating the dataset" (the
row was only in a log line above), and rows whose chat messages lacked a ``content`` (or ``role``) were trained on
as empty prompts without a word."""
import json

import pytest

from tests.test_reliability_data import _jsonl, _row, tok  # noqa: F401  (the tokenizer fixture)
from trainer import embedded
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


def _error(path, tok, **kw):  # noqa: F811
    with pytest.raises(DataError) as info:
        PromptDataset(path, tok, **{"max_prompt_length": 16, **kw})
    assert "\n" not in str(info.value), str(info.value)
    return str(info.value)


def test_a_row_that_cannot_be_used_is_named_by_its_file_and_index(tmp_path, tok):  # noqa: F811
    """Every per-row refusal of the dataset names the file and the row (counted from 0) the way the reward-key
    check does: a prompt too long with ``truncation=error``, a ``tools`` column that is not JSON or not a list, a chat
    template that cannot render the prompt."""
    good = _jsonl(tmp_path / "good.jsonl", [_row()])
    long = _jsonl(tmp_path / "long.jsonl", [_row(), _row(), _row(content=" ".join(["7"] * 40))])
    msg = _error([good, long], tok, filter_overlong_prompts=False)
    assert msg.startswith(f"row 2 of {long} (counted from 0): its prompt has ") and "data.truncation" in msg, msg
    tools = _jsonl(tmp_path / "tools.jsonl", [_row(), {**_row(), "tools": "[{broken"}])
    msg = _error(tools, tok)
    assert msg.startswith(f"row 1 of {tools} (counted from 0): its 'tools' is not JSON"), msg
    tools = _jsonl(tmp_path / "tools2.jsonl", [{**_row(), "tools": "{\"a\": 1}"}])
    assert _error(tools, tok).startswith(f"row 0 of {tools} (counted from 0): its 'tools' is a dict; expected a list")
    broken = embedded.build_tokenizer()
    broken.chat_template = "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}"
    msg = _error(good, broken)
    assert msg.startswith(f"row 0 of {good} (counted from 0): the chat template cannot render its prompt"), msg


def test_rows_with_images_that_do_not_match_are_named_by_their_file_and_index(tmp_path):
    from tests.test_dataset_multimodal import StubProcessor, _image

    proc, img = StubProcessor(), _image(tmp_path)
    ok = {"prompt": "<image> 1", "images": [img], "data_source": "d", "reward_model": {"ground_truth": "1"}}
    path = _jsonl(tmp_path / "img.jsonl", [ok, {**ok, "prompt": "<image> <image> 1"}])
    msg = _error(path, proc.tokenizer, max_prompt_length=512, processor=proc)
    assert msg.startswith(f"row 1 of {path} (counted from 0): its 'images': the prompt has 2 <image>"), msg
    msg = _error(path, proc.tokenizer, max_prompt_length=512)
    assert msg.startswith(f"row 0 of {path} (counted from 0): its 'images': the row has images but"), msg


@pytest.mark.parametrize("bad, why", [
    ({"prompt": None}, "no 'prompt' value"), ({"prompt": ""}, "an empty 'prompt'"),
    ({"prompt": []}, "an empty 'prompt'"),
    ({"reward_model": {}}, "no 'reward_model.ground_truth' value"),
    ({"reward_model": {"ground_truth": ""}}, "an empty 'reward_model.ground_truth'"),
    ({"prompt": [{"role": "user"}]}, "chat message 0 of its 'prompt' lacks its role")])
def test_skipped_rows_name_the_first_one_with_its_file_index_and_reason(tmp_path, tok, caplog, bad, why):  # noqa: F811
    good = _jsonl(tmp_path / "good.jsonl", [_row()])
    path = _jsonl(tmp_path / "d.jsonl", [_row(), {**_row(), **bad}, {**_row(), **bad}])
    with caplog.at_level("WARNING", logger="trainer.dataset"):
        ds = PromptDataset([good, path], tok, max_prompt_length=16)
    assert ds.num_invalid == 2
    assert "skipped 2 rows" in caplog.text and f"the first: row 1 of {path} (counted from 0): {why}" in caplog.text
    only_bad = _jsonl(tmp_path / "bad.jsonl", [{**_row(), **bad}])
    msg = _error(only_bad, tok)
    assert msg.startswith("no usable rows") and f"the first of these: row 0 of {only_bad} (counted from 0): {why}" \
        in msg, msg


def test_a_later_file_without_a_column_is_named(tmp_path, tok):  # noqa: F811
    good = _jsonl(tmp_path / "good.jsonl", [_row()])
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "1 ?", "data_source": "d"}])
    msg = _error([good, bad], tok)
    assert msg.startswith(f"data file {bad!r}: its rows lack column(s) ['reward_model']"), msg
