"""Rollout correction: importance weights between the policy that generated a batch and the one that trains on it.

The rollout engine (vLLM, or the transformers engine in bf16 with other kernels) samples from ``pi_rollout``,
which differs slightly from the trainer's ``pi_old`` for the same weights (kernels, precision, batch shapes),
and more when rollouts are stale. Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl; verl's
``algorithm.rollout_correction``) multiplies each token's policy-gradient term by

    token level:     w_t = min(exp(log pi_old(y_t) - log pi_rollout(y_t)), C)
    sequence level:  w_i = min(exp(sum_t log pi_old(y_t) - log pi_rollout(y_t)), C)   (one weight per response)

with ``C`` = ``rollout_is_threshold``. Log-ratios are clamped to [-20, 20] before ``exp`` (verl's safety bound).
``rollout_is_batch_normalize`` divides the weights by their mean over the batch (tokens for token level,
sequences for sequence level), so that the mean weight is 1.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import torch

__all__ = ["RolloutCorrection", "LEVELS", "apply_rollout_correction", "rollout_is_weights",
           "log_prob_gap_metrics", "LogProbGap"]

LEVELS = ("token", "sequence")
_LOG_BOUND = 20.0


@dataclass(frozen=True)
class RolloutCorrection:
    """``algorithm.rollout_correction`` (verl's keys).

    Attributes:
        rollout_is: None (off), ``"token"`` or ``"sequence"``: the level of the importance weight.
        rollout_is_threshold: ``C`` >= 1, the upper clamp of the weight (below 1 every weight, even an on-policy
            token's 1, would be cut down).
        rollout_is_batch_normalize: divide the weights by their batch mean.

    Raises:
        ValueError: an unknown level or a threshold that is not a finite number >= 1, one line naming the key
            (:func:`trainer.config_checks.check_rollout_correction` turns it into a ConfigError before start-up).
    """

    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False

    def __post_init__(self) -> None:
        if self.rollout_is is not None and self.rollout_is not in LEVELS:
            raise ValueError(f"algorithm.rollout_correction.rollout_is={self.rollout_is!r}; expected null, "
                             f"{', '.join(LEVELS)} or auto")
        try:
            c = float(self.rollout_is_threshold)
        except (TypeError, ValueError):
            c = float("nan")
        if not c >= 1 or c == float("inf"):
            raise ValueError(f"algorithm.rollout_correction.rollout_is_threshold={self.rollout_is_threshold!r}; "
                             "expected a finite number >= 1 (the upper clamp of the importance weight; below 1 "
                             "every weight, an on-policy token's 1 too, is cut down)")

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> "RolloutCorrection":
        """Build from the config section ``algorithm.rollout_correction`` (``configs/ppo_trainer.yaml`` holds its
        defaults; a key the mapping lacks, or None for the whole section, keeps the field's default above).

        Raises:
            ValueError: see the class.
        """
        s = dict(section or {})
        level = s.get("rollout_is")
        # auto: trainer.launch.resolve_config makes it token with trainer.async.staleness >= 1, else off
        s["rollout_is"] = None if level in (None, "", "none", "null", "auto") else str(level)
        if "rollout_is_batch_normalize" in s:
            s["rollout_is_batch_normalize"] = bool(s["rollout_is_batch_normalize"])
        return cls(**{f.name: s[f.name] for f in fields(cls) if f.name in s})

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None


def rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                       spec: RolloutCorrection) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights ``pi_old / pi_rollout`` (see the module doc) and their metrics.

    Args:
        old_log_probs: (B, R) float, the trainer's log-probs of the sampled tokens.
        rollout_log_probs: (B, R) float, the engine's log-probs of the same tokens.
        response_mask: (B, R) 0/1, the tokens that count.
        spec: an enabled :class:`RolloutCorrection`.

    Returns:
        ``(weights, metrics)``: weights (B, R) float32, detached, 0 outside the mask; metrics
        ``rollout_corr/is_weight_mean`` / ``_max`` / ``_min`` (of the raw weights over the counted tokens or
        sequences, before clamping), ``rollout_corr/is_truncated_frac`` (share whose raw weight exceeded ``C``),
        ``rollout_corr/is_eff_sample_size`` (``(sum w)^2 / (n sum w^2)`` of the final weights, in (0, 1]).

    Raises:
        ValueError: the spec is off, or the shapes differ.
    """
    if not spec.enabled:
        raise ValueError("rollout_is_weights needs algorithm.rollout_correction.rollout_is set (token or sequence)")
    if old_log_probs.shape != rollout_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise ValueError(f"old_log_probs {tuple(old_log_probs.shape)}, rollout_log_probs "
                         f"{tuple(rollout_log_probs.shape)} and response_mask {tuple(response_mask.shape)} must match")
    m = response_mask > 0
    delta = torch.where(m, old_log_probs.float() - rollout_log_probs.float(), 0.0)  # NaN * 0 is NaN: not a mask
    if spec.rollout_is == "token":
        raw, counted = torch.exp(delta.clamp(-_LOG_BOUND, _LOG_BOUND)), m
    else:
        seq = torch.exp(delta.sum(-1).clamp(-_LOG_BOUND, _LOG_BOUND))
        raw, counted = seq[:, None].expand_as(delta), m.any(-1)
    c = float(spec.rollout_is_threshold)
    w = raw.clamp(max=c)
    sel = w[counted] if spec.rollout_is == "token" else w[:, 0][counted]
    raw_sel = raw[counted] if spec.rollout_is == "token" else raw[:, 0][counted]
    if spec.rollout_is_batch_normalize and sel.numel():
        scale = sel.mean().clamp(min=1e-8)
        w, sel = w / scale, sel / scale
    metrics = {}
    if sel.numel():
        metrics = {"rollout_corr/is_weight_mean": float(raw_sel.mean()),
                   "rollout_corr/is_weight_max": float(raw_sel.max()),
                   "rollout_corr/is_weight_min": float(raw_sel.min()),
                   "rollout_corr/is_truncated_frac": float((raw_sel > c).float().mean()),
                   "rollout_corr/is_eff_sample_size": float(sel.sum() ** 2 / (sel.numel() * (sel ** 2).sum()))}
    return torch.where(m, w, torch.zeros_like(w)).detach(), metrics


def log_prob_gap_metrics(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                         response_mask: torch.Tensor) -> dict[str, float]:
    """``rollout/log_prob_diff_mean`` / ``_max``: mean and max of ``|log pi_old - log pi_rollout|`` over the
    counted tokens (nats); ``{}`` when no token counts. Shapes (B, R)."""
    m = response_mask > 0
    if not m.any():
        return {}
    diff = (old_log_probs.float() - rollout_log_probs.float()).abs()[m]
    return {"rollout/log_prob_diff_mean": float(diff.mean()), "rollout/log_prob_diff_max": float(diff.max())}


class LogProbGap:
    """:func:`log_prob_gap_metrics` gathered over pieces of a batch (the micro-batches of an on-policy update,
    whose forward gives ``log pi_old``; :func:`trainer.workers.update.ppo_update`) without a host sync per piece.

    :meth:`add` keeps the running sum, count and maximum of ``|log pi_old - log pi_rollout|`` over the counted
    tokens as 0-d tensors on the pieces' device; :meth:`metrics` reduces them over ranks and returns the same
    ``rollout/log_prob_diff_mean`` / ``_max`` as :func:`log_prob_gap_metrics` of the whole batch.
    """

    def __init__(self) -> None:
        self.total = self.count = self.largest = None

    def add(self, log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor) -> None:
        """Take one piece: ``log_probs`` (b, R) float (detached here), ``rollout_log_probs`` (b, R) float and
        ``response_mask`` (b, R) on one device.

        Raises:
            ValueError: shapes that differ.
        """
        if log_probs.shape != rollout_log_probs.shape or log_probs.shape != response_mask.shape:
            raise ValueError(f"log_probs {tuple(log_probs.shape)}, rollout_log_probs "
                             f"{tuple(rollout_log_probs.shape)} and response_mask {tuple(response_mask.shape)} "
                             "must have one shape")
        m = response_mask > 0
        diff = torch.where(m, (log_probs.detach().float() - rollout_log_probs.float()).abs(), 0.0)
        parts = (diff.sum(dtype=torch.float64), m.sum().double(), diff.max() if diff.numel() else diff.new_zeros(()))
        if self.total is None:
            self.total, self.count, self.largest = parts
        else:
            self.total, self.count = self.total + parts[0], self.count + parts[1]
            self.largest = torch.maximum(self.largest, parts[2])

    def metrics(self, total_over_ranks=float, max_over_ranks=float) -> dict[str, float]:
        """``rollout/log_prob_diff_mean`` / ``_max`` over every piece (``{}`` when no token counted).

        Args:
            total_over_ranks / max_over_ranks: ``float -> float``, the sum / maximum of this rank's value over the
                data-parallel ranks (default: this rank alone).
        """
        local = [0.0, 0.0, 0.0] if self.total is None else [float(self.count), float(self.total), float(self.largest)]
        # every rank makes the same three calls in the same order (collectives), whatever it holds
        count, total, largest = total_over_ranks(local[0]), total_over_ranks(local[1]), max_over_ranks(local[2])
        if count == 0:
            return {}
        return {"rollout/log_prob_diff_mean": total / count, "rollout/log_prob_diff_max": largest}


def apply_rollout_correction(batch, spec: RolloutCorrection) -> dict[str, float]:
    """The rollout-correction stage of a training step, after the old log-probs: sets ``rollout_is_weights``
    (B, R) f32 in ``batch`` when ``spec`` is enabled (:func:`rollout_is_weights`; the policy losses multiply their
    per-token terms by it). Returns the stage's metrics: the gap :func:`log_prob_gap_metrics` (always) and the
    weights' statistics.

    Args:
        batch: a :class:`trainer.protocol.DataProto` with ``old_log_probs``, ``rollout_log_probs`` and
            ``response_mask`` (B, R).
        spec: ``algorithm.rollout_correction``.
    """
    args = (batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    metrics = log_prob_gap_metrics(*args)
    if spec.enabled:
        batch["rollout_is_weights"], m = rollout_is_weights(*args, spec)
        metrics.update(m)
    return metrics
