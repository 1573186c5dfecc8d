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
from dataclasses import dataclass

import numpy as np
import torch

from trainer.hooks.base import StepContext, StepHook
from trainer.metric_utils import reduce_rank_metrics
from trainer.protocol import DataProto
from trainer.roles import PRMGroup, Role
from trainer.run_roles import prime_enabled  # noqa: F401 (re-exported: the rule lives with the other roles)

logger = logging.getLogger(__name__)

__all__ = ["UPDATE_MODES", "PrimeConfig", "PrimeHook", "prime_enabled", "truncated_rows"]

UPDATE_MODES = ("before", "after", "none")
_PRM_INPUTS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "acc"]


def truncated_rows(responses: torch.Tensor, response_mask: torch.Tensor, stop_token_ids,
                   attention_mask: torch.Tensor | None = None, stop_reasons=None) -> torch.Tensor:
    """(B,) bool: the response was cut by the length limit.

    A multi-turn trajectory's own ``stop_reason`` decides when given (``stop_reasons``: (B,) strings, the batch's
    ``mt_stop_reason`` column, :data:`rollout.multiturn.metrics.STOP_REASONS`): ``length`` is truncated, whatever
    its last token, also when the budget ran out before the tool answers were appended (the columns are then not
    all filled and the last token is the turn's end-of-turn token).

    Otherwise: the response filled all ``R`` columns and its last token is no stop token. ``stop_token_ids``: an id
    or ids (the rollout's set, see ``rollout.stop_tokens``), or None. A column is filled when ``response_mask`` or
    the response part of ``attention_mask`` ((B, P+R) or (B, R): its last ``R`` columns) is set there: a multi-turn
    trajectory's tool answers and template glue are attended but are not the model's tokens (``response_mask`` 0).
    The last token is judged as :func:`trainer.metric_utils.completion_length_stats` judges a single-turn row: a
    row that ends on a stop id ended by itself.

    Raises:
        ValueError: ``attention_mask`` does not cover the responses, or ``stop_reasons`` has not one entry per row.
    """
    from rollout.stop_tokens import as_id_list

    B, R = responses.shape
    if stop_reasons is not None:
        reasons = list(stop_reasons)
        if len(reasons) != B:
            raise ValueError(f"stop_reasons has {len(reasons)} entries; expected one per row ({B})")
        return torch.tensor([r == "length" for r in reasons], dtype=torch.bool)
    filled = response_mask > 0
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] < R:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not cover responses "
                             f"{tuple(responses.shape)}")
        filled = filled | (attention_mask[:, -R:].to(filled.device) > 0)
    full = filled.sum(-1) == R
    stops = as_id_list(stop_token_ids)
    if not stops:
        return full
    return full & ~torch.isin(responses[:, -1], torch.tensor(stops, dtype=responses.dtype))


def _prm_worker() -> type:
    from trainer.workers.prm import PRMWorker

    return PRMWorker


