"""Image prompts for vision-language models: verl's row layout turned into processor inputs, and the processor.

A row's prompt (chat messages, or a string) marks images with ``<image>`` placeholders in its text; its images
column holds one image per placeholder. :func:`image_messages` turns that into Hugging Face content lists
(``[{"type": "image"}, {"type": "text", "text": ...}]``), :func:`image_prompt_inputs` runs the processor on them:
its chat template, then ``processor(text=[...], images=[...])``, which expands every image into its vision tokens
(Qwen2-VL: ``grid_t * grid_h * grid_w / merge_size**2`` image-pad tokens).

:func:`load_processor` loads a model folder's processor with ``transformers.AutoProcessor``. Where transformers
cannot build one (transformers 5 builds Qwen2-VL's processor only with torchvision installed, for its video
processor), :class:`ImageTextProcessor` composes the folder's image processor and tokenizer with the same token
expansion.
"""
from __future__ import annotations

import copy
import io
import json
import os
import re
from typing import Any, Sequence

import torch

from rollout.base import concat_image_inputs as concat_multi_modal_inputs  # noqa: F401 (re-exported)

IMAGE_PLACEHOLDER = "<image>"


def load_image(x: Any):
    """A PIL RGB image from a PIL image, a ``{"bytes": ..., "path": ...}`` dict (``datasets``' Image feature), an
    ``{"image": path}`` dict (verl's and qwen-vl-utils' layout), a file path (``file://`` too) or raw encoded bytes.

    Raises:
        ValueError: anything else (names its type), a path that is not a file or bytes that are not an image.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(x, dict):  # datasets' Image feature; verl's / qwen-vl-utils' {"image": path}
        x = x.get("bytes") or x.get("path") or x.get("image")
    if isinstance(x, str) and x.startswith("file://"):
        x = x[len("file://"):]
    try:
        if isinstance(x, (bytes, bytearray)):
            x = Image.open(io.BytesIO(x))
        elif isinstance(x, str):
            if not os.path.isfile(x):
                raise ValueError(f"the image file {x!r} is not there (a relative path is read from the data file's "
                                 f"folder, else from the working folder {os.getcwd()})")
            x = Image.open(x)
    except UnidentifiedImageError as exc:
        raise ValueError(f"cannot read an image: {exc}") from exc
    if not isinstance(x, Image.Image):
        raise ValueError(f"cannot read an image from a {type(x).__name__}; expected a PIL image, a path, bytes or "
                         "a {'bytes', 'path'} dict")
    return x.convert("RGB")


def _content(text: str) -> list[dict]:
    parts = []
    for i, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append({"type": "image"})
        if piece.strip():
            parts.append({"type": "text", "text": piece})
    return parts


def image_messages(prompt: str | Sequence[dict], num_images: int) -> list[dict]:
    """Chat messages with content lists from a prompt whose text holds ``<image>`` placeholders (not changed).

    Raises:
        ValueError: the number of placeholders differs from ``num_images``.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else copy.deepcopy(list(prompt))
    found = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))
    if found != num_images:
        raise ValueError(f"the prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) but the row has {num_images} "
                         "image(s); expected one placeholder per image")
    for m in messages:
        if isinstance(m.get("content"), str):
            m["content"] = _content(m["content"])
    return messages


def image_prompt_inputs(processor: Any, prompt: str | Sequence[dict], images: Sequence[Any],
                        chat_template_kwargs: dict | None = None) -> tuple[list[int], dict]:
    """``(prompt token ids with image tokens expanded, multi_modal_inputs)`` of one row; ``chat_template_kwargs``
    are extra arguments of the processor's ``apply_chat_template`` (``data.apply_chat_template_kwargs``).

    ``multi_modal_inputs`` holds the processor's tensors except ``input_ids`` / ``attention_mask`` (e.g.
    ``pixel_values`` ``(patches, C*T*P*P)`` float32 and ``image_grid_thw`` ``(images, 3)`` int64), batch dim dropped
    where the processor adds one.

    Raises:
        ValueError: no processor, or placeholders that do not match the images.
    """
    if processor is None:
        raise ValueError("the row has images but the model has no processor (a text-only model, or a "
                         "vision-language model folder without preprocessor_config.json); train image rows with a "
                         "vision-language model and its processor")
    imgs = [load_image(x) for x in images]
    text = processor.apply_chat_template(image_messages(prompt, len(imgs)), add_generation_prompt=True, tokenize=False,
                                         **(chat_template_kwargs or {}))
    out = processor(text=[text], images=imgs, return_tensors="pt")
    ids = [int(t) for t in out["input_ids"][0]]
    mm = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    return ids, mm


