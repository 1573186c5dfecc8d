"""Training metrics as pure functions of the batch (keys follow verl's ``metric_utils``, PR #599 and HEAD).

All returned values are python floats. Aggregation of per-worker/per-micro-batch lists is explicit
(:func:`reduce_metrics` takes an aggregation per key; nothing is inferred from a key's name).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from trainer.flops import compute_mfu, flops_per_token  # noqa: F401  (re-exported)
from trainer.group_metrics import group_score_metrics
from trainer.multi_turn import generation_metrics

__all__ = ["compute_data_metrics", "completion_length_stats", "CompletionLengthStats", "compute_timing_metrics",
           "compute_throughput_metrics", "flops_per_token", "compute_mfu", "process_validation_metrics",
           "flatten_validation_metrics", "reduce_metrics", "reduce_rank_metrics", "extra_info_means",
           "reward_output_metrics", "bootstrap_metric"]


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        nan = float("nan")
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    x = x.float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def _lengths(batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(prompt_length (B,), response_length (B,), R) from the attention mask (B, P+R)."""
    R = batch["responses"].shape[-1]
    attn = batch["attention_mask"]
    if attn.shape[-1] <= R:
        raise ValueError(f"attention_mask has width {attn.shape[-1]} but responses have width {R}; expected "
                         "attention_mask to cover prompt + response")
    return attn[:, :-R].sum(-1).float(), attn[:, -R:].sum(-1).float(), R


def _cut_at_cap(batch, resp_len: torch.Tensor, cap: int, stop_token_ids) -> torch.Tensor:
    """(B,) bool: the response reached ``cap`` tokens and its last token (``responses`` (B, R), right-padded) is no
    stop id, i.e. the cap cut it; without ``stop_token_ids`` every response at the cap counts (verl's rule)."""
    at_cap = resp_len >= cap
    if not stop_token_ids:
        return at_cap
    last = (resp_len.long() - 1).clamp(min=0).unsqueeze(-1)
    ids = batch["responses"].gather(-1, last).squeeze(-1)
    return at_cap & ~torch.isin(ids, torch.as_tensor(list(stop_token_ids), dtype=ids.dtype, device=ids.device))


def compute_data_metrics(batch, use_critic: bool, max_response_length: int, max_prompt_length: int,
                         stop_token_ids: Sequence[int] | None = None) -> dict[str, float]:
    """Per-step data metrics (verl §3.1) from a :class:`trainer.protocol.DataProto`.

    Reads ``responses`` (B,R), ``attention_mask`` (B,P+R), ``response_mask`` (B,R) (falls back to the response
    part of the attention mask), ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns`` and,
    if ``use_critic``, ``values`` (all (B,R) float).

    Keys: ``critic/score|rewards/{mean,max,min}`` (per-sample sums; over non-aborted samples when any exist),
    ``critic/advantages|returns[|values]/{mean,max,min}`` (over valid tokens of ``response_mask``; NaN if none),
    ``critic/vf_explained_var = 1 - Var(R - V) / (Var(R) + 1e-5)`` (unbiased variances, valid tokens),
    ``response_length/{mean,max,min,clip_ratio}``, ``response_length_non_aborted/{...}``,
    ``response/aborted_ratio`` (response length 0), ``prompt_length/{mean,max,min,clip_ratio}``,
    ``critic/frac_reward_zero_std`` (groups whose scores are all equal: :mod:`trainer.group_metrics`), and for
    multi-turn rollouts the ``multi_turn/*`` and ``tool/*`` metrics (:func:`trainer.multi_turn.generation_metrics`).
    Lengths are counted from the attention mask; ``clip_ratio`` is the fraction of samples whose length reaches
    the CONFIGURED maximum (``max_response_length`` / ``max_prompt_length``), not the padded width; with
    ``stop_token_ids`` (the rollout's stop set) a response ending in one at the maximum is not cut (verl counts it).

    Raises:
        ValueError: non-positive maxima; malformed masks; ``use_critic`` without ``values``.
    """
    if max_response_length < 1 or max_prompt_length < 1:
        raise ValueError(f"max_response_length and max_prompt_length must be >= 1, got {max_response_length}, "
                         f"{max_prompt_length}")
    prompt_len, resp_len, R = _lengths(batch)
    mask = (batch["response_mask"] if "response_mask" in batch else batch["attention_mask"][:, -R:]) != 0
    aborted = resp_len == 0
    keep = ~aborted if bool((~aborted).any()) else torch.ones_like(aborted)
    score = batch["token_level_scores"].sum(-1)[keep]
    reward = batch["token_level_rewards"].sum(-1)[keep]
    out: dict[str, float] = {}
    out.update(_stats("critic/score", score))
    out.update(_stats("critic/rewards", reward))
    out.update(_stats("critic/advantages", torch.masked_select(batch["advantages"], mask)))
    returns = torch.masked_select(batch["returns"], mask)
    out.update(_stats("critic/returns", returns))
    if use_critic:
        if "values" not in batch:
            raise ValueError("use_critic=True but the batch has no 'values'")
        values = torch.masked_select(batch["values"], mask)
        out.update(_stats("critic/values", values))
        if returns.numel() >= 2:
            ev = 1.0 - torch.var(returns.float() - values.float()) / (torch.var(returns.float()) + 1e-5)
            out["critic/vf_explained_var"] = ev.item()
        else:
            out["critic/vf_explained_var"] = float("nan")
    out.update(_stats("response_length", resp_len))
    cut = _cut_at_cap(batch, resp_len, max_response_length, stop_token_ids)
    out["response_length/clip_ratio"] = cut.float().mean().item()
    non_aborted = resp_len[~aborted]
    out.update(_stats("response_length_non_aborted", non_aborted))
    out["response_length_non_aborted/clip_ratio"] = (cut[~aborted].float().mean().item()
                                                     if non_aborted.numel() else float("nan"))
    out["response/aborted_ratio"] = aborted.float().mean().item()
    out.update(_stats("prompt_length", prompt_len))
    out["prompt_length/clip_ratio"] = (prompt_len >= max_prompt_length).float().mean().item()
    out.update(group_score_metrics(batch))
    out.update(generation_metrics(batch))
    return out


