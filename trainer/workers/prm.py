"""The PRIME implicit process reward model worker (one Ray actor per rank, DeepSpeed ZeRO inside).

Holds a trainable causal LM ``pi_phi`` (the implicit PRM) and a frozen reference copy ``pi_ref``, both loaded
from a model path (``reward_model.model.path`` / ``ref_path``; default: the actor's initial weights). Both run
the packed, ``use_cache=False`` forward of :func:`trainer.forward.forward_log_probs` at temperature 1 (the PRM
models the data, not the sampler).

Methods called by the controller (``trainer/hooks/prime.py``, through :class:`trainer.roles.PRMGroup`):

* ``compute_rm_scores(data)`` -> ``rm_scores`` (B, R) f32 = ``beta * (log pi_phi - log pi_ref)`` per token;
* ``update_rm(data)`` -> one pass over mini-batches of ``reward_model.mini_batch_size`` prompts with the PRM
  cross-entropy (:func:`trainer.algos.prime.prm_ce_loss`); returns ``rm_scores`` from the training forward (PRIME's
  ``update: after``, in the original row order even with dynamic micro-batches) and ``meta["metrics"]``;
* ``save_checkpoint`` / ``load_checkpoint`` (a :class:`DeepSpeedCheckpointManager`, like the actor's).
"""
from __future__ import annotations

import logging
from collections import defaultdict

import torch

from trainer.protocol import DataProto
from trainer.workers.base import DistributedWorker
from trainer.workers.batching import global_count, micro_batches, mini_batch_rows
from trainer.workers.model_utils import ModelRole, forward_batch_log_probs, forward_micro
from trainer.workers.step_guard import count_skip, guarded_backward, optimizer_step

logger = logging.getLogger(__name__)

_INPUTS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


class PRMWorker(DistributedWorker):
    """Trainable implicit PRM + frozen reference; ``config`` is a :class:`trainer.config.prm.PRMWorkerConfig`
    (``reward_model``, see configs/algorithm/prime.yaml)."""

    def init_model(self) -> dict:
        import deepspeed  # noqa: F401  (after DS_ACCELERATOR is set)

        self.init_distributed()
        cfg = self.config
        self.rm_cfg = cfg.prm
        self.beta = cfg.prm_model.beta_train
        sp = cfg.prm.ulysses_sequence_parallel_size
        self.prm = ModelRole.build(self, cfg.model, sp=sp, train=True, optim_cfg=cfg.prm_model.optim,
                                   grad_clip=cfg.grad_clip, total_steps=cfg.total_steps)
        self.prm_ref = ModelRole.build(self, cfg.model, sp=sp, train=False, path_override=cfg.ref_path)
        return {**self.attach_checkpointing(self.prm), "path": cfg.model.path, "ref_path": cfg.ref_path}

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _micro(self) -> tuple[int, bool, int]:
        rm = self.rm_cfg
        return rm.micro_batch_size_per_gpu, rm.use_dynamic_bsz, rm.max_token_len_per_gpu

    # ---- scoring ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_rm_scores(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R) f32: ``beta * (log pi_phi - log pi_ref)`` at valid response tokens, 0 elsewhere."""
        from rewards.prime import implicit_token_rewards

        mbs, dyn, max_tok = self._micro()
        lp, _ = forward_batch_log_probs(self.prm, data, mbs, 1.0, False, dyn, max_tok)
        ref, _ = forward_batch_log_probs(self.prm_ref, data, mbs, 1.0, False, dyn, max_tok)
        return DataProto.from_dict({"rm_scores": implicit_token_rewards(lp, ref, data["response_mask"].cpu(),
                                                                        self.beta)})

    # ---- update -----------------------------------------------------------------------------------------------
    def update_rm(self, data: DataProto) -> DataProto:
        """One pass of the PRM cross-entropy over this rank's rows (needs ``acc`` (B,) f32 in [0, 1]).

        Every mini-batch of ``reward_model.mini_batch_size * rollout.n / dp`` rows is one optimizer step; the loss
        of a micro-batch is ``sum of per-sequence BCE / (rows of the mini-batch over all DP ranks) * dp`` (DeepSpeed
        averages gradients over DP ranks), so the step equals one backward over the mini-batch mean. A non-finite
        loss or gradient norm skips the step on every rank (:mod:`trainer.workers.step_guard`; counted in
        ``reward_model/skipped_steps`` and ``reward_model/consecutive_skipped_steps``).

        Returns:
            DataProto with ``rm_scores`` (B, R) f32 from the training forwards (original row order) and
            ``meta["metrics"]``: ``{reward_model/ce_loss, reward_model/grad_norm, reward_model/lr, ...: [floats]}``.
        """
        from rewards.prime import implicit_token_rewards
        from trainer.algos.prime import prm_ce_loss

        if "acc" not in data:
            raise KeyError("update_rm needs the column 'acc' (batch,) float32 of verified accuracies")
        role, engine = self.prm, self.prm.engine
        mbs, dyn, max_tok = self._micro()
        rows_per_mini = mini_batch_rows(self.rm_cfg.mini_batch_size, self.config.rollout_n, role.dp_size, len(data),
                                        key="reward_model.mini_batch_size")
        data = data.select(_INPUTS + ["acc"])
        data["_row"] = torch.arange(len(data))
        dev = role.device
        metrics: dict[str, list[float]] = defaultdict(list)
        scores, rows = [], []
        skipped = 0
        engine.train()
        for mini in data.split(rows_per_mini):
            n_seq = global_count(float(len(mini)), dev, role.dp_group)
            finite, ce_share = torch.ones((), dtype=torch.bool, device=dev), 0.0
            for mb in micro_batches(mini, mbs, dyn, max_tok * role.sp_size, role.dp_group):
                mask = mb["response_mask"].to(dev)
                with torch.no_grad():
                    ref, _ = forward_micro(self.prm_ref, mb, 1.0, False)
                lp, _ = forward_micro(role, mb, 1.0, False)
                per_seq = prm_ce_loss(lp, ref, mask, mb["acc"].to(dev).float(), self.beta, reduction="none")
                loss = per_seq.sum() / max(n_seq, 1.0) * role.dp_size
                finite = finite & guarded_backward(engine, loss)
                scores.append(implicit_token_rewards(lp.detach(), ref, mask, self.beta).float().cpu())
                rows.append(mb["_row"])
                ce_share += float(loss.detach())
            # this rank's share of the mini-batch mean (x dp): averaged over ranks by the controller, it is the mean
            # CE over every sequence of the mini-batch, whatever the micro-batch split
            metrics["reward_model/ce_loss"].append(ce_share)
            metrics["reward_model/lr"].append(float(engine.get_lr()[0]))  # the rate this step uses
            outcome = optimizer_step(engine, finite, dev, "reward_model")
            if outcome.grad_norm is not None:
                metrics["reward_model/grad_norm"].append(outcome.grad_norm)
            skipped += count_skip(role, outcome)
        metrics["reward_model/skipped_steps"].append(float(skipped))
        metrics["reward_model/consecutive_skipped_steps"].append(float(getattr(role, "consecutive_skipped", 0)))
        inv = torch.argsort(torch.cat(rows))
        out = DataProto.from_dict({"rm_scores": torch.cat(scores)[inv]})
        out.meta["metrics"] = dict(metrics)
        return out
