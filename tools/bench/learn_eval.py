"""The evaluator of ``tools/bench/learn_vs_trl.py``: one process scores every saved checkpoint of both sides with
the same code, after training, so that evaluation takes no GPU time from either side's budget.

For each (checkpoint, data set) of the plan: greedy decoding (one answer per question, up to ``max_new_tokens``
tokens, stopping at the stop ids of :func:`rollout.stop_tokens.resolve_stop_token_ids`) of the prompts as the
trainer builds them (:class:`trainer.dataset.PromptDataset`: the chat template with the generation prompt),
decoded with ``skip_special_tokens=True`` as the reward manager does, then scored by this project's format-aware
scorer (:func:`rewards.format_reward.compute_score`, GSM8K ``#### N`` format): ``acc`` is strict accuracy (the
last ``#### N`` equals the answer), ``format`` the share of answers with a ``#### N``.

One engine holds the base model; each checkpoint's weights (safetensors, any dtype) are loaded into it in turn
(``engine.load_weights``, the path the trainer's weight sync uses), so the engine is built once. Engines:
``vllm`` (this project's :class:`rollout.vllm_engine.VLLMRolloutEngine`, bf16, prefix caching off so that no
cached prompt state outlives a weight change) or ``hf`` (:class:`rollout.hf_engine.HFRolloutEngine`: bf16 with a
static cache on CUDA, fp32 on the CPU); ``auto``: vLLM when it is importable and CUDA is available.
"""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Iterator

__all__ = ["checkpoint_tensors", "load_eval_rows", "build_engine", "score_texts", "evaluate_rows", "evaluate"]


