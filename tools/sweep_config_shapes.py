"""Sweep of the start-up checks of ``config.json`` against the weights (``trainer.weight_shapes`` and
``trainer.meta_shapes``) over every causal-LM and image-text-to-text architecture of the installed transformers that
builds from its default config: each is built on the meta device, its parameters written as a header-only
``model.safetensors`` (the names ``save_pretrained`` writes, transformers' reverse key conversion applied) next to
its ``config.json`` (``--bin``: as a ``pytorch_model.bin`` of meta tensors in torch's zip format, whose shapes the
checks read on the meta device). A sound folder must never be refused; the same folder with ``intermediate_size``
doubled (where the text config has one) should be.

    python tools/sweep_config_shapes.py [--bin] [--limit N] [model_type ...]

Prints one line per architecture and a summary; exits 1 when a sound folder is refused.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _header_only(folder: str, shapes: dict) -> None:
    raw = json.dumps({n: {"dtype": "BF16", "shape": list(s), "data_offsets": [0, 0]} for n, s in shapes.items()})
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(raw.encode()).to_bytes(8, "little") + raw.encode())


def _bin_only(folder: str, shapes: dict) -> None:
    """``pytorch_model.bin`` of meta tensors of ``shapes``: the zip archive holds the names and shapes, no data."""
    import torch

    meta = {n: torch.empty(s, device="meta") for n, s in shapes.items()}
    torch.save(meta, os.path.join(folder, "pytorch_model.bin"))


def _saved_shapes(model) -> dict:
    """The checkpoint names and shapes ``save_pretrained`` writes (transformers' reverse conversion when it runs on
    meta tensors, else the state dict's own names)."""
    state = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, dict(state))
    except Exception:  # noqa: BLE001 - a conversion that needs real tensors: the model's own names
        pass
    return {n: tuple(t.shape) for n, t in state.items()}


def _judge(folder: str, remote: bool = False):
    from trainer.meta_shapes import transformers_config_problem
    from trainer.weight_shapes import config_weights_problem

    with open(os.path.join(folder, "config.json")) as f:
        hf = json.load(f)
    files = [n for n in ("model.safetensors", "pytorch_model.bin") if os.path.exists(os.path.join(folder, n))]
    return config_weights_problem(folder, hf, files) or transformers_config_problem(folder, hf, files, remote)


def sweep_one(model_type: str, root: str, as_bin: bool = False) -> tuple[str, str]:
    """``(verdict, detail)`` for one architecture (``as_bin``: its weights as ``pytorch_model.bin``): ``skip`` (does
    not build here), ``REFUSED`` (a sound folder refused: a fault), ``ok`` (the doubled ``intermediate_size``
    refused, or none to double), ``missed``."""
    from transformers import AutoConfig

    from trainer.meta_shapes import _build

    try:
        config = AutoConfig.for_model(model_type)
        model = _build(config, False)
    except Exception as exc:  # noqa: BLE001
        return "skip", f"{type(exc).__name__}: {str(exc)[:100]}"
    folder = os.path.join(root, model_type)
    os.makedirs(folder, exist_ok=True)
    config.save_pretrained(folder)
    (_bin_only if as_bin else _header_only)(folder, _saved_shapes(model))
    problem = _judge(folder)
    if problem:
        return "REFUSED", problem
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        hf = json.load(f)
    section = hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf
    if not isinstance(section.get("intermediate_size"), int):
        return "ok", "no intermediate_size"
    section["intermediate_size"] *= 2
    with open(path, "w") as f:
        json.dump(hf, f)
    problem = _judge(folder)
    return ("ok", problem[:160]) if problem else ("missed", "intermediate_size doubled not refused")


def main() -> int:
    import logging

    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    logging.disable(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("types", nargs="*")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--bin", action="store_true", help="write the weights as pytorch_model.bin (zip format)")
    args = parser.parse_args()
    types = args.types or sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))
    if args.limit:
        types = types[:args.limit]
    counts: dict = {}
    with tempfile.TemporaryDirectory() as root:
        for model_type in types:
            start = time.time()
            verdict, detail = sweep_one(model_type, root, args.bin)
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{verdict:8s} {model_type:32s} {time.time() - start:5.1f}s {detail}", flush=True)
    print("summary:", counts)
    return 1 if counts.get("REFUSED") else 0


if __name__ == "__main__":
    sys.exit(main())
