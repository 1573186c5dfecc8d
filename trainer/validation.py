"""Validation over the held-out set: one generation and scoring pass per decoding mode (sampled ``val_kwargs``,
and greedy with ``trainer.val_also_greedy``), and whether sampling settings sample.
"""
from __future__ import annotations

import logging

import numpy as np

from trainer.dataset import collate_prompts, pad_rows_to_multiple

logger = logging.getLogger(__name__)


def validate(trainer) -> dict:
    """``trainer.validate()``: the sampled pass (``trainer.validate_pass(greedy=False)``), and with
    ``trainer.val_also_greedy`` and sampled ``val_kwargs`` the greedy pass too; {} without held-out data."""
    if trainer.val_dataset is None:
        return {}
    metrics = trainer.validate_pass(greedy=False)
    if trainer.trainer_cfg.val_also_greedy and sampled(trainer.val_kwargs):
        metrics.update(trainer.validate_pass(greedy=True))
    return metrics


def validate_and_log(trainer, tracker, step: int, advance: bool = True) -> dict:
    """``trainer.validate()``, plus the first ``trainer.log_val_generations`` samples logged through ``tracker``
    (:class:`trainer.tracking.Tracking`); at step 0 (before training) the metrics are logged here, later with the
    step's metrics."""
    trainer.log_val_n, trainer.val_samples = trainer.trainer_cfg.log_val_generations, []
    val = trainer.validate()
    if trainer.val_samples:
        tracker.log_generations(trainer.val_samples, step)
    if not advance:
        tracker.log({**val, "_no_advance": True}, step=step)
    return val


def validation_pass(trainer, greedy: bool) -> dict:
    """One generation + scoring pass over the held-out set: ``val/<group>/<metric>`` keys, or
    ``val/<group>/greedy/<metric>`` for the ``greedy`` pass (one greedy response per question), and with more than
    one response per question ``val-core|val-aux/<group>/<metric>/...``. A row's group is its value of the column
    that picks its scorer, ``data.reward_fn_key`` (``data_source`` by default; :func:`metric_groups`)."""
    from trainer.metric_utils import extra_info_means, flatten_validation_metrics, process_validation_metrics
    from trainer.tracking import generation_samples

    ds = trainer.val_dataset
    bs = trainer.data_cfg.val_batch_size or len(ds)
    tok = trainer.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    sources: list = []
    uids: list = []
    infos: dict[str, list] = {}
    n_val = 1
    for start in range(0, len(ds), bs):
        rows = [ds[i] for i in range(start, min(start + bs, len(ds)))]
        batch = collate_prompts(rows, pad_id, getattr(ds, "prompt_key", "prompt"))
        batch["uid"] = [f"val-{start + i}" for i in range(len(batch))]
        batch.meta.update(validate=True, greedy=greedy, seed=trainer.trainer_cfg.seed)
        padded, _ = pad_rows_to_multiple(batch, trainer.world)
        out = trainer.roles.rollout.generate_sequences(padded)
        n_val = len(out) // len(padded)
        out = out.index(slice(0, len(batch) * n_val))  # drop the rows that only padded the batch
        rew = trainer.val_reward_fn(out)
        if not greedy:  # trainer.log_val_generations: the first samples of the sampled pass
            trainer.val_samples += generation_samples(tok, out, rew.token_level_scores.sum(-1).tolist(),
                                                      trainer.log_val_n - len(trainer.val_samples))
        sources.extend(metric_groups(out, trainer.data_cfg.reward_fn_key))
        uids.extend(out["uid"].tolist())
        chunk = {"score": rew.token_level_scores.sum(-1).tolist()}
        chunk.update({k: list(v) for k, v in rew.reward_extra_info.items() if k != "score"})
        for k in set(infos) | set(chunk):
            infos.setdefault(k, [None] * (len(uids) - len(out))).extend(chunk.get(k, [None] * len(out)))
    if "acc" not in infos:
        infos["acc"] = infos["score"]
    metrics: dict = {}
    src_arr = np.asarray(sources, dtype=object)
    for src in sorted(set(sources)):
        sel = np.nonzero(src_arr == src)[0]
        for k, v in extra_info_means({k: [v[i] for i in sel] for k, v in infos.items()}).items():
            name = k[len("reward/"):-len("/mean")]  # reward/<key>/mean; a key may itself hold '/'
            metrics[f"val/{src}/{'greedy/' if greedy else ''}{name}"] = v
    if n_val > 1:
        numeric = {k: v for k, v in infos.items() if all(isinstance(x, (int, float)) for x in v)}
        metrics.update(flatten_validation_metrics(process_validation_metrics(sources, uids, numeric)))
    return metrics


def metric_groups(rows, key: str) -> list[str]:
    """Per row of ``rows`` (a generated :class:`trainer.protocol.DataProto`), the name its validation metrics are
    grouped under: its value in the column ``key`` (``data.reward_fn_key``, the column that picks the row's scorer),
    so that rows scored by different scorers are reported apart. Where a row has no such value (a custom reward
    function that ignores the column), its ``data_source`` (``"unknown"`` when the data file has none)."""
    fallback = list(rows["data_source"]) if "data_source" in rows else ["unknown"] * len(rows)
    if key == "data_source" or key not in rows:
        return [str(v) for v in fallback]
    return [str(fallback[i] if v is None else v) for i, v in enumerate(rows[key])]


def sampled(kwargs) -> bool:
    """True when the sampling settings ``kwargs`` (``rollout.val_kwargs``, a
    :class:`trainer.config.rollout.SamplingKwargs`) sample, by :attr:`rollout.base.SamplingConfig.greedy`'s rule."""
    from rollout.base import SamplingConfig

    return not SamplingConfig(do_sample=kwargs.do_sample, temperature=kwargs.temperature).greedy


def warn_greedy_noop(config: dict, also_greedy: bool, val_kwargs) -> bool:
    """Warn that ``trainer.val_also_greedy=true`` does nothing when ``val_kwargs`` (a
    :class:`trainer.config.rollout.SamplingKwargs`) already decode greedily, only when a validation pass runs
    (:func:`trainer.unused_conditions.validates` on the plain run config ``config``): without one the start-up
    checks (:mod:`trainer.unused_settings`) have already named the key as ignored. Returns whether it warned."""
    from trainer.unused_conditions import validates

    if not also_greedy or sampled(val_kwargs) or not validates(config):
        return False
    logger.warning("trainer.val_also_greedy=true does nothing: actor_rollout_ref.rollout.val_kwargs already decodes "
                   "greedily (do_sample=%s, temperature=%s)", val_kwargs.do_sample, val_kwargs.temperature)
    return True
