"""The evaluator of ``tools/bench/learn_vs_trl.py``: one process scores every saved checkpoint of both sides with
the same code, after training, so that evaluation takes no GPU time from either side's budget.

For each (checkpoint, data set) of the plan: greedy decoding (one answer per question, up to ``max_new_tokens``
tokens, stopping at the stop ids of :func:`rollout.stop_tokens.resolve_stop_token_ids`) of the prompts as the
trainer builds them (:class:`trainer.dataset.PromptDataset`: the chat template with the generation prompt),
decoded with ``skip_special_tokens=True`` as the reward manager does, then scored by this project's format-aware
scorer (:func:`rewards.format_reward.compute_score`, GSM8K ``#### N`` format; the job's ``strict_format``): ``acc``
is strict accuracy (the last ``#### N`` equals the answer), ``format`` the share of answers with a ``#### N``.

A policy can score without solving anything, by giving one answer to every question: each result therefore
also holds the answers' spread (:func:`answer_stats`: the most common answer's share, the number of distinct
answers, the share with several ``#### N`` markers, the share cut at the length limit), the accuracy on the
questions whose answer is not the most common one given (``acc_beyond_top``), and the evaluator's
``sets`` the accuracy of answering every question of a set with its most common true answer
(:func:`constant_baseline`).

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

__all__ = ["checkpoint_tensors", "load_eval_rows", "build_engine", "response_text", "score_response", "score_texts",
           "answer_stats", "constant_baseline", "evaluate_rows", "evaluate"]


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


def score_texts(texts: list[str], truths: list[str], format_score: float = 0.1, strict_format: bool = False) -> dict:
    """Strict accuracy and format compliance of ``texts`` against ``truths`` (:func:`rewards.format_reward.
    compute_score` with ``strict_format``): ``{"n", "acc", "format", "score"}``, the last three means over the rows
    (fractions), :func:`answer_stats` of ``texts``, and ``acc_beyond_top``: the strict accuracy over the questions
    whose true answer is not ``top_answer`` (None when there are none), what giving one answer to every question
    cannot earn (0 for such a policy; the base model's accuracy for one that did not collapse)."""
    texts = [response_text(t) for t in texts]
    scores = [score_response(t, gt, format_score, strict_format) for t, gt in zip(texts, truths)]
    n = len(scores)
    mean = (lambda k: sum(s[k] for s in scores) / n if n else float("nan"))
    stats = answer_stats(texts)
    top = stats["top_answer"]
    other = [s["acc"] for s, gt in zip(scores, truths) if top is None or _answer_key(gt) != top]
    return dict(n=n, acc=mean("acc"), format=mean("format"), score=mean("score"), **stats,
                acc_beyond_top=sum(other) / len(other) if other else None)


def response_text(text: str) -> str:
    """``text`` as the reward manager hands a single-turn response to a built-in scorer
    (:func:`rewards.response_text.solution_text`: a ``</tool_response>`` the model wrote is no boundary); a
    non-str ``text`` as it is (the scorer gives it 0)."""
    from rewards.gsm8k import TOOL_RESPONSE_END
    from rewards.response_text import solution_text

    return solution_text(text, None, TOOL_RESPONSE_END) if isinstance(text, str) else text


def score_response(text: str, truth, format_score: float = 0.1, strict_format: bool = False) -> dict[str, float]:
    """The format scorer's ``{"score", "acc", "format"}`` of one single-turn response read as the reward manager
    reads it (:func:`response_text`): what ours' ``reward=format`` pays, for TRL's reward function and the
    evaluator alike (:func:`rewards.format_reward.compute_score`)."""
    from rewards.format_reward import compute_score

    return compute_score(response_text(text), truth, format_score=format_score, strict_format=strict_format)


def _answer_key(value) -> str | None:
    """A number's canonical text (``12.0`` and ``"12"`` both ``"12"``; :func:`rewards.gsm8k.normalize_number`)."""
    from rewards.gsm8k import normalize_number

    num = normalize_number(value)
    return None if num is None else str(num)


def answer_stats(texts: list[str]) -> dict:
    """How spread the answers of ``texts`` are (GSM8K strict extraction, the last ``#### N``):
    ``top_answer`` (the most common answer, canonical text; None when no text has one), ``top_answer_share``
    (its count over all texts, a fraction), ``distinct_answers`` (count) and ``multi_marker`` (fraction of texts
    with more than one ``#### N`` marker, :func:`rewards.gsm8k.answer_markers`). A ``top_answer_share`` near 1 is a
    policy giving one answer to every question."""
    from collections import Counter

    from rewards.gsm8k import answer_markers, extract_solution

    keys = [_answer_key(extract_solution(t, method="strict")) for t in texts]
    counts = Counter(k for k in keys if k is not None)
    top = counts.most_common(1)
    n = len(texts)
    multi = sum(isinstance(t, str) and len(answer_markers(t)) > 1 for t in texts)
    return dict(top_answer=top[0][0] if top else None, top_answer_share=top[0][1] / n if top else 0.0,
                distinct_answers=len(counts), multi_marker=multi / n if n else 0.0)


def constant_baseline(truths: list) -> dict:
    """The accuracy of one answer given to every question: ``{"n", "answer", "acc"}`` for the most common true
    answer of ``truths`` (canonical text; ties: the first seen), ``acc`` a fraction. Any checkpoint at or below
    this accuracy may have learned nothing but that answer."""
    from collections import Counter

    counts = Counter(k for k in (_answer_key(t) for t in truths) if k is not None)
    if not counts:
        return dict(n=len(truths), answer=None, acc=0.0)
    answer, count = counts.most_common(1)[0]
    return dict(n=len(truths), answer=answer, acc=count / len(truths))


def evaluate_rows(engine, tokenizer, rows: list[dict], max_new_tokens: int, format_score: float = 0.1,
                  samples: int = 2, strict_format: bool = False) -> dict:
    """Greedy answers of ``engine`` to ``rows`` (:func:`load_eval_rows`), scored (:func:`score_texts`), with
    ``response_tokens`` (mean generated tokens, stop token included), ``at_length_limit`` (fraction of answers
    of ``max_new_tokens`` tokens: cut, or stopped on the last one), ``seconds`` and ``samples`` (the first
    ``samples`` answers' text)."""
    from rollout.base import SamplingConfig

    t0 = time.perf_counter()
    out = engine.generate([r["input_ids"] for r in rows],
                          SamplingConfig(n=1, temperature=0.0, do_sample=False, max_new_tokens=int(max_new_tokens)))
    mask = out.response_mask.bool()
    texts = tokenizer.batch_decode([out.responses[i][mask[i]].tolist() for i in range(len(rows))],
                                   skip_special_tokens=True)
    res = score_texts(texts, [r["ground_truth"] for r in rows], format_score, strict_format)
    lengths = mask.sum(dim=1)
    res.update(response_tokens=float(lengths.sum()) / max(len(rows), 1),
               at_length_limit=float((lengths >= int(max_new_tokens)).sum()) / max(len(rows), 1),
               seconds=time.perf_counter() - t0, samples=texts[:samples])
    return res


def evaluate(job: dict) -> dict:
    """Run the plan of ``job`` and write the result JSON to ``job["out"]`` after every entry (a run cut short keeps
    what it scored).

    ``job``: ``model`` (the base HF folder: tokenizer, config), ``engine`` (auto|vllm|hf), ``gpu_util``,
    ``max_new_tokens``, ``max_prompt_len``, ``format_score``, ``strict_format`` (default false), ``sets`` ({name:
    {"path", "max_rows"}}), ``checkpoints`` ({id: folder}), ``plan`` ([[checkpoint id, set name], ...] in order).

    Returns: ``{"engine", "build_s", "sets": {set name: constant_baseline(...)}, "results": {checkpoint id:
    {set name: evaluate_rows(...)}}, "errors"}``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(job["model"])
    rows = {name: load_eval_rows(s["path"], tok, int(job["max_prompt_len"]), s.get("max_rows"))
            for name, s in job["sets"].items()}
    t0 = time.perf_counter()
    engine, kind = build_engine(job.get("engine", "auto"), job["model"], tok,
                                int(job["max_prompt_len"]) + int(job["max_new_tokens"]), float(job.get("gpu_util", 0.5)))
    baselines = {name: constant_baseline([row["ground_truth"] for row in set_rows]) for name, set_rows in rows.items()}
    doc = dict(engine=kind, build_s=time.perf_counter() - t0, sets=baselines, results={}, errors={})
    loaded = None
    for ckpt, name in job["plan"]:
        try:
            if loaded != ckpt:
                loaded = None
                engine.load_weights(checkpoint_tensors(job["checkpoints"][ckpt]))
                loaded = ckpt
            res = evaluate_rows(engine, tok, rows[name], int(job["max_new_tokens"]), float(job["format_score"]),
                                strict_format=bool(job.get("strict_format", False)))
            doc["results"].setdefault(ckpt, {})[name] = res
            print(f"eval {ckpt} {name}: acc {res['acc']:.4f} format {res['format']:.4f} top answer "
                  f"{res['top_answer']} x {res['top_answer_share']:.3f} ({res['n']} rows, {res['seconds']:.1f} s)",
                  flush=True)
        except Exception as err:  # one bad checkpoint must not lose the others
            doc["errors"][f"{ckpt}/{name}"] = f"{type(err).__name__}: {err}"
            print(f"eval {ckpt} {name} failed: {err}", flush=True)
        with open(job["out"], "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return doc
