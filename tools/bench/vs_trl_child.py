"""The TRL side of ``tools/bench/vs_trl.py``: TRL's ``GRPOTrainer`` on the bench's job, in its own process.

``python tools/bench/vs_trl.py --trl-child JOB.json`` calls :func:`run_trl`, which builds the ``GRPOConfig`` of
:func:`trl_config_kwargs` (transformers ``model.generate``, or with ``job["use_vllm"]`` TRL's colocated vLLM with
sleep mode), wraps the trainer's stage methods with a :class:`StageClock`, trains ``job["steps"]`` optimizer steps
and writes one record per step: its wall seconds, its generated and prompt tokens and its stage split.

What each TRL stage covers (exclusive wall seconds, CUDA synchronised at every boundary, so nested stages are not
counted twice):

- ``gen``: ``GRPOTrainer._generate_single_turn`` (``model.generate``, or vLLM's ``LLM.generate`` and the list
  building around it), less the stages below that run inside it;
- ``weight_sync``: ``VLLMGeneration.sync_weights`` (``empty_cache``, ``load_weights`` per parameter, prefix-cache
  reset), less its ``wake_up``;
- ``wake_up`` / ``sleep``: vLLM's ``LLM.wake_up`` (weights, then KV cache) and ``LLM.sleep(level=2)``;
- ``old_log_prob`` / ``ref``: ``_get_per_token_logps_and_entropies`` without gradients on the policy / on the
  reference model (TRL computes old log-probs only with vLLM's importance-sampling correction, its default);
- ``reward``: ``_calculate_rewards`` (this project's rule scorer);
- ``adv``: the rest of ``_generate_and_score_completions`` (prompt tokenisation, padding, group advantages, its
  logging);
- ``update``: ``training_step`` (forward + loss + backward of each micro-batch) less the stages above that TRL
  runs inside its first micro-batch, plus ``optimizer.step`` (between the ``on_pre_optimizer_step`` and
  ``on_optimizer_step`` callbacks).

Step seconds are the time between consecutive ``on_step_end`` callbacks (the first from ``on_train_begin``), so
data loading, gradient clipping, the scheduler and logging are in the step but in no stage ("other" in the report).
"""
from __future__ import annotations

import functools
import time
from collections import defaultdict
from typing import Any, Callable

__all__ = ["StageClock", "trl_config_kwargs", "project_reward", "load_rows", "run_trl"]


class StageClock:
    """Exclusive wall seconds per named stage, nested stages subtracted from their parent.

    ``sync`` is called at every stage boundary (``torch.cuda.synchronize`` on CUDA) so that asynchronous GPU work
    is charged to the stage that launched it. ``totals`` maps stage name -> seconds (float) since creation."""

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []  # [name, start, seconds of nested stages]

    def push(self, name: str) -> None:
        self.sync()
        self._stack.append([name, time.perf_counter(), 0.0])

    def pop(self) -> None:
        """End the innermost stage. Raises RuntimeError when no stage is open."""
        if not self._stack:
            raise RuntimeError("StageClock.pop() without an open stage")
        self.sync()
        name, t0, nested = self._stack.pop()
        dt = time.perf_counter() - t0
        self.totals[name] += dt - nested
        if self._stack:
            self._stack[-1][2] += dt

    def wrap(self, obj: Any, attr: str, stage: str | Callable[..., str | None]) -> None:
        """Replace ``obj.attr`` (a callable) by a timed one. ``stage``: a name, or a function of the call's
        arguments returning a name or None (then the call is not timed)."""
        orig = getattr(obj, attr)

        @functools.wraps(orig)
        def timed(*args, **kwargs):
            name = stage(*args, **kwargs) if callable(stage) else stage
            if name is None:
                return orig(*args, **kwargs)
            self.push(name)
            try:
                return orig(*args, **kwargs)
            finally:
                self.pop()

        setattr(obj, attr, timed)

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


