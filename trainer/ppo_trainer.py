"""The single controller: the PPO/GRPO loop as a plain Python dataflow over the run's roles.

One step (:meth:`RayPPOTrainer.train_step`): prompts -> rollout + rewards -> the algorithm's filter -> balance
-> old log-probs and rollout correction (not when the update's forward gives them: :mod:`trainer.on_policy`) -> ref
log-probs -> the algorithm's inputs (critic values, ...) -> KL in reward (optional) -> advantages -> the algorithm's
updates (critic) -> actor update. The algorithm (PRIME, dynamic sampling, the critic, the estimator) plugs in
through :mod:`trainer.hooks`; the worker groups are the run's :class:`trainer.roles.Roles`. :meth:`fit` loops over
steps with metrics, checkpoints every ``save_freq`` steps, HF exports at wall-clock marks (``export_hf_freq_s``,
:mod:`trainer.hf_exports`) and validation every ``test_freq`` steps. With ``trainer.rollout_placement=separate`` the
rollout role generates on its own workers, ``trainer.async.staleness`` batches ahead of the update
(:class:`trainer.async_rollout.OffPolicyPipeline`).
"""
from __future__ import annotations

import logging
import os
import signal
import time

from trainer.config.data import DataConfig
from trainer.config.rollout import SamplingKwargs
from trainer.config.trainer import TrainerConfig
from trainer.config_reads import plain
from trainer.dataset import DataExhausted, PromptLoader
from trainer.hooks import StepContext, build_hooks
from trainer.hf_exports import TimedHFExports
from trainer.hooks.base import timed
from trainer.interrupt import check_interrupted, loop_sigterm, stop_handlers, stop_requested
from trainer.metric_utils import reduce_rank_metrics, reward_output_metrics
from trainer.on_policy import OLD_FROM_UPDATE, OnPolicyRule
from trainer.protocol import DataProto
from trainer.roles import Roles, actor_role, rollout_role
from trainer.seqlen_balancing import balance_batch
from trainer.validation import validate_and_log, warn_greedy_noop
from trainer.workers.profiling import profile_meta
from trainer.workers.step_guard import TrainingDiverged  # noqa: F401 (raised here; imported from here too)

logger = logging.getLogger(__name__)


