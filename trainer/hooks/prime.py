"""PRIME as a hook of the training step (Cui et al. 2025, "Process Reinforcement through Implicit Rewards").

Selected with ``algorithm=prime`` (``configs/algorithm/prime.yaml`` sets ``algorithm.use_prime: true``). The PPO
step is not copied; :class:`PrimeHook` plugs in at these seams (:mod:`trainer.hooks.base`):

* roles: a :class:`trainer.workers.prm.PRMWorker` group colocated with the actor (checkpoint folder ``reward/``);
* the prompt loader draws ``round(data.train_batch_size * data.oversample_factor)`` prompts per step (its state
  resumes as usual);
* ``filter_batch`` (``timing_s/prime_filter``): per-row accuracy (the reward manager's ``verify`` rule,
  :func:`rewards.verify.accuracy_from_reward`), the accuracy-band / truncation filter, downsampling to
  ``train_batch_size`` groups (:meth:`PrimeHook.band_filter`);
* ``compute_advantage`` in place of the estimator (:meth:`PrimeHook.prime_advantage`, ``timing_s/prm``): PRM
  update/scoring (``reward_model.model.update``: ``before`` | ``after`` | ``none``), batch-global normalisation,
  per-source RLOO advantages (:func:`trainer.algos.prime.compute_prime_advantages`).

Groups are found by ``uid`` everywhere, so ``trainer.balance_batch`` may reorder rows.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from trainer.hooks.base import StepContext, StepHook
from trainer.metric_utils import reduce_rank_metrics
from trainer.protocol import DataProto
from trainer.roles import PRMGroup, Role

logger = logging.getLogger(__name__)

__all__ = ["UPDATE_MODES", "PrimeHook", "prime_enabled", "truncated_rows"]

UPDATE_MODES = ("before", "after", "none")
_PRM_INPUTS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "acc"]


def prime_enabled(cfg) -> bool:
    """True when the config asks for PRIME (``algorithm.use_prime``)."""
    return bool((cfg.get("algorithm") or {}).get("use_prime", False))


def truncated_rows(responses: torch.Tensor, response_mask: torch.Tensor, stop_token_ids) -> torch.Tensor:
    """(B,) bool: the response filled all ``R`` columns and its last token is no stop token (cut by the length
    limit). ``stop_token_ids``: an id or ids (the rollout's set, see ``rollout.stop_tokens``), or None."""
    from rollout.stop_tokens import as_id_list

    full = (response_mask > 0).sum(-1) == responses.shape[1]
    stops = as_id_list(stop_token_ids)
    if not stops:
        return full
    return full & ~torch.isin(responses[:, -1], torch.tensor(stops, dtype=responses.dtype))


def _prm_worker() -> type:
    from trainer.workers.prm import PRMWorker

    return PRMWorker


class PrimeHook(StepHook):
    """PRIME's seams of the step (see the module docstring).

    Args:
        config: the resolved config (``data``, ``reward_model``, ``algorithm`` keys of prime.yaml).
        world: number of workers (data-parallel x sequence-parallel).
        stop_token_ids: the rollout's stop ids, for the truncation flag (replaced by the engine's set once the
            workers report it).

    Raises:
        ValueError: a PRIME setting is out of range (named in the message).
    """

    def __init__(self, config, world: int, stop_token_ids=None):
        self.world, self.stop_token_ids = int(world), stop_token_ids
        d, rm, algo = config["data"], config["reward_model"], config["algorithm"]
        self.bs = int(d["train_batch_size"])
        self.n = int(config["actor_rollout_ref"]["rollout"]["n"])
        self.factor = float(d.get("oversample_factor", 1.0))
        self.lower = float(d.get("accuracy_lower_bound", 0.2))
        self.upper = float(d.get("accuracy_upper_bound", 0.8))
        self.filter_accuracy = bool(d.get("filter_accuracy", True))
        self.filter_truncate = bool(d.get("filter_truncate", True))
        self.update_mode = str(rm["model"].get("update", "before"))
        self.granularity = str(rm.get("prime_granularity", "token"))
        self.norm = str(rm.get("prime_norm", "batch_norm"))
        self.dpo_coef = float(algo.get("reward_dpo_coef", 5.0))
        self.gt_coef = float(algo.get("reward_gt_coef", 5.0))
        self._check(str(rm["model"].get("loss_type", "ce")))
        self.role = Role("prm", _prm_worker, PRMGroup, sp_size=int(rm.get("ulysses_sequence_parallel_size", 1)),
                         ckpt_dir="reward",
                         missing_hint="PRIME reward model folder 'reward/'; it was saved without algorithm=prime")
        self.prm: PRMGroup | None = None

    def _check(self, loss_type: str) -> None:
        if self.n < 2:
            raise ValueError(f"actor_rollout_ref.rollout.n={self.n}; PRIME's leave-one-out needs n >= 2")
        if not self.factor >= 1.0:
            raise ValueError(f"data.oversample_factor={self.factor}; expected >= 1")
        self.n_prompts = int(round(self.bs * self.factor))
        if self.n_prompts % self.world:
            raise ValueError(f"data.train_batch_size*data.oversample_factor={self.n_prompts} prompts must divide "
                             f"over the {self.world} workers")
        if not 0.0 <= self.lower <= self.upper <= 1.0:
            raise ValueError(f"data.accuracy_lower_bound={self.lower}, data.accuracy_upper_bound={self.upper}; "
                             "expected 0 <= lower <= upper <= 1")
        if self.update_mode not in UPDATE_MODES:
            raise ValueError(f"reward_model.model.update={self.update_mode!r}; expected one of {UPDATE_MODES}")
        if loss_type != "ce":
            raise ValueError(f"reward_model.model.loss_type={loss_type!r}; only 'ce' is built")
        if self.granularity not in ("token", "whole"):
            raise ValueError(f"reward_model.prime_granularity={self.granularity!r}; expected token or whole")
        if self.norm not in ("batch_norm", "none"):
            raise ValueError(f"reward_model.prime_norm={self.norm!r}; expected batch_norm or none")
        if self.dpo_coef == 0 and self.gt_coef == 0:
            raise ValueError("algorithm.reward_dpo_coef and algorithm.reward_gt_coef are both 0: no reward source")

    # ---- set-up -----------------------------------------------------------------------------------------------
    def roles(self) -> list[Role]:
        return [self.role]

    def wrap_loader(self, loader):
        """A :class:`trainer.dataset.PromptLoader` over the same dataset yielding ``n_prompts`` prompts per step."""
        from trainer.dataset import PromptLoader

        if self.n_prompts == loader.batch_size:
            return loader
        return PromptLoader(loader.dataset, self.n_prompts, loader.pad_token_id, shuffle=loader.shuffle,
                            seed=loader.seed, num_epochs=loader.num_epochs)

    def workers_ready(self, roles, infos: dict[str, list[dict]]) -> None:
        self.prm = roles.get("prm")
        self.stop_token_ids = list(infos["actor"][0]["stop_token_ids"])
        info = infos["prm"][0]
        logger.info("PRIME PRM ready: %s params (path %s, ref %s)", info["num_params"], info["path"],
                    info["ref_path"])

    # ---- step -------------------------------------------------------------------------------------------------
    def filter_batch(self, step: StepContext, batch: DataProto, rewards) -> DataProto:
        with step.timer("prime_filter"):
            return self.band_filter(batch, rewards[0], step.metrics)

    def compute_advantage(self, step: StepContext, batch: DataProto) -> bool:
        self.prime_advantage(batch, step.metrics, step.timing)
        return True

    def band_filter(self, batch: DataProto, reward_output, metrics: dict) -> DataProto:
        """Accuracy, band filter and downsampling of the oversampled batch (rows of ``n_prompts`` groups).

        Sets ``batch["acc"]`` (B,) f32; returns the kept rows (``train_batch_size`` groups, contiguous, passing
        groups first). Metrics: ``prime/acc`` (mean over the oversampled batch), ``prime/acc_kept``, and the
        counts of :func:`trainer.algos.prime.band_filter_indices`.
        """
        from rewards.verify import accuracy_from_reward
        from trainer.algos.prime import band_filter_indices

        acc = accuracy_from_reward(reward_output.reward_extra_info, len(batch))
        batch["acc"] = torch.tensor(acc, dtype=torch.float32)
        trunc = truncated_rows(batch["responses"], batch["response_mask"], self.stop_token_ids)
        keep, m = band_filter_indices(acc, batch["uid"], keep_groups=self.bs, truncated=trunc, lower=self.lower,
                                      upper=self.upper, filter_accuracy=self.filter_accuracy,
                                      filter_truncate=self.filter_truncate)
        metrics.update(m)
        metrics["prime/acc"] = float(np.mean(acc)) if acc else 0.0
        out = batch.index(keep)
        metrics["prime/acc_kept"] = float(out["acc"].mean()) if len(out) else 0.0
        return out

    def _scores(self, batch: DataProto, metrics: dict) -> torch.Tensor:
        sel = batch.select(_PRM_INPUTS)
        if self.update_mode == "none":
            return self.prm.compute_rm_scores(sel)["rm_scores"]
        trained, per_rank = self.prm.update_rm(sel)
        metrics.update(reduce_rank_metrics(per_rank))
        if self.update_mode == "after":
            return trained["rm_scores"]
        return self.prm.compute_rm_scores(sel)["rm_scores"]

    def prime_advantage(self, batch: DataProto, metrics: dict, timing: dict | None = None) -> DataProto:
        """PRM update/scoring, then ``rm_scores``, ``advantages`` and ``returns`` (B, R) f32 into ``batch``.

        Raises:
            RuntimeError: the PRM workers are not started.
        """
        from trainer.algos.prime import (compute_prime_advantages, last_token_mask, normalize_implicit_rewards,
                                         prime_metrics)

        if self.prm is None:
            raise RuntimeError("PRIME's PRM workers were not started (Roles.start, then workers_ready)")
        t0 = time.perf_counter()
        mask = batch["response_mask"]
        rm = self._scores(batch, metrics).float()
        if self.granularity == "whole":  # the sequence's implicit reward on its last valid token
            rm = torch.where(last_token_mask(mask), rm.sum(-1, keepdim=True), torch.zeros_like(rm))
        raw = rm
        rm = normalize_implicit_rewards(rm, mask, self.norm)
        batch["rm_scores"] = rm
        uid, acc = batch["uid"], batch["acc"]
        metrics.update(prime_metrics(raw, acc, mask, uid))
        adv, ret = compute_prime_advantages(rm, acc, mask, uid, reward_dpo_coef=self.dpo_coef,
                                            reward_gt_coef=self.gt_coef)
        batch["advantages"], batch["returns"] = adv, ret
        if timing is not None:
            timing["prm"] = timing.get("prm", 0.0) + time.perf_counter() - t0
        return batch
