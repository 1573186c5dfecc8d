"""verl's config keys that are not keys of this framework's configs, and what happens to each.

Every leaf key of verl's PPO trainer config (``verl/trainer/config/ppo_trainer.yaml`` and the DAPO and PRIME
recipes) is either a key of ``configs/`` with the same meaning, or matched by one entry of :data:`VERL_KEYS`.
This one table drives the command-line check (``trainer/overrides.py`` lets these keys through without ``+``),
the handling of the composed config (``trainer/verl_compat.py``: mapping, warnings, refusals) and the key table of
the README ("Coming from verl"; ``python -m trainer.verl_compat --markdown``).

Patterns are dotted keys; ``{a,b}`` is either name, ``*`` one name, ``**`` the whole subtree below.

Kinds:

* ``map``: read as ``target`` (a key of configs/), with a warning naming the mapping (``alias``: the same
  meaning under another name, logged without a warning).
* ``ignore``: accepted and ignored with a warning that says why.
* ``refuse``: a config error that says what to use instead.
* ``vllm``: an argument of ``vllm.LLM``, passed on with ``rollout.name=vllm`` and ignored (with a warning) otherwise.
* ``rule``: a mapping with its own rule, named by ``target`` (see ``trainer/verl_compat.py``).

``ok`` lists values that are accepted without a word: verl's default of a feature that is off, or the behaviour
this framework always has.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerlKey:
    """One row of the table (see the module docstring for ``kind``, ``target`` and ``ok``)."""

    pattern: str
    kind: str
    note: str
    target: str | None = None
    ok: tuple = ()


A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "critic"
FSDP = "{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model,reward_model.model}.fsdp_config"
OPTIM = "{actor_rollout_ref.actor,critic,reward_model.model}.optim"
MODEL = "{actor_rollout_ref.model,critic.model}"
NO_FSDP = "FSDP-only: DeepSpeed ZeRO partitions the parameters itself (deepspeed group: zero_stage, offload)"
NO_PROFILE = "profiling hooks are not wired into the trainer; profile a step with tools/bench/step_profile.py"
NO_MULTI_TURN = ("agent loops and interactions are not supported; tool-using rollouts are "
                 "actor_rollout_ref.rollout.multi_turn (enable, tools, format)")
NO_RM = ("model-based reward models are not supported: rewards come from rule scorers (reward_model.scorer), "
         "custom_reward_function.path, or algorithm=prime's implicit PRM")
GLOBAL_MICRO = "a global micro-batch size: set the rows per worker with the key's _per_gpu form"
ENTROPY = "entropy is computed chunk by chunk from each micro-batch's own logits (trainer/forward.py)"
VLLM = "an argument of vllm.LLM: passed on with rollout.name=vllm, ignored by the transformers engine"

VERL_KEYS: tuple[VerlKey, ...] = (
    # ---- FSDP engine settings -------------------------------------------------------------------------------------
    VerlKey(f"{A}.fsdp_config.param_offload", "rule", "ZeRO-3 parameter offload to CPU memory",
            "deepspeed.offload_param", ok=(False,)),
    VerlKey(f"{A}.fsdp_config.optimizer_offload", "rule", "ZeRO-Offload of the optimizer state (DeepSpeedCPUAdam)",
            "deepspeed.offload_optimizer", ok=(False,)),
    VerlKey("{actor_rollout_ref.ref,critic.model,reward_model.model}.fsdp_config.{param_offload,optimizer_offload}",
            "rule", "every role follows the one DeepSpeed setting (actor_rollout_ref.actor.fsdp_config.* or "
            "deepspeed.offload_param/offload_optimizer)", "same_offload"),
    VerlKey(f"{FSDP}.{{wrap_policy.**,min_num_params,fsdp_size,reshard_after_forward,forward_prefetch,offload_policy,"
            "use_orig_params,strategy,seed,full_determinism,forward_only,grad_offload}", "ignore", NO_FSDP),
    VerlKey(f"{FSDP}.{{model_dtype,dtype}}", "ignore",
            "precision follows deepspeed.bf16 (auto: bf16 with fp32 master weights on cuda, fp32 on cpu)"),
    VerlKey(f"{FSDP}.{{entropy_from_logits_with_chunking,entropy_checkpointing}}", "ignore", ENTROPY),
    VerlKey(f"{FSDP}.use_torch_compile", "ignore", "use actor_rollout_ref.model.use_torch_compile"),
    VerlKey(f"{FSDP}.ulysses_sequence_parallel_size", "ignore",
            "set the role's own ulysses_sequence_parallel_size (e.g. actor_rollout_ref.actor.ulysses_sequence_parallel_size)"),
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic,reward_model}.strategy", "rule",
            "fsdp/fsdp2 train with DeepSpeed here; megatron selects trainer.strategy=megatron (actor and reference)",
            "strategy"),
    # ---- batch sizes --------------------------------------------------------------------------------------------
    VerlKey(f"{A}.ppo_micro_batch_size", "refuse", f"{GLOBAL_MICRO} ({A}.ppo_micro_batch_size_per_gpu)", ok=(None,)),
    VerlKey(f"{R}.log_prob_micro_batch_size", "refuse", f"{GLOBAL_MICRO} ({R}.log_prob_micro_batch_size_per_gpu)",
            ok=(None,)),
    VerlKey("actor_rollout_ref.ref.log_prob_micro_batch_size", "refuse",
            f"{GLOBAL_MICRO} (actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)", ok=(None,)),
    VerlKey(f"{C}.{{ppo_micro_batch_size,forward_micro_batch_size}}", "refuse",
            f"{GLOBAL_MICRO} (critic.ppo_micro_batch_size_per_gpu, critic.forward_micro_batch_size_per_gpu)", ok=(None,)),
    VerlKey("reward_model.micro_batch_size", "refuse",
            f"{GLOBAL_MICRO} (reward_model.micro_batch_size_per_gpu, with algorithm=prime)", ok=(None,)),
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.rollout_n", "ignore",
            "derived from actor_rollout_ref.rollout.n; set that"),
    # ---- actor ----------------------------------------------------------------------------------------------------
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.ref}.use_torch_compile", "ignore",
            "use actor_rollout_ref.model.use_torch_compile (torch.compile of the decoder layers and the log-prob math)"),
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.ref}.{entropy_from_logits_with_chunking,entropy_checkpointing}",
            "ignore", ENTROPY),
    VerlKey(f"{A}.calculate_entropy", "ignore", "the entropy is always computed (logged as actor/entropy)", ok=(True,)),
    VerlKey(f"{A}.calculate_sum_pi_squared", "rule",
            "sum_pi_squared is computed by the actor's log-prob pass exactly when algorithm.adv_estimator reads it "
            "(optimal_token_baseline)", "sum_pi_squared", ok=(False,)),
    VerlKey(f"{A}.sum_pi_squared_checkpointing", "ignore",
            "sum_pi_squared comes from the log-prob pass without gradient, which keeps no graph to checkpoint",
            ok=(False,)),
    VerlKey(f"{{{A},{C}}}.checkpoint.**", "ignore",
            "a checkpoint always holds model, optimizer and extra state (verl's default) plus the HF config and "
            "tokenizer; full HF weights: trainer.export_hf_on_end or tools/export_hf.py merge"),
    VerlKey(f"{{{A},{C}}}.data_loader_seed", "ignore",
            "the prompt order follows data.seed, the mini-batch shuffle (shuffle=true) the epoch number"),
    VerlKey(f"{A}.freeze_vision_tower", "refuse",
            "a vision-language model's vision tower is trained with the decoder (freezing it is not supported)",
            ok=(False,)),
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.model,reward_model.model}.use_fused_kernels", "refuse",
            "use actor_rollout_ref.model.use_liger=true (Liger kernels) or use_torch_compile=true", ok=(False,)),
    VerlKey("{actor_rollout_ref.model,reward_model.model}.fused_kernel_options.**", "ignore",
            "settings of verl's fused kernels (use_fused_kernels is not supported)"),
    VerlKey(f"{A}.use_prefix_grouper", "refuse", "shared-prefix grouping of a prompt's responses is not supported",
            ok=(False,)),
    VerlKey(f"{A}.use_remove_padding", "ignore", "set actor_rollout_ref.model.use_remove_padding (every role)"),
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.ref}.router_replay.mode", "refuse",
            "MoE router replay is not supported", ok=("disabled",)),
    VerlKey("{actor_rollout_ref.actor,actor_rollout_ref.ref}.router_replay.{record_file,replay_file}", "ignore",
            "MoE router replay is not supported"),
    VerlKey(f"{R}.enable_rollout_routing_replay", "refuse", "MoE router replay is not supported", ok=(False,)),
    VerlKey("{actor_rollout_ref,actor_rollout_ref.actor,actor_rollout_ref.ref,actor_rollout_ref.rollout,critic,"
            "reward_model}.profiler.**", "ignore", NO_PROFILE),
    VerlKey("{global_profiler,trainer.npu_profile,trainer.controller_nsight_options,trainer.worker_nsight_options}.**",
            "ignore", NO_PROFILE),
    VerlKey("trainer.profile_steps", "ignore", NO_PROFILE),
    VerlKey("actor_rollout_ref.hybrid_engine", "refuse",
            "the actor and the reference share one worker; to give the rollout engine workers of its own (verl's "
            "hybrid_engine=false), set trainer.rollout_placement=separate", ok=(True,)),
    VerlKey("actor_rollout_ref.nccl_timeout", "ignore",
            "process groups use torch's default timeout; trainer.ray_timeout_s bounds every worker call"),
    # ---- optimizer --------------------------------------------------------------------------------------------------
    VerlKey(f"{OPTIM}.clip_grad", "rule", "the role's grad_clip", "grad_clip"),
    VerlKey(f"{OPTIM}.warmup_style", "rule", "the deprecated name of lr_scheduler_type", "warmup_style", ok=(None,)),
    VerlKey(f"{OPTIM}.optimizer", "refuse",
            "the optimizer is AdamW; choose its implementation with deepspeed.optimizer=torch_adamw|deepspeed_adamw",
            ok=("AdamW", "adamw")),
    VerlKey(f"{OPTIM}.optimizer_impl", "refuse",
            "choose the AdamW implementation with deepspeed.optimizer=torch_adamw|deepspeed_adamw",
            ok=("torch.optim",)),
    VerlKey(f"{OPTIM}.override_optimizer_config", "refuse",
            "set optim.betas / optim.weight_decay, or DeepSpeed's own optimizer settings in deepspeed.ds_config",
            ok=(None, {})),
    # ---- models -------------------------------------------------------------------------------------------------------
    VerlKey("actor_rollout_ref.model.lora_adapter_path", "refuse",
            "training starts from new adapters; to go on from a saved one, merge it into its base first (peft's "
            "merge_and_unload) and pass the merged folder as the model's path", ok=(None,)),
    VerlKey(f"{MODEL}.enable_activation_offload", "refuse",
            "use actor_rollout_ref.model.enable_gradient_checkpointing=true (and deepspeed=zero3 offload)", ok=(False,)),
    VerlKey(f"{MODEL}.tiled_mlp.enabled", "refuse", "tiled MLP computation is not supported", ok=(False,)),
    VerlKey(f"{MODEL}.tiled_mlp.num_shards", "ignore", "a tiled-MLP setting (tiled MLP is not supported)"),
    VerlKey("{actor_rollout_ref.model,critic.model,reward_model.model}.use_shm", "ignore",
            "models are read from their folders (no shared-memory copy)"),
    VerlKey("actor_rollout_ref.model.hf_config_path", "refuse",
            "the HF config is read from actor_rollout_ref.model.path; change fields with "
            "actor_rollout_ref.model.override_config", ok=(None,)),
    VerlKey("actor_rollout_ref.model.mtp.{enable,enable_train,enable_rollout}", "refuse",
            "multi-token prediction is not supported", ok=(False,)),
    VerlKey("actor_rollout_ref.model.mtp.{detach_encoder,mtp_loss_scaling_factor,speculative_algorithm,"
            "speculative_num_steps,speculative_eagle_topk,speculative_num_draft_tokens,method,num_speculative_tokens}",
            "ignore", "a multi-token-prediction setting (not supported)"),
    VerlKey("actor_rollout_ref.ref.model", "refuse",
            "the reference model is the actor's initial weights (actor_rollout_ref.model.path)", ok=(None,)),
    # ---- rollout ------------------------------------------------------------------------------------------------------
    VerlKey(f"{R}.calculate_log_probs", "ignore",
            "the engine's log-probs are always returned (rollout/log_prob_diff_* metrics)", ok=(True,)),
    VerlKey(f"{R}.checkpoint_engine.update_weights_bucket_megabytes", "alias", "the bucket size of the weight sync",
            f"{R}.update_weights_bucket_megabytes"),
    VerlKey(f"{R}.checkpoint_engine.{{backend,engine_kwargs}}", "ignore",
            "weights move to the colocated engine in process, in buckets of rollout.update_weights_bucket_megabytes",
            ok=("naive", {})),
    VerlKey(f"{R}.{{enable_chunked_prefill,max_num_batched_tokens,max_num_seqs,enforce_eager,enable_prefix_caching,"
            "disable_log_stats,max_model_len,scheduling_policy,logprobs_mode}", "vllm", VLLM, ok=(None,)),
    VerlKey(f"{R}.cudagraph_capture_sizes", "vllm", f"{VLLM} (as compilation_config.cudagraph_capture_sizes)",
            ok=(None,)),
    VerlKey(f"{R}.engine_kwargs.vllm.**", "vllm", VLLM, ok=({},)),
    VerlKey(f"{R}.engine_kwargs.{{sglang,trtllm}}.**", "ignore",
            "only vLLM and the transformers engine are available (rollout.name=vllm|hf)", ok=({},)),
    VerlKey(f"{R}.skip_tokenizer_init", "ignore", "the engine is given token ids and keeps its tokenizer"),
    VerlKey(f"{R}.{{quantization,quantization_config_file}}", "refuse",
            "the engine receives the actor's weights in the training dtype every step; a quantized engine cannot "
            "take them", ok=(None,)),
    VerlKey(f"{R}.dtype", "ignore", "the engine's dtype follows deepspeed.bf16 (bf16 on cuda)"),
    VerlKey(f"{R}.load_format", "ignore",
            "the engine starts from dummy weights and receives the actor's weights before every generation",
            ok=("dummy",)),
    VerlKey(f"{R}.{{data_parallel_size,expert_parallel_size,pipeline_model_parallel_size}}", "refuse",
            "one engine per worker, tensor parallel only (actor_rollout_ref.rollout.tensor_model_parallel_size)",
            ok=(1,)),
    VerlKey(f"{R}.layered_summon", "ignore",
            "FSDP-only; ZeRO-3 weights are gathered in buckets of rollout.update_weights_bucket_megabytes"),
    VerlKey(f"{R}.mode", "ignore", "generation is one batched call of the colocated engine per step (verl's sync mode)",
            ok=("sync",)),
    VerlKey(f"{R}.multi_stage_wake_up", "ignore",
            "the engine always wakes its weights first and its KV cache after the weights are loaded"),
    VerlKey(f"{R}.multi_turn.{{interaction_config_path,completion_callback}}", "refuse", NO_MULTI_TURN,
            ok=(None,)),
    VerlKey(f"{R}.multi_turn.use_inference_chat_template", "ignore",
            "tool turns are always rendered with the tokenizer's chat template (the prompt's)", ok=(False,)),
    VerlKey(f"{R}.multi_turn.tokenization_sanity_check_mode", "ignore",
            "the loop keeps the token ids the engine wrote; nothing is re-tokenized to compare"),
    VerlKey(f"{R}.multi_turn.num_repeat_rollouts", "ignore", "samples per prompt are actor_rollout_ref.rollout.n"),
    VerlKey(f"{R}.agent.{{agent_loop_config_path,custom_async_server.path}}", "refuse", NO_MULTI_TURN, ok=(None,)),
    VerlKey(f"{R}.agent.**", "ignore", f"an agent-loop setting: {NO_MULTI_TURN}"),
    VerlKey("data.tool_config_path", "refuse",
            "the prompts show the schemas of actor_rollout_ref.rollout.multi_turn's tools (tools, tool_config_path)",
            ok=(None,)),
    VerlKey(f"{R}.over_sample_rate", "refuse",
            "stopping generation early for a share of the requests is not supported", ok=(0, 0.0)),
    VerlKey(f"{R}.skip_rollout", "refuse", "every step generates (no replay of dumped rollouts)", ok=(False,)),
    VerlKey(f"{R}.skip_dump_dir", "ignore", "only used with skip_rollout=true (not supported)"),
    VerlKey(f"{R}.trace.**", "ignore", "rollout tracing is not wired; trainer.log_val_generations logs samples"),
    VerlKey(f"{R}.use_fire_sampling", "refuse", "FIRE sampling is not supported", ok=(False,)),
    VerlKey(f"{R}.mtp", "refuse", "multi-token prediction is not supported", ok=(None,)),
    VerlKey(f"{R}.prometheus.**", "ignore", "the engine's Prometheus metrics are not exported"),
    # ---- algorithm --------------------------------------------------------------------------------------------------
    VerlKey("algorithm.use_pf_ppo", "refuse", "preference-feedback PPO reweighting is not supported", ok=(False,)),
    VerlKey("algorithm.pf_ppo.**", "ignore", "only used with algorithm.use_pf_ppo=true (not supported)"),
    VerlKey("algorithm.rollout_correction.{rollout_rs,rollout_token_veto_threshold}", "refuse",
            "rejection sampling by the rollout/trainer ratio is not supported", ok=(None,)),
    VerlKey("algorithm.rollout_correction.{rollout_rs_threshold,rollout_rs_threshold_lower}", "ignore",
            "only used with rollout_rs (not supported)", ok=(None,)),
    VerlKey("algorithm.rollout_correction.{bypass_mode,use_policy_gradient}", "refuse",
            "only truncated importance sampling is available (algorithm.rollout_correction.rollout_is=token|sequence)",
            ok=(False,)),
    VerlKey("algorithm.rollout_correction.loss_type", "refuse",
            "the policy loss is chosen by actor_rollout_ref.actor.policy_loss.loss_mode", ok=("ppo_clip",)),
    # ---- data ---------------------------------------------------------------------------------------------------------
    VerlKey("data.train_max_samples", "rule", "data.max_rows (-1: every row)", "data.max_rows"),
    VerlKey("data.val_max_samples", "rule", "data.val_max_rows (-1: every row)", "data.val_max_rows"),
    VerlKey("data.tokenizer", "alias", "the tokenizer of the prompts", "actor_rollout_ref.model.tokenizer_path",
            ok=(None,)),
    VerlKey("data.return_raw_chat", "ignore", "the batch always carries the chat messages (raw_prompt)", ok=(True,)),
    VerlKey("data.{return_raw_input_ids,return_full_prompt}", "refuse",
            f"only needed by model-based reward models: {NO_RM}", ok=(False,)),
    VerlKey("data.{dataloader_num_workers,filter_overlong_prompts_workers}", "ignore",
            "prompts are tokenized and filtered once in the driver (no loader processes)"),
    VerlKey("data.video_key", "ignore", "video columns are not read (image rows: data.image_key)"),
    VerlKey("data.image_patch_size", "ignore", "the model's processor sets the patch size of image rows"),
    VerlKey("data.return_multi_modal_inputs", "ignore",
            "image rows always carry their processor outputs (multi_modal_inputs)", ok=(True,)),
    VerlKey("data.{custom_cls.path,datagen.path,sampler.class_path}", "refuse",
            "write the data in verl's parquet layout (tools/data_preprocess/) instead of a custom class", ok=(None,)),
    VerlKey("data.{custom_cls.name,datagen.name,sampler.class_name}", "ignore",
            "only used with a custom class path (not supported)"),
    VerlKey("data.trust_remote_code", "ignore",
            "the tokenizer is the model's: set actor_rollout_ref.model.trust_remote_code", ok=(False,)),
    VerlKey("data.use_shm", "ignore", "data files are read from their paths (no shared-memory copy)"),
    VerlKey("data.validation_shuffle", "refuse", "validation runs over the whole held-out set in file order",
            ok=(False,)),
    # ---- rewards ----------------------------------------------------------------------------------------------------
    VerlKey("custom_reward_function.{path,name}", "alias", "the user's scoring function",
            "reward_model.custom_reward_function"),
    VerlKey("custom_reward_function.reward_kwargs.**", "alias", "keyword arguments of the user's scoring function",
            "reward_model.custom_reward_function.reward_kwargs"),
    VerlKey("reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor}", "alias",
            "DAPO's soft overlong punishment", "reward_model.overlong_buffer"),
    VerlKey("reward_model.{reward_kwargs.overlong_buffer_cfg,overlong_buffer}.log", "ignore",
            "the overlong penalty is always logged (reward/overlong_penalty_mean, reward/overlong_frac)", ok=(True,)),
    VerlKey("reward_model.reward_kwargs.max_resp_len", "rule",
            "the overlong penalty counts up to data.max_response_length", "max_resp_len"),
    VerlKey("reward_manager.name", "alias", "the reward manager", "reward_model.reward_manager"),
    VerlKey("reward_manager.source", "ignore", "reward managers are chosen by name (reward_model.reward_manager)",
            ok=("register",)),
    VerlKey("reward_manager.module.path", "refuse",
            "a custom reward manager is not supported; use custom_reward_function.path (a scoring function)",
            ok=(None,)),
    VerlKey("reward_manager.module.name", "ignore", "only used with reward_manager.module.path (not supported)"),
    VerlKey("reward_model.enable", "rule", NO_RM, "reward_model_enable", ok=(False,)),
    VerlKey("reward_model.enable_resource_pool", "refuse", NO_RM, ok=(False,)),
    VerlKey("reward_model.{n_gpus_per_node,nnodes,num_workers,max_length,use_reward_loop,reward_loop_source}",
            "ignore", f"a reward-model worker setting: {NO_RM}"),
    VerlKey("reward_model.{reward_loop_module_path,reward_loop_class_name}", "refuse",
            "use custom_reward_function.path (a scoring function)", ok=(None,)),
    VerlKey("reward_model.rollout.**", "ignore", f"a generative reward model setting: {NO_RM}"),
    VerlKey("reward_model.forward_max_token_len_per_gpu", "rule",
            "the PRM's token budget, reward_model.max_token_len_per_gpu (algorithm=prime)", "prm_max_token_len"),
    VerlKey("reward_model.launch_reward_fn_async", "ignore",
            "rule scoring runs in a process pool (rewards/pool.py) while the driver waits", ok=(False,)),
    VerlKey("reward_model.sandbox_fusion.url", "refuse",
            "code-execution rewards through a sandbox are not supported; use custom_reward_function.path", ok=(None,)),
    VerlKey("reward_model.sandbox_fusion.{max_concurrent,memory_limit_mb}", "ignore",
            "only used with reward_model.sandbox_fusion.url (not supported)"),
    VerlKey("reward_model.model.input_tokenizer", "ignore", "the PRM reads the actor's token ids (same tokenizer)",
            ok=(None,)),
    VerlKey("reward_model.model.ref_type", "refuse", "the PRM's reference is frozen (reward_model.model.ref_path)",
            ok=("freeze",)),
    # ---- trainer ------------------------------------------------------------------------------------------------------
    VerlKey("trainer.default_hdfs_dir", "refuse",
            "checkpoints are written to trainer.default_local_dir only; copy them to HDFS yourself", ok=(None,)),
    VerlKey("trainer.del_local_ckpt_after_load", "refuse",
            "a loaded checkpoint is kept (trainer.max_actor_ckpt_to_keep prunes old ones)", ok=(False,)),
    VerlKey("trainer.esi_redundant_time", "ignore",
            "saves before an instance expires are not supported; use trainer.save_freq (SIGTERM saves too: the step "
            "finishes, a checkpoint or the HF export is written, exit 143)", ok=(0,)),
    VerlKey("trainer.ray_wait_register_center_timeout", "ignore", "trainer.ray_timeout_s bounds every worker call"),
    VerlKey("trainer.{rollout_data_dir,validation_data_dir}", "refuse",
            "generations are not dumped to files; trainer.log_val_generations logs validation samples, "
            "metrics.jsonl every step's metrics", ok=(None,)),
    VerlKey("trainer.use_legacy_worker_impl", "ignore", "there is one worker implementation"),
    VerlKey("trainer.val_generations_to_log_to_wandb", "alias", "verl's old name of trainer.log_val_generations",
            "trainer.log_val_generations"),
    VerlKey("trainer.remove_previous_ckpt_in_save", "refuse", "use trainer.max_actor_ckpt_to_keep",
            ok=(None, False)),
    VerlKey("{ray_init,ray_kwargs}.**", "ignore",
            "Ray is started for trainer.nnodes x trainer.n_gpus_per_node workers of trainer.cpus_per_worker CPUs; "
            "join a running cluster with RAY_ADDRESS"),
    VerlKey("transfer_queue.enable", "refuse", "the single controller passes batches to the workers directly",
            ok=(False,)),
)
