"""From a composed Hydra config to a finished run: checks, embedded assets, datasets, rewards, trainer.

Everything that can be wrong with the input is checked here, before any worker starts, and reported in one
line naming the bad value (:class:`ConfigError` / :class:`trainer.dataset.DataError`).
"""
from __future__ import annotations

import json
import logging
import os
import sys

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

# keys that were renamed: old dotted key -> new dotted key (verl and our own history)
RENAMED_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.clip_ratio_lower": "actor_rollout_ref.actor.clip_ratio_low",
    "trainer.remove_previous_ckpt_in_save": "trainer.max_actor_ckpt_to_keep",
    "actor_rollout_ref.actor.fsdp_config": "deepspeed (ZeRO settings live in the deepspeed group)",
}


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what was expected."""


def check_renamed(overrides: list[str]) -> None:
    """Raise :class:`ConfigError` for an override that uses a renamed key, naming the new key."""
    for ov in overrides:
        key = ov.split("=", 1)[0].lstrip("+~")
        for old, new in RENAMED_KEYS.items():
            if key == old or key.startswith(old + "."):
                raise ConfigError(f"config key {key!r} was renamed: use {new!r}")


def validate(cfg: dict) -> None:
    """Batch arithmetic, lengths, devices, estimator names. Raises :class:`ConfigError`."""
    t, d = cfg["trainer"], cfg["data"]
    arr = cfg["actor_rollout_ref"]
    actor, rollout = arr["actor"], arr["rollout"]
    if t["device"] not in ("cpu", "cuda"):
        raise ConfigError(f"trainer.device={t['device']!r}; expected cpu or cuda")
    world = int(t["nnodes"]) * int(t["n_gpus_per_node"])
    if world < 1:
        raise ConfigError(f"trainer.nnodes*trainer.n_gpus_per_node={world}; expected >= 1")
    for key in ("max_prompt_length", "max_response_length", "train_batch_size"):
        if int(d[key]) <= 0:
            raise ConfigError(f"data.{key}={d[key]}; expected a positive integer")
    n = int(rollout["n"])
    if n < 1:
        raise ConfigError(f"actor_rollout_ref.rollout.n={n}; expected >= 1")
    bs, mini = int(d["train_batch_size"]), int(actor["ppo_mini_batch_size"])
    sp = int(actor["ulysses_sequence_parallel_size"])
    if sp < 1 or world % sp:
        raise ConfigError(f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp} must divide the {world} "
                          "workers (trainer.nnodes*trainer.n_gpus_per_node)")
    dp = world // sp
    if bs % world:
        raise ConfigError(f"data.train_batch_size={bs} must be divisible by the {world} workers")
    if mini <= 0 or bs % mini:
        raise ConfigError(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size={bs}")
    if (mini * n) % dp:
        raise ConfigError(f"ppo_mini_batch_size*rollout.n={mini * n} rows must be divisible by the data-parallel "
                          f"size {dp}")
    micro = int(actor["ppo_micro_batch_size_per_gpu"])
    if micro <= 0:
        raise ConfigError(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}; expected >= 1")
    if not actor.get("use_dynamic_bsz") and (mini * n // dp) % micro:
        raise ConfigError(f"a mini-batch holds {mini * n // dp} rows per data-parallel rank, not divisible by "
                          f"actor.ppo_micro_batch_size_per_gpu={micro}")
    if float(actor["clip_ratio_c"]) <= 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio_c={actor['clip_ratio_c']}; expected > 1")
    from trainer import core_algos

    try:
        core_algos.get_adv_estimator_fn(cfg["algorithm"]["adv_estimator"])
        core_algos.get_policy_loss_fn(actor["policy_loss"]["loss_mode"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if int(cfg["deepspeed"]["zero_stage"]) not in (0, 1, 2, 3):
        raise ConfigError(f"deepspeed.zero_stage={cfg['deepspeed']['zero_stage']}; expected 0, 1, 2 or 3")


def check_model_context(cfg: dict, hf_config, tokenizer) -> None:
    """Prompt+response must fit the model's context; the tokenizer needs an EOS token."""
    d = cfg["data"]
    need = int(d["max_prompt_length"]) + int(d["max_response_length"])
    ctx = getattr(hf_config, "max_position_embeddings", None)
    if ctx is not None and need > int(ctx):
        raise ConfigError(f"data.max_prompt_length+data.max_response_length={need} exceeds the model's context "
                          f"max_position_embeddings={ctx}")
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer of {cfg['actor_rollout_ref']['model']['path']!r} has no EOS token; "
                          "set one in its tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # pad falls back to EOS (SmolLM2 has no pad token)


