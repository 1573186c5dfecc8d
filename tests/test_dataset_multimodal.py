"""verl's multimodal rows (an images column, ``<image>`` placeholders) through PromptDataset and a processor."""
import copy
import json

import pytest
import torch

from trainer.dataset import DataError, PromptDataset, collate_prompts
from trainer.embedded import build_tokenizer


class StubProcessor:
    """Expands every image into 100 tokens (id 3); text words are tokenised by the embedded tokenizer."""

    def __init__(self):
        self.tokenizer = build_tokenizer()

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        parts = [c["text"] if c["type"] == "text" else "<img>" for m in messages for c in m["content"]]
        return " ".join(parts)

    def __call__(self, text, images=None, return_tensors="pt"):
        ids = []
        for word in text[0].split():
            ids += [3] * 100 if word == "<img>" else self.tokenizer(word, add_special_tokens=False)["input_ids"]
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                "pixel_values": torch.zeros(len(images or []) * 4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])}


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _image(tmp_path):
    from PIL import Image

    p = tmp_path / "a.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(p)
    return str(p)


def test_p21_image_tokens_count_toward_the_prompt_length_filter(tmp_path):
    words = " ".join(["1"] * 10)  # 10 text tokens
    rows = [{"prompt": [{"role": "user", "content": f"<image> {words}"}], "images": [_image(tmp_path)],
             "data_source": "d", "reward_model": {"ground_truth": "1"}},
            {"prompt": [{"role": "user", "content": words}], "images": [],
             "data_source": "d", "reward_model": {"ground_truth": "2"}}]
    original = copy.deepcopy(rows)
    proc = StubProcessor()
    ds = PromptDataset(_write(tmp_path / "t.jsonl", rows), proc.tokenizer, max_prompt_length=64, processor=proc)
    assert len(ds) == 1 and ds.num_filtered == 1                       # 10 + 100 image tokens > 64: dropped
    assert ds[0]["reward_model"]["ground_truth"] == "2"                # the text-only row is kept
    for i in range(len(ds)):
        kept = {k: v for k, v in ds.rows[i].items() if k != "input_ids"}
        assert kept == original[1]                                     # rows are not changed by the filter
        assert len(ds.prompt_ids(kept)) == len(ds[i]["input_ids"])     # the filter's length is the kept length
    assert len(ds.prompt_ids(original[0])) == 110 and original == rows


def test_colour_task_rows_through_the_tiny_vlm_processor(tmp_path):
    from trainer.embedded_vlm import build_vlm_processor, write_colour_task

    proc = build_vlm_processor()
    train, _ = write_colour_task(str(tmp_path / "data"), train_rows=4, val_rows=1)
    ds = PromptDataset(train, proc.tokenizer, max_prompt_length=64, processor=proc)
    row = ds[0]
    image_id = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert row["input_ids"].count(image_id) == 4                       # 56 x 56 pixels, 28 x 28 per token
    mm = row["multi_modal_inputs"]
    assert mm["pixel_values"].shape == (16, 3 * 2 * 14 * 14) and mm["image_grid_thw"].tolist() == [[1, 4, 4]]
    batch = collate_prompts([ds[i] for i in range(2)], proc.tokenizer.pad_token_id)
    assert len(batch.non_tensor["multi_modal_inputs"]) == 2
    # 19 tokens with the 4 image tokens (16 if an image counted as one): none fits 18
    with pytest.raises(DataError, match="4 longer than data.max_prompt_length=18"):
        PromptDataset(train, proc.tokenizer, max_prompt_length=18, processor=proc)


def test_bad_multimodal_rows_name_the_problem(tmp_path):
    proc = StubProcessor()
    img = _image(tmp_path)
    two = [{"prompt": "<image> <image> 1", "images": [img], "data_source": "d", "reward_model": {"ground_truth": "1"}}]
    with pytest.raises(DataError, match=r"2 <image> placeholder\(s\) but the row has 1 image"):
        PromptDataset(_write(tmp_path / "a.jsonl", two), proc.tokenizer, 512, processor=proc)
    one = [{"prompt": "<image> 1", "images": [img], "data_source": "d", "reward_model": {"ground_truth": "1"}}]
    with pytest.raises(DataError, match="the row has images but the model has no processor"):
        PromptDataset(_write(tmp_path / "b.jsonl", one), proc.tokenizer, 512)


def test_image_paths_relative_to_the_data_file_load_from_any_folder_and_a_missing_one_names_the_row(tmp_path,
                                                                                                     monkeypatch):
    """The colour task written from one folder and trained from another stopped with a bare ``[Errno 2]``."""
    import json

    from trainer.embedded_vlm import build_vlm_processor, write_colour_task

    proc = build_vlm_processor()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    train, _ = write_colour_task("vlm_data", train_rows=2, val_rows=1)
    first = json.loads(open(train).readline())
    assert first["images"] == ["images/s0_0.png"]  # relative to the data file, not to the folder it was written from
    monkeypatch.chdir(tmp_path / "b")
    ds = PromptDataset(str(tmp_path / "a" / train), proc.tokenizer, max_prompt_length=64, processor=proc)
    assert ds.rows[0]["images"] == [str(tmp_path / "a" / "vlm_data" / "images" / "s0_0.png")]
    assert ds[0]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    rows = [{**first, "images": ["images/none.png"]}, {**first, "images": [{"path": "images/s0_1.png"}]}]
    path = _write(tmp_path / "a" / "vlm_data" / "c.jsonl", [rows[1]])
    assert PromptDataset(path, proc.tokenizer, max_prompt_length=64, processor=proc).rows[0]["images"] == \
        [{"path": str(tmp_path / "a" / "vlm_data" / "images" / "s0_1.png")}]  # a {'path'} dict too
    verl = [{**first, "images": [{"image": "images/s0_0.png"}]}, {**first, "images": ["file://images/s0_1.png"]}]
    ds = PromptDataset(_write(tmp_path / "a" / "vlm_data" / "v.jsonl", verl), proc.tokenizer, max_prompt_length=64,
                       processor=proc)  # verl's {"image": path} and file:// paths
    assert ds.rows[0]["images"] == [{"image": str(tmp_path / "a" / "vlm_data" / "images" / "s0_0.png")}]
    assert ds.rows[1]["images"] == [str(tmp_path / "a" / "vlm_data" / "images" / "s0_1.png")]
    assert ds[1]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    path = _write(tmp_path / "a" / "vlm_data" / "d.jsonl", rows)
    with pytest.raises(DataError, match=r"^row 0 of .*d\.jsonl \(counted from 0\): its 'images': the image file "
                                        r"'images/none.png' is not there \(a relative path is read from the data "
                                        r"file's folder, else from the working folder .*b\)$"):
        PromptDataset(path, proc.tokenizer, max_prompt_length=64, processor=proc)
