"""The ``transformers.GenerationConfig`` of one ``generate`` call of :class:`rollout.hf_engine.HFRolloutEngine`."""
from __future__ import annotations

from rollout.base import SamplingConfig

__all__ = ["generation_config", "static_cache_on"]


def static_cache_on(setting, on_cuda: bool) -> bool:
    """Whether the engine decodes with the static KV cache: ``setting`` (``rollout.static_cache``) None or
    ``"auto"`` means on with CUDA (``on_cuda``) and off elsewhere; anything else is read as a bool."""
    return on_cuda if setting is None or setting == "auto" else bool(setting)


def generation_config(model_config, sampling: SamplingConfig, stop_ids: list[int], cache_len: int, pad_id: int,
                      static_cache: bool, compile_mode: str | None):
    """The ``GenerationConfig`` for ``sampling``: stop at ``stop_ids`` (masked out until ``max_new_tokens`` with
    ``ignore_eos``), pad with ``pad_id``, greedy or sampled with temperature / top-p / top-k (top-p 1 and top-k 0:
    off), no repetition penalty; a vision-language model's image and video placeholder ids suppressed (their count
    must match the images). ``static_cache``: transformers' static KV cache of ``cache_len`` tokens and its
    compiled decoding step in the ``torch.compile`` mode ``compile_mode``; else the dynamic cache."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import CompileConfig

    min_new = sampling.max_new_tokens if sampling.ignore_eos else 0  # stop ids are masked out until then
    kw = dict(max_new_tokens=sampling.max_new_tokens, min_new_tokens=min_new, eos_token_id=stop_ids,
              pad_token_id=pad_id, output_logits=False, return_dict_in_generate=False,
              num_return_sequences=1, num_beams=1, use_cache=True, repetition_penalty=1.0)
    vision = [getattr(model_config, k, None) for k in ("image_token_id", "video_token_id",
                                                       "vision_start_token_id", "vision_end_token_id")]
    if any(v is not None for v in vision):
        kw["suppress_tokens"] = [int(v) for v in vision if v is not None]
    if sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=float(sampling.temperature),
                  top_p=float(sampling.top_p) if sampling.top_p < 1.0 else None,
                  top_k=int(sampling.top_k) if sampling.top_k > 0 else 0)
    if static_cache:
        kw.update(cache_implementation="static", max_cache_len=cache_len,
                  compile_config=CompileConfig(fullgraph=False, dynamic=False, mode=compile_mode))
    return GenerationConfig(**kw)