@dataclass(frozen=True)
class PrimeConfig:
    """PRIME's settings, from the ``data``, ``reward_model`` and ``algorithm`` sections (``configs/algorithm/
    prime.yaml``; a key the config lacks keeps the default below, the YAML's).

    Attributes:
        world: workers per role (data-parallel x sequence-parallel); the oversampled prompts divide over them.
        train_batch_size: prompt groups trained per step (``data.train_batch_size``).
        n: responses per prompt (``actor_rollout_ref.rollout.n``), >= 2 for the leave-one-out.
        oversample_factor: prompts drawn per step = ``train_batch_size`` x this (``data.oversample_factor``).
        accuracy_lower_bound, accuracy_upper_bound, filter_accuracy, filter_truncate: the band filter
            (``data.*``).
        update: ``reward_model.model.update`` (:data:`UPDATE_MODES`); loss_type: ``reward_model.model.loss_type``.
        prime_granularity, prime_norm, ulysses_sequence_parallel_size: ``reward_model.*``.
        reward_dpo_coef, reward_gt_coef: the weights of the implicit and the verifiable source (``algorithm.*``).

    Raises:
        ConfigError: (a ValueError) a setting out of range, one line naming the key.
    """

    world: int
    train_batch_size: int
    n: int
    oversample_factor: float = 1.0
    accuracy_lower_bound: float = 0.2
    accuracy_upper_bound: float = 0.8
    filter_accuracy: bool = True
    filter_truncate: bool = True
    update: str = "before"
    loss_type: str = "ce"
    prime_granularity: str = "token"
    prime_norm: str = "batch_norm"
    ulysses_sequence_parallel_size: int = 1
    reward_dpo_coef: float = 5.0
    reward_gt_coef: float = 5.0

    @classmethod
    def from_config(cls, config, world: int) -> "PrimeConfig":
        """Build from the resolved config (see the class docstring for where each key lives)."""
        from trainer.config_reads import section_fields

        rm = config["reward_model"]
        kw = {**section_fields(config["data"], cls), **section_fields(rm.get("model"), cls),
              **section_fields(rm, cls), **section_fields(config["algorithm"], cls)}
        kw.update(world=int(world), train_batch_size=int(config["data"]["train_batch_size"]),
                  n=int(config["actor_rollout_ref"]["rollout"]["n"]))
        return cls(**kw)

    @property
    def n_prompts(self) -> int:
        """Prompts drawn per step: ``round(train_batch_size * oversample_factor)``."""
        return int(round(self.train_batch_size * float(self.oversample_factor)))

    def __post_init__(self) -> None:
        from trainer.config_checks import ConfigError

        lower, upper = float(self.accuracy_lower_bound), float(self.accuracy_upper_bound)
        if self.n < 2:
            raise ConfigError(f"actor_rollout_ref.rollout.n={self.n}; PRIME's leave-one-out needs n >= 2")
        if not float(self.oversample_factor) >= 1.0:
            raise ConfigError(f"data.oversample_factor={float(self.oversample_factor)}; expected >= 1")
        if self.n_prompts % self.world:
            raise ConfigError(f"data.train_batch_size*data.oversample_factor={self.n_prompts} prompts must divide "
                              f"over the {self.world} workers")
        if not 0.0 <= lower <= upper <= 1.0:
            raise ConfigError(f"data.accuracy_lower_bound={lower}, data.accuracy_upper_bound={upper}; "
                              "expected 0 <= lower <= upper <= 1")
        if self.update not in UPDATE_MODES:
            raise ConfigError(f"reward_model.model.update={self.update!r}; expected one of {UPDATE_MODES}")
        if self.loss_type != "ce":
            raise ConfigError(f"reward_model.model.loss_type={self.loss_type!r}; only 'ce' is built")
        if self.prime_granularity not in ("token", "whole"):
            raise ConfigError(f"reward_model.prime_granularity={self.prime_granularity!r}; expected token or whole")
        if self.prime_norm not in ("batch_norm", "none"):
            raise ConfigError(f"reward_model.prime_norm={self.prime_norm!r}; expected batch_norm or none")
        if float(self.reward_dpo_coef) == 0 and float(self.reward_gt_coef) == 0:
            raise ConfigError("algorithm.reward_dpo_coef and algorithm.reward_gt_coef are both 0: no reward source")


