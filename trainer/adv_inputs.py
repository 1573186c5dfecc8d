"""The batch columns an advantage estimator reads, and who makes them.

An estimator's registry entry (:class:`trainer.algos.registry.EstimatorSpec`) declares its ``inputs``. Each is
either made by a stage of the step (:func:`stage_columns`: the rollout, the actor's log-prob pass, the critic;
the log-prob pass adds ``sum_pi_squared``, the reward stage ``reward_components``, only for an estimator that
reads them)
or by a producer, ``fn(step, batch) -> tensor`` run just before the advantage stage (``step``: the
:class:`trainer.hooks.base.StepContext`): the built-in ones are registered here with :func:`register_adv_input`
(ReMax's greedy ``reward_baselines``), an estimator may bring its own in its entry
(``register_adv_est(..., inputs={"col": fn})``). :func:`missing_inputs` is what the config check
asks, so an estimator whose input nobody makes is refused before start-up, naming the column.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

logger = logging.getLogger(__name__)

__all__ = ["ADV_INPUT_PRODUCERS", "LOG_PROB_PASS_OPTIONAL", "register_adv_input", "stage_columns", "missing_inputs",
           "produce_inputs", "estimator_kwargs", "log_prob_pass_columns", "reward_component_keys",
           "greedy_reward_baselines"]

ADV_INPUT_PRODUCERS: dict[str, Callable] = {}

#: columns the actor's log-prob pass adds only for an estimator that reads them (the logits are at hand there)
LOG_PROB_PASS_OPTIONAL = ("sum_pi_squared",)


def register_adv_input(column: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(step, batch) -> tensor`` as the producer of the batch column ``column``
    (``step``: the :class:`trainer.hooks.base.StepContext` of the training step)."""
    def decorator(fn: Callable) -> Callable:
        ADV_INPUT_PRODUCERS[column] = fn
        return fn

    return decorator


def stage_columns(cfg: dict, spec=None) -> dict[str, str]:
    """``{column: stage}`` of the columns the step's stages put into the batch before the advantage stage
    (``critic.enable`` null counts as on for an estimator ``spec`` that needs a critic)."""
    out = {k: "the rollout" for k in ("prompts", "responses", "response_mask", "attention_mask", "input_ids",
                                      "position_ids", "rollout_log_probs", "token_level_scores")}
    out.update(old_log_probs="the actor's log-prob pass", entropys="the actor's log-prob pass",
               token_level_rewards="the reward stage")
    if spec is not None:
        out.update({k: "the actor's log-prob pass" for k in LOG_PROB_PASS_OPTIONAL if k in spec.inputs})
    if reward_component_keys(cfg):
        out["reward_components"] = "the reward stage (algorithm.gdpo_reward_keys)"
    critic = cfg["critic"]["enable"]
    if critic or (critic is None and spec is not None and spec.needs_critic):
        out["values"] = "the critic (critic.enable=true)"
    from trainer.config.runtime import needs_reference

    if needs_reference(cfg):
        out["ref_log_prob"] = "the reference model"
    from trainer.algos.rollout_correction import RolloutCorrection

    try:
        correction = RolloutCorrection.from_config(cfg["algorithm"].get("rollout_correction")).enabled
    except ValueError:  # a bad value: trainer.config_checks.check_rollout_correction names it
        correction = False
    if correction:
        out["rollout_is_weights"] = "the rollout correction (algorithm.rollout_correction.rollout_is)"
    return out


def missing_inputs(spec, cfg: dict) -> list[str]:
    """The declared inputs of ``spec`` that neither a stage (for this ``cfg``) nor a producer makes."""
    made = set(stage_columns(cfg, spec)) | set(ADV_INPUT_PRODUCERS) | set(spec.producers)
    return [k for k in spec.inputs if k not in made]


