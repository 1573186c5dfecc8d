"""verl's own example scripts as override lists (test data): the GRPO, GAE-with-sequence-balancing and REINFORCE++
examples, and the DAPO and PRIME recipes, each as verl passes them to its entry point, with the data, model and
checkpoint paths as ``{train}``, ``{val}``, ``{model}``, ``{ckpt}`` placeholders.

:func:`embedded_assets` writes the embedded task's data and a tiny model (random weights, the project's own
tokenizer) whose head counts and context fit every script (8 heads for Ulysses SP 8, a 32k context for DAPO's
22k tokens); :func:`script` fills the placeholders. The scripts come from verl's repository (examples/ and
recipe/, release v0.7.0) and the PRIME recipe runs with ``algorithm=prime`` added (``recipe.prime.main_prime``
is ``trainer/main.py algorithm=prime`` here).
"""
from __future__ import annotations

import os
import re

GRPO = [
    "algorithm.adv_estimator=grpo", "data.train_files={train}", "data.val_files={val}", "data.train_batch_size=1024",
    "data.max_prompt_length=512", "data.max_response_length=1024", "data.filter_overlong_prompts=True",
    "data.truncation=error", "actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]', "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
    "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
]
GAE_SEQ_BALANCE = [
    "algorithm.adv_estimator=gae", "data.train_files={train}", "data.val_files={val}", "data.return_raw_chat=True",
    "data.train_batch_size=4096", "data.max_prompt_length=4096", "data.max_response_length=4096",
    "data.filter_overlong_prompts=True", "data.truncation=error", "actor_rollout_ref.model.path={model}",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.ppo_mini_batch_size=512",
    "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000", "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True", "critic.model.path={model}",
    "critic.model.enable_gradient_checkpointing=True", "critic.ppo_max_token_len_per_gpu=98304",
    "critic.model.fsdp_config.param_offload=False", "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=verl_example_gsm8k",
    "trainer.experiment_name=qwen2-7b_function_rm_bsz8k_p4k_r4k_seq_packing", "trainer.n_gpus_per_node=8",
    "trainer.val_before_train=False", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15",
]
REINFORCE_PP = [
    "algorithm.adv_estimator=reinforce_plus_plus", "data.train_files={train}", "data.val_files={val}",
    "data.train_batch_size=1024", "data.max_prompt_length=1024", "data.max_response_length=1024",
    "data.filter_overlong_prompts=True", "data.truncation=error", "actor_rollout_ref.model.path={model}",
    "actor_rollout_ref.actor.optim.lr=3e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1024", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=mse", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=True",
    "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]', "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm", "trainer.n_gpus_per_node=16", "trainer.nnodes=1",
    "trainer.save_freq=-1", "trainer.test_freq=5", "trainer.total_epochs=15",
]
DAPO = [
    "data.train_files={train}", "data.val_files={val}", "data.prompt_key=prompt", "data.truncation=left",
    "data.max_prompt_length=2048", "data.max_response_length=20480", "data.gen_batch_size=1536",
    "data.train_batch_size=512", "actor_rollout_ref.rollout.n=16", "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0", "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "algorithm.filter_groups.enable=True", "algorithm.filter_groups.max_num_gen_batches=10",
    "algorithm.filter_groups.metric=acc", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22528",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=22528",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=22528", "actor_rollout_ref.model.path={model}",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10", "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.80", "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True", "actor_rollout_ref.rollout.max_num_batched_tokens=22528",
    "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7", "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True", "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=8", "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
    "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=True",
    "reward_model.overlong_buffer.len=4096", "reward_model.overlong_buffer.penalty_factor=1.0",
    'trainer.logger=["console","wandb"]', "trainer.project_name=DAPO", "trainer.experiment_name=DAPO-Qwen2.5-32B",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=16", "trainer.val_before_train=True", "trainer.test_freq=5",
    "trainer.save_freq=5", "trainer.total_epochs=1", "trainer.default_local_dir={ckpt}", "trainer.resume_mode=auto",
]
PRIME = [
    "data.train_files={train}", "data.val_files={val}", "data.train_batch_size=64", "data.val_batch_size=6312",
    "data.max_prompt_length=1024", "data.max_response_length=3072", "data.filter_overlong_prompts=True",
    "data.filter_accuracy=True", "data.accuracy_lower_bound=0.2", "data.accuracy_upper_bound=0.8",
    "data.oversample_factor=4", "actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=5e-7",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32", "algorithm.adv_estimator=rloo",
    "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl", "algorithm.kl_ctrl.kl_coef=0.001",
    "reward_model.model.path={model}", "reward_model.micro_batch_size_per_gpu=1", "reward_model.model.update=before",
    "reward_model.model.beta_train=0.05", "reward_model.model.optim.lr=1e-6",
    "reward_model.model.optim.grad_clip=10.0", "reward_model.model.input_tokenizer=null",
    "reward_model.mini_batch_size=64", "trainer.val_before_train=False", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=prime_example", "trainer.experiment_name=Eurus-2-7B-SFT-gsm8k", "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1", "trainer.save_freq=64", "trainer.test_freq=64", "trainer.total_epochs=15",
]

