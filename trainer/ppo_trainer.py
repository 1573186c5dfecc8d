"""The single controller: the PPO/GRPO loop as a plain Python dataflow over Ray worker groups.

One step: prompts -> rollout (actor workers) -> rewards -> old log-probs (actor) -> ref log-probs (ref)
-> values (critic, GAE only) -> KL in reward (optional) -> advantages -> critic update -> actor update
-> metrics -> checkpoint every ``save_freq`` steps -> validation every ``test_freq`` steps.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager

import numpy as np

from trainer.adv_inputs import estimator_kwargs, produce_inputs
from trainer.config_reads import plain
from trainer.dataset import DataExhausted, PromptLoader
from trainer.protocol import DataProto
from trainer.validation import extra_info_means as _extra_info_means, sampled as _sampled, validate_and_log

logger = logging.getLogger(__name__)


@contextmanager
def _timer(name: str, timing: dict):
    t0 = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - t0


class RayPPOTrainer:
    """Drives the worker groups through ``fit()``.

    Args:
        config: the resolved config as a plain dict.
        tokenizer: the actor's tokenizer (decoding for rewards).
        train_loader: a :class:`trainer.dataset.PromptLoader`.
        val_dataset: a :class:`trainer.dataset.PromptDataset` or None.
        reward_fn / val_reward_fn: :class:`rewards.manager.RewardManager` instances.
    """

    def __init__(self, config: dict, tokenizer, train_loader: PromptLoader, val_dataset, reward_fn, val_reward_fn):
        self.cfg, self.tokenizer, self.loader = config, tokenizer, train_loader
        self.val_dataset, self.reward_fn, self.val_reward_fn = val_dataset, reward_fn, val_reward_fn
        t = config["trainer"]
        self.device = t["device"]
        self.world = int(t["nnodes"]) * int(t["n_gpus_per_node"])
        self.algo = config["algorithm"]
        self.use_critic = bool(config["critic"]["enable"])
        self.need_ref = bool(config["actor_rollout_ref"]["actor"]["use_kl_loss"] or self.algo["use_kl_in_reward"])
        self.n = int(config["actor_rollout_ref"]["rollout"]["n"])
        self.global_step = 0
        self.stop_token_ids = [tokenizer.eos_token_id]  # replaced by the rollout engine's set in init_workers
        self._stop_requested = False
        self.stop_reason = ""  # why the run ended before trainer.total_training_steps (for the final line)
        self._val_samples: list[dict] = []  # trainer.log_val_generations samples of the last validation
        self._log_val_n = 0
        from trainer import core_algos

        self.kl_ctrl = core_algos.get_kl_controller(self.algo["kl_ctrl"]) if self.algo["use_kl_in_reward"] else None
        vk = config["actor_rollout_ref"]["rollout"].get("val_kwargs") or {}
        if t.get("val_also_greedy") and not _sampled(vk):
            logger.warning("trainer.val_also_greedy=true does nothing: actor_rollout_ref.rollout.val_kwargs already "
                           "decodes greedily (do_sample=%s, temperature=%s)", vk.get("do_sample"), vk.get("temperature"))
        self.prime = None  # [PRIME] algorithm=prime: step logic in trainer/prime.py
        from trainer.prime import PrimeController, prime_enabled

        if prime_enabled(config):
            self.prime = PrimeController(config, self.world, stop_token_ids=self.stop_token_ids)
            self.loader = self.prime.oversampled_loader(self.loader)

    # ---- workers --------------------------------------------------------------------------------------------
    def init_workers(self) -> None:
        from trainer.placement import WorkerGroup, create_placement_group, init_ray
        from trainer.workers.actor import ActorRolloutRefWorker
        from trainer.workers.critic import CriticWorker

        t = self.cfg["trainer"]
        cpus = int(t.get("cpus_per_worker", 1))
        init_ray(self.device)
        self.pg = create_placement_group(self.device, int(t["nnodes"]), int(t["n_gpus_per_node"]), cpus)
        share = 1.0 / (1 + int(self.use_critic) + int(self.prime is not None))  # [PRIME] PRM shares the bundles
        sp = int(self.cfg["actor_rollout_ref"]["actor"]["ulysses_sequence_parallel_size"])
        actor_cls = ActorRolloutRefWorker
        if t.get("strategy", "deepspeed") == "megatron":  # TP peers of a data-parallel rank get the same rows
            from trainer.workers.megatron_actor import MegatronActorRefWorker as actor_cls
            sp = int(self.cfg["actor_rollout_ref"]["actor"]["megatron"]["tensor_model_parallel_size"])
        self.actor_wg = WorkerGroup(actor_cls, "actor", self.pg, self.world, self.cfg, self.device,
                                    cpus, share=share, sp_size=sp)
        self.critic_wg = None
        if self.use_critic:
            self.critic_wg = WorkerGroup(CriticWorker, "critic", self.pg, self.world, self.cfg, self.device, cpus,
                                         share=share, sp_size=int(self.cfg["critic"]["ulysses_sequence_parallel_size"]))
        info = self.actor_wg.run_all("init_model")[0]
        self.stop_token_ids = list(info["stop_token_ids"])  # the engines' own set: masks, rewards, flags agree
        if self.prime is not None:
            self.prime.stop_token_ids = self.stop_token_ids
        if self.critic_wg is not None:
            self.critic_wg.run_all("init_model")
        if self.prime is not None:  # [PRIME]
            self.prime.init_workers(self.pg, self.device, cpus, share)
        logger.info("workers ready: %d actor ranks (%s params)", self.world, info["num_params"])

    # ---- checkpoints ------------------------------------------------------------------------------------------
    def _ckpt_root(self) -> str:
        return self.cfg["trainer"]["default_local_dir"]

    def save_checkpoint(self) -> str:
        from trainer.checkpoint.base import commit_checkpoint, save_trainer_state

        t = self.cfg["trainer"]
        step_dir = os.path.join(self._ckpt_root(), f"global_step_{self.global_step}")
        self.actor_wg.run_all("save_checkpoint", os.path.join(step_dir, "actor"))
        if self.critic_wg is not None:
            self.critic_wg.run_all("save_checkpoint", os.path.join(step_dir, "critic"))
        if self.prime is not None:  # [PRIME]
            self.prime.save_checkpoint(step_dir)
        extra = {"kl_coef": self.kl_ctrl.value} if self.kl_ctrl is not None else {}
        save_trainer_state(step_dir, {**self.loader.state_dict(), **extra}, self.global_step, plain(self.cfg))
        commit_checkpoint(self._ckpt_root(), self.global_step, t.get("max_actor_ckpt_to_keep"))
        return step_dir

    def load_checkpoint(self, path: str | None = None) -> int:
        """Load the checkpoint ``trainer.resume_mode`` names (or the step folder ``path``); returns its step."""
        from trainer.checkpoint.base import load_trainer_state, resolve_resume_path

        path, step = (path, -1) if path else resolve_resume_path(self.cfg["trainer"]["resume_mode"], self._ckpt_root())
        if path is None:
            return 0
        t0 = time.perf_counter()
        self.actor_wg.run_all("load_checkpoint", os.path.join(path, "actor"))
        if self.critic_wg is not None:
            self.critic_wg.run_all("load_checkpoint", os.path.join(path, "critic"))
        if self.prime is not None:  # [PRIME]
            self.prime.load_checkpoint(path)
        state = load_trainer_state(path)
        loader_state = state["dataloader"]
        self.loader.load_state_dict(loader_state)
        if self.kl_ctrl is not None and "kl_coef" in loader_state:
            self.kl_ctrl.value = float(loader_state["kl_coef"])
        step = int(state.get("global_step", step))
        logger.warning("resumed from %s (step %d); checkpoint loaded in %.2f s", path, step, time.perf_counter() - t0)
        return step

    # ---- one step -------------------------------------------------------------------------------------------
    def _balance(self, batch: DataProto) -> DataProto:
        """Reorder rows so that every data-parallel rank gets a similar number of tokens."""
        from trainer.seqlen_balancing import get_seqlen_balanced_partitions

        dp = self.actor_wg.dp_size
        if dp == 1:
            return batch
        seqlens = batch["attention_mask"].sum(-1).tolist()
        parts = get_seqlen_balanced_partitions(seqlens, k=dp, equal_size=True)
        return batch.index(np.concatenate([np.asarray(sorted(p)) for p in parts]))

    def train_step(self, batch: DataProto, timing: dict) -> dict:
        from trainer import core_algos

        metrics: dict = {}
        fg = (self.cfg.get("algorithm") or {}).get("filter_groups") or {}
        if fg.get("enable"):  # DAPO dynamic sampling: more generation batches until enough informative groups
            from trainer.dynamic_sampling import collect_informative_groups

            pad_id = self.tokenizer.pad_token_id
            batch, rews = collect_informative_groups(
                batch, lambda: self.loader.next_batch()[0], lambda p, k: self._generate_and_score(p, k, timing),
                want_groups=int((self.cfg.get("data") or {}).get("train_batch_size", len(batch))), n=self.n, metric=str(fg.get("metric", "acc")),
                max_num_gen_batches=int(fg.get("max_num_gen_batches", 10) or 0),  # 10: the config default
                pad_token_id=self.tokenizer.eos_token_id if pad_id is None else pad_id, metrics=metrics,
                no_cap_limit=len(self.loader))
        else:
            batch, rew = self._generate_and_score(batch, 1, timing)
            rews = [rew]
        rew = rews[0]
        for key in dict.fromkeys(k for r in rews for k in r.metrics):  # over every generated row
            vals = [r.metrics[key] for r in rews if key in r.metrics]
            additive = key.startswith("reward/num_") or key == "reward/time_s"  # counts and seconds add up
            metrics[key] = float(np.sum(vals) if additive else np.mean(vals))  # rates: means of equal-size batches
        extra_keys = dict.fromkeys(k for r in rews for k in r.reward_extra_info)  # a batch may lack a key: None rows
        metrics.update(_extra_info_means({k: [v for r in rews for v in (
            r.reward_extra_info[k] if k in r.reward_extra_info else [None] * len(r.token_level_scores))]
            for k in extra_keys}))
        if self.prime is not None:  # [PRIME] accuracy-band filter + downsampling of the oversampled groups
            with _timer("prime_filter", timing):
                batch = self.prime.filter_batch(batch, rew, metrics)
        if self.cfg["trainer"].get("balance_batch", True):
            batch = self._balance(batch)
        with _timer("old_log_prob", timing):
            batch.union(self.actor_wg.dispatch_dp("compute_log_prob", batch))
            ent = batch["entropys"]
            metrics["actor/entropy"] = float(core_algos.masked_mean(ent, batch["response_mask"]))
            self._rollout_gap(batch, metrics)
        if self.need_ref:
            with _timer("ref", timing):
                batch.union(self.actor_wg.dispatch_dp("compute_ref_log_prob", batch))
        if self.use_critic:
            with _timer("values", timing):
                batch.union(self.critic_wg.dispatch_dp("compute_values", batch))
        spec = None if self.prime is not None else core_algos.get_adv_estimator_spec(self.algo["adv_estimator"])
        if spec is not None:  # the estimator's declared inputs that no stage made (ReMax: greedy baselines)
            produce_inputs(self, batch, spec, timing)
        with _timer("adv", timing):
            if self.algo["use_kl_in_reward"]:
                rewards, kl_m = core_algos.apply_kl_penalty(batch["token_level_scores"], batch["old_log_probs"],
                                                            batch["ref_log_prob"], batch["response_mask"],
                                                            self.kl_ctrl, self.algo["kl_penalty"])
                batch["token_level_rewards"] = rewards
                metrics.update(kl_m)
            else:
                batch["token_level_rewards"] = batch["token_level_scores"]
            if self.prime is not None:  # [PRIME] PRM update/scores + per-source RLOO advantages
                self.prime.compute_advantage(batch, metrics, timing)
            else:
                core_algos.compute_advantage(batch, spec.name, gamma=float(self.algo["gamma"]),
                                             lam=float(self.algo["lam"]), **estimator_kwargs(spec, self.algo))
        if self.use_critic:
            with _timer("update_critic", timing):
                metrics.update(_reduce(self.critic_wg.dispatch_dp_metrics("update_critic", batch)))
        if self.global_step > int(self.cfg["trainer"].get("critic_warmup", 0)):
            with _timer("update_actor", timing):
                metrics.update(_reduce(self.actor_wg.dispatch_dp_metrics("update_actor", batch)))
        # per-stage peak GPU memory reported by the workers (max over ranks; trainer/workers/base.stage_peak_memory)
        metrics.update({k: batch.meta.pop(k) for k in list(batch.meta) if k.startswith("perf/")})
        self._last_batch = batch
        return metrics

    def _generate_and_score(self, prompts: DataProto, k: int, timing: dict):
        """Generate ``rollout.n`` responses per prompt of the step's ``k``-th prompt batch (1-based; more than one
        only with dynamic sampling) and score them. Returns ``(rows, reward_output)``; ``rows`` carries ``uid``
        (one per prompt group, unique within the step) and ``token_level_scores`` (B*n, R) f32."""
        base = self.global_step + int(self.cfg["trainer"]["seed"]) * 100003
        prompts.meta.update(seed=base + (k - 1) * 7919)
        tag = f"{self.global_step}-" if k == 1 else f"{self.global_step}.{k}-"
        prompts["uid"] = [f"{tag}{i}" for i in range(len(prompts))]
        with _timer("gen", timing):
            rows = self.actor_wg.dispatch_all("generate_sequences", prompts)
        with _timer("reward", timing):
            rew = self.reward_fn(rows)
            rows["token_level_scores"] = rew.token_level_scores
        return rows, rew

    def _rollout_gap(self, batch: DataProto, metrics: dict) -> None:
        """Gap between the engine's log-probs and the trainer's recomputed ones; the rollout-correction stage
        (``trainer.algos.rollout_correction``) sets ``rollout_is_weights`` when it is on."""
        from trainer.algos.rollout_correction import RolloutCorrection, log_prob_gap_metrics, rollout_is_weights

        args = (batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
        metrics.update(log_prob_gap_metrics(*args))
        spec = RolloutCorrection.from_config(self.algo.get("rollout_correction"))
        if spec.enabled:
            batch["rollout_is_weights"], m = rollout_is_weights(*args, spec)
            metrics.update(m)

    # ---- validation -------------------------------------------------------------------------------------------
    def validate(self) -> dict:
        """Generate on the held-out set (``val_kwargs`` sampling) and score it: ``val/<data_source>/<metric>``
        (``acc`` is the strict accuracy, the mean over all samples). With ``trainer.val_also_greedy`` and sampled
        ``val_kwargs``, a second pass decodes one greedy response per question and logs
        ``val/<data_source>/greedy/<metric>``, so sampled and greedy accuracy of the same weights sit side by side
        (:func:`trainer.validation.validate`)."""
        from trainer.validation import validate

        return validate(self)

    def _validate_pass(self, greedy: bool) -> dict:
        """One generation + scoring pass over the held-out set (:func:`trainer.validation.validation_pass`)."""
        from trainer.validation import validation_pass

        return validation_pass(self, greedy)

    # ---- loop -----------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        from trainer.metric_utils import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics
        from trainer.tracking import Tracking

        t = self.cfg["trainer"]
        total = self._last_step()
        self.global_step = self.load_checkpoint()
        tracker = Tracking(t["project_name"], t["experiment_name"], t["logger"], t["output_dir"], plain(self.cfg),
                           total_steps=total, start_step=self.global_step)
        from trainer.placement import WorkerDied
        from trainer.recovery import Recovery

        self._driver_pid = os.getpid()
        old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        last: dict = {}
        try:
            if t.get("val_only") or (t.get("val_before_train") and self.val_dataset is not None
                                     and self.global_step == 0):
                last.update(validate_and_log(self, tracker, self.global_step, advance=False))
                if t.get("val_only"):
                    self.stop_reason = " (trainer.val_only: validation only)"
                    return last
            save_freq, test_freq = int(t.get("save_freq", -1)), int(t.get("test_freq", -1))
            recovery = Recovery(self, tracker, int(t.get("max_restarts", 0)))  # the state training starts from
            while self.global_step < total and not self._stop_requested:
                self.global_step += 1
                timing: dict = {}
                try:
                    with _timer("step", timing):
                        batch, epoch = self.loader.next_batch()
                        metrics = self.train_step(batch, timing)
                        self._check_skipped(metrics)
                        is_last = self.global_step == total
                        if save_freq > 0 and (self.global_step % save_freq == 0 or is_last):
                            with _timer("save_checkpoint", timing):
                                self.save_checkpoint()
                        if test_freq > 0 and (self.global_step % test_freq == 0 or is_last):
                            with _timer("testing", timing):
                                metrics.update(validate_and_log(self, tracker, self.global_step))
                except DataExhausted:  # dynamic sampling drew past the last epoch: verl's loop ends here too
                    self.global_step -= 1
                    break
                except WorkerDied as exc:  # trainer.max_restarts: re-raised, or back at the last checkpoint
                    recovery.restart(exc)
                    continue
                b = self._last_batch
                metrics.update(compute_data_metrics(b, use_critic=self.use_critic,
                                                    max_response_length=int(self.cfg["data"]["max_response_length"]),
                                                    max_prompt_length=int(self.cfg["data"]["max_prompt_length"])))
                metrics.update(compute_timing_metrics(b, timing))
                metrics.update(compute_throughput_metrics(b, timing, n_gpus=self.world))
                metrics.update({"training/global_step": self.global_step, "training/epoch": epoch,
                                **recovery.metrics()})
                tracker.log(metrics, step=self.global_step)
                last = metrics
            if self._stop_requested:
                self.stop_reason = " (stopped early by SIGTERM)"
            elif self.global_step < int(t["total_training_steps"]):
                self.stop_reason = f" (trainer.total_epochs={t.get('total_epochs')} epochs of data used up)"
            if self._stop_requested and int(t.get("save_freq", -1)) > 0:
                logger.warning("SIGTERM: saving step %d before exiting", self.global_step)
                self.save_checkpoint()
            if t.get("export_hf_on_end") and not self._stop_requested:
                out = os.path.join(t["output_dir"], "hf_actor")
                self.actor_wg.run_all("export_hf", out)
                last["hf_export_dir"] = out
        finally:
            signal.signal(signal.SIGTERM, old_handler)
            tracker.close()
        return last

    def _last_step(self) -> int:
        """``trainer.total_training_steps``, or the step where ``trainer.total_epochs`` of data end when that comes
        first and every step takes one loader batch (verl's epoch loop ends the run there)."""
        total = int(self.cfg["trainer"]["total_training_steps"])
        fixed = not (self.cfg["algorithm"].get("filter_groups") or {}).get("enable")
        epochs = self.loader.num_epochs
        return min(total, epochs * len(self.loader)) if fixed and epochs else total

    def _check_skipped(self, metrics: dict) -> None:
        """Stop the run when a role's optimizer steps were skipped (non-finite loss or gradient) too many times in
        a row: ``<role>/consecutive_skipped_steps`` (max over ranks) >= ``trainer.max_consecutive_skipped_steps``.

        Raises:
            TrainingDiverged: naming the role, the streak and the last checkpoint (which stays intact).
        """
        limit = int(self.cfg["trainer"].get("max_consecutive_skipped_steps", 5))
        for key, streak in metrics.items():  # actor, critic, reward_model (PRIME)
            role = key[:-len("/consecutive_skipped_steps")]
            if key.endswith("/consecutive_skipped_steps") and streak >= limit:
                from trainer.checkpoint.base import find_latest_checkpoint

                raise TrainingDiverged(
                    f"{role}: {int(streak)} optimizer steps in a row had a non-finite loss or gradient norm and were "
                    f"skipped (trainer.max_consecutive_skipped_steps={limit}); stopping at step {self.global_step}. "
                    f"Last checkpoint: {find_latest_checkpoint(self._ckpt_root())}")

    def _on_sigterm(self, signum, frame) -> None:
        if os.getpid() != self._driver_pid:
            # a process forked from the driver (e.g. a reward-scoring worker) inherits this handler: it must die
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._stop_requested:  # a second SIGTERM: stop now, as Ctrl-C (trainer/interrupt.py)
            from trainer.interrupt import RunInterrupted

            raise RunInterrupted(signum, self.global_step)
        logger.warning("SIGTERM received: the run stops after the current step (a second SIGTERM stops at once)")
        self._stop_requested = True


class TrainingDiverged(RuntimeError):
    """Too many optimizer steps in a row were skipped because of a non-finite loss or gradient."""


def _reduce(per_rank: list[dict]) -> dict:
    """Mean over ranks and mini-batches of each metric list (``*/grad_norm``, ``*/lr`` are equal on all ranks);
    skipped-step counts and peak memory take the maximum over ranks."""
    from trainer.metric_utils import reduce_metrics

    merged: dict[str, list[float]] = {}
    for m in per_rank:
        for k, v in m.items():
            merged.setdefault(k, []).extend(v)
    agg = {k: ("max" if k.endswith("skipped_steps") or k.startswith("perf/max_memory") else "mean") for k in merged}
    return reduce_metrics(merged, agg)