class RayPPOTrainer:
    """Drives the run's roles through ``fit()``.

    Args:
        config: the resolved config as a plain dict; its ``trainer`` and ``data`` sections are read as
            :attr:`trainer_cfg` (:class:`trainer.config.trainer.TrainerConfig`; ``total_training_steps`` is replaced
            once :func:`trainer.launch.plan_run_length` planned it), :attr:`data_cfg`
            (:class:`trainer.config.data.DataConfig`) and :attr:`val_kwargs` (``actor_rollout_ref.rollout.val_kwargs``,
            :class:`trainer.config.rollout.SamplingKwargs`).
        tokenizer: the actor's tokenizer (decoding for rewards).
        train_loader: a :class:`trainer.dataset.PromptLoader`.
        val_dataset: a :class:`trainer.dataset.PromptDataset` or None.
        reward_fn / val_reward_fn: :class:`rewards.manager.RewardManager` instances.
    """

    def __init__(self, config: dict, tokenizer, train_loader: PromptLoader, val_dataset, reward_fn, val_reward_fn):
        from trainer import core_algos
        from trainer.algos.rollout_correction import RolloutCorrection

        self.cfg, self.tokenizer = config, tokenizer
        self.val_dataset, self.reward_fn, self.val_reward_fn = val_dataset, reward_fn, val_reward_fn
        self.algo = config["algorithm"]
        t = self.trainer_cfg = TrainerConfig.from_dict(config["trainer"], "trainer")
        self.data_cfg = DataConfig.from_dict(config["data"], "data")
        # the generation cap (rollout.response_length follows data.max_response_length unless set apart)
        self.response_length = int(config["actor_rollout_ref"]["rollout"].get("response_length")
                                   or self.data_cfg.max_response_length)
        self.device, self.world = t.device, t.nnodes * t.n_gpus_per_node
        self.global_step = 0
        self.stop_token_ids = [tokenizer.eos_token_id]  # replaced by the rollout engine's set in init_workers
        self._stop_requested = False
        self.stop_reason = ""  # why the run ended before trainer.total_training_steps (for the final line)
        self.val_samples: list[dict] = []  # trainer.log_val_generations samples of the last validation
        self.log_val_n = 0
        self.kl_ctrl = core_algos.get_kl_controller(self.algo["kl_ctrl"]) if self.algo["use_kl_in_reward"] else None
        self.rollout_correction = RolloutCorrection.from_config(self.algo.get("rollout_correction"))
        self.hf_exports = TimedHFExports.from_config(config["trainer"])  # trainer.export_hf_freq_s (None: off)
        vk = self.val_kwargs = SamplingKwargs.from_dict(config["actor_rollout_ref"]["rollout"]["val_kwargs"],
                                                         "actor_rollout_ref.rollout.val_kwargs")
        warn_greedy_noop(config, t.val_also_greedy, vk)  # once: without validation the start-up checks named it
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.hooks = build_hooks(config, self.world, pad, len(train_loader))
        self.loader = self.hooks.wrap_loader(train_loader)
        from trainer.config.runtime import needs_reference

        need_ref = needs_reference(config)
        rollout = rollout_role(config, self.world)  # None: the engine is colocated in the actor's workers
        self.on_policy = OnPolicyRule.from_config(config, separate_rollout=rollout is not None)
        self.roles = Roles([actor_role(config), *self.hooks.roles(), *([rollout] if rollout else [])],
                           ref_from_actor=need_ref)
        self.pipeline = None  # the OffPolicyPipeline of a separate rollout role (init_workers)

    # ---- workers --------------------------------------------------------------------------------------------
    def init_workers(self) -> None:
        """Start Ray, place the run's bundles and start every role's workers (again after a restart)."""
        from trainer.async_rollout import OffPolicyPipeline
        from trainer.placement import start_workers, startup_split
        from trainer.rollout_placement import RolloutPlacement

        t, t_ray, restart = self.trainer_cfg, time.time(), bool(self.roles.startup_s)  # set by an earlier start
        placement = RolloutPlacement.from_config(self.cfg)
        self.pg, infos, t_workers = start_workers(self.roles, self.cfg, t, self.device, self.world,
                                                  placement.rollout_bundles)
        if placement.separate:
            self.pipeline = OffPolicyPipeline(self, placement)
        info = infos["actor"][0]
        self.stop_token_ids = list(info["stop_token_ids"])  # the engines' own set: masks, rewards, flags agree
        self.hooks.workers_ready(self.roles, infos)
        logger.info("workers ready: %d actor rank%s (%s params), %s", self.world, "" if self.world == 1 else "s",
                    info["num_params"], startup_split(t_ray, t_workers, parts=self.roles.startup_s, restart=restart,
                                                      no_ray=t.single_process))
        check_interrupted()  # a Ctrl-C / SIGTERM whose exception was swallowed during start-up stops the run here

    # ---- checkpoints ------------------------------------------------------------------------------------------
    def _ckpt_root(self) -> str:
        return self.trainer_cfg.default_local_dir

    def save_checkpoint(self) -> str:
        """Every role's state and the trainer's (data loader, KL coefficient) in ``global_step_<N>``; returns it."""
        from trainer.checkpoint.base import commit_checkpoint, save_trainer_state

        step_dir = os.path.join(self._ckpt_root(), f"global_step_{self.global_step}")
        self.roles.save(step_dir)
        extra = {"kl_coef": self.kl_ctrl.value} if self.kl_ctrl is not None else {}
        loader = self.pipeline.loader_state() if self.pipeline is not None else self.loader.state_dict()
        save_trainer_state(step_dir, {**loader, **extra}, self.global_step, plain(self.cfg))
        commit_checkpoint(self._ckpt_root(), self.global_step, self.trainer_cfg.max_actor_ckpt_to_keep)
        return step_dir

    def load_checkpoint(self, path: str | None = None) -> int:
        """Load the checkpoint ``trainer.resume_mode`` names (or the step folder ``path``); returns its step."""
        from trainer.checkpoint.base import load_trainer_state
        from trainer.checkpoint.resume import resolve_resume_path

        path, step = (path, -1) if path else resolve_resume_path(self.trainer_cfg.resume_mode, self._ckpt_root())
        if path is None:
            return 0
        t0 = time.perf_counter()
        self.roles.load(path)
        if self.pipeline is not None:
            self.pipeline.reset()  # the batches in flight are generated again
        state = load_trainer_state(path)
        loader_state = state["dataloader"]
        self.loader.load_state_dict(loader_state)
        if self.kl_ctrl is not None and "kl_coef" in loader_state:
            self.kl_ctrl.value = float(loader_state["kl_coef"])
        step = int(state.get("global_step", step))
        logger.warning("resumed from %s (step %d); checkpoint loaded in %.2f s", path, step, time.perf_counter() - t0)
        return step

    # ---- one step -------------------------------------------------------------------------------------------
    def train_step(self, prompts: DataProto, timing: dict) -> tuple[DataProto, dict]:
        """Train on one prompt batch; returns the trained rows and the step's metrics (``timing`` gets the stages'
        seconds)."""
        step = self._step_context(timing)
        batch, rewards = self.hooks.generate(step, prompts)
        step.metrics.update(reward_output_metrics(rewards))  # over every generated row
        batch = self.hooks.filter_batch(step, batch, rewards)
        if self.trainer_cfg.balance_batch:  # every data-parallel rank gets a similar number of tokens
            batch = balance_batch(batch, self.roles.actor.dp_size)
        self._old_log_probs(step, batch)
        self._rollout_correction(step, batch)
        self._ref_log_probs(step, batch)
        self.hooks.add_inputs(step, batch)
        with step.timer("adv"):
            self._token_level_rewards(step, batch)
            self.hooks.compute_advantage(step, batch)
        self.hooks.update(step, batch)
        started = time.time()
        self._update_actor(step, batch)
        if self.pipeline is not None:
            self.pipeline.step_done(self.global_step, (started, time.time()))
        # per-stage peak GPU memory reported by the workers (max over ranks; trainer/workers/base.stage_peak_memory)
        step.metrics.update({k: batch.meta.pop(k) for k in list(batch.meta) if k.startswith("perf/")})
        return batch, step.metrics

    def _step_context(self, timing: dict) -> StepContext:
        step = StepContext(self.global_step, self.world, self.roles, self.reward_fn, timing=timing,
                           next_prompts=lambda: self.loader.next_batch()[0])
        step.generate_and_score = lambda prompts, k: self._generate_and_score(step, prompts, k)
        return step

    def _generate_and_score(self, step: StepContext, prompts: DataProto, k: int):
        """Generate ``rollout.n`` responses per prompt of the step's ``k``-th prompt batch (1-based; more than one
        only with dynamic sampling) and score them. Returns ``(rows, reward_output)``; ``rows`` carries ``uid``
        (one per prompt group, unique within the step), ``token_level_scores`` (B*n, R) f32 and, when the reward
        returns named components (GDPO's ``algorithm.gdpo_reward_keys``), ``reward_components`` (B*n, K) f32. The
        pipelined rollout started the first batch earlier (:meth:`OffPolicyPipeline.collect`; ``timing_s/gen`` is
        then the wait for it)."""
        self.tag_prompts(prompts, self.global_step, k)
        with step.timer("gen"):
            rows = self.pipeline.collect(step) if self.pipeline is not None and k == 1 else step.generate(prompts)
        with step.timer("reward"):
            rew = self.reward_fn(rows)
            rows["token_level_scores"] = rew.token_level_scores
            if rew.reward_components is not None:
                rows["reward_components"] = rew.reward_components
        return rows, rew

    def tag_prompts(self, prompts: DataProto, step: int, k: int) -> None:
        """Seed (``meta["seed"]``), profiler mark (``profile_meta``) and ``uid`` column of prompt batch ``k`` of ``step``."""
        base = step + self.trainer_cfg.seed * 100003
        prompts.meta.update(seed=base + (k - 1) * 7919, **profile_meta(step, self.trainer_cfg.output_dir))
        tag = f"{step}-" if k == 1 else f"{step}.{k}-"
        prompts["uid"] = [f"{tag}{i}" for i in range(len(prompts))]

    def _old_log_probs(self, step: StepContext, batch: DataProto) -> None:
        """The actor's old-log-prob pass, unless the update's forward gives ``pi_old`` (:class:`trainer.on_policy.
        OnPolicyRule`: then the batch is marked and the update computes them; ``perf/old_log_prob_pass`` 1 / 0)."""
        from trainer import core_algos

        needed = self.on_policy.needs_pass(len(batch), self.global_step > self.trainer_cfg.critic_warmup)
        step.metrics["perf/old_log_prob_pass"] = float(needed)
        if not needed:
            batch.meta[OLD_FROM_UPDATE] = True  # read by trainer.workers.update
            return
        with step.timer("old_log_prob"):
            batch.union(self.roles.actor.compute_log_prob(batch))
            step.metrics["actor/entropy"] = float(core_algos.masked_mean(batch["entropys"], batch["response_mask"]))

    def _rollout_correction(self, step: StepContext, batch: DataProto) -> None:
        """``rollout_is_weights`` and the engine/trainer log-prob gap (:func:`trainer.algos.rollout_correction.
        apply_rollout_correction`); with old log-probs from the update, the update reports the gap."""
        from trainer.algos.rollout_correction import apply_rollout_correction

        if not batch.meta.get(OLD_FROM_UPDATE):
            step.metrics.update(apply_rollout_correction(batch, self.rollout_correction))

    def _ref_log_probs(self, step: StepContext, batch: DataProto) -> None:
        if self.roles.ref is not None:
            with step.timer("ref"):
                batch.union(self.roles.ref.compute_ref_log_prob(batch))

    def _token_level_rewards(self, step: StepContext, batch: DataProto) -> None:
        """``token_level_rewards``: the scores, minus the KL penalty when ``algorithm.use_kl_in_reward``."""
        from trainer import core_algos

        if self.kl_ctrl is None:
            batch["token_level_rewards"] = batch["token_level_scores"]
            return
        rewards, kl_m = core_algos.apply_kl_penalty(batch["token_level_scores"], batch["old_log_probs"],
                                                    batch["ref_log_prob"], batch["response_mask"], self.kl_ctrl,
                                                    self.algo["kl_penalty"])
        batch["token_level_rewards"] = rewards
        step.metrics.update(kl_m)

    def _update_actor(self, step: StepContext, batch: DataProto) -> None:
        if self.global_step > self.trainer_cfg.critic_warmup:
            with step.timer("update_actor"):
                step.metrics.update(reduce_rank_metrics(self.roles.actor.update_actor(batch)))

    # ---- validation -------------------------------------------------------------------------------------------
    def validate(self) -> dict:
        """Generate on the held-out set (``val_kwargs`` sampling) and score it: ``val/<source>/<metric>``, where
        ``<source>`` is a row's value of ``data.reward_fn_key`` (``data_source`` by default; ``acc`` is the strict
        accuracy, the mean over all samples). With ``trainer.val_also_greedy`` and sampled ``val_kwargs``, a second
        pass decodes one greedy response per question and logs ``val/<source>/greedy/<metric>``, so sampled and
        greedy accuracy of the same weights sit side by side (:func:`trainer.validation.validate`)."""
        from trainer.validation import validate

        return validate(self)

    def validate_pass(self, greedy: bool) -> dict:
        """One generation + scoring pass over the held-out set (:func:`trainer.validation.validation_pass`)."""
        from trainer.validation import validation_pass

        return validation_pass(self, greedy)

    # ---- loop -----------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to ``trainer.total_training_steps`` (or the end of the data, or SIGTERM); returns the last metrics."""
        from trainer.tracking import Tracking

        check_interrupted()  # a signal recorded before (its exception swallowed): stop before any more work
        t = self.trainer_cfg
        total = self.last_step()
        self.global_step = self.load_checkpoint()
        tracker = Tracking(t.project_name, t.experiment_name, t.logger, t.output_dir, plain(self.cfg),
                           total_steps=total, start_step=self.global_step, keep_rows=bool(t.val_only))
        self._driver_pid = os.getpid()
        old_handlers = stop_handlers(self._on_sigterm)  # SIGTERM and SIGHUP: the step finishes
        last: dict = {}
        try:
            if t.val_only or (t.val_before_train and self.val_dataset is not None and self.global_step == 0):
                last.update(validate_and_log(self, tracker, self.global_step, advance=False))
                if t.val_only:
                    self.stop_reason = " (trainer.val_only: validation only)"
                    return last
            last = self._train_loop(tracker, total, last)
            self._finish(last)
        finally:
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler)
            tracker.close()
        return last

    def _train_loop(self, tracker, total: int, last: dict) -> dict:
        """Steps until ``total`` (or the end of the data, or SIGTERM), with in-job recovery; the last step's metrics
        (``last`` when no step ran)."""
        from trainer.placement import WorkerDied
        from trainer.recovery import Recovery

        recovery = Recovery(self, tracker, self.trainer_cfg.max_restarts)  # the start state
        while self.global_step < total and not self._stop_requested:
            self.global_step += 1
            check_interrupted(self.global_step)  # a Ctrl-C (or second SIGTERM) whose exception was swallowed
            try:
                metrics = self._step_with_saves(tracker, total)
            except DataExhausted:  # dynamic sampling drew past the last epoch: verl's loop ends here too
                self.global_step -= 1
                break
            except WorkerDied as exc:  # trainer.max_restarts: re-raised, or back at the last checkpoint
                if self._stop_requested:  # after SIGTERM: the workers died of it too (Slurm signals them all)
                    raise
                recovery.restart(exc)
                continue
            metrics.update(recovery.metrics())
            tracker.log(metrics, step=self.global_step)
            last = metrics
        return last

    def _step_with_saves(self, tracker, total: int) -> dict:
        """One step, then the checkpoint and validation it is due for; its metrics (data, timing, throughput)."""
        from trainer.metric_utils import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics

        save_freq, test_freq = self.trainer_cfg.save_freq, self.trainer_cfg.test_freq
        timing: dict = {}
        with timed("step", timing):
            prompts, epoch = self.pipeline.next_batch(self.global_step, timing) if self.pipeline is not None \
                else self.loader.next_batch()
            batch, metrics = self.train_step(prompts, timing)
            self._check_skipped(metrics)
            is_last = self.global_step == total
            if save_freq > 0 and (self.global_step % save_freq == 0 or is_last):
                with timed("save_checkpoint", timing):
                    self.save_checkpoint()
            if self.hf_exports is not None and self.hf_exports.due():
                with timed("export_hf", timing):
                    self.hf_exports.export(self.roles.actor.export_hf, self.global_step)
            if test_freq > 0 and (self.global_step % test_freq == 0 or is_last):
                with timed("testing", timing):
                    metrics.update(validate_and_log(self, tracker, self.global_step))
        metrics.update(compute_data_metrics(batch, use_critic=self.roles.has("critic"),
                                            max_response_length=self.response_length,
                                            max_prompt_length=self.data_cfg.max_prompt_length,
                                            stop_token_ids=self.stop_token_ids))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, n_gpus=self.world))
        metrics.update({"training/global_step": self.global_step, "training/epoch": epoch})
        return metrics

    def _finish(self, last: dict) -> None:
        """The stop reason, then what keeps the work: after SIGTERM / SIGHUP a checkpoint (``save_freq > 0``: the run
        can resume) or else the HF export; at the end the HF export (``trainer.export_hf_on_end``)."""
        t = self.trainer_cfg
        name = signal.Signals((stop_requested() or (signal.SIGTERM,))[0]).name
        if self._stop_requested:
            self.stop_reason = f" (stopped early by {name})"
            last["_stopped_by_sigterm"] = True
        elif self.global_step < t.total_training_steps:
            self.stop_reason = f" (trainer.total_epochs={t.total_epochs} epochs of data used up)"
        if self._stop_requested and t.save_freq > 0:
            logger.warning("%s: saving step %d before exiting", name, self.global_step)
            self.save_checkpoint()
        elif t.export_hf_on_end:  # the end, or SIGTERM in a run without checkpoints: the export keeps the work
            out = os.path.join(t.output_dir, "hf_actor")
            self.roles.actor.export_hf(out)
            last["hf_export_dir"] = out

    def last_step(self) -> int:
        """``trainer.total_training_steps``, or the step where ``trainer.total_epochs`` of data end when that comes
        first and every step takes one loader batch (verl's epoch loop ends the run there)."""
        total = self.trainer_cfg.total_training_steps
        epochs = self.loader.num_epochs
        return min(total, epochs * len(self.loader)) if self.hooks.one_batch_per_step and epochs else total

    def _check_skipped(self, metrics: dict) -> None:
        """Stop the run when a role's optimizer steps were skipped (non-finite loss or gradient) too many times in
        a row: ``<role>/consecutive_skipped_steps`` (max over ranks) >= ``trainer.max_consecutive_skipped_steps``.

        Raises:
            TrainingDiverged: naming the role, the streak and the last checkpoint (which stays intact).
        """
        limit = self.trainer_cfg.max_consecutive_skipped_steps
        for key, streak in metrics.items():  # actor, critic, reward_model (PRIME)
            role = key[:-len("/consecutive_skipped_steps")]
            if key.endswith("/consecutive_skipped_steps") and streak >= limit:
                from trainer.checkpoint.base import find_latest_checkpoint

                raise TrainingDiverged(
                    f"{role}: {int(streak)} optimizer steps in a row had a non-finite loss or gradient norm and were "
                    f"skipped (trainer.max_consecutive_skipped_steps={limit}); stopping at step {self.global_step}. "
                    f"Last checkpoint: {find_latest_checkpoint(self._ckpt_root())}")

    def _on_sigterm(self, signum, frame) -> None:
        loop_sigterm(self, signum)  # the step finishes; a second SIGTERM stops at once (trainer/interrupt.py)