def produce_inputs(step, batch, spec, timing: dict | None = None) -> None:
    """Run the producer of every declared input of ``spec`` that ``batch`` lacks; the column is set in place.
    ``step`` (a :class:`trainer.hooks.base.StepContext`) is passed to each producer.

    A producer's wall time goes to ``timing["adv_inputs/<column>"]`` (seconds).

    Raises:
        ValueError: an input with no producer (the config check refuses such an estimator before start-up).
    """
    import time

    for column in spec.inputs:
        if column in batch:
            continue
        fn = spec.producers.get(column) or ADV_INPUT_PRODUCERS.get(column)
        if fn is None:
            raise ValueError(f"advantage estimator {spec.name!r} needs the batch column {column!r}, which no stage "
                             "produced")
        t0 = time.perf_counter()
        batch[column] = fn(step, batch)
        if timing is not None:
            timing[f"adv_inputs/{column}"] = time.perf_counter() - t0


def _reads(cfg: dict, column: str) -> bool:
    """Whether the configured estimator (``algorithm.adv_estimator``) declares ``column`` as an input (False for a
    name the registry lacks)."""
    from trainer import core_algos  # registers the built-in estimators

    spec = core_algos.ADV_ESTIMATOR_SPECS.get(str(cfg["algorithm"]["adv_estimator"]))
    return spec is not None and column in spec.inputs


def log_prob_pass_columns(cfg: dict) -> tuple[str, ...]:
    """The optional columns of the actor's log-prob pass (:data:`LOG_PROB_PASS_OPTIONAL`) that the configured
    estimator reads."""
    return tuple(k for k in LOG_PROB_PASS_OPTIONAL if _reads(cfg, k))


def reward_component_keys(cfg: dict) -> tuple[str, ...]:
    """The scorer-dict keys the training reward returns as ``reward_components`` (B, K): ``algorithm.gdpo_reward_keys``
    when the configured estimator reads that column, else ()."""
    return tuple(cfg["algorithm"].get("gdpo_reward_keys") or ()) if _reads(cfg, "reward_components") else ()


def estimator_kwargs(spec, algorithm_cfg: dict) -> dict:
    """``{key: algorithm.<key>}`` for the entry's ``config_kwargs`` that the config sets (not null)."""
    return {k: algorithm_cfg[k] for k in spec.config_kwargs if algorithm_cfg.get(k) is not None}


@register_adv_input("reward_baselines")
def greedy_reward_baselines(step, batch) -> torch.Tensor:
    """ReMax's baseline (Li et al. 2023, arXiv:2310.10505): the reward of ONE greedy response per prompt.

    The prompts of ``batch`` (one per ``uid``, its first row's ``prompts`` and prompt attention mask and its
    non-tensor columns) are generated again by the rollout group (``step.generate``) with greedy decoding
    (``meta["greedy"]``, ``rollout.response_length`` new tokens) and scored by the step's own reward function
    (``step.reward_fn``, the same as the sampled responses); each row gets its prompt's greedy score.

    Returns:
        ``(len(batch),)`` float32 summed token-level scores of the greedy responses.
    """
    import numpy as np

    from trainer.dataset import pad_rows_to_multiple
    from trainer.protocol import DataProto

    uids = list(batch["uid"])
    first: dict = {}
    for i, u in enumerate(uids):
        first.setdefault(u, i)
    rows = batch.index(np.asarray(list(first.values())))
    P = rows["prompts"].shape[1]
    prompts = DataProto.from_dict({"input_ids": rows["prompts"], "attention_mask": rows["attention_mask"][:, :P]},
                                  dict(rows.non_tensor), meta={"greedy": True, "seed": step.global_step})
    padded, _ = pad_rows_to_multiple(prompts, step.world)
    out = step.generate(padded).index(slice(0, len(prompts)))
    scores = step.reward_fn(out).token_level_scores.sum(-1).float()
    by_uid = dict(zip(out["uid"].tolist(), scores))
    return torch.stack([by_uid[u] for u in uids]).float()