class CompletionLengthStats(NamedTuple):
    """Result of :func:`completion_length_stats` (a tuple: unpack it or use the names)."""

    mean: float
    min: float
    max: float
    clipped_ratio: float
    mean_terminated: float
    loss_mask: torch.Tensor


def completion_length_stats(completions: torch.Tensor, eos_id, max_len: int,
                            mask_truncated: bool = True) -> CompletionLengthStats:
    """Completion lengths measured from the token ids BEFORE any truncation masking.

    ``eos_id``: one id or a list of stop ids (the rollout's set, ``rollout.stop_tokens``); any of them ends a row.
    A row's length is the position of its first ``eos_id`` + 1 (EOS counted), or the row width if it has no EOS
    (it was truncated at ``max_len``). ``clipped_ratio`` = fraction of rows without EOS; ``mean_terminated`` = mean
    length of rows with EOS (0.0 if none). ``loss_mask`` (B, L) float32 is 1 up to and including the EOS, and all
    zero for truncated rows when ``mask_truncated`` (otherwise 1 over the whole row).

    Args:
        completions: ``(B, L)`` int token ids (right-padded after EOS with anything).
    Raises:
        ValueError: not 2-D, or ``L > max_len``.
    """
    if completions.dim() != 2:
        raise ValueError(f"completions must be (batch, length), got shape {tuple(completions.shape)}")
    B, L = completions.shape
    if L > max_len:
        raise ValueError(f"completions have width {L} > max_len={max_len}")
    from rollout.stop_tokens import as_id_list

    is_eos = torch.isin(completions, torch.tensor(as_id_list(eos_id), device=completions.device))
    has_eos = is_eos.any(dim=-1)
    first = torch.where(has_eos, is_eos.int().argmax(dim=-1), torch.full((B,), L - 1, device=completions.device))
    length = (first + 1).float()
    pos = torch.arange(L, device=completions.device).unsqueeze(0)
    loss_mask = (pos <= first.unsqueeze(-1)).float()
    if mask_truncated:
        loss_mask = torch.where(has_eos.unsqueeze(-1), loss_mask, 0.0)
    if B == 0:
        return CompletionLengthStats(0.0, 0.0, 0.0, 0.0, 0.0, loss_mask)
    term = length[has_eos]
    return CompletionLengthStats(length.mean().item(), length.min().item(), length.max().item(),
                                 (~has_eos).float().mean().item(), term.mean().item() if term.numel() else 0.0,
                                 loss_mask)


_RESPONSE_TOKEN_TIMERS = ("gen",)
_ALL_TOKEN_TIMERS = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def compute_timing_metrics(batch, timing_raw: dict[str, float]) -> dict[str, float]:
    """``timing_s/<name>`` (seconds) for every timer, and ``timing_per_token_ms/<name> = 1000 * t / N`` where
    ``N`` = response tokens for ``gen`` (``batch.meta['gen_response_tokens']`` when set: every response token
    generated in the step, also those that dynamic sampling dropped) and all (prompt + response) tokens for
    ``old_log_prob, ref, values, adv, update_critic, update_actor`` (verl §3.2; ``old_log_prob`` is our addition).
    Token counts come from the attention mask; a timer whose token count is 0 gets no per-token entry."""
    prompt_len, resp_len, _ = _lengths(batch)
    n_resp = resp_len.sum().item()
    n_all = n_resp + prompt_len.sum().item()
    out = {f"timing_s/{k}": float(v) for k, v in timing_raw.items()}
    n_gen = float((getattr(batch, "meta", None) or {}).get("gen_response_tokens", n_resp))
    for names, n in ((_RESPONSE_TOKEN_TIMERS, n_gen), (_ALL_TOKEN_TIMERS, n_all)):
        for k in names:
            if k in timing_raw and n > 0:
                out[f"timing_per_token_ms/{k}"] = float(timing_raw[k]) * 1000.0 / n
    return out


