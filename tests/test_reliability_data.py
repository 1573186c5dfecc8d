"""Bad data: empty files, unusable rows (skipped and counted), non-UTF-8 text, overlong prompts, duplicated uids,
parquet files with extra or missing columns."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer import embedded
from trainer.dataset import DataError, PromptDataset, collate_prompts


@pytest.fixture(scope="module")
def tok():
    return embedded.build_tokenizer()


def _row(content="last of 1 ?", gt="1", **extra):
    return {"data_source": "synthetic/digits", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": gt}, **extra}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_empty_file_names_the_path(tmp_path, tok):
    p = tmp_path / "empty.parquet"
    p.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.parquet' is empty"):
        PromptDataset(str(p), tok, max_prompt_length=16)


def test_parquet_with_columns_but_no_rows_says_so(tmp_path, tok):
    import datasets

    p = tmp_path / "zero.parquet"
    datasets.Dataset.from_dict({"prompt": [], "reward_model": []}).to_parquet(str(p))
    with pytest.raises(DataError, match=r"zero\.parquet' has no rows"):
        PromptDataset(str(p), tok, max_prompt_length=16)


def test_rows_without_prompt_or_ground_truth_are_skipped_and_counted(tmp_path, tok):
    rows = [_row(), {**_row(), "prompt": []}, _row(gt=""), {**_row(), "reward_model": {}}, _row("last of 2 ?", "2"),
            {**_row(), "reward_model": None}]
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, max_prompt_length=16)
    assert (len(ds), ds.num_invalid, ds.num_filtered) == (2, 4, 0)
    assert [r["reward_model"]["ground_truth"] for r in ds.rows] == ["1", "2"]
    with pytest.raises(DataError, match=r"no usable rows.*2 read, 0 longer.*2 without a prompt or ground truth"):
        PromptDataset(_jsonl(tmp_path / "bad.jsonl", rows[1:3]), tok, max_prompt_length=16)


def test_non_utf8_text_names_the_file(tmp_path, tok):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(json.dumps(_row()).encode() + b"\n" + '{"prompt": "last of \xe9 2 ?", "reward_model": '
                  '{"ground_truth": "2"}}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.jsonl' is not valid UTF-8"):
        PromptDataset(str(p), tok, max_prompt_length=16)


def test_overlong_prompts_are_counted(tmp_path, tok):
    rows = [_row(), _row(" ".join(["3"] * 30)), _row(" ".join(["4"] * 15)), _row("last of 5 ?", "5")]
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, max_prompt_length=16)
    # chat template adds "=>": 31 and 16 tokens; 16 fits exactly, 31 does not
    assert (len(ds), ds.num_filtered) == (3, 1)
    assert max(len(r["input_ids"]) for r in ds.rows) == 16


def test_parquet_with_extra_columns_keeps_them_and_missing_columns_are_named(tmp_path, tok):
    rows = [_row("last of 1 ?", "1", uid="a", difficulty=3), _row("last of 2 ?", "2", uid="a", difficulty=5)]
    path = str(tmp_path / "extra.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = PromptDataset(path, tok, max_prompt_length=16)
    batch = collate_prompts(ds.rows, tok.pad_token_id)
    assert list(batch["difficulty"]) == [3, 5] and list(batch["uid"]) == ["a", "a"]
    missing = str(tmp_path / "missing.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "last of 1 ?", "data_source": "x"}]), missing)
    with pytest.raises(DataError, match=r"lack column\(s\) \['reward_model'\]"):
        PromptDataset(missing, tok, max_prompt_length=16)
    no_prompt = str(tmp_path / "no_prompt.parquet")
    pq.write_table(pa.Table.from_pylist([{"question": "q", "reward_model": {"ground_truth": "1"}}]), no_prompt)
    with pytest.raises(DataError, match=r"lack column\(s\) \['prompt'\]"):
        PromptDataset(no_prompt, tok, max_prompt_length=16)


def test_duplicated_uids_in_the_data_do_not_merge_groups(tmp_path, tok):
    """The trainer gives every prompt of a step its own uid (GRPO groups are formed by uid), whatever the file says."""
    from trainer.ppo_trainer import RayPPOTrainer

    rows = [_row(f"last of {i} ?", str(i), uid="dup") for i in range(4)]
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, max_prompt_length=16)
    batch = collate_prompts(ds.rows, tok.pad_token_id)
    seen = {}

    class Stop(Exception):
        pass

    class FakeGroup:
        def dispatch_all(self, method, data):
            seen["uid"] = list(data["uid"])
            raise Stop

    from tests.e2e_utils import resolved_config
    from trainer.dataset import PromptLoader

    tr = RayPPOTrainer(resolved_config("trainer.seed=1"), tok, PromptLoader(ds, 4, tok.pad_token_id), None, None, None)
    tr.global_step = 3
    tr.roles.attach("actor", FakeGroup())
    with pytest.raises(Stop):
        tr.train_step(batch, {})
    assert seen["uid"] == ["3-0", "3-1", "3-2", "3-3"]


def test_p21_verls_middle_truncation_keeps_both_ends_and_a_bad_value_is_refused_before_start_up(tmp_path, tok):
    from trainer.config_checks import ConfigError
    from trainer.config.data import DataConfig
    from trainer.data_rows import truncate_prompt

    ids = list(range(10))
    assert truncate_prompt(ids, 5, "middle") == [0, 1, 7, 8, 9]  # verl: first max//2, last max - max//2
    assert truncate_prompt(ids, 4, "middle") == [0, 1, 8, 9]
    assert truncate_prompt(ids, 4, "left") == [6, 7, 8, 9] and truncate_prompt(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_prompt(ids, 10, "middle") == ids
    long_row = _row(" ".join(["3"] * 30))
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", [long_row]), tok, max_prompt_length=16,
                       filter_overlong_prompts=False, truncation="middle")
    full = PromptDataset(_jsonl(tmp_path / "e.jsonl", [long_row]), tok, max_prompt_length=64).rows[0]["input_ids"]
    assert ds.rows[0]["input_ids"] == full[:8] + full[-8:]
    from tests.verl_scripts import composed

    cfg = composed(["data.truncation=middel"])[2]
    with pytest.raises(ConfigError, match=r"^data.truncation='middel'; expected one of error, left, right, middle$"):
        DataConfig.from_dict(cfg["data"], "data").check("data")


def test_the_batch_carries_the_chat_messages_of_a_non_default_prompt_key(tmp_path, tok):
    """``raw_prompt`` is the ``data.prompt_key`` column (it was read from ``prompt`` only: None for every row)."""
    rows = [{"question": [{"role": "user", "content": f"last of {i} ?"}], "data_source": "digits",
             "reward_model": {"ground_truth": str(i)}} for i in (1, 2)]
    ds = PromptDataset(_jsonl(tmp_path / "q.jsonl", rows), tok, max_prompt_length=16, prompt_key="question")
    batch = collate_prompts(ds.rows, tok.pad_token_id, ds.prompt_key)
    assert list(batch["raw_prompt"]) == [r["question"] for r in rows] and "question" not in batch.non_tensor
    from trainer.dataset import PromptLoader

    loader = PromptLoader(ds, batch_size=2, pad_token_id=tok.pad_token_id, shuffle=False)
    assert list(loader.next_batch()[0]["raw_prompt"]) == [r["question"] for r in rows]