def trl_config_kwargs(job: dict) -> dict:
    """``trl.GRPOConfig`` keyword arguments for the bench's ``job`` (TRL 1.16 field names).

    One optimizer step per training step: ``per_device_train_batch_size = job["micro"]`` rows x
    ``gradient_accumulation_steps = batch * n / micro`` (TRL then generates the whole ``batch * n`` rows in one
    generation call, ``steps_per_generation`` defaulting to the accumulation steps). ``job["use_vllm"]``: TRL's
    colocated vLLM (``vllm_mode="colocate"``, ``vllm_enable_sleep_mode=True``: level-2 sleep after each
    generation, weights pushed again before the next) with ``vllm_gpu_memory_utilization =
    job["trl_vllm_gpu_util"]`` and a context of ``max_prompt_len + response_len`` tokens, as ours' vLLM engine has.
    ``job["ignore_eos"]``: every response exactly ``response_len`` tokens (``min_tokens`` for vLLM's
    ``SamplingParams``, ``min_new_tokens`` for ``GenerationConfig``: stop tokens are masked until the length is
    reached, and ``max_completion_length`` ends it there).

    Raises: ValueError when ``micro`` does not divide ``batch * n``.
    """
    rows = job["batch"] * job["n"]
    if rows % job["micro"]:
        raise ValueError(f"micro ({job['micro']}) must divide batch*n ({rows})")
    cuda = job["device"] == "cuda"
    kw = dict(output_dir=job["out_dir"], max_steps=job["steps"], per_device_train_batch_size=job["micro"],
              gradient_accumulation_steps=rows // job["micro"], num_generations=job["n"],
              max_completion_length=job["response_len"], learning_rate=job["lr"], lr_scheduler_type="constant",
              warmup_steps=0, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, loss_type="dapo",
              scale_rewards="group", bf16=cuda, use_cpu=not cuda, report_to="none", save_strategy="no",
              logging_steps=1, seed=job["seed"], dataloader_num_workers=0, remove_unused_columns=False)
    if job.get("use_vllm"):
        kw.update(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True,
                  vllm_gpu_memory_utilization=float(job["trl_vllm_gpu_util"]),
                  vllm_max_model_length=job["max_prompt_len"] + job["response_len"])
        if job.get("ignore_eos"):
            kw["generation_kwargs"] = {"min_tokens": job["response_len"]}
    else:
        kw["cache_implementation"] = job.get("trl_cache_implementation")
        if job.get("ignore_eos"):
            kw["generation_kwargs"] = {"min_new_tokens": job["response_len"]}
    return kw


def project_reward(completions, ground_truth, data_source, **_):
    """TRL reward function that scores with this project's rule scorer for each row's ``data_source``.

    Args: completions: list of str or of chat messages ``[{"role": "assistant", "content": str}]``.
    Returns: list of float rewards (a dict result contributes its ``score``)."""
    from rewards.registry import get_scorer

    out = []
    for c, gt, ds in zip(completions, ground_truth, data_source):
        text = c if isinstance(c, str) else c[-1]["content"]
        s = get_scorer(ds)(text, gt)
        out.append(float(s["score"] if isinstance(s, dict) else s))
    return out


def load_rows(path: str, tokenizer, max_prompt_len: int, max_rows: int | None = None):
    """The bench's rows as TRL's conversational dataset (``prompt`` messages, ``ground_truth``, ``data_source``),
    keeping, as ours does (``data.filter_overlong_prompts``), only prompts of at most ``max_prompt_len`` tokens
    after the chat template, then the first ``max_rows``."""
    import datasets

    kind = "parquet" if path.endswith(".parquet") else "json"
    ds = datasets.load_dataset(kind, data_files=path, split="train")
    ds = ds.map(lambda r: {"prompt": [{"role": m["role"], "content": m["content"]} for m in r["prompt"]],
                           "ground_truth": str(r["reward_model"]["ground_truth"]), "data_source": r["data_source"]})
    keep = ["prompt", "ground_truth", "data_source"]
    ds = ds.remove_columns([c for c in ds.column_names if c not in keep])

    def short(r):
        ids = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids) <= max_prompt_len
    ds = ds.filter(short)
    if max_rows:
        ds = ds.select(range(min(max_rows, len(ds))))
    return ds