SCRIPTS = {"grpo": GRPO, "gae_seq_balance": GAE_SEQ_BALANCE, "reinforce_plus_plus": REINFORCE_PP, "dapo": DAPO,
           "prime": ["algorithm=prime", *PRIME]}

# what this machine (no GPU, no vLLM) cannot run as written: the transformers engine instead of vLLM
NO_VLLM = {"actor_rollout_ref.rollout.name": "hf"}

# a CPU step with the tiny model: one worker process, small batches, short sequences, one step
CPU_STEP = {"trainer.n_gpus_per_node": "1", "trainer.nnodes": "1", "data.train_batch_size": "4",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "actor_rollout_ref.rollout.n": "2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4", "data.max_prompt_length": "16",
            "data.max_response_length": "4", "trainer.total_training_steps": "1", "trainer.logger": "[console]",
            "trainer.test_freq": "-1", "trainer.val_before_train": "false", "trainer.save_freq": "-1",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "1",
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
            "actor_rollout_ref.model.enable_gradient_checkpointing": "false", "trainer.export_hf_on_end": "false"}


# the CPU step's further changes of one script (its lengths and batch sizes as CPU_STEP's)
CPU_STEP_EXTRA = {"dapo": {"data.gen_batch_size": "6", "reward_model.overlong_buffer.len": "2"},
                  "prime": {"reward_model.mini_batch_size": "4"}}


def embedded_assets(root: str) -> dict[str, str]:
    """Write the embedded task (train/val jsonl) and a tiny Llama that fits every script under ``root``."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import embedded

    model = os.path.join(root, "model")
    if not os.path.exists(os.path.join(model, "config.json")):
        tok = embedded.build_tokenizer(model)
        torch.manual_seed(0)
        conf = embedded.tiny_model_config(len(tok), hidden_size=32, num_attention_heads=8, num_key_value_heads=8,
                                          intermediate_size=64, max_position_embeddings=32768)
        AutoModelForCausalLM.from_config(conf).save_pretrained(model)
    train, val = embedded.write_task(os.path.join(root, "data"), train_rows=64, val_rows=8)
    return {"model": model, "train": train, "val": val, "ckpt": os.path.join(root, "ckpt")}


def script(name: str, assets: dict[str, str], *replacements: dict[str, str]) -> list[str]:
    """The script's overrides with the asset paths filled in and each replacement's keys set to its values
    (replaced where the script has the key, appended otherwise)."""
    out = [o.format(**assets) for o in SCRIPTS[name]]
    for rep in replacements:
        for key, value in rep.items():
            hits = [i for i, o in enumerate(out) if o.split("=", 1)[0] == key]
            for i in hits:
                out[i] = f"{key}={value}"
            if not hits:
                out.append(f"{key}={value}")
    return out


def composed(overrides: list[str]):
    """``(prepared, unresolved, resolved, report)`` of a command line: the checked overrides
    (:func:`trainer.overrides.prepare_overrides`), the composed config before interpolation (a dict), and the
    resolved config with verl's keys handled (:func:`trainer.launch.resolve_config`) and its report."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from trainer.launch import resolve_config
    from trainer.overrides import CONFIG_DIR, prepare_overrides
    from trainer.verl_compat import Report

    prepared = prepare_overrides(overrides)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("ppo_trainer", overrides=prepared.overrides)
    unresolved = OmegaConf.to_container(cfg, resolve=False)
    report = Report()
    return prepared, unresolved, resolve_config(cfg, report), report


_INTERP = re.compile(r"^\$\{([.\w]+)\}$")


def interpolation_sources(unresolved: dict) -> dict[str, str]:
    """``{key: source}`` for every leaf whose value is exactly ``${source}`` (absolute, or relative with leading
    dots), so that a source counts as read when a key interpolating it is read."""
    from trainer.verl_compat import leaves

    out = {}
    for key, value in leaves(unresolved):
        m = _INTERP.match(value) if isinstance(value, str) else None
        if not m:
            continue
        ref = m.group(1)
        if ref.startswith("."):
            dots = len(ref) - len(ref.lstrip("."))
            base = key.split(".")[:-dots]
            ref = ".".join(base + [ref.lstrip(".")])
        out[key] = ref
    return out


def _loss_mode(cfg: dict) -> str:
    return cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"]


