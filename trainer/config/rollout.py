"""``actor_rollout_ref.rollout``: the rollout engine, its sampling, old-log-prob batching and the multi-turn loop
(verl's keys; the rollout group, ``configs/rollout/hf.yaml`` or ``vllm.yaml``, holds the defaults)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.config.section import ABSENT_OK, AUTO_BOOL, Section, bounded, built_by, finite
from trainer.config_checks import ConfigError, as_int

__all__ = ["SamplingKwargs", "RolloutConfig", "ENGINES"]

ENGINES = ("hf", "vllm")
DECODE_LOOPS = ("auto", "generate", "graph")  # rollout.hf_engine.DECODE_LOOPS (trainer/config imports no engine)


def _temperature(key: str, value: float, given) -> None:
    if finite(f"{key}.temperature", value) < 0:
        raise ConfigError(f"{key}.temperature={given}; expected >= 0 (0: greedy)")


def _sampling(key: str, section: Section) -> None:
    """The sampling values every engine takes (:class:`rollout.base.SamplingConfig`'s rules, checked before any
    worker builds one): n >= 1, temperature >= 0, top_p in (0, 1], top_k -1 / 0 (off) or positive."""
    if section.n < 1:
        raise ConfigError(f"{key}.n={section.given('n')}; expected >= 1")
    _temperature(key, section.temperature, section.given("temperature"))
    bounded(f"{key}.top_p", section.top_p, section.given("top_p"), gt=0, le=1, why="the nucleus mass; 1: off")
    if section.top_k < -1:
        raise ConfigError(f"{key}.top_k={section.given('top_k')}; expected -1 or 0 (off) or a positive integer")


SLEEP_LEVELS = (1, 2)  # rollout.context: 1 keeps the engine's weights in CPU memory, 2 discards them


def _engine_numbers(key: str, section: Section) -> None:
    """The engine's batch, bucket and parallel sizes >= 1, ``sleep_level`` 1 or 2 and ``gpu_memory_utilization`` in
    (0, 1] (the lengths follow ``data``'s and the old-log-prob micro-batch the actor's by default: their checks are
    :class:`trainer.config.data.DataConfig`'s and :func:`trainer.config.workers.check_sections`')."""
    for name in ("max_batch_size", "prompt_length_bucket", "tensor_model_parallel_size",
                 "update_weights_bucket_megabytes"):
        if getattr(section, name) < 1:
            raise ConfigError(f"{key}.{name}={section.given(name)}; expected an integer >= 1")
    if section.sleep_level not in SLEEP_LEVELS:
        raise ConfigError(f"{key}.sleep_level={section.given('sleep_level')}; expected 1 (the engine's weights kept "
                          "in CPU memory while it sleeps) or 2 (discarded)")
    bounded(f"{key}.gpu_memory_utilization", section.gpu_memory_utilization, section.given("gpu_memory_utilization"),
            gt=0, le=1, why="the share of the GPU's memory vLLM takes")


def _multi_turn(value: Any, path: str):
    """``rollout.multi_turn`` as :class:`rollout.multiturn.MultiTurnConfig` (checked by
    :func:`trainer.multi_turn.multi_turn_config`)."""
    from trainer.multi_turn import multi_turn_config

    return multi_turn_config({"multi_turn": value})


@dataclass(frozen=True)
class SamplingKwargs(Section):
    """``rollout.val_kwargs``: the sampling of validation generations (verl's keys)."""

    n: int
    do_sample: bool
    temperature: float
    top_p: float
    top_k: int

    def check(self, key: str) -> None:
        _sampling(key, self)


@dataclass(frozen=True)
class RolloutConfig(Section):
    """``actor_rollout_ref.rollout``.

    Attributes:
        name: the engine, hf (transformers) or vllm; n: responses per prompt; temperature / top_p / top_k /
            do_sample: training sampling; val_kwargs: validation sampling (:class:`SamplingKwargs`).
        stop_token_ids: more ids ending a response; ignore_eos: responses always run to response_length.
        prompt_length, response_length: tokens (prompts are left-padded; responses at most response_length).
        log_prob_*: batching of the old log-probs (rows per worker, or a token budget per worker).
        static_cache, max_batch_size, prompt_length_bucket, attn_implementation, decode_loop,
            decode_compile_regions: hf engine options (the last three are the hf group's keys: None under
            rollout=vllm; decode_loop: ``auto`` (null: auto), ``generate`` or ``graph``,
            :func:`rollout.graph_decode.resolve_decode_loop`; decode_compile_regions: :mod:`rollout.compile_regions`,
            null: false).
        tensor_model_parallel_size, gpu_memory_utilization, engine_kwargs: vLLM's (engine_kwargs: verl's
            ``engine_kwargs.vllm`` entries passed to ``vllm.LLM``; None when not set).
        sleep_level, update_weights_bucket_megabytes, offload_optimizer_during_rollout, lora_sync: how the
            colocated engine sleeps and receives the actor's weights (MiB per bucket).
        multi_turn: :class:`rollout.multiturn.MultiTurnConfig`.
    """

    name: str
    n: int
    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    stop_token_ids: tuple
    ignore_eos: bool
    prompt_length: int
    response_length: int
    log_prob_micro_batch_size_per_gpu: int
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    static_cache: Any = field(metadata=AUTO_BOOL)  # auto | true | false
    max_batch_size: int
    prompt_length_bucket: int
    attn_implementation: str | None = field(metadata=ABSENT_OK)
    decode_loop: str | None = field(metadata=ABSENT_OK)
    decode_compile_regions: bool | None = field(metadata=ABSENT_OK)
    tensor_model_parallel_size: int
    sleep_level: int
    gpu_memory_utilization: float
    update_weights_bucket_megabytes: int
    offload_optimizer_during_rollout: bool
    lora_sync: str
    val_kwargs: SamplingKwargs
    multi_turn: Any = field(metadata=built_by(_multi_turn, records_reads=True))
    engine_kwargs: dict | None = field(metadata=ABSENT_OK)

    def check(self, key: str) -> None:
        """A known engine; the sampling values (n, temperature, top_p, top_k); the engine's counts and sizes
        (:func:`_engine_numbers`); the hf engine's
        attn_implementation one that transformers knows and its decode_loop auto, generate or graph."""
        if self.name not in ENGINES:
            raise ConfigError(f"{key}.name={self.given('name')!r}; expected hf or vllm")
        _sampling(key, self)
        _engine_numbers(key, self)
        if self.log_prob_use_dynamic_bsz:
            as_int(self.log_prob_max_token_len_per_gpu, f"{key}.log_prob_max_token_len_per_gpu", minimum=1)
        # transformers drops a "paged|" prefix; org/name is a kernel from the Hub (trainer.attention_checks)
        given = str(self.attn_implementation or "auto")
        attn = given.removeprefix("paged|")
        if self.name == "hf" and attn != given and attn in ("auto", "sdpa_gqa"):
            raise ConfigError(f"{key}.attn_implementation={given!r}; expected {attn} without the paged| prefix (the "
                              "prefix applies to transformers' own implementations)")
        if self.name == "hf" and attn not in ("auto", "sdpa", "sdpa_gqa", "eager") and "/" not in attn:
            from transformers import AttentionInterface

            known = sorted(AttentionInterface().valid_keys())  # transformers' registered attention functions
            if attn not in known:
                raise ConfigError(f"{key}.attn_implementation={given!r}; expected auto, sdpa, "
                                  f"sdpa_gqa, eager or one of transformers' {known}")
        if self.name == "hf" and (self.decode_loop or "auto") not in DECODE_LOOPS:
            raise ConfigError(f"{key}.decode_loop={self.given('decode_loop')!r}; expected auto (graph on CUDA where "
                              "it runs, else generate), generate (transformers' generate) or graph (one compiled "
                              "function per decode step)")
