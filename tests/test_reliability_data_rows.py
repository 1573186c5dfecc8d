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
    empty_system = [{"role": "system", "content": ""}, {"role": "user", "content": "last of 4 ?"}]
    image_only = [{"role": "user", "content": [{"type": "image"}]}]  # a part that is not text counts as content
    rows = [_row(), {**_row(), "prompt": chat}, {**_row(), "prompt": "last of 3 ?"},
            {**_row(), "prompt": empty_system}]
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, max_prompt_length=32)
    assert len(ds) == 4 and ds.num_invalid == 0
    from trainer.data_rows import row_problem

    assert row_problem({**_row(), "prompt": image_only}) is None


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
    msg = _error(tools, tok)
    assert msg.startswith(f"row 0 of {tools} (counted from 0): its 'tools' is a dict ({{'a': 1}}); expected a list"), msg
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
    ({"prompt": [{"role": "user"}]}, "chat message 0 of its 'prompt' lacks its role"),
    ({"prompt": "   "}, "an empty 'prompt'"),
    ({"prompt": [{"role": "usr", "content": "last of 1 ?"}]}, "chat message 0 of its 'prompt' has the role 'usr', "
     "expected one of ['system', 'developer', 'user', 'assistant', 'model', 'tool', 'function', 'ipython']"),
    ({"prompt": [{"role": "system", "content": ""}, {"role": "user", "content": " \n"}]},
     "every chat message of its 'prompt' has empty content"),
    ({"prompt": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
     "every chat message of its 'prompt' has empty content")])
def test_skipped_rows_name_the_first_one_with_its_file_index_and_reason(tmp_path, tok, caplog, bad, why):  # noqa: F811
    good = _jsonl(tmp_path / "good.jsonl", [_row()])
    path = _jsonl(tmp_path / "d.jsonl", [_row(), {**_row(), **bad}, {**_row(), **bad}])
    with caplog.at_level("WARNING", logger="trainer.dataset"):
        ds = PromptDataset([good, path], tok, max_prompt_length=16)
    assert ds.num_invalid == 2
    assert "skipped 2 unusable rows" in caplog.text and f"the first: row 1 of {path} (counted from 0): {why}" in caplog.text
    only_bad = _jsonl(tmp_path / "bad.jsonl", [{**_row(), **bad}])
    msg = _error(only_bad, tok)
    assert msg.startswith("no usable rows") and f"the first of these: row 0 of {only_bad} (counted from 0): {why}" \
        in msg, msg


def test_a_later_file_without_a_column_is_named(tmp_path, tok):  # noqa: F811
    good = _jsonl(tmp_path / "good.jsonl", [_row()])
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "1 ?", "data_source": "d"}])
    msg = _error([good, bad], tok)
    assert msg.startswith(f"data file {bad!r}: its rows lack column(s) ['reward_model']"), msg