def compute_throughput_metrics(batch, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens`` (sum of ``batch.meta["global_token_num"]`` if set, else of the attention mask),
    ``perf/time_per_step = timing_raw["step"]`` (s) and ``perf/throughput = tokens / (time * n_gpus)``
    (tokens/s per GPU), verl §3.3.

    Raises:
        ValueError: ``n_gpus < 1``, missing or non-positive ``timing_raw["step"]``.
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    t = timing_raw.get("step")
    if t is None or t <= 0:
        raise ValueError(f"timing_raw['step'] must be a positive number of seconds, got {t!r}")
    meta = getattr(batch, "meta", {}) or {}
    if "global_token_num" in meta:
        total = float(sum(meta["global_token_num"]))
    else:
        total = float(batch["attention_mask"].sum().item())
    return {"perf/total_num_tokens": total, "perf/time_per_step": float(t),
            "perf/throughput": total / (float(t) * n_gpus)}


def bootstrap_metric(data: Sequence[Any], subset_size: int, reduce_fns: Sequence[Callable], n_bootstrap: int = 1000,
                     seed: int = 42) -> list[tuple[float, float]]:
    """(mean, std) over ``n_bootstrap`` resamples (with replacement, size ``subset_size``) of each reduce_fn."""
    rng = np.random.default_rng(seed)
    results = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        idx = rng.choice(len(data), size=subset_size, replace=True)
        sample = [data[i] for i in idx]
        for j, fn in enumerate(reduce_fns):
            results[j].append(fn(sample))
    return [(float(np.mean(r)), float(np.std(r))) for r in results]


def _majority_value(sample: list[tuple[Any, float]]) -> float:
    """Value of the first sample whose pred wins the vote; ties go to the pred seen first."""
    counts = Counter(p for p, _ in sample)
    best = max(counts.values())
    for pred, val in sample:
        if counts[pred] == best:
            return val
    return float("nan")  # pragma: no cover


def process_validation_metrics(data_sources: Sequence[str], uids: Sequence[Any], infos: dict[str, list],
                               seed: int = 42) -> dict[str, dict[str, dict[str, float]]]:
    """Validation metrics per data source and variable, averaged over prompts (verl, after #599).

    For each (data source, prompt uid, numeric variable) with ``N`` responses: ``mean@N``; if ``N > 1``:
    ``std@N`` and, for ``n`` in ``{2, 4, 8, ... < N} ∪ {N}``, bootstrap (1000 resamples with replacement,
    ``seed``) ``best@n/mean|std``, ``worst@n/mean|std``, and ``maj@n/mean|std`` when ``infos`` has a ``"pred"``
    list (majority vote on pred; the value of the first sample carrying the winning pred). Non-numeric variables
    and ``pred`` itself are skipped. Returns ``{data_source: {var: {metric: mean over prompts}}}``.

    Raises:
        ValueError: lists of different lengths.
    """
    n = len(data_sources)
    if len(uids) != n or any(len(v) != n for v in infos.values()):
        raise ValueError(f"data_sources ({n}), uids ({len(uids)}) and every infos list "
                         f"({ {k: len(v) for k, v in infos.items()} }) must have the same length")
    preds = infos.get("pred")
    groups: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (ds, uid) in enumerate(zip(data_sources, uids)):
        groups[ds][uid].append(i)
    numeric = [k for k, v in infos.items() if k != "pred" and all(isinstance(x, (int, float, np.number, bool))
                                                                  for x in v)]
    per_prompt: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for ds, by_uid in groups.items():
        for uid, rows in by_uid.items():
            for var in numeric:
                vals = [float(infos[var][i]) for i in rows]
                N = len(vals)
                m = per_prompt[ds][var]
                m[f"mean@{N}"].append(float(np.mean(vals)))
                if N <= 1:
                    continue
                m[f"std@{N}"].append(float(np.std(vals)))
                ns, k = [], 2
                while k < N:
                    ns.append(k)
                    k *= 2
                ns.append(N)
                for k in ns:
                    (bm, bs), (wm, ws) = bootstrap_metric(vals, k, [max, min], seed=seed)
                    m[f"best@{k}/mean"].append(bm)
                    m[f"best@{k}/std"].append(bs)
                    m[f"worst@{k}/mean"].append(wm)
                    m[f"worst@{k}/std"].append(ws)
                    if preds is not None:
                        pairs = [(preds[i], float(infos[var][i])) for i in rows]
                        [(mm, ms)] = bootstrap_metric(pairs, k, [_majority_value], seed=seed)
                        m[f"maj@{k}/mean"].append(mm)
                        m[f"maj@{k}/std"].append(ms)
    return {ds: {var: {name: float(np.mean(v)) for name, v in metrics.items()} for var, metrics in by_var.items()}
            for ds, by_var in per_prompt.items()}


def flatten_validation_metrics(nested: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """``val-core/{ds}/{var}/{metric}`` for the core variable (``acc`` if present else ``reward``) and
    ``mean|maj|best`` at the largest n; everything else ``val-aux/{ds}/{var}/{metric}`` (verl's naming)."""
    out = {}
    for ds, by_var in nested.items():
        core_var = "acc" if "acc" in by_var else "reward"
        for var, metrics in by_var.items():
            n_max = max(int(name.split("@")[1].split("/")[0]) for name in metrics)
            for name, val in metrics.items():
                n = int(name.split("@")[1].split("/")[0])
                core = (var == core_var and n == n_max and name.split("@")[0] in ("mean", "maj", "best")
                        and "/std" not in name)
                out[f"{'val-core' if core else 'val-aux'}/{ds}/{var}/{name}"] = val
    return out


_AGG = {"mean": np.mean, "max": np.max, "min": np.min, "sum": np.sum}


def reduce_metrics(metric_lists: dict[str, list[float]], agg: dict[str, str] | None = None) -> dict[str, float]:
    """Reduce lists of values (one per micro-batch/worker) to one float per key.

    ``agg`` maps a key to ``"mean" | "max" | "min" | "sum"``; keys not in ``agg`` use the mean. The aggregation is
    never inferred from the key's name (``timing`` contains "min"). Tensors are converted with ``float``. An empty
    list gives NaN.

    Raises:
        ValueError: an unknown aggregation name.
    """
    agg = agg or {}
    bad = {k: v for k, v in agg.items() if v not in _AGG}
    if bad:
        raise ValueError(f"unknown aggregation(s) {bad}; expected one of {sorted(_AGG)}")
    out = {}
    for key, values in metric_lists.items():
        vals = [float(v) for v in values]
        out[key] = float(_AGG[agg.get(key, "mean")](vals)) if vals else float("nan")
    return out


def reduce_rank_metrics(per_rank: list[dict[str, list[float]]]) -> dict[str, float]:
    """One float per key from the ``{metric: [values]}`` dicts of every rank of a worker group (an update's
    metrics: one value per mini-batch and rank). Mean over ranks and mini-batches (``*/grad_norm``, ``*/lr`` are
    equal on all ranks); skipped-step counts and peak memory (``perf/max_memory*``) take the maximum over ranks."""
    merged: dict[str, list[float]] = {}
    for m in per_rank:
        for k, v in m.items():
            merged.setdefault(k, []).extend(v)
    agg = {k: ("max" if k.endswith("skipped_steps") or k.startswith("perf/max_memory") else "mean") for k in merged}
    return reduce_metrics(merged, agg)


def extra_info_means(info: dict[str, list]) -> dict[str, float]:
    """``reward/<key>/mean`` for every numeric per-sample key of a reward's ``reward_extra_info`` (None entries and
    non-numeric keys skipped; bools count as 0/1)."""
    out = {}
    for k, values in info.items():
        nums = [float(v) for v in values if isinstance(v, (int, float, np.number))]
        if nums and len(nums) == sum(v is not None for v in values):
            out[f"reward/{k}/mean"] = float(np.mean(nums))
    return out


def reward_output_metrics(outputs: Sequence) -> dict[str, float]:
    """The reward metrics of one training step from the :class:`rewards.manager.RewardOutput` of every generation
    batch (more than one with dynamic sampling), over every generated row: the scorer's ``metrics`` (counts
    ``reward/num_*`` and ``reward/time_s`` summed, rates averaged over the equal-size batches) and
    :func:`extra_info_means` of ``reward_extra_info`` (a batch that lacks a key gives None rows)."""
    metrics: dict[str, float] = {}
    for key in dict.fromkeys(k for r in outputs for k in r.metrics):
        vals = [r.metrics[key] for r in outputs if key in r.metrics]
        additive = key.startswith("reward/num_") or key == "reward/time_s"
        metrics[key] = float(np.sum(vals) if additive else np.mean(vals))
    keys = dict.fromkeys(k for r in outputs for k in r.reward_extra_info)
    metrics.update(extra_info_means({k: [v for r in outputs for v in (
        r.reward_extra_info[k] if k in r.reward_extra_info else [None] * len(r.token_level_scores))] for k in keys}))
    return metrics