class PrimeHook(StepHook):
    """PRIME's seams of the step (see the module docstring).

    Args:
        config: the resolved config (``data``, ``reward_model``, ``algorithm`` keys of prime.yaml;
            :class:`PrimeConfig`).
        world: number of workers (data-parallel x sequence-parallel).
        stop_token_ids: the rollout's stop ids, for the truncation flag (replaced by the engine's set once the
            workers report it).

    Raises:
        ValueError: a PRIME setting is out of range (named in the message).
    """

    def __init__(self, config, world: int, stop_token_ids=None):
        self.settings = c = PrimeConfig.from_config(config, world)
        self.stop_token_ids = stop_token_ids
        self.bs, self.n, self.n_prompts = c.train_batch_size, c.n, c.n_prompts
        from trainer.config.prm import prm_worker_config

        self.role = Role("prm", _prm_worker, PRMGroup, sp_size=int(c.ulysses_sequence_parallel_size),
                         ckpt_dir="reward", worker_config=prm_worker_config,
                         missing_hint="PRIME reward model folder 'reward/'; it was saved without algorithm=prime")
        self.prm: PRMGroup | None = None

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
        trunc = truncated_rows(batch["responses"], batch["response_mask"], self.stop_token_ids,
                               batch["attention_mask"] if "attention_mask" in batch else None,
                               batch.non_tensor.get("mt_stop_reason"))
        c = self.settings
        keep, m = band_filter_indices(acc, batch["uid"], keep_groups=self.bs, truncated=trunc,
                                      lower=float(c.accuracy_lower_bound), upper=float(c.accuracy_upper_bound),
                                      filter_accuracy=bool(c.filter_accuracy), filter_truncate=bool(c.filter_truncate))
        metrics.update(m)
        if m["prime/groups_passed"] == 0:
            self._warn_none_passed(m, c)
        metrics["prime/acc"] = float(np.mean(acc)) if acc else 0.0
        out = batch.index(keep)
        metrics["prime/acc_kept"] = float(out["acc"].mean()) if len(out) else 0.0
        return out

    def _warn_none_passed(self, m: dict, c) -> None:
        """Warn once per run that no group passed the filters, so the whole batch is groups they filtered out
        (verl's fill-up): each kind of failing group counted, with the keys that set the filters."""
        if getattr(self, "_warned_none_passed", False):
            return
        self._warned_none_passed = True
        parts = []
        if c.filter_truncate and m["prime/truncated_groups"]:
            parts.append(f"{m['prime/truncated_groups']:.0f} of {m['prime/groups_total']:.0f} groups hold a response "
                         "cut at data.max_response_length (data.filter_truncate)")
        if c.filter_accuracy:
            parts.append(f"{m['prime/solve_none'] * 100:.0f}% of groups solve none and "
                         f"{m['prime/solve_all'] * 100:.0f}% all, outside the accuracy band [{c.accuracy_lower_bound}, {c.accuracy_upper_bound}] "
                         "(data.accuracy_lower_bound / accuracy_upper_bound)")
        logger.warning("PRIME: no group of this batch passed the filters (%s); the batch is made of groups they "
                       "filtered out, as in verl; logged once, prime/groups_passed counts each step",
                       "; ".join(parts) or "none passed")

    def _scores(self, batch: DataProto, metrics: dict) -> torch.Tensor:
        sel = batch.select(_PRM_INPUTS)
        if self.settings.update == "none":
            return self.prm.compute_rm_scores(sel)["rm_scores"]
        trained, per_rank = self.prm.update_rm(sel)
        metrics.update(reduce_rank_metrics(per_rank))
        if self.settings.update == "after":
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
        if self.settings.prime_granularity == "whole":  # the sequence's implicit reward on its last valid token
            rm = torch.where(last_token_mask(mask), rm.sum(-1, keepdim=True), torch.zeros_like(rm))
        raw = rm
        rm = normalize_implicit_rewards(rm, mask, self.settings.prime_norm)
        batch["rm_scores"] = rm
        uid, acc = batch["uid"], batch["acc"]
        metrics.update(prime_metrics(raw, acc, mask, uid))
        adv, ret = compute_prime_advantages(rm, acc, mask, uid, reward_dpo_coef=float(self.settings.reward_dpo_coef),
                                            reward_gt_coef=float(self.settings.reward_gt_coef))
        batch["advantages"], batch["returns"] = adv, ret
        if timing is not None:
            timing["prm"] = timing.get("prm", 0.0) + time.perf_counter() - t0
        return batch