def _instrument(trainer, clock: StageClock, counts: dict) -> None:
    """Wrap ``trainer``'s stage methods with ``clock`` (see the module docstring) and count each generation call's
    prompt and completion tokens into ``counts``."""
    import torch

    gen = trainer._generate_single_turn

    @functools.wraps(gen)
    def counted(prompt_ids, *args, **kwargs):
        out = gen(prompt_ids, *args, **kwargs)
        counts["prompt_tokens"] += sum(len(p) for p in prompt_ids)
        counts["gen_tokens"] += sum(len(c) for c in out[0])
        counts["rows"] += len(out[0])
        return out
    trainer._generate_single_turn = counted
    clock.wrap(trainer, "_generate_single_turn", "gen")
    clock.wrap(trainer, "_generate_and_score_completions", "adv")
    clock.wrap(trainer, "_calculate_rewards", "reward")
    clock.wrap(trainer, "training_step", "update")

    def logps_stage(model, *a, **k):
        if torch.is_grad_enabled():
            return None  # the loss's forward inside training_step: part of "update"
        return "ref" if trainer.ref_model is not None and model is trainer.ref_model else "old_log_prob"
    clock.wrap(trainer, "_get_per_token_logps_and_entropies", logps_stage)
    vg = getattr(trainer, "vllm_generation", None)
    if vg is not None:
        clock.wrap(vg, "sync_weights", "weight_sync")
        clock.wrap(vg.llm, "wake_up", "wake_up")
        clock.wrap(vg.llm, "sleep", "sleep")


def run_trl(job: dict) -> dict:
    """Run TRL's GRPOTrainer for ``job['steps']`` optimizer steps.

    Returns a dict: ``trl_version``, ``steps`` (one dict per optimizer step: ``step_s``, ``gen_tokens``,
    ``prompt_tokens``, ``rows``, ``split_s`` {stage: seconds}), ``reward_mean``, ``completion_length`` (TRL's
    logged values), ``peak_torch_allocated_gib`` / ``peak_torch_reserved_gib`` (None on CPU), ``config`` (the
    GRPOConfig keyword arguments)."""
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = job["device"] == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tok = AutoTokenizer.from_pretrained(job["model"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    kwargs = trl_config_kwargs(job)
    clock, counts, steps = StageClock(sync), defaultdict(int), []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            self.t, self.split, self.counts = time.perf_counter(), clock.snapshot(), dict(counts)

        def on_pre_optimizer_step(self, args, state, control, **kw):
            clock.push("update")

        def on_optimizer_step(self, args, state, control, **kw):
            clock.pop()

        def on_step_end(self, args, state, control, **kw):
            sync()
            now, split, cnt = time.perf_counter(), clock.snapshot(), dict(counts)
            steps.append(dict(step_s=now - self.t, **{k: cnt.get(k, 0) - self.counts.get(k, 0) for k in
                                                      ("gen_tokens", "prompt_tokens", "rows")},
                              split_s={k: v - self.split.get(k, 0.0) for k, v in split.items()}))
            self.t, self.split, self.counts = now, split, cnt

    trainer = GRPOTrainer(model=model, reward_funcs=project_reward, args=GRPOConfig(**kwargs),
                          train_dataset=load_rows(job["data"], tok, job["max_prompt_len"], job.get("max_rows")),
                          processing_class=tok, callbacks=[StepClock()])
    _instrument(trainer, clock, counts)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    peak = (lambda f: f() / 2**30 if cuda else None)
    return dict(framework="trl", trl_version=trl.__version__, steps=steps, config=kwargs,
                reward_mean=[h.get("reward") for h in logs],
                completion_length=[h.get("completions/mean_length") for h in logs],
                peak_torch_allocated_gib=peak(torch.cuda.max_memory_allocated),
                peak_torch_reserved_gib=peak(torch.cuda.max_memory_reserved))
