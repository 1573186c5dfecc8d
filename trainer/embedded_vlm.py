"""A tiny vision-language setup the project builds itself (no download): a word-level tokenizer with Qwen2-VL's
vision tokens, its processor (transformers' ``Qwen2VLImageProcessorPil`` inside
:class:`trainer.multimodal.ImageTextProcessor`), a random ``Qwen2VLForConditionalGeneration`` and a generated
image task.

The task ("synthetic/colour"): a 56 x 56 picture of one coloured square on grey, and the prompt
``<image> which colour is the square ? red 0 green 1 blue 2``; the answer is the square's number, scored by the
GSM8K flexible rule (the last number of the response; ``reward_model.scorer=gsm8k_flexible``). A random model
answers right about 1 time in 10 (it may also say another digit or a word).
"""
from __future__ import annotations

import os
import random

from trainer.embedded import DIGITS, write_task

TASK_NAME = "synthetic/colour"
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}
VISION = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
SPECIAL = ["<pad>", "<eos>", "<unk>"]
WORDS = ["which", "colour", "is", "the", "square", "?", "=>", *COLOURS]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }} {% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|> <|image_pad|> <|vision_end|> "
    "{% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}=>{% endif %}"
)
IMAGE_SIZE = 56


def build_vlm_processor(save_dir: str | None = None):
    """Tokenizer (ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, the vision tokens, digits, words) and processor
    (28 x 28 pixels per image token: a 56 x 56 image gives 4); saved to ``save_dir`` when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from trainer.multimodal import ImageTextProcessor

    vocab = {t: i for i, t in enumerate(SPECIAL + VISION + DIGITS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                 additional_special_tokens=VISION)
    hf.chat_template = CHAT_TEMPLATE
    images = Qwen2VLImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 16}, patch_size=14,
                                      merge_size=2, temporal_patch_size=2)
    proc = ImageTextProcessor(images, hf)
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
        proc.save_pretrained(save_dir)
    return proc


def tiny_vlm_config(tokenizer, hidden_size: int = 32, num_hidden_layers: int = 2, num_attention_heads: int = 4,
                    num_key_value_heads: int = 2, intermediate_size: int = 64, vision_depth: int = 1):
    """A tiny ``Qwen2VLConfig`` (M-RoPE sections sum to half the head dim) for ``tokenizer``'s vocabulary."""
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION}
    head = hidden_size // num_attention_heads
    section = [head // 8, head // 8, head // 2 - 2 * (head // 8)]
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                num_key_value_heads=num_key_value_heads, max_position_embeddings=256, bos_token_id=None,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": 10000.0})
    vision = dict(depth=vision_depth, embed_dim=hidden_size, hidden_size=hidden_size, num_heads=2, mlp_ratio=2,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    return Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                         video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"], eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)


def write_tiny_vlm(out_dir: str, seed: int = 0) -> str:
    """Save the tokenizer, processor and a random tiny Qwen2-VL into ``out_dir``; returns it."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    proc = build_vlm_processor(out_dir)
    with torch.random.fork_rng(devices=[]):  # drawn from ``seed``; the caller's stream is left as it was
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(tiny_vlm_config(proc.tokenizer))
    model.save_pretrained(out_dir)
    from trainer.checkpoint.atomic import give_umask_modes

    give_umask_modes(out_dir)  # safetensors writes its weights 0600
    return out_dir


def make_colour_rows(num_rows: int, seed: int, image_dir: str, relative_to: str | None = None) -> list[dict]:
    """Rows in verl's multimodal layout; each image is written as a PNG into ``image_dir``, and named in its row by
    its path relative to ``relative_to`` (the data files' folder, which relative image paths are read from:
    :class:`trainer.dataset.PromptDataset`), or as joined when None."""
    from PIL import Image

    rng = random.Random(seed)
    os.makedirs(image_dir, exist_ok=True)
    rows = []
    for i in range(num_rows):
        name = rng.choice(list(COLOURS))
        img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (128, 128, 128))
        x, y = rng.randint(0, IMAGE_SIZE - 24), rng.randint(0, IMAGE_SIZE - 24)
        img.paste(COLOURS[name], (x, y, x + 24, y + 24))
        path = os.path.join(image_dir, f"s{seed}_{i}.png")
        img.save(path)
        rows.append({"data_source": TASK_NAME, "images": [os.path.relpath(path, relative_to) if relative_to else path],
                     "prompt": [{"role": "user", "content": "<image> which colour is the square ? red 0 green 1 blue 2"}],
                     "reward_model": {"style": "rule", "ground_truth": str(list(COLOURS).index(name))},
                     "extra_info": {"index": i, "colour": name}})
    return rows


def write_colour_task(out_dir: str, train_rows: int = 256, val_rows: int = 32, seed: int = 0) -> tuple[str, str]:
    """Write ``train.jsonl`` / ``val.jsonl`` (and their images, under ``images/``) of the colour task; returns the
    two paths."""
    images = os.path.join(out_dir, "images")
    return write_task(out_dir, train_rows, val_rows, seed, make=lambda n, s: make_colour_rows(n, s, images, out_dir))
