"""The embedded default: a generated task, a tokenizer the project builds itself, and a tiny model config.

With no overrides, ``python trainer/main.py`` trains on this so that a fresh CPU machine with nothing
downloaded runs the whole product (Ray, DeepSpeed, rollout, rewards, GRPO, checkpoint, HF export).

The task ("synthetic/digits"): the prompt lists ``k`` digits, e.g. ``last of 3 7 1 ?``; the right answer is
the last digit (``1``). The reward is the GSM8K scorer in its *flexible* mode (the last number in the
response must equal the answer), so the same rule-reward path as real math data is exercised. A randomly
initialised model says the right digit about 1 time in 10; GRPO teaches it to copy the digit.
"""
from __future__ import annotations

import json
import os
import random

from transformers import PreTrainedTokenizerFast

TASK_NAME = "synthetic/digits"
DIGITS = [str(i) for i in range(10)]
WORDS = ["last", "of", "?", "the", "answer", "is", "####", "=>", "user", "assistant"]
SPECIAL = ["<pad>", "<eos>", "<unk>"]
# Tiny: the user's content, then "=>" opens the answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}=>{% endif %}"
)


def build_tokenizer(save_dir: str | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over digits and a few words (vocabulary of 23), built with ``tokenizers``.

    Token ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, then digits and words. Decoding joins tokens with a
    space. If ``save_dir`` is given, the tokenizer (with its chat template) is saved there.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL + DIGITS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    hf.chat_template = CHAT_TEMPLATE
    if save_dir:
        hf.save_pretrained(save_dir)
    return hf


def tiny_model_config(vocab_size: int, hidden_size: int = 64, num_hidden_layers: int = 2,
                      num_attention_heads: int = 4, num_key_value_heads: int = 2, intermediate_size: int = 128,
                      max_position_embeddings: int = 128, tie_word_embeddings: bool = True, **extra):
    """A tiny ``LlamaConfig`` (random weights at build time); the keys mirror Hugging Face's names."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                       num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                       intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                       tie_word_embeddings=tie_word_embeddings, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                       **extra)


def init_model_settings(seed: int, task: str, warm_start_steps: int, tiny: dict) -> dict:
    """The settings that decide the embedded tiny model (``<trainer.output_dir>/init_model``), by config key:
    ``trainer.seed``, ``data.synthetic_task``, ``data.warm_start_steps`` (0 for a task without a warm start) and every
    ``actor_rollout_ref.model.tiny.<key>`` (``tiny``; :func:`tiny_model_config`'s defaults filled in)."""
    import inspect

    defaults = {name: p.default for name, p in inspect.signature(tiny_model_config).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {"trainer.seed": int(seed), "data.synthetic_task": task, "data.warm_start_steps": int(warm_start_steps),
            **{f"actor_rollout_ref.model.tiny.{k}": v for k, v in {**defaults, **tiny}.items()}}


def make_rows(num_rows: int, seed: int, min_digits: int = 1, max_digits: int = 1) -> list[dict]:
    """Rows in verl's column layout: ``prompt`` (chat messages), ``data_source``, ``reward_model``, ``extra_info``."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        digits = [rng.choice(DIGITS) for _ in range(rng.randint(min_digits, max_digits))]
        rows.append({
            "data_source": TASK_NAME,
            "prompt": [{"role": "user", "content": "last of " + " ".join(digits) + " ?"}],
            "ability": "copy",
            "reward_model": {"style": "rule", "ground_truth": digits[-1]},
            "extra_info": {"index": i, "split": f"seed{seed}"},
        })
    return rows


def write_task(out_dir: str, train_rows: int = 2240, val_rows: int = 64, seed: int = 0,
               make=make_rows) -> tuple[str, str]:
    """Write ``train.jsonl`` and ``val.jsonl`` of a generated task (rows from ``make(num_rows, seed)``, the synthetic
    digits task by default); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, n, s in (("train", train_rows, seed), ("val", val_rows, seed + 1)):
        path = os.path.join(out_dir, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for row in make(n, s):
                f.write(json.dumps(row) + "\n")
        paths.append(path)
    return paths[0], paths[1]
