"""Prompt dataset: verl's column layout, the overlong filter (case P21, text-only part), loader resumption."""
import copy
import json

import pytest

from trainer import embedded
from trainer.dataset import DataError, PromptDataset, PromptLoader, collate_prompts


@pytest.fixture(scope="module")
def tok():
    return embedded.build_tokenizer()


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _row(content, gt="1", **extra):
    return {"data_source": "synthetic/digits", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": gt}, **extra}


def test_p21_overlong_filter_counts_and_keeps_rows_unchanged(tmp_path, tok):
    short = _row("last of 1 ?")                      # 5 tokens with the template
    long = _row(" ".join(["1"] * 70))                # 72 tokens
    raw = [short, long, _row("last of 2 3 ?", gt="3")]
    path = _write(tmp_path / "d.jsonl", raw)
    before = copy.deepcopy(raw)
    ds = PromptDataset(path, tok, max_prompt_length=64)
    assert len(ds) == 2 and ds.num_filtered == 1
    for row in ds.rows:
        ids = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"]
        assert len(row["input_ids"]) == len(ids) <= 64           # the filter length is the collated length
        src = next(r for r in before if r["prompt"] == row["prompt"])
        assert {k: v for k, v in row.items() if k != "input_ids"} == src  # rows are unchanged by filtering
    assert raw == before                                          # the caller's rows were not mutated
    batch = collate_prompts(ds.rows, tok.pad_token_id)
    assert batch["input_ids"].shape[1] == max(len(r["input_ids"]) for r in ds.rows)


def test_truncation_modes_and_errors(tmp_path, tok):
    path = _write(tmp_path / "d.jsonl", [_row(" ".join(["1"] * 20))])
    with pytest.raises(DataError, match="max_prompt_length"):
        PromptDataset(path, tok, max_prompt_length=8, filter_overlong_prompts=False, truncation="error")
    ds = PromptDataset(path, tok, max_prompt_length=8, filter_overlong_prompts=False, truncation="left")
    assert len(ds.rows[0]["input_ids"]) == 8 and ds.rows[0]["input_ids"][-1] == tok.convert_tokens_to_ids("=>")
    with pytest.raises(DataError, match="no usable rows"):
        PromptDataset(path, tok, max_prompt_length=8)


def test_missing_and_empty_files_name_the_path(tmp_path, tok):
    with pytest.raises(DataError, match="does not exist"):
        PromptDataset(str(tmp_path / "nope.parquet"), tok, max_prompt_length=8)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="is empty"):
        PromptDataset(str(empty), tok, max_prompt_length=8)
    path = _write(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}])
    with pytest.raises(DataError, match="lack column"):
        PromptDataset(path, tok, max_prompt_length=8)


def test_rows_without_ground_truth_are_skipped_and_counted(tmp_path, tok):
    rows = [_row("last of 1 ?"), {"data_source": "x", "prompt": [{"role": "user", "content": "last of 2 ?"}],
                                  "reward_model": {"ground_truth": ""}}]
    ds = PromptDataset(_write(tmp_path / "d.jsonl", rows), tok, max_prompt_length=16)
    assert len(ds) == 1 and ds.num_invalid == 1


def test_loader_state_resumes_the_same_batches(tmp_path, tok):
    path = _write(tmp_path / "d.jsonl", embedded.make_rows(40, seed=3))
    ds = PromptDataset(path, tok, max_prompt_length=16)
    a = PromptLoader(ds, batch_size=8, pad_token_id=0, shuffle=True, seed=7)
    seen = [a.next_batch()[0]["input_ids"] for _ in range(3)]
    state = a.state_dict()
    rest = [a.next_batch()[0]["input_ids"] for _ in range(4)]       # crosses into epoch 1
    b = PromptLoader(ds, batch_size=8, pad_token_id=0, shuffle=True, seed=7)
    b.load_state_dict(state)
    again = [b.next_batch()[0]["input_ids"] for _ in range(4)]
    assert all((x == y).all() for x, y in zip(rest, again))
    assert not all((x == y).all() for x, y in zip(seen, rest[:3]))