BAD_TYPES = [  # (what row 1 of three gets, what happens to it, what the message says)
    ({"prompt": "last of 1 ?"}, "kept", None),  # a plain-string prompt is tokenised without the chat template
    ({"prompt": 5}, "skipped", "its 'prompt' is an int (5), expected a list of chat messages or a string"),
    ({"prompt": True}, "skipped", "its 'prompt' is a bool (True), expected a list of chat messages"),
    ({"prompt": {"role": "user", "content": "last of 1 ?"}}, "skipped",
     "its 'prompt' is a dict ({'role': 'user', 'content': 'last of 1 ?'}), expected a list of chat messages"),
    ({"prompt": ["last of 1 ?"]}, "skipped",
     "chat message 0 of its 'prompt' is a str ('last of 1 ?'), expected a mapping with a role and content"),
    ({"reward_model": "one"}, "skipped",  # (datasets reads the string "1" here back as the number 1)
     "its 'reward_model' is a str ('one'), expected a mapping with a 'ground_truth'"),
    ({"reward_model": ["1"]}, "skipped", "its 'reward_model' is a list (['1']), expected a mapping"),
    ({"reward_model": 1}, "skipped", "its 'reward_model' is an int (1), expected a mapping"),
    ({"reward_model": {"ground_truth": 1}}, "kept", None),  # a ground truth goes to the scorer as it is
    ({"reward_model": {"ground_truth": 1.5}}, "kept", None),
    ({"reward_model": {"ground_truth": ["1", "one"]}}, "kept", None),
    ({"reward_model": {"ground_truth": {"answer": "1"}}}, "kept", None),
    ({"reward_model": {"ground_truth": []}}, "skipped", "an empty 'reward_model.ground_truth' ([])"),
    ({"extra_info": "hello"}, "skipped", "its 'extra_info' is a str ('hello'), expected a mapping (or no value)"),
    ({"extra_info": [1, 2]}, "skipped", "its 'extra_info' is a list ([1, 2]), expected a mapping"),
    ({"extra_info": 3}, "skipped", "its 'extra_info' is an int (3), expected a mapping"),
    ({"extra_info": None}, "kept", None),
    ({"data_source": 3}, "refused", "has data_source=3 (int), not a scorer name"),  # by the reward-key check
    ({"data_source": ["a"]}, "refused", "has data_source=['a'] (list), not a scorer name"),
    ({"images": "x.png"}, "refused", "its 'images' is a str ('x.png'); expected a list of images"),
    ({"images": {"path": "x.png"}}, "refused", "its 'images' is a dict ({'path': 'x.png'}); expected a list of images"),
    ({"images": 5}, "refused", "its 'images' is an int (5); expected a list of images"),
    ({"tools": {"type": "function"}}, "refused", "its 'tools' is a dict ({'type': 'function'}); expected a list of"),
    ({"tools": 5}, "refused", "its 'tools' is an int (5); expected a list of function definitions"),
    ({"tools": ["f"]}, "refused", "its 'tools' is a list (['f']); expected a list of function definitions"),
    ({"tools": "not json"}, "refused", "its 'tools' is not JSON"),
    ({"prompt": "last of 1 ?", "tools": 5}, "refused", "its 'tools' is an int (5)"),  # checked for plain prompts too
    ({"extra_info": "hello", "reward_model": {"style": "rule"}}, "skipped",  # every problem of the row is named
     "no 'reward_model.ground_truth' value; its 'extra_info' is a str ('hello'), expected a mapping"),
]


@pytest.mark.parametrize("change, outcome, why", BAD_TYPES, ids=[f"{'+'.join(c)}={list(c.values())[-1]!r}"
                                                                   for c, _, _ in BAD_TYPES])
def test_a_field_of_an_unexpected_type_works_or_is_named_with_its_type(tmp_path, tok, caplog, change, outcome,
                                                                        why):  # noqa: F811
    """Each per-row field of an unexpected type (a string for a list or a mapping, a number, a list for a mapping)
    either works, or the row is skipped (the fields whose other problems skip the row: prompt, reward_model and its
    ground truth, extra_info) or refused (those whose problems are refused: data_source by the reward-key check,
    images, tools), the message naming the row, the field, its type and what was expected."""
    from trainer.data_rows import check_reward_key

    path = _jsonl(tmp_path / "d.jsonl", [_row(), {**_row(), **change}, _row()])
    place = f"row 1 of {path} (counted from 0): "
    if outcome == "refused":
        with pytest.raises(DataError) as info:
            check_reward_key(PromptDataset(path, tok, max_prompt_length=16), "data_source")
        assert why in str(info.value) and "row 1 of " in str(info.value) and "\n" not in str(info.value), info.value
        return
    with caplog.at_level("WARNING", logger="trainer.dataset"):
        ds = PromptDataset(path, tok, max_prompt_length=16)
    if outcome == "kept":
        assert (len(ds), ds.num_invalid) == (3, 0) and "skipped" not in caplog.text
        assert {k: v for k, v in ds.rows[1].items() if k != "input_ids"} == {**_row(), **change}
        check_reward_key(ds, "data_source")
    else:
        assert (len(ds), ds.num_invalid) == (2, 1) and f"the first: {place}{why}" in caplog.text, caplog.text


