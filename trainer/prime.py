"""PRIME on the single controller: the step logic that ``trainer/ppo_trainer.py`` calls when it is on.

Selected with ``algorithm=prime`` (``configs/algorithm/prime.yaml`` sets ``algorithm.use_prime: true``). The PPO
loop is not copied; the trainer calls, in order:

1. :meth:`PrimeController.oversampled_loader` once: the prompt loader draws
   ``round(data.train_batch_size * data.oversample_factor)`` prompts per step (its state resumes as usual);
2. :meth:`PrimeController.init_workers` once: a :class:`trainer.workers.prm.PRMWorker` group on the run's
   placement group (colocated with the actor);
3. :meth:`PrimeController.filter_batch` after the reward stage: per-row accuracy (the reward manager's
   ``verify`` rule), the accuracy-band / truncation filter, downsampling to ``train_batch_size`` groups;
4. :meth:`PrimeController.compute_advantage` in place of the advantage estimator: PRM update/scoring
   (``reward_model.model.update``: ``before`` | ``after`` | ``none``), batch-global normalisation, per-source
   RLOO advantages (:func:`rewards.prime.compute_prime_advantages`);
5. :meth:`save_checkpoint` / :meth:`load_checkpoint` with the actor's (``global_step_N/reward``).

Groups are found by ``uid`` everywhere, so ``trainer.balance_batch`` may reorder rows.
"""
from __future__ import annotations

import logging
import math
import os
import time

import numpy as np
import torch

from trainer.protocol import DataProto

logger = logging.getLogger(__name__)

UPDATE_MODES = ("before", "after", "none")
_PRM_INPUTS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "acc"]


def prime_enabled(cfg: dict) -> bool:
    """True when the config asks for PRIME (``algorithm.use_prime``)."""
    return bool((cfg.get("algorithm") or {}).get("use_prime", False))


def accuracy_from_reward(reward_extra_info: dict, batch_size: int) -> list[float]:
    """Per-row accuracy from a :class:`rewards.manager.RewardOutput`'s ``reward_extra_info`` by the rule of
    ``RewardManager.verify``: the scorer's ``acc`` when it returned one (non-numbers and non-finite values give
    0.0), else the score. Avoids scoring the (oversampled) batch twice.

    Raises:
        ValueError: when ``score`` is missing or has the wrong length.
    """
    scores = reward_extra_info.get("score")
    if scores is None or len(scores) != batch_size:
        raise ValueError(f"reward_extra_info['score'] must hold {batch_size} values, got "
                         f"{None if scores is None else len(scores)}")
    accs = reward_extra_info.get("acc") or [None] * batch_size
    out = []
    for s, a in zip(scores, accs):
        if a is None:
            out.append(float(s))
            continue
        try:
            a = float(a)
        except (TypeError, ValueError):
            a = 0.0
        out.append(a if math.isfinite(a) else 0.0)
    return out


def truncated_rows(responses: torch.Tensor, response_mask: torch.Tensor, stop_token_ids) -> torch.Tensor:
    """(B,) bool: the response filled all ``R`` columns and its last token is no stop token (cut by the length
    limit). ``stop_token_ids``: an id or ids (the rollout's set, see ``rollout.stop_tokens``), or None."""
    from rollout.stop_tokens import as_id_list

    full = (response_mask > 0).sum(-1) == responses.shape[1]
    stops = as_id_list(stop_token_ids)
    if not stops:
        return full
    return full & ~torch.isin(responses[:, -1], torch.tensor(stops, dtype=responses.dtype))


