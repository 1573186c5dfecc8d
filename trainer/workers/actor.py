"""The actor + rollout + reference worker (one Ray actor per rank, DeepSpeed ZeRO inside).

Methods called by the single controller (how each splits its batch is declared in ``trainer/placement.py``):
``init_model``, ``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``,
``save_checkpoint``, ``load_checkpoint``, ``export_hf``; with ``trainer.rollout_placement=separate`` the engine lives
in the rollout workers instead (:mod:`trainer.workers.rollout`) and the actor pushes its weights to them
(:class:`trainer.workers.weight_sync.WeightSender`).
"""
from __future__ import annotations

import logging
import time

import torch

from rollout.compile_stats import compile_counts, count_delta
from trainer.protocol import DataProto
from trainer.workers.base import DistributedWorker, StartupClock, reset_peak_memory, stage_peak_memory
from trainer.workers.generation import call_sampling, generation_rows, prompt_lists, sampling_config
from trainer.workers.lora import lora_enabled
from trainer.workers.model_utils import ModelRole, forward_batch_log_probs
from trainer.workers.profiling import profiled
from trainer.workers.weight_sync import WeightSender

logger = logging.getLogger(__name__)


class ActorRolloutRefWorker(WeightSender, DistributedWorker):
    """Holds the trainable actor (DeepSpeed engine), the rollout engine (colocated placement) and the frozen
    reference model; ``config`` is a :class:`trainer.config.workers.ActorWorkerConfig`."""

    lora = False  # the actor trains LoRA adapters (set by init_model)

    def init_model(self) -> dict:
        """Build the actor (DeepSpeed engine), the reference and the rollout engine; returns the checkpoint info,
        ``pad_token_id``, ``stop_token_ids`` and ``startup_s`` (seconds of each part, for the start-up log)."""
        clock = StartupClock()
        import deepspeed  # noqa: F401  (after DS_ACCELERATOR is set)

        from trainer.workers.kernels import warm_compile_pool

        warm_compile_pool(self.config.model.use_torch_compile, self.config.rollout, self.device_type)  # beside loading
        clock.mark("imports")
        self.init_distributed()
        cfg = self.config
        self.actor_cfg, self.rollout_cfg = cfg.actor, cfg.rollout
        self.need_ref = cfg.need_ref
        self.lora = lora_enabled(cfg.model)  # LoRA: the reference is the actor with its adapters disabled
        a = cfg.actor
        clock.mark("distributed")
        self.actor = ModelRole.build(self, cfg.model, sp=a.ulysses_sequence_parallel_size, train=True,
                                     optim_cfg=a.optim, grad_clip=a.grad_clip, total_steps=cfg.total_steps)
        clock.mark("actor")
        self.tokenizer = self.actor.tokenizer
        self.ref = None
        if self.need_ref and not self.lora:
            self.ref = ModelRole.build(self, cfg.model, sp=cfg.ref.ulysses_sequence_parallel_size, train=False)
            clock.mark("reference")
        self._build_rollout()
        if self.engine is not None:  # colocated; a separate rollout role builds its own
            clock.mark("rollout engine")
        return {**self.attach_checkpointing(self.actor), "pad_token_id": self.pad_token_id,
                "stop_token_ids": list(self.stop_token_ids), "startup_s": clock.parts}

    # ---- rollout -------------------------------------------------------------------------------------------
    def _build_rollout(self) -> None:
        """The stop and pad ids; with colocated placement the rollout engine (``self.engine``, asleep) and the
        generator over it (``self.generator``); with ``separate`` both stay None (the rollout workers hold them)."""
        from rollout.stop_tokens import resolve_stop_token_ids

        rc = self.rollout_cfg
        tok = self.tokenizer
        self.stop_token_ids = resolve_stop_token_ids(tok, self.actor.hf_config, self.actor.model_path,
                                                     extra=list(rc.stop_token_ids))
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else self.stop_token_ids[0]
        self.engine = self.generator = self.lora_sync = None
        if self.config.separate_rollout:
            return
        self.engine = build_engine(self.config, self.actor.hf_config, self.actor.model_path, self.stop_token_ids,
                                   self.pad_token_id, self.device, self.device_type, self.param_dtype(), self.rank)
        self.engine.sleep(level=rc.sleep_level)
        if self.lora:
            from trainer.workers.lora_sync import LoraWeightSync

            self.lora_sync = LoraWeightSync(self.actor.engine.module, self.engine, self.config.deepspeed.zero_stage,
                                            mode=rc.lora_sync, sleep_level=rc.sleep_level,
                                            base_model_path=self.actor.model_path)
        from trainer.multi_turn import build_generator

        # what generate_sequences asks for responses (a rollout.generator.Generator): one model turn per prompt,
        # or the multi-turn tool loop with rollout.multi_turn.enable
        self.generator = build_generator(self.engine, rc.multi_turn, tok, self.config.chat_template_kwargs)

    def _sampling(self, validate: bool, seed: int | None, greedy: bool = False):
        """:func:`trainer.workers.generation.sampling_config` of this worker's rollout settings."""
        return sampling_config(self.rollout_cfg, validate, seed, greedy)

    def _rollout_context(self, validate: bool, memory_log: dict | None = None, timing_log: dict | None = None):
        """``rollout.context.rollout_mode`` with this worker's weight source (ZeRO-gathered actor parameters);
        the Megatron worker overrides it with TP-gathered HF tensors. ``memory_log`` receives the GPU memory in
        use after each wake/sleep stage (see ``rollout_mode``). An engine that can run on the actor's own tensors
        (``can_share_weights``: the transformers engine) does so when they persist in place and are what it would
        hold: ZeRO stage <= 2 (whole parameters on every rank), no LoRA (whose engine weights are merged) and the
        engine's dtype."""
        from rollout.context import iter_actor_params, offload_optimizer_states, reload_optimizer_states, rollout_mode

        rc = self.rollout_cfg
        stage = self.config.deepspeed.zero_stage
        bucket = rc.update_weights_bucket_megabytes * 2 ** 20
        offload = rc.offload_optimizer_during_rollout and not validate
        module = self.actor.engine.module
        source = self.lora_sync.named_params if self.lora_sync is not None else (
            lambda b: iter_actor_params(module, stage, b))
        share = (self.engine.can_share_weights and self.lora_sync is None and stage < 3
                 and getattr(self.engine, "dtype", None) == next(module.parameters()).dtype)
        return rollout_mode(self.engine, lambda: source(bucket), bucket,
                            offload_fn=(lambda: offload_optimizer_states(self.actor.engine)) if offload else None,
                            reload_fn=(lambda: reload_optimizer_states(self.actor.engine)) if offload else None,
                            sleep_level=rc.sleep_level, memory_log=memory_log, timing_log=timing_log,
                            share_weights=share)

    @profiled("gen")
    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt (``self.generator``, see :meth:`_build_rollout`); returns
        prompt-major rows with the standard columns.

        ``prompts`` holds left-padded ``input_ids``/``attention_mask`` (B, P); the result has B*n rows with
        ``prompts`` (B*n, P), ``responses``/``response_mask``/``rollout_log_probs`` (B*n, R), ``input_ids``,
        ``attention_mask``, ``position_ids`` (B*n, P+R; a vision-language model's rotary rows (B*n, 3, P+R)) and
        the prompt's non-tensor columns repeated (``multi_modal_inputs`` go to the rollout engine too).

        With ``rollout.multi_turn.enable`` the generator is the multi-turn loop (:mod:`trainer.multi_turn`):
        ``response_mask`` is 1 on the model's tokens only, ``attention_mask``/``position_ids`` also cover the tool
        answers and the template's glue, ``num_turns`` (B*n,) int64 and the other per-sample figures
        (:data:`rollout.multiturn.metrics.ROW_COLUMNS`) are non-tensor columns, and the call's ``multi_turn/*``
        and ``tool/*`` metrics are in ``meta`` (the step logs those computed from the columns of the whole batch).
        """
        if self.generator is None:
            raise RuntimeError("trainer.rollout_placement=separate: the rollout workers generate, not the actor")
        t0 = time.perf_counter()
        validate = bool(prompts.meta.get("validate", False))
        sampling = call_sampling(self.rollout_cfg, prompts, self.rank)
        reset_peak_memory(self.device)
        stages: dict[str, float] = {}
        seconds: dict[str, float] = {}
        compiled = compile_counts()
        with self._rollout_context(validate, memory_log=stages, timing_log=seconds):
            perf = {}
            if self.device.type == "cuda":  # weights synced, KV cache awake; optimizer states gone if offloaded
                perf["perf/memory_allocated_gb/rollout_start"] = torch.cuda.memory_allocated(self.device) / 2**30
            mm = list(prompts["multi_modal_inputs"]) if "multi_modal_inputs" in prompts else None
            gen = self.generator.generate(prompt_lists(prompts), sampling, mm)
        perf.update(stage_peak_memory(self.device, "val_gen" if validate else "gen"))
        perf.update({f"perf/{self.rollout_cfg.name}_{k}_gib": v for k, v in stages.items()})
        perf.update({f"perf/rollout_s/{k}": v for k, v in seconds.items()})  # wake, sync, generate, sleep
        perf.update(gen.metrics)
        perf.update(count_delta(compiled, "perf/rollout"))  # compilations / CUDA-graph recordings of this call
        result = generation_rows(prompts, gen, sampling.n,
                                 rope_model=self.actor.engine if "multi_modal_inputs" in prompts else None)
        result.meta["timing_gen_s"] = perf["perf/worker_s/gen"] = time.perf_counter() - t0
        result.meta.update(perf)
        return result

    # ---- log-probs ------------------------------------------------------------------------------------------
    @profiled("old_log_prob")
    @torch.no_grad()
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) f32 and ``entropys`` (B, R) f32 of the current actor, and ``sum_pi_squared``
        (B, R) f32 (``sum_v pi_v^2`` per token, from the same chunked pass over the logits) when the configured
        advantage estimator reads it (:func:`trainer.adv_inputs.log_prob_pass_columns`)."""
        rc = self.rollout_cfg
        t0 = time.perf_counter()
        reset_peak_memory(self.device)
        spp = self.config.sum_pi_squared
        lp, ent, *rest = forward_batch_log_probs(self.actor, data, rc.log_prob_micro_batch_size_per_gpu,
                                                 rc.temperature or 1.0, calculate_entropy=True,
                                                 use_dynamic_bsz=rc.log_prob_use_dynamic_bsz,
                                                 max_token_len=rc.log_prob_max_token_len_per_gpu,
                                                 calculate_sum_pi_squared=spp)
        cols = {"old_log_probs": lp, "entropys": ent, **({"sum_pi_squared": rest[0]} if spp else {})}
        meta = {**stage_peak_memory(self.device, "old_log_prob"),
                "perf/worker_s/old_log_prob": time.perf_counter() - t0}
        return DataProto.from_dict(cols, meta=meta)

    @profiled("ref")
    @torch.no_grad()
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) f32 of the frozen reference model (a LoRA actor with its adapters disabled)."""
        from trainer.workers.lora import reference_mode

        if self.ref is None and not self.lora:
            raise RuntimeError("the reference model was not built: enable actor.use_kl_loss or algorithm.use_kl_in_reward")
        ref = self.config.ref
        t0 = time.perf_counter()
        reset_peak_memory(self.device)
        role = self.ref if self.ref is not None else self.actor
        with reference_mode(role.engine.module):
            lp, _ = forward_batch_log_probs(role, data, ref.log_prob_micro_batch_size_per_gpu,
                                            self.rollout_cfg.temperature or 1.0, calculate_entropy=False,
                                            use_dynamic_bsz=ref.log_prob_use_dynamic_bsz,
                                            max_token_len=ref.log_prob_max_token_len_per_gpu)
        meta = {**stage_peak_memory(self.device, "ref"), "perf/worker_s/ref": time.perf_counter() - t0}
        return DataProto.from_dict({"ref_log_prob": lp}, meta=meta)

    # ---- update ---------------------------------------------------------------------------------------------
    @profiled("update_actor")
    def update_actor(self, data: DataProto) -> dict:
        """PPO-family actor update over mini-batches / micro-batches / epochs; returns metric lists."""
        from trainer.workers.update import ppo_update

        return ppo_update(self, self.actor, data, self.actor_cfg, n=self.rollout_cfg.n,
                          temperature=self.rollout_cfg.temperature or 1.0, kind="actor",
                          response_length=self.rollout_cfg.response_length)

    @torch.no_grad()
    def weights_fingerprint(self) -> dict:
        """Sums of the actor's parameters (gathered under ZeRO-3) and of the rollout engine's copy; for checks
        that every data-parallel rank holds the same weights and that the engine received them."""
        from rollout.context import iter_actor_params
        from trainer.workers.lora import iter_merged_params

        stage = self.config.deepspeed.zero_stage
        weights = iter_merged_params if self.lora else iter_actor_params  # a LoRA actor: its merged weights
        actor = {n: float(t.double().sum()) for bucket in weights(self.actor.engine.module, stage) for n, t in bucket}
        engine_model = getattr(self.engine, "model", None)
        eng = {n: float(p.double().sum()) for n, p in engine_model.named_parameters()} if engine_model is not None else {}
        return {"actor": actor, "engine": eng}


def build_engine(config, hf_config, model_path: str, stop_token_ids: list[int], pad_token_id: int,
                 device: torch.device, device_type: str, dtype: torch.dtype, rank: int):
    """The rollout engine ``config.rollout.name`` names (``hf``: :class:`rollout.hf_engine.HFRolloutEngine`,
    ``vllm``: :class:`rollout.vllm_engine.VLLMRolloutEngine`, created asleep) for the model ``model_path`` /
    ``hf_config``; ``config``: the worker's :class:`trainer.config.workers.ActorWorkerConfig` or
    :class:`trainer.config.workers.RolloutWorkerConfig` (the engine name is checked by its section)."""
    rc = config.rollout
    if rc.name == "hf":
        from rollout.generation_config import static_cache_on
        from rollout.hf_engine import HFRolloutEngine

        static = static_cache_on(rc.static_cache, device_type == "cuda")
        return HFRolloutEngine(hf_config, eos_token_id=stop_token_ids, pad_token_id=pad_token_id, device=device,
                               dtype=dtype, use_static_cache=static, max_batch_size=rc.max_batch_size,
                               prompt_len_multiple=rc.prompt_length_bucket,
                               attn_implementation=rc.attn_implementation or "auto",  # None: the vllm group's
                               decode_loop=rc.decode_loop or "auto", compile_regions=bool(rc.decode_compile_regions))
    from rollout.vllm_engine import VLLMRolloutEngine

    return VLLMRolloutEngine(model_path, eos_token_id=stop_token_ids, pad_token_id=pad_token_id,
                             tensor_model_parallel_size=rc.tensor_model_parallel_size,
                             gpu_memory_utilization=rc.gpu_memory_utilization,
                             dtype="bfloat16" if dtype == torch.bfloat16 else "float32", seed=config.seed + rank,
                             **vllm_kwargs(rc, config.model))


def vllm_kwargs(rollout_cfg, model) -> dict:
    """Further ``vllm.LLM`` arguments of a :class:`trainer.config.rollout.RolloutConfig` and the policy's
    :class:`trainer.config.model.ModelConfig`: ``max_model_len`` (prompt + response unless set), verl's engine keys
    collected in ``rollout.engine_kwargs.vllm`` (trainer.verl_compat), vLLM's LoRA with ``lora_sync=adapter`` and
    the model's ``override_config`` as vLLM's ``hf_overrides``."""
    rc = rollout_cfg
    kwargs = {"max_model_len": rc.prompt_length + rc.response_length,
              **dict((rc.engine_kwargs or {}).get("vllm") or {})}
    if lora_enabled(model) and rc.lora_sync == "adapter":  # vLLM applies the adapter itself
        from trainer.workers.lora_sync import vllm_lora_kwargs

        kwargs = {**vllm_lora_kwargs(int(model.lora_rank)), **kwargs}
    if model.override_config:
        kwargs["hf_overrides"] = {**model.override_config, **dict(kwargs.get("hf_overrides") or {})}
    return kwargs