# keys a run leaves unread because another setting switches their feature off (each covered by another script, or,
# for the settings of one policy loss, by that loss's tests in tests/test_core_algos_extra.py)
CONDITIONAL = (
    ("critic.", lambda c: not c["critic"]["enable"], "no critic: only GAE has one"),
    ("actor_rollout_ref.actor.megatron.", lambda c: c["trainer"]["strategy"] != "megatron",
     "trainer.strategy=deepspeed"),
    ("actor_rollout_ref.model.tiny", lambda c: c["actor_rollout_ref"]["model"]["path"] is not None,
     "a model folder is given (the tiny model's sizes are for path=null)"),
    ("algorithm.kl_ctrl.", lambda c: not c["algorithm"]["use_kl_in_reward"], "no KL penalty in the reward"),
    ("algorithm.kl_penalty", lambda c: not c["algorithm"]["use_kl_in_reward"], "no KL penalty in the reward"),
    ("actor_rollout_ref.actor.kl_loss_type", lambda c: not c["actor_rollout_ref"]["actor"]["use_kl_loss"],
     "no KL loss"),
    ("actor_rollout_ref.ref.", lambda c: not (c["actor_rollout_ref"]["actor"]["use_kl_loss"]
                                             or c["algorithm"]["use_kl_in_reward"]), "no reference model (no KL)"),
    ("algorithm.norm_adv_by_std_in_grpo", lambda c: c["algorithm"]["adv_estimator"] not in ("grpo", "dr_grpo")
     or c["algorithm"].get("use_prime"), "a setting of the GRPO estimators"),
    ("algorithm.gamma", lambda c: bool(c["algorithm"].get("use_prime")), "PRIME's advantages have no discount"),
    ("algorithm.lam", lambda c: bool(c["algorithm"].get("use_prime")), "PRIME's advantages have no GAE lambda"),
    ("algorithm.kl_ctrl.horizon", lambda c: c["algorithm"]["kl_ctrl"]["type"] != "adaptive",
     "a setting of the adaptive KL controller"),
    ("algorithm.kl_ctrl.target_kl", lambda c: c["algorithm"]["kl_ctrl"]["type"] != "adaptive",
     "a setting of the adaptive KL controller"),
    ("data.name", lambda c: c["trainer"]["experiment_name"] != c["data"]["name"],
     "data.name is only the default of trainer.experiment_name, which is set"),
    ("actor_rollout_ref.actor.policy_loss.clip_cov_", lambda c: _loss_mode(c) != "clip_cov",
     "settings of the clip_cov policy loss"),
    ("actor_rollout_ref.actor.policy_loss.kl_cov_ratio", lambda c: _loss_mode(c) != "kl_cov",
     "a setting of the kl_cov policy loss"),
    ("actor_rollout_ref.actor.policy_loss.ppo_kl_coef", lambda c: _loss_mode(c) != "kl_cov",
     "a setting of the kl_cov policy loss"),
    ("actor_rollout_ref.actor.tau_", lambda c: _loss_mode(c) != "sapo", "settings of the sapo policy loss"),
    ("actor_rollout_ref.rollout.log_prob_", lambda c: _old_log_probs_from_update(c),
     "old log-probs come from the update's forward (one optimizer step per batch: trainer.on_policy), so the "
     "separate old-log-prob pass that these keys size does not run"),
    *((f"actor_rollout_ref.{key}", lambda c: not c["actor_rollout_ref"]["model"]["lora_rank"],
       "a LoRA setting (actor_rollout_ref.model.lora_rank=0: every weight is trained)")
      for key in ("model.lora_alpha", "model.target_modules", "model.exclude_modules", "rollout.lora_sync")),
)


def _old_log_probs_from_update(c: dict) -> bool:
    """Whether every step of the run skips the old-log-prob pass (:class:`trainer.on_policy.OnPolicyRule` with
    the whole batch as one actor mini-batch and no critic warm-up)."""
    from trainer.on_policy import OnPolicyRule

    rule = OnPolicyRule.from_config(c, separate_rollout=c["trainer"]["rollout_placement"] == "separate")
    return (not rule.blockers and not c["trainer"]["critic_warmup"]
            and int(c["data"]["train_batch_size"]) == int(c["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]))


def unread_keys(resolved: dict, unresolved: dict, reads: set[str]) -> list[str]:
    """Leaves of ``resolved`` that no code read (``reads``: trainer.config_reads), after counting interpolation
    sources of read keys as read and dropping the :data:`CONDITIONAL` keys whose condition holds."""
    from trainer.overrides import FREE_FORM
    from trainer.verl_compat import leaves

    read = set(reads)
    sources = interpolation_sources(unresolved)
    changed = True
    while changed:
        changed = False
        for key, src in sources.items():
            if key in read and src not in read:
                read.add(src)
                changed = True
    out = []
    for key, _ in leaves(resolved):
        if key in read or any(key.startswith(f + ".") and f in read for f in FREE_FORM):
            continue
        if any(key.startswith(prefix) and cond(resolved) for prefix, cond, _ in CONDITIONAL):
            continue
        out.append(key)
    return out
