"""The PPO-family update loop of the actor and critic workers (epochs x mini-batches x micro-batches).

Loss normalisation: every micro-batch loss is aggregated with the mini-batch's GLOBAL counts (valid tokens and
sequences summed over its micro-batches and over data-parallel ranks; ``trainer.core_algos.agg_loss``), and
multiplied by the data-parallel size because DeepSpeed averages gradients over data-parallel ranks. DeepSpeed
runs with ``managed_gradient_accumulation: false``: each ``backward`` accumulates, and ``step`` is one
optimizer step. The result equals one backward over the whole mini-batch, for every loss_agg_mode (tested in
tests/test_loss_normalisation.py). Logged metrics: see LOSS_METRICS below.
With Ulysses SP the SP peers of a data-parallel rank hold the same rows; DeepSpeed averages over all
dp*sp ranks and the gathered log-probs scale their gradient by sp (patches/ulysses.py), which nets out.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from trainer.protocol import DataProto
from trainer.workers.base import reset_peak_memory, stage_peak_memory
from trainer.workers.batching import global_count, global_max, micro_batches, mini_batch_rows
from trainer.workers.step_guard import count_skip, guarded_backward, optimizer_step
from trainer.workers.update_mfu import update_mfu


def forward_values_micro(role, mb: DataProto) -> torch.Tensor:
    """Values of the response positions of one micro-batch of a critic ``role``
    (:class:`trainer.workers.model_utils.ModelRole` with a value head): (b, R) f32."""
    from trainer.forward import forward_values

    return forward_values(role.engine, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                          response_length=mb["responses"].shape[1], use_remove_padding=role.use_remove_padding,
                          sp=role.sp, device=role.device)


def _shuffle(data: DataProto, seed: int) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return data.index(torch.randperm(len(data), generator=g))


# How the per-micro-batch metric values of one mini-batch become ONE value per mini-batch and rank; the controller
# then averages over data-parallel ranks (and mini-batches), trainer.metric_utils.reduce_rank_metrics.
# * LOSS_METRICS are the losses as optimised: each micro-batch value is aggregated with the mini-batch's global
#   counts and scaled by dp_size (module docstring), so their sum over micro-batches, averaged over ranks, is the
#   mini-batch loss under the configured loss_agg_mode.
# * CONSTANT_METRICS are the same number in every micro-batch (a coefficient): averaged.
# * every other metric is a per-token statistic: its micro-batch value is a mean over that micro-batch's valid
#   tokens (entropy, clip fractions, approx-KL, value clip fraction, mean value; a policy loss's metrics by the
#   registry's contract). It is weighted by the micro-batch's share of the mini-batch's valid tokens,
#   ``value * tokens_mb / tokens_global * dp_size``, and summed: averaged over ranks that is the token mean over
#   the whole mini-batch, whatever the loss_agg_mode, the micro-batch split and the data-parallel size.
LOSS_METRICS = frozenset({"pg_loss", "kl_loss", "vf_loss"})
CONSTANT_METRICS = frozenset({"kl_coef"})


def ppo_update(worker, role, data: DataProto, cfg, n: int, temperature: float, kind: str,
               response_length: int | None = None) -> dict:
    """Run ``cfg.ppo_epochs`` passes over ``data`` (this rank's rows); returns ``{metric: [values]}``.

    Args:
        worker: the DistributedWorker (its device).
        role: the :class:`trainer.workers.model_utils.ModelRole` being trained.
        data: rows with ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``response_mask``
            and, for the actor, ``advantages``, ``old_log_probs`` (+ ``ref_log_prob`` with a KL loss); for the
            critic ``values``, ``returns``. An actor batch whose ``meta`` marks it on-policy
            (:data:`trainer.on_policy.OLD_FROM_UPDATE`, set by the trainer instead of running the old-log-prob pass)
            needs no ``old_log_probs``: ``pi_old`` is the update's own forward, detached, which it equals in one
            optimizer step (:func:`check_on_policy`; verl's ``on_policy`` rule in ``dp_actor.update_policy``); the
            entropy is then always computed (``actor/entropy``) and, with ``rollout_log_probs``, the
            engine-vs-trainer gap ``rollout/log_prob_diff_mean`` / ``_max``
            (:class:`trainer.algos.rollout_correction.LogProbGap`) comes from the same forward.
        cfg: the :class:`trainer.config.actor.ActorConfig` or :class:`trainer.config.actor.CriticConfig`.
        n: responses per prompt (``rollout.n``); temperature: of the log-prob forwards.
        kind: ``actor`` or ``critic``.
        response_length: ``rollout.response_length``, the default of ``loss_scale_factor``
            (:func:`loss_scale_factor`).

    Raises:
        ValueError: an on-policy actor batch that the update would train in more than one optimizer step
            (:func:`check_on_policy`).
    """
    from trainer.algos.rollout_correction import LogProbGap
    from trainer.on_policy import OLD_FROM_UPDATE

    t0 = time.perf_counter()
    role.engine.train()
    metrics: dict[str, list[float]] = defaultdict(list)
    reset_peak_memory(worker.device)  # the peak memory metrics below then cover this update only
    mb_rows = mini_batch_rows(cfg.ppo_mini_batch_size, n, role.dp_size, len(data))
    on_policy = kind == "actor" and bool(data.meta.get(OLD_FROM_UPDATE))
    if on_policy:
        check_on_policy(cfg.ppo_epochs, mb_rows, len(data))
    gap = LogProbGap() if on_policy and "rollout_log_probs" in data else None
    step = _MiniBatchStep(worker, role, cfg, kind, temperature,
                          loss_scale_factor(cfg.loss_scale_factor, response_length, data["response_mask"].shape[-1]),
                          gap)
    skipped = 0
    for epoch in range(cfg.ppo_epochs):
        epoch_data = _shuffle(data, seed=epoch) if cfg.shuffle else data
        for mini in epoch_data.split(mb_rows):
            skipped += step(mini, metrics)
    metrics[f"{kind}/skipped_steps"].append(float(skipped))
    metrics[f"{kind}/consecutive_skipped_steps"].append(float(getattr(role, "consecutive_skipped", 0)))
    if gap is not None:  # over every counted token of every rank (the ranks' sums and maxima all-reduced)
        for k, v in gap.metrics(lambda x: global_count(x, worker.device, role.dp_group),
                                lambda x: global_max(x, worker.device, role.dp_group)).items():
            metrics[k].append(v)
    for k, v in stage_peak_memory(worker.device, kind).items():  # this process during the update, GiB
        metrics[k].append(v)
    mfu = update_mfu(role, data, cfg.ppo_epochs, t0, worker.device) if kind == "actor" else None
    if mfu is not None:
        metrics["perf/mfu/actor"].append(mfu)
    metrics[f"perf/worker_s/update_{kind}"].append(time.perf_counter() - t0)  # the trainer's timer less Ray's part
    return dict(metrics)


def check_on_policy(ppo_epochs: int, mini_batch_rows: int, rows: int) -> None:
    """An actor update that takes ``pi_old`` from its own forward must be ONE optimizer step over all its rows:
    then every row's forward runs with the weights the step starts from, the weights a separate old-log-prob pass
    would have used, so ``pi_old = pi_theta`` there (the PPO ratio is 1 in value and its gradient is that of
    ``log pi_theta``; TRL and verl take the same shortcut).

    Args:
        ppo_epochs: ``actor.ppo_epochs``.
        mini_batch_rows: rows of one mini-batch on this rank (:func:`trainer.workers.batching.mini_batch_rows`).
        rows: rows of this rank's batch.

    Raises:
        ValueError: more than one epoch or more than one mini-batch (the trainer runs the old-log-prob pass then;
            see :mod:`trainer.on_policy`).
    """
    if ppo_epochs != 1 or mini_batch_rows != rows:
        raise ValueError(f"the actor batch is marked on-policy (no old_log_probs), but its update takes "
                         f"{ppo_epochs} epoch(s) of {rows // max(mini_batch_rows, 1)} mini-batch(es) of "
                         f"{mini_batch_rows} rows; only one optimizer step over the whole batch may use its own "
                         "forward as pi_old")


class _MiniBatchStep:
    """One optimizer step over a mini-batch: its global token and sequence counts, the micro-batches' losses and
    backward passes, the metrics (one value per mini-batch, see :data:`LOSS_METRICS`) and the guarded step.
    Calling it returns 1 when the step was skipped (non-finite loss or gradient), else 0."""

    def __init__(self, worker, role, cfg, kind: str, temperature: float, scale: float, gap=None):
        self.worker, self.role, self.cfg, self.kind = worker, role, cfg, kind
        self.temperature, self.scale, self.gap = temperature, scale, gap
        self.max_tok = (cfg.ppo_max_token_len_per_gpu or 0) * role.sp_size  # read only with use_dynamic_bsz

    def __call__(self, mini: DataProto, metrics: dict) -> int:
        worker, role, cfg, kind = self.worker, self.role, self.cfg, self.kind
        mask = mini["response_mask"]
        n_tok = global_count(mask.sum().item(), worker.device, role.dp_group)
        n_seq = global_count((mask.sum(-1) > 0).sum().item(), worker.device, role.dp_group)
        agg = dict(global_num_tokens=max(n_tok, 1.0), global_num_seqs=max(n_seq, 1.0), dp_size=role.dp_size,
                   loss_scale_factor=self.scale)
        finite = torch.ones((), dtype=torch.bool, device=worker.device)
        pending: dict[str, list] = defaultdict(list)  # this mini-batch's metric values, read once at its end
        for mb in micro_batches(mini, cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz, self.max_tok,
                                role.dp_group):
            if kind == "actor":
                extra = {} if self.gap is None else {"gap": self.gap}
                loss, m = _actor_loss(role, mb, cfg, self.temperature, cfg.loss_agg_mode, agg, **extra)
            else:
                loss, m = _critic_loss(role, mb, cfg, cfg.loss_agg_mode, agg)
            finite = finite & guarded_backward(role.engine, loss)  # no host sync per micro-batch
            token_share = float(mb["response_mask"].sum()) / max(n_tok, 1.0) * role.dp_size
            for k, v in m.items():
                pending[k].append(v if k in LOSS_METRICS or k in CONSTANT_METRICS else v * token_share)
        for k, vals in _read_metrics(pending).items():  # one value per mini-batch (see LOSS_METRICS)
            metrics[f"{kind}/{k}"].append(sum(vals) / len(vals) if k in CONSTANT_METRICS else sum(vals))
        metrics[f"{kind}/lr"].append(float(role.engine.get_lr()[0]))  # the rate this step uses (verl logs it so)
        outcome = optimizer_step(role.engine, finite, worker.device, kind)  # then the scheduler moves to the next
        if outcome.grad_norm is not None:
            metrics[f"{kind}/grad_norm"].append(outcome.grad_norm)
        return count_skip(role, outcome)


def loss_scale_factor(factor: float | None, response_length: int | None, width: int) -> float:
    """The constant of ``seq-mean-token-sum-norm``: ``factor`` (the role's ``loss_scale_factor``, verl's key), else
    ``response_length`` (``actor_rollout_ref.rollout.response_length``, verl's default, the padded response
    width), else ``width`` (the batch's response columns).

    Raises:
        ValueError: a factor that is not a positive number.
    """
    if factor is None:
        factor = width if response_length is None else response_length
    if not float(factor) > 0:
        raise ValueError(f"loss_scale_factor={factor!r}; expected a positive number")
    return float(factor)


def _read_metrics(pending: dict[str, list]) -> dict[str, list[float]]:
    """``{name: [0-d tensors or floats]}`` -> ``{name: [floats]}`` with ONE device->host copy for all tensors."""
    tensors = [v.detach().float().reshape(()) for vals in pending.values() for v in vals if torch.is_tensor(v)]
    host = iter(torch.stack(tensors).tolist()) if tensors else iter(())
    return {k: [next(host) if torch.is_tensor(v) else float(v) for v in vals] for k, vals in pending.items()}


def _actor_loss(role, mb: DataProto, cfg, temperature: float, agg_mode: str, agg: dict, gap=None):
    """The actor's loss of one micro-batch and its metrics (0-d tensors). In an on-policy update (``mb.meta``
    marked :data:`trainer.on_policy.OLD_FROM_UPDATE`, :func:`check_on_policy`) ``pi_old`` is this forward's
    log-probs, detached, and the entropy is computed for the ``entropy`` metric; ``gap`` (a
    :class:`trainer.algos.rollout_correction.LogProbGap`, or None) takes the micro-batch's engine-vs-trainer gap."""
    from trainer import core_algos
    from trainer.forward import to_device
    from trainer.on_policy import OLD_FROM_UPDATE
    from trainer.workers.model_utils import forward_micro

    dev = role.device
    mask = to_device(mb["response_mask"], dev)
    entropy_coeff = cfg.entropy_coeff
    on_policy = bool(mb.meta.get(OLD_FROM_UPDATE))
    log_prob, entropy = forward_micro(role, mb, temperature, calculate_entropy=entropy_coeff != 0 or on_policy)
    old = log_prob.detach() if on_policy else to_device(mb["old_log_probs"], dev)
    if gap is not None:
        gap.add(log_prob, to_device(mb["rollout_log_probs"], dev), mask)
    adv = to_device(mb["advantages"], dev)
    loss_fn = core_algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
    is_w = to_device(mb["rollout_is_weights"], dev) if "rollout_is_weights" in mb else None
    pg_loss, pg_m = loss_fn(old, log_prob, adv, mask, loss_agg_mode=agg_mode, config=cfg,
                            rollout_is_weights=is_w, **agg)
    loss = pg_loss
    metrics = {"pg_loss": pg_loss.detach(), **pg_m}  # 0-d tensors: read once per mini-batch (_read_metrics)
    if entropy is not None:
        metrics["entropy"] = core_algos.masked_mean(entropy.detach(), mask)  # a token mean, not the loss term
        if entropy_coeff:
            loss = loss - entropy_coeff * core_algos.agg_loss(entropy, mask, agg_mode, **agg)
    if cfg.use_kl_loss:
        # outside the response the reference is the policy itself (a KL of 0 with a 0 gradient): a non-finite
        # reference log-prob there must not reach the gradient as NaN * 0
        ref = torch.where(mask.bool(), to_device(mb["ref_log_prob"], dev), log_prob.detach())
        kld = core_algos.kl_penalty(log_prob, ref, cfg.kl_loss_type)
        kl_loss = core_algos.agg_loss(kld, mask, agg_mode, **agg)
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
        metrics["kl_coef"] = cfg.kl_loss_coef
    return loss, metrics


def _critic_loss(role, mb: DataProto, cfg, agg_mode: str, agg: dict):
    from trainer import core_algos
    from trainer.forward import to_device

    dev = role.device
    mask = to_device(mb["response_mask"], dev)
    vpreds = forward_values_micro(role, mb)
    vf_loss, clipfrac = core_algos.compute_value_loss(vpreds, to_device(mb["returns"], dev),
                                                      to_device(mb["values"], dev), mask,
                                                      cliprange_value=cfg.cliprange_value,
                                                      loss_agg_mode=agg_mode, **agg)
    vmean = core_algos.masked_mean(vpreds.detach(), mask)
    return vf_loss, {"vf_loss": vf_loss.detach(), "vf_clipfrac": clipfrac, "vpred_mean": vmean}