def _big_jsonl(path, rows, tail):
    """``rows`` copies of the embedded task's row (about 200 bytes each: 2240 of them span two blocks of the JSON
    reader) and the text ``tail``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in embedded.make_rows(rows, seed=0)) + tail, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("rows, tail, why", [
    (2240, '{"data_source": "synthetic/digits", "prompt": [{"role": "us',
     "row 2240 of {p} (counted from 0), line 2241 of the file, is cut short (truncated JSON: Unterminated string"),
    (2240, '{"prompt": [ broken\n' + json.dumps(_row()) + "\n",
     "row 2240 of {p} (counted from 0), line 2241 of the file, is not JSON (Expecting value at column 14)"),
    (2000, "\n\n[1, 2]\n", "row 2000 of {p} (counted from 0), line 2003 of the file, is a list ([1, 2]), expected a "
                           "JSON object")])
def test_a_broken_jsonl_line_is_named_by_its_row_and_line_in_a_file_of_several_blocks(tmp_path, tok, caplog, rows,
                                                                                       tail, why):  # noqa: F811
    """The JSON reader counts its error's row within a block of the file (``row 718`` for the cut-short line 2241);
    the error names the row counted from 0 in the whole file, its line (blank lines are not rows) and what is wrong,
    in one line, and the reader's own log line with its block's row is not shown."""
    path = _big_jsonl(tmp_path / "big.jsonl", rows, tail)
    with caplog.at_level("ERROR"):
        msg = _error(path, tok)
    assert msg.startswith(why.format(p=path)) and msg.endswith("; fix or remove that line"), msg
    assert "row 718" not in caplog.text and "Failed to load JSON" not in caplog.text, caplog.text


def test_reading_local_files_does_not_reach_the_network(tmp_path, tok, monkeypatch):  # noqa: F811
    """``datasets.load_dataset`` of a local file sent a download count to the Hub (a HEAD request): without a
    network its name lookup held the load for 5 s now and then; the dataset reads its files without it."""
    import datasets.load

    asked = []  # the library catches the error of a failed request
    monkeypatch.setattr(datasets.load, "get_session", lambda: asked.append("the Hub"))
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", [_row()]), tok, max_prompt_length=16)
    assert len(ds) == 1 and asked == [] and datasets.config.HF_UPDATE_DOWNLOAD_COUNTS is True


def test_content_given_as_text_parts_is_the_same_prompt_as_its_text(tmp_path, tok):  # noqa: F811
    """A chat message whose content is a list of text parts (``[{"type": "text", "text": ...}]``) was rendered by a
    text-only template as the list's Python text (``"last of 6 ?"`` became 8 tokens of ``<unk>`` and brackets): its
    text parts are joined into one string, as templates that take parts render them; a part that is not text in a
    row without images is refused, naming the row, the message and the part."""
    parts = {**_row(), "prompt": [{"role": "user", "content": [{"type": "text", "text": "last of "},
                                                               {"type": "text", "text": "1 ?"}]}]}
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", [_row(), parts]), tok, max_prompt_length=16)
    assert ds.rows[1]["input_ids"] == ds.rows[0]["input_ids"]
    assert ds.rows[1]["prompt"] == parts["prompt"]  # the row itself is kept as it was
    image = {**_row(), "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "1"}]}]}
    path = _jsonl(tmp_path / "image.jsonl", [_row(), image])
    message = _error(path, tok)
    assert message.startswith(f"row 1 of {path} (counted from 0): chat message 0 of its 'prompt' has the content "
                              "part {'type': 'image'}, not a text part"), message


def test_plain_string_prompts_are_warned_once_when_the_tokenizer_has_a_chat_template(tmp_path, tok,  # noqa: F811
                                                                                      caplog):
    """A plain-string prompt is tokenised without the chat template (as documented), which the model then never
    sees in training: one warning per data set, with the count; none for chat messages or a tokenizer without one."""
    from types import SimpleNamespace

    from trainer.data_rows import plain_prompt_note

    rows = [{**_row(), "prompt": "last of 1 ?"}, _row(), {**_row(), "prompt": "last of 2 ?"}]
    with caplog.at_level("WARNING", logger="trainer.dataset"):
        PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, max_prompt_length=16)
        PromptDataset(_jsonl(tmp_path / "chat.jsonl", [_row(), _row()]), tok, max_prompt_length=16)
    lines = [r.getMessage() for r in caplog.records if "plain strings" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("data: 2 of 3 prompts ('prompt') are plain strings, tokenised "
                                                   "without the tokenizer's chat template"), lines
    assert "d.jsonl" in lines[0]
    assert plain_prompt_note(rows, "prompt", SimpleNamespace(chat_template=None)) is None
