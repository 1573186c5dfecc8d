"""From a composed Hydra config to a finished run: checks, embedded assets, datasets, rewards, trainer.

Everything that can be wrong with the input is checked here, before any worker starts, and reported in one
line naming the bad value (:class:`ConfigError` / :class:`trainer.dataset.DataError`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys

from omegaconf import DictConfig, OmegaConf

from trainer.config_checks import (ConfigError, _as_int, check_megatron, check_megatron_model,  # noqa: F401
                                   check_model_files, check_resume_checkpoint, check_reward_scorers,
                                   check_rollout_correction, reward_options)

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
    "algorithm.rollout_correction.tis_threshold": "algorithm.rollout_correction.rollout_is_threshold (with "
                                                  "algorithm.rollout_correction.rollout_is=token)",
}


def check_renamed(overrides: list[str]) -> None:
    """Raise :class:`ConfigError` for an override that uses a renamed key, naming the new key."""
    for ov in overrides:
        key = ov.split("=", 1)[0].lstrip("+~")
        for old, new in RENAMED_KEYS.items():
            if key == old or key.startswith(old + "."):
                raise ConfigError(f"config key {key!r} was renamed: use {new!r}")


def check_overrides(overrides: list[str], config_dir: str | None = None,
                    config_name: str = "ppo_trainer") -> None:
    """Renamed keys, unknown keys and unknown group options in the command-line overrides, before Hydra runs.

    Composes the overrides with ``hydra.compose`` (as ``trainer/main.py`` will); Hydra's multi-line
    composition error becomes one :class:`ConfigError` line naming the key or option. Arguments that are not
    ``key=value`` overrides (``--cfg job``, ``-m``) and ``hydra.*`` keys are left to Hydra.

    Raises:
        ConfigError: a renamed key (naming the new one), an unknown key, or a group option that does not exist.
    """
    check_renamed(overrides)
    plain = [o for o in overrides if "=" in o and not o.startswith("-") and not o.lstrip("+~").startswith("hydra.")]
    if not plain:
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    config_dir = config_dir or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            compose(config_name=config_name, overrides=plain)
    except HydraException as exc:
        text = " ".join(str(exc).split()).split(" Config search path:")[0]
        key = _offending_key(text, plain)
        if key and text.startswith("Could not override"):
            raise ConfigError(f"unknown config key {key!r}: it is not in configs/{config_name}.yaml or its groups "
                              f"(check the spelling; '+{key}=...' adds a new key)") from None
        where = f" (override {key!r})" if key else ""
        raise ConfigError(f"{text}{where}") from None


def _offending_key(text: str, overrides: list[str]) -> str | None:
    for ov in overrides:
        key = ov.split("=", 1)[0].lstrip("+~")
        if f"'{key}'" in text or key in text.split():
            return key
    return None


def _model_config_dict(cfg: dict, path: str | None) -> dict:
    """The HF config of a model folder (read as JSON, no import), or the embedded tiny model's sizes."""
    if path is None:
        return dict(cfg["actor_rollout_ref"]["model"].get("tiny") or {})
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _as_list(files) -> list[str]:
    return [files] if isinstance(files, str) else list(files or [])


