"""A random-weight model of a known architecture, saved as an HF folder that transformers, TRL and vLLM load.

The architecture comes from :data:`tools.bench.common.MODEL_CONFIGS` (``qwen2-1.5b``, ``smollm2-135m`` (alias
``smollm2``), ``tiny``); the tokenizer is copied from another folder (e.g. SmolLM2's, 49,152 tokens) and the
config's ``vocab_size`` becomes the tokenizer's length, with its BOS/EOS/pad ids, so that every sampled id decodes
on both sides of a benchmark. Weights: transformers' initialisation (normal, std ``initializer_range``) from
``torch.manual_seed(seed)``, stored in ``dtype``. A ``random_model.json`` beside the weights records what was
built; a folder whose record matches the request is reused.

Usage: ``python tools/bench/random_model.py qwen2-1.5b --tokenizer /tmp/smol_hf --out /tmp/qwen2_rand``
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ALIASES = {"smollm2": "smollm2-135m"}
RECORD = "random_model.json"


def config_name(name: str) -> str:
    """The :data:`~tools.bench.common.MODEL_CONFIGS` key of ``name`` (aliases resolved).

    Raises: ValueError for an unknown name (the message lists the known ones)."""
    from tools.bench.common import MODEL_CONFIGS

    key = ALIASES.get(name, name)
    if key not in MODEL_CONFIGS:
        raise ValueError(f"unknown random config {name!r}; expected one of {sorted(MODEL_CONFIGS) + sorted(ALIASES)}")
    return key


def build_random_model(name: str, tokenizer_dir: str, out_dir: str, seed: int = 0,
                       dtype: str = "bfloat16") -> dict:
    """Write a random-weight model of architecture ``name`` with ``tokenizer_dir``'s tokenizer to ``out_dir``.

    Args:
        name: a :data:`~tools.bench.common.MODEL_CONFIGS` key or alias.
        tokenizer_dir: folder with a tokenizer ``AutoTokenizer`` loads.
        out_dir: output folder (created); config.json, weights, generation_config.json, tokenizer files, RECORD.
        seed: ``torch.manual_seed`` before the weights are initialised on the CPU.
        dtype: storage dtype (``torch`` attribute name), also the config's ``dtype``.
    Returns:
        the record: ``name``, ``config``, ``tokenizer``, ``vocab_size``, ``seed``, ``dtype``, ``parameters``,
        ``reused`` (True when an identical folder was already there).
    Raises:
        ValueError: unknown ``name``; OSError: no tokenizer in ``tokenizer_dir``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tools.bench.common import hf_config

    key = config_name(name)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    want = dict(name=name, config=key, tokenizer=os.path.abspath(tokenizer_dir), vocab_size=len(tok), seed=seed,
                dtype=dtype)
    path = os.path.join(out_dir, RECORD)
    if os.path.exists(path) and os.path.exists(os.path.join(out_dir, "config.json")):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if {k: old.get(k) for k in want} == want:
            return dict(old, reused=True)
    cfg = hf_config(key)
    cfg.vocab_size = len(tok)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(cfg, attr, getattr(tok, attr))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    rec = dict(want, parameters=sum(p.numel() for p in model.parameters()))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1)
    return dict(rec, reused=False)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", help="qwen2-1.5b | smollm2 | smollm2-135m | tiny")
    ap.add_argument("--tokenizer", required=True, help="folder whose tokenizer is copied")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rec = build_random_model(args.name, args.tokenizer, args.out, seed=args.seed)
    print(json.dumps(rec))
    return rec


if __name__ == "__main__":
    main()
