"""The TRL side of ``tools/bench/learn_vs_trl.py``: TRL's ``GRPOTrainer`` with its colocated vLLM on the learning
job, saving the policy as a Hugging Face folder at fixed wall-clock marks.

``python tools/bench/learn_vs_trl.py --trl-child JOB.json`` calls :func:`run_trl_learn`. The marks, their folder
names and the manifest are the ones of this project's ``trainer.export_hf_freq_s`` (:mod:`trainer.hf_exports`):
seconds since this process started (the operating system's start time, so imports, model loading and vLLM's
start-up count), a folder ``<out_dir>/hf_exports/t<mark>s`` per mark and one line per save in
``<out_dir>/hf_exports/exports.jsonl``. :func:`wall_clock_saver` saves in ``on_step_end`` (after the optimizer
step) and stops training after the last mark (``job["budget_s"]``).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

# TRL's per-step log entries kept beside the reward: the share of prompt groups whose rewards are all equal (no
# policy-gradient signal; ours logs it as ``critic/frac_reward_zero_std``), the policy entropy, the KL to the
# reference and the reward's standard deviation.
TRL_STEP_KEYS = ("frac_reward_zero_std", "entropy", "kl", "reward_std")

__all__ = ["learn_config_kwargs", "make_format_reward", "wall_clock_saver", "run_trl_learn"]


def learn_config_kwargs(job: dict) -> dict:
    """``trl.GRPOConfig`` keyword arguments (TRL 1.16 field names) of the learning job.

    The throughput bench's settings (:func:`tools.bench.vs_trl_child.trl_config_kwargs`: one optimizer step per
    generation of ``batch * n`` rows, AdamW at a constant ``lr``, temperature 1, group-scaled advantages, the
    ``dapo`` token-mean loss, one iteration), with TRL's colocated vLLM (``use_vllm=True``,
    ``vllm_mode="colocate"``), and for this job:

    - ``beta = job["kl_coef"]``: TRL's KL term (the k3 estimator against a reference model), as ours'
      ``use_kl_loss`` with ``kl_loss_type=low_var_kl`` (k3, clamped to [-10, 10]) at ``kl_loss_coef``;
    - ``vllm_importance_sampling_correction=False``: with one optimizer step per generation both sides train
      on-policy with no engine-vs-trainer correction (ours' ``rollout_correction.rollout_is`` is off);
    - ``gradient_checkpointing=False`` (TRL's default is True; ours' SmolLM2 config has it off);
    - ``vllm_enable_sleep_mode = job["trl_vllm_sleep"]`` (TRL's default, False: no wake/sleep per step);
    - ``max_steps = job["max_steps"]``: larger than the budget allows; the wall-clock saver ends the run.
    """
    from tools.bench.vs_trl_child import trl_config_kwargs

    kw = trl_config_kwargs(dict(job, steps=int(job["max_steps"]), use_vllm=job["device"] == "cuda",
                                ignore_eos=False))
    kw.update(beta=float(job["kl_coef"]), gradient_checkpointing=False)
    if kw.get("use_vllm"):
        kw.update(vllm_enable_sleep_mode=bool(job.get("trl_vllm_sleep", False)),
                  vllm_importance_sampling_correction=False)
    return kw


def make_format_reward(format_score: float, strict_format: bool = False) -> Callable[..., list[float]]:
    """A TRL reward function scoring each completion with this project's format-aware scorer, each read as ours'
    reward manager reads it (:func:`tools.bench.learn_eval.score_response`, GSM8K ``#### N`` format,
    ``strict_format``): 1 correct, ``format_score`` well-formed but wrong, 0 otherwise; what ours' ``reward=format``
    gives (with ``reward_model.scorer_kwargs.strict_format``). Completions: str or chat messages."""
    from tools.bench.learn_eval import score_response

    def format_reward(completions, ground_truth, **_):
        out = []
        for c, gt in zip(completions, ground_truth):
            text = c if isinstance(c, str) else c[-1]["content"]
            out.append(float(score_response(text, gt, format_score, strict_format)["score"]))
        return out
    return format_reward


def wall_clock_saver(marks, root: str, final_mark_s: float, save: Callable[[Any, Any, str], None] | None = None):
    """A ``transformers.TrainerCallback`` saving the policy at the marks of ``marks``
    (:class:`trainer.hf_exports.WallClockMarks`) into ``root`` (folders and manifest of :mod:`trainer.hf_exports`)
    at ``on_step_end``, and setting ``control.should_training_stop`` once a mark >= ``final_mark_s`` is saved.

    ``save(model, processing_class, folder)``: default ``model.save_pretrained(folder)`` and the tokenizer's
    ``save_pretrained``. Each manifest entry holds ``mark_s``, ``elapsed_s`` (when the save began), ``global_step``
    (``state.global_step``), ``path`` and ``export_s`` (seconds the save took)."""
    from transformers import TrainerCallback

    from trainer.hf_exports import append_entry, export_dir

    def default_save(model, tok, path):
        model.save_pretrained(path)
        if tok is not None:
            tok.save_pretrained(path)
    save = save or default_save

    class WallClockSaver(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            mark = marks.due()
            if mark is None:
                return control
            elapsed, path, t0 = marks.elapsed(), export_dir(root, mark), time.perf_counter()
            save(model, processing_class, path)
            marks.take(mark)
            append_entry(root, dict(mark_s=mark, elapsed_s=elapsed, global_step=int(state.global_step),
                                    path=os.path.abspath(path), export_s=time.perf_counter() - t0))
            if mark >= final_mark_s:
                control.should_training_stop = True
            return control

    return WallClockSaver()


def run_trl_learn(job: dict) -> dict:
    """Train TRL's GRPOTrainer on ``job["train"]`` until the last wall-clock mark is saved.

    Returns: ``trl_version``, ``config`` (the GRPOConfig keyword arguments), ``steps`` (per optimizer step:
    ``step``, ``reward``, ``completion_length``, ``elapsed_s`` from TRL's log history and the clock, and those of
    :data:`TRL_STEP_KEYS` TRL logged), ``exports``
    (the manifest's entries)."""
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tools.bench.vs_trl_child import load_rows
    from trainer.hf_exports import EXPORTS_SUBDIR, WallClockMarks, read_entries

    marks = WallClockMarks(float(job["every_s"]))  # from this process's start
    root = os.path.join(job["out_dir"], EXPORTS_SUBDIR)
    tok = AutoTokenizer.from_pretrained(job["model"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    kwargs = learn_config_kwargs(job)
    step_times: dict[int, float] = {}

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step_times[int(state.global_step)] = marks.elapsed()

    trainer = GRPOTrainer(model=model, reward_funcs=make_format_reward(float(job["format_score"]),
                                                                        bool(job.get("strict_format", False))),
                          args=GRPOConfig(**kwargs), processing_class=tok,
                          train_dataset=load_rows(job["train"], tok, job["max_prompt_len"]),
                          callbacks=[StepTimes(), wall_clock_saver(marks, root, float(job["budget_s"]))])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    steps = [dict(step=h.get("step"), reward=h.get("reward"), completion_length=h.get("completions/mean_length"),
                  elapsed_s=step_times.get(int(h.get("step") or -1)),
                  **{k: h[k] for k in TRL_STEP_KEYS if k in h}) for h in logs]
    return dict(framework="trl", trl_version=trl.__version__, config=kwargs, steps=steps, exports=read_entries(root))