class ImageTextProcessor:
    """A processor from a folder's image processor and tokenizer, for models whose transformers processor
    class cannot be built here (see the module docstring). Qwen2-VL's token expansion.

    Args:
        image_processor: e.g. ``Qwen2VLImageProcessorPil`` (returns ``pixel_values`` and ``image_grid_thw``).
        tokenizer: the model's tokenizer; its chat template renders image content as the image token.
        image_token: the token repeated once per merged image patch.
    """

    def __init__(self, image_processor, tokenizer, image_token: str = "<|image_pad|>"):
        self.image_processor, self.tokenizer, self.image_token = image_processor, tokenizer, image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)

    @classmethod
    def from_pretrained(cls, path: str) -> "ImageTextProcessor":
        from transformers import AutoImageProcessor, AutoTokenizer

        extra = {}
        if os.path.isfile(os.path.join(path, "processor_config.json")):
            with open(os.path.join(path, "processor_config.json"), encoding="utf-8") as f:
                extra = {k: v for k, v in json.load(f).items() if k == "image_token"}
        return cls(AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path), **extra)

    def save_pretrained(self, path: str) -> None:
        self.image_processor.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        with open(os.path.join(path, "processor_config.json"), "w", encoding="utf-8") as f:
            json.dump({"processor_class": "ImageTextProcessor", "image_token": self.image_token}, f)

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(self, text: list[str], images=None, return_tensors: str = "pt", **kwargs) -> dict:
        """Tokenised ``text`` with each image token repeated ``grid.prod() // merge_size**2`` times, in order."""
        out = {}
        if images:
            out = dict(self.image_processor(images=images, return_tensors=return_tensors))
            counts = iter((out["image_grid_thw"].prod(-1) // self.image_processor.merge_size ** 2).tolist())
            pat = re.escape(self.image_token)
            text = [re.sub(pat, lambda _: self.image_token * next(counts), t) for t in text]
        enc = self.tokenizer(text, return_tensors=return_tensors, add_special_tokens=False)
        return {**dict(enc), **out}


def check_processor(key: str, path: str, hf: dict, tokenizer_path: str | None = None) -> None:
    """A vision-language model (``hf``, its ``config.json``, has ``vision_config``) must come with its processor:
    ``preprocessor_config.json`` in ``tokenizer_path`` or ``path``. Text-only models pass.

    Raises:
        ValueError: naming the key, the folder and the missing file.
    """
    if not hf.get("vision_config"):
        return
    folders = [p for p in (tokenizer_path, path) if p]
    if not any(os.path.isfile(os.path.join(p, "preprocessor_config.json")) for p in folders):
        raise ValueError(f"{key}={path!r} is a vision-language model (model_type={hf.get('model_type')!r}) without "
                         f"a processor: no preprocessor_config.json in {folders}; save the model's processor there")


def load_processor(path: str) -> Any:
    """The processor of the model folder ``path``: ``AutoProcessor`` when it gives one with an image processor,
    else :class:`ImageTextProcessor` when the folder has ``preprocessor_config.json``, else None."""
    if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        return None
    try:
        from transformers import AutoProcessor

        proc = AutoProcessor.from_pretrained(path)
        if getattr(proc, "image_processor", None) is not None:
            return proc
    except (ValueError, AttributeError, TypeError, ImportError, OSError):
        pass  # e.g. Qwen2-VL's processor without torchvision
    return ImageTextProcessor.from_pretrained(path)


def rope_position_ids(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      rows_inputs: Sequence[dict | None]) -> torch.Tensor | None:
    """Multimodal rotary positions ``(B, C, L)`` int64 of a padded batch (verl's layout), from the model's own
    ``get_rope_index`` (Qwen2-VL's M-RoPE: C = 3 rows, temporal/height/width; image tokens get grid positions,
    text after an image continues after the image's largest position); None when the model has no such method
    (its positions are the text positions).

    Args:
        model: the (DeepSpeed-wrapped) vision-language model.
        input_ids, attention_mask: ``(B, L)``, prompts and responses, any padding.
        rows_inputs: each row's ``multi_modal_inputs`` (``image_grid_thw`` used), in row order.
    """
    inner = getattr(model, "module", model)
    owner = next((m for m in inner.modules() if callable(getattr(m, "get_rope_index", None))), None)
    if owner is None:
        return None
    grids = [r["image_grid_thw"] for r in rows_inputs if r and "image_grid_thw" in r]
    image_id = getattr(owner.config, "image_token_id", None)
    types = (input_ids == image_id).long() if image_id is not None else torch.zeros_like(input_ids)
    rope, _ = owner.get_rope_index(input_ids, types, torch.cat(grids) if grids else None, None,
                                   attention_mask=attention_mask)
    return rope.transpose(0, 1).contiguous()