class PrimeController:
    """PRIME's step logic for :class:`trainer.ppo_trainer.RayPPOTrainer` (see the module docstring).

    Args:
        config: the resolved config dict (``data``, ``reward_model``, ``algorithm`` keys of prime.yaml).
        world: number of workers (data-parallel x sequence-parallel).
        stop_token_ids: the rollout's stop ids, for the truncation flag (the trainer sets them again once the
            workers report the engine's set).

    Raises:
        ValueError: a PRIME setting is out of range (named in the message).
    """

    def __init__(self, config: dict, world: int, stop_token_ids=None):
        self.cfg, self.world, self.stop_token_ids = config, int(world), stop_token_ids
        d, rm, algo = config["data"], config["reward_model"], config["algorithm"]
        self.bs = int(d["train_batch_size"])
        self.n = int(config["actor_rollout_ref"]["rollout"]["n"])
        self.factor = float(d.get("oversample_factor", 1.0))
        self.lower = float(d.get("accuracy_lower_bound", 0.2))
        self.upper = float(d.get("accuracy_upper_bound", 0.8))
        self.filter_accuracy = bool(d.get("filter_accuracy", True))
        self.filter_truncate = bool(d.get("filter_truncate", True))
        self.update = str(rm["model"].get("update", "before"))
        self.granularity = str(rm.get("prime_granularity", "token"))
        self.norm = str(rm.get("prime_norm", "batch_norm"))
        self.dpo_coef = float(algo.get("reward_dpo_coef", 5.0))
        self.gt_coef = float(algo.get("reward_gt_coef", 5.0))
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
        if self.update not in UPDATE_MODES:
            raise ValueError(f"reward_model.model.update={self.update!r}; expected one of {UPDATE_MODES}")
        if str(rm["model"].get("loss_type", "ce")) != "ce":
            raise ValueError(f"reward_model.model.loss_type={rm['model'].get('loss_type')!r}; only 'ce' is built")
        if self.granularity not in ("token", "whole"):
            raise ValueError(f"reward_model.prime_granularity={self.granularity!r}; expected token or whole")
        if self.norm not in ("batch_norm", "none"):
            raise ValueError(f"reward_model.prime_norm={self.norm!r}; expected batch_norm or none")
        if self.dpo_coef == 0 and self.gt_coef == 0:
            raise ValueError("algorithm.reward_dpo_coef and algorithm.reward_gt_coef are both 0: no reward source")
        self.wg = None

    # ---- set-up -----------------------------------------------------------------------------------------------
    def oversampled_loader(self, loader):
        """A :class:`trainer.dataset.PromptLoader` over the same dataset yielding ``n_prompts`` prompts per step."""
        from trainer.dataset import PromptLoader

        if self.n_prompts == loader.batch_size:
            return loader
        return PromptLoader(loader.dataset, self.n_prompts, loader.pad_token_id, shuffle=loader.shuffle,
                            seed=loader.seed, num_epochs=loader.num_epochs)

    def init_workers(self, pg, device: str, cpus_per_worker: int, share: float) -> dict:
        """Create and initialise the PRM worker group; returns rank 0's ``init_model`` info."""
        from trainer.placement import WorkerGroup
        from trainer.workers.prm import PRMWorker

        sp = int(self.cfg["reward_model"].get("ulysses_sequence_parallel_size", 1))
        self.wg = WorkerGroup(PRMWorker, "prm", pg, self.world, self.cfg, device, cpus_per_worker, share=share,
                              sp_size=sp)
        info = self.wg.run_all("init_model")[0]
        logger.info("PRIME PRM ready: %s params (path %s, ref %s)", info["num_params"], info["path"],
                    info["ref_path"])
        return info

    # ---- step -------------------------------------------------------------------------------------------------
    def filter_batch(self, batch: DataProto, reward_output, metrics: dict) -> DataProto:
        """Accuracy, band filter and downsampling of the oversampled batch (rows of ``n_prompts`` groups).

        Sets ``batch["acc"]`` (B,) f32; returns the kept rows (``train_batch_size`` groups, contiguous, passing
        groups first). Metrics: ``prime/acc`` (mean over the oversampled batch), ``prime/acc_kept``, and the
        counts of :func:`rewards.prime.band_filter_indices`.
        """
        from rewards.prime import band_filter_indices

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
        from trainer.ppo_trainer import _reduce

        sel = batch.select(_PRM_INPUTS)
        if self.update == "none":
            return self.wg.dispatch_dp("compute_rm_scores", sel)["rm_scores"]
        outs = self.wg.dispatch_dp_metrics("update_rm", sel)
        metrics.update(_reduce([o.meta["metrics"] for o in outs]))
        if self.update == "after":
            sp, dp = self.wg.sp_size, self.wg.dp_size
            return DataProto.concat([outs[d * sp] for d in range(dp)])["rm_scores"]
        return self.wg.dispatch_dp("compute_rm_scores", sel)["rm_scores"]

    def compute_advantage(self, batch: DataProto, metrics: dict, timing: dict | None = None) -> DataProto:
        """PRM update/scoring, then ``rm_scores``, ``advantages`` and ``returns`` (B, R) f32 into ``batch``."""
        from rewards.prime import compute_prime_advantages, normalize_implicit_rewards, prime_metrics

        if self.wg is None:
            raise RuntimeError("PrimeController.init_workers was not called")
        t0 = time.perf_counter()
        mask = batch["response_mask"]
        rm = self._scores(batch, metrics).float()
        if self.granularity == "whole":  # the sequence's implicit reward on its last valid token
            from rewards.prime import last_token_mask

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

    # ---- checkpoints ------------------------------------------------------------------------------------------
    def save_checkpoint(self, step_dir: str) -> None:
        self.wg.run_all("save_checkpoint", os.path.join(step_dir, "reward"))

    def load_checkpoint(self, step_dir: str) -> None:
        path = os.path.join(step_dir, "reward")
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint {step_dir} has no PRIME reward model folder 'reward/'; it was "
                                    "saved without algorithm=prime")
        self.wg.run_all("load_checkpoint", path)
