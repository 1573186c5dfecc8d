"""What every worker that generates does around its generator: the call's sampling settings and the rows built
from a :class:`rollout.generator.Generation` (the actor's colocated engine and the separate rollout workers)."""
from __future__ import annotations

import torch

from trainer.protocol import DataProto

__all__ = ["sampling_config", "call_sampling", "prompt_lists", "generation_rows"]


def sampling_config(rollout_cfg, validate: bool, seed: int | None, greedy: bool = False):
    """The call's :class:`rollout.base.SamplingConfig` of a :class:`trainer.config.rollout.RolloutConfig`: the
    rollout settings, ``val_kwargs`` when ``validate``, or one greedy sample per prompt when ``greedy`` (the extra
    validation pass of ``trainer.val_also_greedy``; ReMax's baseline rollout)."""
    from rollout.base import SamplingConfig

    rc = rollout_cfg
    if greedy:
        return SamplingConfig(n=1, max_new_tokens=rc.response_length, do_sample=False, seed=seed)
    src = rc.val_kwargs if validate else rc
    return SamplingConfig(n=src.n, temperature=src.temperature, top_p=src.top_p, top_k=src.top_k,
                          max_new_tokens=rc.response_length, do_sample=src.do_sample, seed=seed,
                          ignore_eos=rc.ignore_eos and not validate)


def call_sampling(rollout_cfg, prompts: DataProto, rank: int):
    """:func:`sampling_config` of a ``generate_sequences`` call, from the prompts' ``meta`` (``validate``,
    ``greedy``, ``seed``; the seed of rank ``rank`` is ``seed * 1009 + rank``)."""
    seed = prompts.meta.get("seed")
    return sampling_config(rollout_cfg, bool(prompts.meta.get("validate", False)),
                           None if seed is None else int(seed) * 1009 + rank,
                           greedy=bool(prompts.meta.get("greedy", False)))


def prompt_lists(prompts: DataProto) -> list[list[int]]:
    """The unpadded token ids of each left-padded prompt row."""
    return [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]


def generation_rows(prompts: DataProto, gen, n: int, rope_model=None) -> DataProto:
    """The rows of ``generate_sequences`` from the prompts and the generator's :class:`rollout.generator.Generation`.

    Args:
        prompts: left-padded ``input_ids`` / ``attention_mask`` (B, P) and non-tensor columns.
        gen: ``n`` trajectories per prompt, prompt-major.
        n: samples per prompt.
        rope_model: the model whose ``get_rope_index`` gives a vision-language model's rotary rows (needed only
            when the prompts carry ``multi_modal_inputs``).

    Returns:
        B*n rows: ``prompts`` (B*n, P), ``responses`` / ``rollout_log_probs`` (B*n, R), ``response_mask`` (B*n, R)
        f32, ``input_ids`` / ``attention_mask`` / ``position_ids`` (B*n, P+R; a vision-language model's rotary
        rows (B*n, 3, P+R)), the generator's columns, the prompts' non-tensor columns repeated, ``meta`` a copy of
        the prompts'.

    Raises:
        ValueError: image prompts without a ``rope_model``.
    """
    out = gen.rollout
    rep = prompts.repeat(n, interleave=True)
    responses = out.responses.to(torch.long)
    p_ids, p_mask = rep["input_ids"], rep["attention_mask"]
    attn = torch.cat([p_mask, gen.attention_mask.to(torch.long)], dim=1)  # tool answers are attended
    input_ids = torch.cat([p_ids, responses], dim=1)
    position_ids = torch.clamp(torch.cumsum(attn, dim=1) - 1, min=0)
    if "multi_modal_inputs" in rep:  # a vision-language model: its rotary position rows (B, 3, P+R)
        from trainer.multimodal import rope_position_ids

        if rope_model is None:
            raise ValueError("image prompts need the model's rotary position rows; this engine exposes no model")
        rows = rope_position_ids(rope_model, input_ids, attn, list(rep["multi_modal_inputs"]))
        position_ids = rows if rows is not None else position_ids
    return DataProto.from_dict({
        "prompts": p_ids,
        "responses": responses,
        "response_mask": out.response_mask.to(torch.long).float(),
        "rollout_log_probs": out.rollout_log_probs.float(),
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": position_ids,
        **gen.columns,
    }, {**rep.non_tensor, **gen.non_tensor}, meta=dict(prompts.meta))