def prepare_embedded(cfg: dict) -> None:
    """Write the tiny model + tokenizer and the synthetic task when the config asks for them (in place)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import embedded

    out = os.path.abspath(cfg["trainer"]["output_dir"])
    model = cfg["actor_rollout_ref"]["model"]
    if model.get("path") is None:
        init_dir = os.path.join(out, "init_model")
        if not os.path.exists(os.path.join(init_dir, "config.json")):
            tok = embedded.build_tokenizer(init_dir)
            torch.manual_seed(int(cfg["trainer"]["seed"]))
            conf = embedded.tiny_model_config(len(tok), **dict(model.get("tiny") or {}))
            AutoModelForCausalLM.from_config(conf).save_pretrained(init_dir)
        model["path"] = init_dir
        if cfg["critic"]["model"].get("path") is None:
            cfg["critic"]["model"]["path"] = init_dir
    data = cfg["data"]
    if data.get("train_files") is None:
        train, val = embedded.write_task(os.path.join(out, "data"), seed=int(data.get("seed", 0)))
        data["train_files"] = train
        if data.get("val_files") is None:
            data["val_files"] = val


def run(hydra_cfg: DictConfig) -> dict:
    """Check the config, prepare data and model, start the workers and train. Returns the last metrics."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "datasets", "filelock", "urllib3", "DeepSpeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = OmegaConf.to_container(hydra_cfg, resolve=True)
    if cfg["critic"].get("enable") is None:
        cfg["critic"]["enable"] = cfg["algorithm"]["adv_estimator"] == "gae"
    if int(cfg["actor_rollout_ref"]["actor"]["optim"].get("total_training_steps", -1)) < 0:
        cfg["actor_rollout_ref"]["actor"]["optim"]["total_training_steps"] = int(cfg["trainer"]["total_training_steps"])
    validate(cfg)
    prepare_embedded(cfg)
    from transformers import AutoConfig, AutoTokenizer

    from rewards.manager import RewardManager
    from trainer.dataset import PromptDataset, PromptLoader

    mpath = cfg["actor_rollout_ref"]["model"]["path"]
    if not os.path.exists(os.path.join(mpath, "config.json")):
        raise ConfigError(f"actor_rollout_ref.model.path={mpath!r} is not a Hugging Face model folder "
                          "(no config.json there)")
    tok = AutoTokenizer.from_pretrained(cfg["actor_rollout_ref"]["model"].get("tokenizer_path") or mpath)
    check_model_context(cfg, AutoConfig.from_pretrained(mpath), tok)
    d = cfg["data"]
    ds_kwargs = dict(tokenizer=tok, max_prompt_length=int(d["max_prompt_length"]), prompt_key=d["prompt_key"],
                     filter_overlong_prompts=bool(d["filter_overlong_prompts"]), truncation=d["truncation"])
    train_ds = PromptDataset(d["train_files"], max_rows=d.get("max_rows"), **ds_kwargs)
    val_ds = PromptDataset(d["val_files"], max_rows=d.get("val_max_rows"), **ds_kwargs) if d.get("val_files") else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    loader = PromptLoader(train_ds, int(d["train_batch_size"]), pad, shuffle=bool(d["shuffle"]), seed=int(d["seed"]))
    logger.info("train rows: %d (%d overlong filtered); val rows: %s", len(train_ds), train_ds.num_filtered,
                len(val_ds) if val_ds is not None else 0)
    rm = cfg["reward_model"]
    scorer = rm.get("scorer")
    custom = rm.get("custom_reward_function") or {}
    if custom.get("path"):
        from rewards.registry import load_custom_scorer

        scorer = load_custom_scorer(custom["path"], custom.get("name") or "compute_score")
    make_rm = lambda: RewardManager(tok, reward_fn_key=d["reward_fn_key"], scorer=scorer,  # noqa: E731
                                    scorer_kwargs=dict(rm.get("scorer_kwargs") or {}),
                                    timeout_s=float(rm.get("timeout_s", 10.0)))
    from trainer.ppo_trainer import RayPPOTrainer

    trainer = RayPPOTrainer(cfg, tok, loader, val_ds, make_rm(), make_rm())
    trainer.init_workers()
    last = trainer.fit()
    summary = {k: v for k, v in last.items() if not k.startswith("_")}
    os.makedirs(cfg["trainer"]["output_dir"], exist_ok=True)
    with open(os.path.join(cfg["trainer"]["output_dir"], "final_metrics.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"done: {cfg['trainer']['total_training_steps']} steps; output in {cfg['trainer']['output_dir']}",
          file=sys.stderr)
    return summary
