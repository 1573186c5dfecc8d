"""KL estimators between the policy and the reference model, the in-reward KL penalty and KL controllers.

Estimators of ``KL(pi || pi_ref)`` per token from ``x = log pi - log pi_ref`` (J. Schulman, "Approximating KL
Divergence", 2020, http://joschu.net/blog/kl-approx.html):

* ``k1`` / ``kl``: ``x``; ``abs``: ``|x|``; ``k2`` / ``mse``: ``x^2 / 2``;
* ``k3`` / ``low_var_kl``: ``exp(-x) + x - 1`` (non-negative, unbiased, low variance), computed as
  ``expm1(y) - y`` with ``y = clamp(ref - logp, -20, 20)`` and the result clamped to ``[0, 10]``.
* suffix ``+`` (e.g. ``k3+``): straight-through -- forward value of the named estimator, gradient of ``k2``
  (whose gradient is the unbiased gradient of the KL; verl >= 0.5).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .masked import as_bool_mask, masked_mean

__all__ = ["kl_penalty", "apply_kl_penalty", "FixedKLController", "AdaptiveKLController", "get_kl_controller",
           "KL_PENALTY_TYPES", "K3_INPUT_CLAMP", "K3_OUTPUT_CLAMP"]

KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
K3_INPUT_CLAMP = 20.0
K3_OUTPUT_CLAMP = 10.0


def _kl_forward(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("low_var_kl", "k3"):
        # Clamp the exponent *before* exp: clamp's gradient outside the range is 0, so saturated entries get
        # gradient 0 instead of 0 * inf = NaN. Computed in float32 even for bf16 inputs.
        y = (ref_log_prob.float() - log_prob.float()).clamp(-K3_INPUT_CLAMP, K3_INPUT_CLAMP)
        k3 = (torch.expm1(y) - y).clamp(0.0, K3_OUTPUT_CLAMP)
        return k3.to(torch.promote_types(log_prob.dtype, ref_log_prob.dtype))
    raise ValueError(f"unknown kl_penalty {kind!r}; expected one of {list(KL_PENALTY_TYPES)} "
                     "(optionally with a '+' suffix)")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """Per-token KL estimate, same shape and dtype as the inputs (typically ``(batch, response_len)``).

    Args:
        log_prob: log-probs of the sampled tokens under the policy.
        ref_log_prob: log-probs under the reference model.
        kl_penalty: one of ``kl|k1, abs, mse|k2, low_var_kl|k3``, each optionally suffixed with ``+``.
    Raises:
        ValueError: for an unknown estimator name (``"full"`` is not supported).
    """
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(f"log_prob {tuple(log_prob.shape)} and ref_log_prob {tuple(ref_log_prob.shape)} "
                         "must have the same shape")
    if kl_penalty.endswith("+"):
        value = _kl_forward(log_prob, ref_log_prob, kl_penalty[:-1])
        k2 = _kl_forward(log_prob, ref_log_prob, "k2")
        return k2 - k2.detach() + value.detach()
    return _kl_forward(log_prob, ref_log_prob, kl_penalty)


class FixedKLController:
    """Constant KL coefficient ``value = kl_coef`` (``algorithm.kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for interface parity with :class:`AdaptiveKLController`)."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, section 2.2).

    ``update``: ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``;
    ``value <- value * (1 + e * n_steps / horizon)``; ``n_steps`` is the number of samples in the batch.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if init_kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs init_kl_coef >= 0, target_kl > 0, horizon > 0; got "
                             f"init_kl_coef={init_kl_coef}, target_kl={target_kl}, horizon={horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon


def get_kl_controller(cfg: Mapping[str, Any]):
    """Build a controller from ``algorithm.kl_ctrl``: keys ``type`` (``fixed``|``adaptive``), ``kl_coef``,
    and for adaptive ``target_kl`` and ``horizon`` (verl names). Accepts a dict or an OmegaConf DictConfig.

    Raises:
        ValueError: unknown ``type`` or a missing key.
    """
    for key in ("type", "kl_coef"):
        if key not in cfg:
            raise ValueError(f"kl_ctrl config needs {key!r}")
    kind = cfg["type"]
    if kind == "fixed":
        return FixedKLController(kl_coef=cfg["kl_coef"])
    if kind == "adaptive":
        missing = [k for k in ("target_kl", "horizon") if cfg.get(k) is None]
        if missing:
            raise ValueError(f"adaptive kl_ctrl config lacks {missing}")
        return AdaptiveKLController(init_kl_coef=cfg["kl_coef"], target_kl=cfg["target_kl"], horizon=cfg["horizon"])
    raise ValueError(f"unknown kl_ctrl type {kind!r}; expected 'fixed' or 'adaptive'")


def apply_kl_penalty(token_level_scores: torch.Tensor, old_log_probs: torch.Tensor, ref_log_prob: torch.Tensor,
                     response_mask: torch.Tensor, kl_ctrl, kl_penalty: str = "kl",
                     update_kl_ctrl: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL (``algorithm.use_kl_in_reward``): ``rewards = scores - beta * kld`` on valid tokens.

    ``kld = kl_penalty(old_log_probs, ref_log_prob)`` with masked positions replaced by 0 through ``where``
    (a NaN log-prob at a masked position cannot leak). ``current_kl`` = mean over rows with at least
    one valid token of the per-row masked mean of ``kld``. If ``update_kl_ctrl``, calls
    ``kl_ctrl.update(current_kl, n_steps=batch)`` after reading ``beta`` (as verl does).

    Args:
        token_level_scores, old_log_probs, ref_log_prob, response_mask: ``(batch, response_len)``.
        kl_ctrl: an object with ``.value`` (beta) and ``.update(current_kl, n_steps)``.
    Returns:
        ``(token_level_rewards (batch, response_len), {"actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": beta})``; masked positions keep their score.
    """
    m = as_bool_mask(response_mask, token_level_scores)
    zero = torch.zeros((), dtype=old_log_probs.dtype, device=old_log_probs.device)
    old = torch.where(m, old_log_probs, zero)
    ref = torch.where(m, ref_log_prob, zero)
    kld = torch.where(m, _kl_forward(old, ref, kl_penalty.rstrip("+")), zero).detach()
    beta = float(kl_ctrl.value)
    rewards = torch.where(m, token_level_scores - beta * kld.to(token_level_scores.dtype), token_level_scores)
    rows = m.any(dim=-1)
    per_row = masked_mean(kld.float(), m, dim=-1)
    current_kl = float(per_row[rows].mean()) if bool(rows.any()) else 0.0
    if update_kl_ctrl:
        kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