def checkpoint_tensors(folder: str) -> Iterator[tuple[str, "object"]]:
    """``(name, tensor)`` of every ``*.safetensors`` file in ``folder`` (one file or shards), names as saved.

    Raises: FileNotFoundError when the folder has no safetensors file."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors file (expected a Hugging Face model folder)")
    for path in files:
        yield from load_file(path).items()


def load_eval_rows(path: str, tokenizer, max_prompt_len: int, max_rows: int | None = None) -> list[dict]:
    """``[{"input_ids": list[int], "ground_truth": str}]`` of a verl-layout file, the first ``max_rows`` rows,
    prompts longer than ``max_prompt_len`` tokens left out (as the trainer's overlong filter does)."""
    from trainer.dataset import PromptDataset

    ds = PromptDataset([path], tokenizer, max_prompt_len, max_rows=max_rows)
    return [{"input_ids": r["input_ids"], "ground_truth": str(r["reward_model"]["ground_truth"])} for r in ds.rows]


def build_engine(kind: str, model_path: str, tokenizer, max_model_len: int, gpu_util: float = 0.5):
    """The evaluation engine and its resolved kind (``vllm`` or ``hf``) for ``kind`` in auto|vllm|hf.

    Raises: ValueError for another kind; ImportError when ``vllm`` is asked for and absent."""
    import importlib.util

    import torch
    from transformers import AutoConfig

    from rollout.stop_tokens import resolve_stop_token_ids

    if kind not in ("auto", "vllm", "hf"):
        raise ValueError(f"evaluation engine {kind!r}; expected auto, vllm or hf")
    cuda = torch.cuda.is_available()
    if kind == "auto":
        kind = "vllm" if cuda and importlib.util.find_spec("vllm") is not None else "hf"
    config = AutoConfig.from_pretrained(model_path)
    stops = resolve_stop_token_ids(tokenizer, config, model_path)
    if kind == "vllm":
        from rollout.vllm_engine import VLLMRolloutEngine

        engine = VLLMRolloutEngine(model_path, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id,
                                   gpu_memory_utilization=gpu_util, max_model_len=max_model_len, load_format="auto",
                                   seed=0, enable_prefix_caching=False)
    else:
        from rollout.hf_engine import HFRolloutEngine

        engine = HFRolloutEngine.from_tokenizer(config, tokenizer, model_path=model_path,
                                                device="cuda" if cuda else "cpu", use_static_cache=cuda)
    engine.wake_up()
    return engine, kind


def score_texts(texts: list[str], truths: list[str], format_score: float = 0.1) -> dict:
    """Strict accuracy and format compliance of ``texts`` against ``truths`` (:func:`rewards.format_reward.
    compute_score`): ``{"n", "acc", "format", "score"}``, the last three means over the rows (fractions)."""
    from rewards.format_reward import compute_score

    scores = [compute_score(t, gt, format_score=format_score) for t, gt in zip(texts, truths)]
    n = len(scores)
    mean = (lambda k: sum(s[k] for s in scores) / n if n else float("nan"))
    return dict(n=n, acc=mean("acc"), format=mean("format"), score=mean("score"))


def evaluate_rows(engine, tokenizer, rows: list[dict], max_new_tokens: int, format_score: float = 0.1,
                  samples: int = 2) -> dict:
    """Greedy answers of ``engine`` to ``rows`` (:func:`load_eval_rows`), scored (:func:`score_texts`), with
    ``response_tokens`` (mean generated tokens, stop token included), ``seconds`` and ``samples`` (the first
    ``samples`` answers' text)."""
    from rollout.base import SamplingConfig

    t0 = time.perf_counter()
    out = engine.generate([r["input_ids"] for r in rows],
                          SamplingConfig(n=1, temperature=0.0, do_sample=False, max_new_tokens=int(max_new_tokens)))
    mask = out.response_mask.bool()
    texts = tokenizer.batch_decode([out.responses[i][mask[i]].tolist() for i in range(len(rows))],
                                   skip_special_tokens=True)
    res = score_texts(texts, [r["ground_truth"] for r in rows], format_score)
    res.update(response_tokens=float(mask.sum()) / max(len(rows), 1), seconds=time.perf_counter() - t0,
               samples=texts[:samples])
    return res


def evaluate(job: dict) -> dict:
    """Run the plan of ``job`` and write the result JSON to ``job["out"]`` after every entry (a run cut short keeps
    what it scored).

    ``job``: ``model`` (the base HF folder: tokenizer, config), ``engine`` (auto|vllm|hf), ``gpu_util``,
    ``max_new_tokens``, ``max_prompt_len``, ``format_score``, ``sets`` ({name: {"path", "max_rows"}}),
    ``checkpoints`` ({id: folder}), ``plan`` ([[checkpoint id, set name], ...] in order).

    Returns: ``{"engine", "build_s", "results": {checkpoint id: {set name: evaluate_rows(...)}}, "errors"}``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(job["model"])
    rows = {name: load_eval_rows(s["path"], tok, int(job["max_prompt_len"]), s.get("max_rows"))
            for name, s in job["sets"].items()}
    t0 = time.perf_counter()
    engine, kind = build_engine(job.get("engine", "auto"), job["model"], tok,
                                int(job["max_prompt_len"]) + int(job["max_new_tokens"]), float(job.get("gpu_util", 0.5)))
    doc = dict(engine=kind, build_s=time.perf_counter() - t0, results={}, errors={})
    loaded = None
    for ckpt, name in job["plan"]:
        try:
            if loaded != ckpt:
                loaded = None
                engine.load_weights(checkpoint_tensors(job["checkpoints"][ckpt]))
                loaded = ckpt
            res = evaluate_rows(engine, tok, rows[name], int(job["max_new_tokens"]), float(job["format_score"]))
            doc["results"].setdefault(ckpt, {})[name] = res
            print(f"eval {ckpt} {name}: acc {res['acc']:.4f} format {res['format']:.4f} ({res['n']} rows, "
                  f"{res['seconds']:.1f} s)", flush=True)
        except Exception as err:  # one bad checkpoint must not lose the others
            doc["errors"][f"{ckpt}/{name}"] = f"{type(err).__name__}: {err}"
            print(f"eval {ckpt} {name} failed: {err}", flush=True)
        with open(job["out"], "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return doc