def preflight(cfg: dict) -> None:
    """Fast checks of paths and model limits before anything heavy is imported or any worker starts.

    Model folders must hold ``config.json``; data files must exist; the Ulysses size must divide the model's
    attention heads (``heads % sp == 0`` and ``kv_heads % sp == 0 or sp % kv_heads == 0``, case P01); prompt +
    response must fit ``max_position_embeddings``.

    Raises:
        ConfigError: naming the key and the bad value.
    """
    arr = cfg["actor_rollout_ref"]
    paths = [("actor_rollout_ref.model.path", arr["model"].get("path"))]
    if cfg["critic"].get("enable"):
        paths.append(("critic.model.path", cfg["critic"]["model"].get("path")))
    for key, path in paths:
        if path is not None and not os.path.isfile(os.path.join(path, "config.json")):
            what = "does not exist" if not os.path.exists(path) else "is not a Hugging Face model folder (no config.json)"
            raise ConfigError(f"{key}={path!r} {what}")
    mode, resume_path = cfg["trainer"]["resume_mode"], None
    if mode != "disable":
        from trainer.checkpoint.base import resolve_resume_path

        try:
            resume_path, _ = resolve_resume_path(mode, cfg["trainer"]["default_local_dir"])
        except (ValueError, FileNotFoundError) as exc:
            raise ConfigError(f"trainer.resume_mode: {exc}") from exc
        if resume_path is not None:
            check_resume_checkpoint(cfg, resume_path)
    for key in ("train_files", "val_files"):
        for f in _as_list(cfg["data"].get(key)):
            if not os.path.isfile(f):
                raise ConfigError(f"data.{key}: file {f!r} does not exist (expected a .parquet or .jsonl file)")
    hf = _model_config_dict(cfg, arr["model"].get("path"))
    check_model_files(cfg, hf, resume_path)
    heads = hf.get("num_attention_heads")
    kv = hf.get("num_key_value_heads") or heads
    for key, sp in (("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                     arr["actor"]["ulysses_sequence_parallel_size"]),
                    ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", arr["ref"]["ulysses_sequence_parallel_size"]),
                    ("critic.ulysses_sequence_parallel_size", cfg["critic"]["ulysses_sequence_parallel_size"])):
        sp = int(sp)
        if sp > 1 and heads and (heads % sp or (kv % sp and sp % kv)):
            raise ConfigError(f"{key}={sp} does not fit the model's heads (num_attention_heads={heads}, "
                              f"num_key_value_heads={kv}): need heads % sp == 0 and (kv_heads % sp == 0 or "
                              "sp % kv_heads == 0)")
    if cfg["trainer"].get("strategy", "deepspeed") == "megatron":
        check_megatron_model(cfg, hf)
    ctx = hf.get("max_position_embeddings")
    need = int(cfg["data"]["max_prompt_length"]) + int(cfg["data"]["max_response_length"])
    if ctx is not None and need > int(ctx):
        raise ConfigError(f"data.max_prompt_length+data.max_response_length={need} exceeds the model's context "
                          f"max_position_embeddings={ctx}")


def overlong_kwargs(cfg: dict) -> dict:
    """RewardManager arguments of ``reward_model.overlong_buffer`` (verl's keys), checked.

    Raises:
        ConfigError: ``enable`` with ``len`` not in (0, data.max_response_length), or a negative penalty factor.
    """
    ob = cfg.get("reward_model", {}).get("overlong_buffer") or {}
    if not ob.get("enable"):
        return {}
    max_len = int(cfg["data"]["max_response_length"])
    buf = _as_int(ob.get("len", 0), "reward_model.overlong_buffer.len")
    if not 0 < buf < max_len:
        raise ConfigError(f"reward_model.overlong_buffer.len={buf}; with enable=true expected "
                          f"0 < len < data.max_response_length={max_len}")
    factor = float(ob.get("penalty_factor", 1.0))
    if not factor >= 0:
        raise ConfigError(f"reward_model.overlong_buffer.penalty_factor={factor}; expected >= 0")
    return dict(overlong_buffer_len=buf, overlong_penalty_factor=factor, max_response_length=max_len)


def _finite(key: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r}; expected a number") from None
    if not math.isfinite(v):
        raise ConfigError(f"{key}={value!r}; expected a finite number")
    return v


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
    from trainer.algo_checks import check_estimator_and_loss, check_loss_aggregation

    check_estimator_and_loss(cfg)  # the registry's traits: group-based, critic, inputs; known loss_mode
    if rollout["name"] == "vllm":
        if t["device"] != "cuda":
            raise ConfigError("actor_rollout_ref.rollout.name=vllm needs trainer.device=cuda; "
                              "use rollout=hf on CPU")
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("rollout=vllm but vLLM is not installed: pip install -e .[vllm] (or use rollout=hf)")
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
    # a micro-batch larger than the rank's mini-batch is clamped to it (one micro-batch); smaller must divide it
    if not actor.get("use_dynamic_bsz") and micro < mini * n // dp and (mini * n // dp) % micro:
        raise ConfigError(f"a mini-batch holds {mini * n // dp} rows per data-parallel rank, not divisible by "
                          f"actor.ppo_micro_batch_size_per_gpu={micro}")
    for sp_key, sp_val in (("actor_rollout_ref.ref.ulysses_sequence_parallel_size", arr["ref"]["ulysses_sequence_parallel_size"]),
                           ("critic.ulysses_sequence_parallel_size", cfg["critic"]["ulysses_sequence_parallel_size"])):
        if int(sp_val) < 1 or world % int(sp_val):
            raise ConfigError(f"{sp_key}={sp_val} must divide the {world} workers (trainer.nnodes*trainer.n_gpus_per_node)")
    for key, section in (("actor_rollout_ref.actor", actor), ("critic", cfg["critic"])):
        for name in ("grad_clip", "entropy_coeff", "kl_loss_coef"):
            if name in section:
                _finite(f"{key}.{name}", section[name])
        if float(_finite(f"{key}.optim.lr", section["optim"]["lr"])) < 0:
            raise ConfigError(f"{key}.optim.lr={section['optim']['lr']}; expected >= 0")
    restarts = t.get("max_restarts", 0)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ConfigError(f"trainer.max_restarts={restarts!r}; expected an integer >= 0")
    max_skip = int(t.get("max_consecutive_skipped_steps", 5))
    if max_skip < 1:
        raise ConfigError(f"trainer.max_consecutive_skipped_steps={max_skip}; expected >= 1")
    if int(t["total_training_steps"]) < 1:
        raise ConfigError(f"trainer.total_training_steps={t['total_training_steps']}; expected >= 1")
    if float(actor["clip_ratio_c"]) <= 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio_c={actor['clip_ratio_c']}; expected > 1")
    check_loss_aggregation(cfg)
    fg = cfg["algorithm"].get("filter_groups") or {}
    from trainer.dynamic_sampling import METRICS

    # the values are checked even while the filter is off, so that a typo does not wait for enable=true
    cap = fg.get("max_num_gen_batches", 10)
    if isinstance(cap, bool) or not isinstance(cap, int):
        raise ConfigError(f"algorithm.filter_groups.max_num_gen_batches={cap!r}; expected an integer "
                          "(<= 0: no cap)")
    if fg.get("metric", "acc") not in METRICS:
        raise ConfigError(f"algorithm.filter_groups.metric={fg.get('metric')!r}; expected one of {list(METRICS)}")
    if fg.get("enable"):
        from trainer.prime import prime_enabled

        if n < 2:
            raise ConfigError("algorithm.filter_groups.enable=true compares the responses of one prompt, but "
                              f"actor_rollout_ref.rollout.n={n}; set rollout.n >= 2")
        if prime_enabled(cfg):
            raise ConfigError("algorithm.filter_groups.enable=true with algorithm=prime: PRIME filters its "
                              "oversampled groups itself (data.oversample_factor, data.filter_accuracy, "
                              "data.accuracy_lower_bound)")
    attn = rollout.get("attn_implementation", "auto")
    if rollout["name"] == "hf" and attn not in ("auto", "sdpa", "sdpa_gqa", "eager"):
        from transformers import AttentionInterface

        known = sorted(AttentionInterface().valid_keys())  # transformers' registered attention functions
        if attn not in known:
            raise ConfigError(f"actor_rollout_ref.rollout.attn_implementation={attn!r}; expected auto, sdpa, sdpa_gqa, "
                              f"eager or one of transformers' {known}")
    check_rollout_correction(cfg)
    if int(cfg["deepspeed"]["zero_stage"]) not in (0, 1, 2, 3):
        raise ConfigError(f"deepspeed.zero_stage={cfg['deepspeed']['zero_stage']}; expected 0, 1, 2 or 3")
    strategy = t.get("strategy", "deepspeed")
    overlong_kwargs(cfg)
    if strategy not in ("deepspeed", "megatron"):
        raise ConfigError(f"trainer.strategy={strategy!r}; expected deepspeed or megatron")
    if strategy == "megatron":
        check_megatron(cfg, world)
    from trainer.workers.base import effective_zero_stage
    from trainer.workers.kernels import check_kernel_options

    ds = cfg["deepspeed"]

    def check(model_cfg: dict) -> None:
        check_kernel_options(model_cfg, t["device"], effective_zero_stage(ds), ds_config=ds.get("ds_config"),
                             offload_optimizer=bool(ds.get("offload_optimizer")))

    from trainer.workers.step_guard import check_ds_config_keeps_norm_check

    try:
        check(arr["model"])
        check_ds_config_keeps_norm_check(ds.get("ds_config"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    from trainer.prime import prime_enabled

    if prime_enabled(cfg):  # the PRM worker builds actor_rollout_ref.model with reward_model.model's overrides
        from trainer.workers.prm import _MODEL_KEYS

        rm = cfg.get("reward_model") or {}
        over = {k: v for k, v in (rm.get("model") or {}).items() if k in _MODEL_KEYS and v is not None}
        try:
            check({**arr["model"], **over})
        except ValueError as exc:
            keys = ", ".join(f"reward_model.model.{k}={str(v).lower()}" for k, v in over.items())
            raise ConfigError(f"the PRIME reward model (actor_rollout_ref.model{' with ' + keys if keys else ''}): "
                              f"{exc}") from exc


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
    from rollout.stop_tokens import resolve_stop_token_ids

    try:  # the set every engine stops at (the workers resolve it the same way)
        stops = resolve_stop_token_ids(tokenizer, hf_config, cfg["actor_rollout_ref"]["model"]["path"],
                                       extra=cfg["actor_rollout_ref"]["rollout"].get("stop_token_ids"))
    except ValueError as exc:
        raise ConfigError(f"actor_rollout_ref.rollout.stop_token_ids: {exc}") from None
    logger.info("responses end at token ids %s (%s)", stops, tokenizer.convert_ids_to_tokens(stops))
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


def resolve_config(hydra_cfg: DictConfig) -> dict:
    """The composed config as a plain dict with derived defaults filled in: ``critic.enable`` (when null: on
    exactly for an estimator whose registry entry needs a critic, e.g. GAE) and each
    ``optim.total_training_steps`` (from ``trainer.total_training_steps`` when -1)."""
    cfg = OmegaConf.to_container(hydra_cfg, resolve=True)
    if cfg["critic"].get("enable") is None:  # on for an estimator whose registry entry needs a critic
        from trainer.core_algos import ADV_ESTIMATOR_SPECS

        spec = ADV_ESTIMATOR_SPECS.get(cfg["algorithm"]["adv_estimator"])
        cfg["critic"]["enable"] = bool(spec is not None and spec.needs_critic)
    for optim in (cfg["actor_rollout_ref"]["actor"]["optim"], cfg["critic"]["optim"]):
        if int(optim.get("total_training_steps", -1)) < 0:
            optim["total_training_steps"] = int(cfg["trainer"]["total_training_steps"])
    return cfg


def run(hydra_cfg: DictConfig) -> dict:
    """Check the config, prepare data and model, start the workers and train. Returns the last metrics."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "datasets", "filelock", "urllib3", "DeepSpeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = resolve_config(hydra_cfg)
    validate(cfg)
    preflight(cfg)
    from trainer.placement import check_placement

    check_placement(cfg["trainer"])  # the workers fit this machine or the Ray cluster (PlacementError)
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
    from trainer.multimodal import load_processor

    processor = load_processor(cfg["actor_rollout_ref"]["model"].get("tokenizer_path") or mpath)  # None: text-only
    ds_kwargs = dict(tokenizer=tok, max_prompt_length=int(d["max_prompt_length"]), prompt_key=d["prompt_key"],
                     filter_overlong_prompts=bool(d["filter_overlong_prompts"]), truncation=d["truncation"],
                     processor=processor, image_key=d.get("image_key", "images"))
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
                                    scorer_kwargs=reward_options(cfg),
                                    timeout_s=float(rm.get("timeout_s", 10.0)), **overlong_kwargs(cfg))
    reward_fn = check_reward_scorers(make_rm, d["reward_fn_key"], [train_ds, val_ds])
    from trainer.ppo_trainer import RayPPOTrainer

    trainer = RayPPOTrainer(cfg, tok, loader, val_ds, reward_fn, make_rm())
    from trainer.interrupt import as_interrupt

    try:
        trainer.init_workers()
        last = trainer.fit()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: trainer/main.py prints the step in progress
        raise as_interrupt(exc, trainer.global_step) from None
    summary = {k: v for k, v in last.items() if not k.startswith("_")}
    os.makedirs(cfg["trainer"]["output_dir"], exist_ok=True)
    with open(os.path.join(cfg["trainer"]["output_dir"], "final_metrics.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    total = int(cfg["trainer"]["total_training_steps"])
    stopped = "" if trainer.global_step >= total else " (stopped early by SIGTERM)"
    print(f"done: step {trainer.global_step} of {total}{stopped}; output in {cfg['trainer']['output_dir']}",
          file=sys.stderr)
    return summary
