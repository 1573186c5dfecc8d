"""From a composed Hydra config to a finished run: checks, embedded assets, datasets, rewards, trainer.

Everything that can be wrong with the input is checked here, before any worker starts, and reported in one
line naming the bad value (:class:`ConfigError` / :class:`trainer.dataset.DataError`).
"""
from __future__ import annotations

import importlib
import logging
import os
import sys

from omegaconf import DictConfig, OmegaConf

from trainer.config.data import DataConfig
from trainer.config.section import replaced
from trainer.config_checks import (ConfigError, ConfigErrors, ErrorCollector, as_int, custom_scorer,  # noqa: F401
                                   check_reward_scorers, reward_option_keys, reward_options, run_checks)
from trainer.megatron_checks import check_megatron, check_megatron_model  # noqa: F401
from trainer.resume_checks import check_resume_checkpoint  # noqa: F401
from trainer.run_folder import FINAL_METRICS, already_complete, nothing_saved_warnings, write_final_metrics  # noqa
from trainer.config_preflight import check_decode_loop, check_model_context, preflight, resume_path  # noqa: F401
from trainer.packing_probe import check_packed_attention
from trainer.config_validate import detect_device, overlong_kwargs, validate  # noqa: F401
from trainer.embedded_assets import prepare_embedded
from trainer.lora_checks import check_lora
from trainer.multi_turn import check_multi_turn_template, tool_schemas
from trainer.run_length_checks import (check_training_happens, lr_warmup_warnings, schedule_length_warnings,
                                       validation_sampling_warnings)
from trainer.single_process_checks import single_process_warnings
from trainer.overrides import RENAMED_KEYS, check_overrides  # noqa: F401  (the entry point's pre-Hydra check)

logger = logging.getLogger(__name__)


def resolve_config(hydra_cfg, report=None) -> dict:
    """The composed config as a plain dict, with verl's keys handled and derived defaults filled in.

    ``trainer.device=auto`` becomes cuda or cpu; the keys of :data:`trainer.verl_keys.VERL_KEYS` are mapped or
    removed (:func:`trainer.verl_compat.apply_verl_keys`; its warnings are logged); ``trainer.resume_mode=resume_path``
    becomes the path of ``trainer.resume_from_path``; ``critic.enable`` (when null) is on exactly for an estimator
    whose registry entry needs a critic (e.g. GAE).

    Args:
        hydra_cfg: the composed config (DictConfig or dict).
        report: a :class:`trainer.verl_compat.Report` that receives the verl keys' warnings and errors; without one,
            the errors are raised.

    Raises:
        ConfigError: (without ``report``) a refused verl key; :class:`ConfigErrors` for several.
    """
    from trainer.unused_settings import set_by_user, unused_setting_warnings
    from trainer.verl_compat import apply_verl_keys, command_line_keys

    from trainer.config_reads import track_reads

    cfg = OmegaConf.to_container(hydra_cfg, resolve=True) if isinstance(hydra_cfg, DictConfig) else hydra_cfg
    cfg = track_reads(cfg)  # records the keys read from here on, when DSRL_CONFIG_READS is set
    t = cfg["trainer"]
    if t["device"] == "auto":
        t["device"] = detect_device()
    got = apply_verl_keys(cfg, command_line_keys(), set_by_user)
    got.warnings += unused_setting_warnings(cfg) + nothing_saved_warnings(t) + single_process_warnings(cfg)
    _expand_home_paths(cfg)
    mode, path = t["resume_mode"], t["resume_from_path"]
    if mode == "resume_path":
        if not path:
            got.errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
        else:
            t["resume_mode"] = str(path)
    elif path:
        got.errors.append(f"trainer.resume_from_path={path!r} is only read with trainer.resume_mode=resume_path "
                          f"(trainer.resume_mode={mode}); set both, or drop resume_from_path")
    from trainer.rollout_placement import resolve_async_defaults, separate_placement_warnings

    resolve_async_defaults(cfg)  # rollout_correction.rollout_is=auto: on exactly with trainer.async.staleness >= 1
    got.warnings += separate_placement_warnings(cfg)
    for line in got.warnings:
        logger.warning(line)
    for line in got.notes:
        logger.info(line)
    _resolve_critic(cfg, got.errors)
    if report is not None:
        report.warnings += got.warnings
        report.notes += got.notes
        report.errors += got.errors
    elif got.errors:
        ErrorCollector(got.errors).raise_if_any()
    return cfg


def _resolve_critic(cfg: dict, errors: list[str]) -> None:
    """``critic.enable`` null: on exactly for an estimator whose registry entry needs a critic (e.g. GAE); a value
    other than null, true or false adds its error line to ``errors``."""
    if cfg["critic"].get("enable") not in (None, True, False):
        errors.append(f"critic.enable={cfg['critic']['enable']!r}; expected null (on exactly for an estimator that "
                      "needs a critic, e.g. gae), true or false")
    elif cfg["critic"].get("enable") is None:
        from trainer.core_algos import ADV_ESTIMATOR_SPECS

        spec = ADV_ESTIMATOR_SPECS.get(cfg["algorithm"]["adv_estimator"])
        cfg["critic"]["enable"] = bool(spec is not None and spec.needs_critic)


def _expand_home_paths(cfg: dict) -> None:
    """``~/...`` in data files, model folders and the checkpoint folder, expanded as a shell would (verl's scripts
    pass such paths)."""
    d, t = cfg["data"], cfg["trainer"]
    for key in ("train_files", "val_files"):
        if isinstance(d.get(key), str):
            d[key] = os.path.expanduser(d[key])
        elif isinstance(d.get(key), list):
            d[key] = [os.path.expanduser(f) for f in d[key]]
    model = cfg["actor_rollout_ref"]["model"]
    for section, key in ((model, "path"), (model, "tokenizer_path"), (cfg["critic"]["model"], "path"),
                         (t, "default_local_dir"), (t, "output_dir")):
        if isinstance(section.get(key), str):
            section[key] = os.path.expanduser(section[key])


def _trained_optims(cfg: dict) -> list[dict]:
    """The ``optim`` sections of the roles that train: actor, critic and (algorithm=prime) the PRM."""
    out = [cfg["actor_rollout_ref"]["actor"]["optim"], cfg["critic"]["optim"]]
    rm = (cfg.get("reward_model") or {}).get("model") or {}
    if isinstance(rm.get("optim"), dict):
        out.append(rm["optim"])
    return out


def plan_run_length(cfg: dict, batches_per_epoch: int, one_batch_per_step: bool = True) -> int:
    """Fill in the run's length, as verl defines it, and each trained role's LR-schedule horizon and warmup.

    ``trainer.total_training_steps`` = its own value when set, else ``trainer.total_epochs * batches_per_epoch``;
    the run also ends when ``total_epochs`` epochs of prompt batches are used up (verl's epoch loop). Each
    ``optim.total_training_steps`` of -1 becomes that total, and each ``optim.lr_warmup_steps`` < 0 becomes
    ``int(optim.lr_warmup_steps_ratio * optim.total_training_steps)`` (verl's rule). Changes ``cfg`` in place.

    Args:
        batches_per_epoch: prompt batches the step loader yields per epoch (generation batches with dynamic
            sampling, oversampled batches with PRIME).
        one_batch_per_step: each step takes exactly one batch (not dynamic sampling), so the step where the data
            runs out is known: a warning names it when it comes before ``total_training_steps``.

    Returns:
        ``trainer.total_training_steps``.
    """
    t = cfg["trainer"]
    epochs = int(t["total_epochs"])  # checked by trainer.config.trainer.TrainerConfig
    data_steps = epochs * int(batches_per_epoch)
    set_steps = t["total_training_steps"] is not None
    total = int(t["total_training_steps"]) if set_steps else data_steps
    t["total_training_steps"] = total
    if one_batch_per_step and total > data_steps:
        logger.warning("trainer.total_training_steps=%d needs more data than trainer.total_epochs=%d epochs of %d "
                       "batches: the run ends after the last epoch, at step %d (verl's rule); raise "
                       "trainer.total_epochs to train %d steps", total, epochs, batches_per_epoch, data_steps, total)
    for line in schedule_length_warnings(cfg, total):
        logger.warning(line)
    for optim in _trained_optims(cfg):
        if int(optim["total_training_steps"]) < 0:
            optim["total_training_steps"] = total
        if int(optim["lr_warmup_steps"] or 0) < 0:
            optim["lr_warmup_steps"] = int(float(optim["lr_warmup_steps_ratio"] or 0.0)
                                           * int(optim["total_training_steps"]))
    logger.info("run length: %d steps (%strainer.total_epochs=%d x %d batches per epoch)", total,
                "trainer.total_training_steps; the data: " if set_steps else "", epochs, batches_per_epoch)
    return total


def prestart(hydra_cfg) -> dict:
    """Every check before anything heavy starts: verl's keys, :func:`validate` and :func:`preflight`; all their
    errors are raised together (:class:`ConfigErrors`, one line each). Returns the resolved config."""
    from trainer.verl_compat import Report

    report = Report()
    cfg = resolve_config(hydra_cfg, report)
    errors = ErrorCollector(report.errors)
    errors.run(validate, cfg)
    errors.run(preflight, cfg)
    errors.run(check_lora, cfg)  # LoRA settings (trainer/lora_checks.py)
    errors.raise_if_any()
    return cfg


def import_external_lib(model_cfg: dict) -> None:
    """Import ``model_cfg['external_lib']`` (a module that registers custom models with transformers), if set.

    Raises:
        ConfigError: the module cannot be imported (named, with the import error).
    """
    name = model_cfg["external_lib"]
    if name:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"actor_rollout_ref.model.external_lib={name!r} cannot be imported: {exc}") from exc


def load_tokenizer(cfg: dict):
    """The actor's tokenizer (``tokenizer_path`` or the model folder) with ``custom_chat_template`` applied, once it
    has encoded a text of its own tokens (:func:`trainer.tokenizer_files.probe_text`).

    Raises:
        ConfigError: the tokenizer does not load, or does not encode that text (one line with the library's error,
            :func:`trainer.tokenizer_files.load_problem`).
    """
    from transformers import AutoTokenizer

    from trainer.tokenizer_files import load_problem, probe_text

    model = cfg["actor_rollout_ref"]["model"]
    try:
        tok = AutoTokenizer.from_pretrained(model["tokenizer_path"] or model["path"],
                                            trust_remote_code=bool(model["trust_remote_code"]))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises bare Exception for a bad file
        raise ConfigError(load_problem(cfg, exc)) from exc
    try:  # files that load can still fail on the first prompt (an empty WordLevel vocabulary: no [UNK] token)
        tok(probe_text(tok), add_special_tokens=False)
    except Exception as exc:  # noqa: BLE001 - as above
        raise ConfigError(load_problem(cfg, exc, "does not encode text")) from exc
    if model["custom_chat_template"]:
        tok.chat_template = model["custom_chat_template"]
    return tok


def load_processor(cfg: dict):
    """The actor's processor for image rows (:func:`trainer.multimodal.load_processor`; None for a text-only
    model) with ``custom_chat_template`` applied."""
    from trainer.multimodal import load_processor as load

    model = cfg["actor_rollout_ref"]["model"]
    processor = load(model["tokenizer_path"] or model["path"])
    if processor is not None and model["custom_chat_template"]:
        owner = processor if hasattr(processor, "chat_template") else processor.tokenizer
        owner.chat_template = model["custom_chat_template"]
    return processor


def build_data(cfg: dict, data: DataConfig, tok, processor=None):
    """The training prompt loader (``data.gen_batch_size`` prompts a batch with dynamic sampling, else
    ``train_batch_size``; ``trainer.total_epochs`` epochs) and the held-out dataset (None without one or validation)
    of the section ``data`` (files filled in); ``processor``: a VLM's (reads ``data.image_key``), else None."""
    from trainer.chat_template_checks import warn_unread_template_kwargs
    from trainer.dataset import PromptDataset, PromptLoader

    d = data
    warn_unread_template_kwargs(dict(d.apply_chat_template_kwargs or {}), tok, processor)
    ds_kwargs = dict(tokenizer=tok, max_prompt_length=d.max_prompt_length, prompt_key=d.prompt_key,
                     filter_overlong_prompts=d.filter_overlong_prompts, truncation=d.truncation,
                     chat_template_kwargs=dict(d.apply_chat_template_kwargs or {}),
                     processor=processor, image_key=d.image_key, tools=tool_schemas(cfg))
    train_ds = PromptDataset(d.train_files, max_rows=d.max_rows, **ds_kwargs)
    from trainer.unused_conditions import validates

    # data.val_files of a run that never validates is warned as unused (trainer.unused_settings), not read
    use_val = bool(d.val_files) and validates(cfg)
    val_ds = PromptDataset(d.val_files, max_rows=d.val_max_rows, **ds_kwargs) if use_val else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    dynamic = bool(cfg["algorithm"]["filter_groups"]["enable"])
    batch = (d.gen_batch_size or d.train_batch_size) if dynamic else d.train_batch_size
    loader = PromptLoader(train_ds, batch, pad, shuffle=d.shuffle, seed=d.seed,
                          num_epochs=int(cfg["trainer"]["total_epochs"]))
    logger.info("train rows: %d (%d overlong filtered); val rows: %s", len(train_ds), train_ds.num_filtered,
                len(val_ds) if val_ds is not None else 0)
    return loader, val_ds


def build_reward_managers(cfg: dict, data: DataConfig, tok, datasets) -> tuple:
    """Two :class:`rewards.manager.RewardManager` (training, validation) from ``reward_model`` and the ``data``
    section ``data`` (:class:`rewards.batch_manager.BatchRewardManager` for a custom reward function with
    ``reward_model.reward_manager=batch``, verl's batch call); the scorers that the rows of ``datasets`` reach are
    checked against the scorer options first (:func:`trainer.config_checks.check_reward_scorers`).

    Raises:
        ConfigError: a row without ``data.reward_fn_key``, a data source without a scorer, a scorer option that a
            scorer does not take, a ``custom_reward_function`` file or function that does not load.
    """
    from rewards.batch_manager import BatchRewardManager
    from rewards.manager import RewardManager

    rm, key = cfg["reward_model"], data.reward_fn_key
    custom = custom_scorer(cfg)  # custom_reward_function.path replaces the registered scorers
    scorer = rm["scorer"] if custom is None else custom
    # verl's batch manager calls the custom function once per batch; the registered scorers score rows
    cls = BatchRewardManager if custom is not None and rm.get("reward_manager") == "batch" else RewardManager
    make = lambda keys=(): cls(tok, reward_fn_key=key, scorer=scorer,  # noqa: E731
                               scorer_kwargs=reward_options(cfg), timeout_s=float(rm["timeout_s"]),
                               component_keys=keys, **overlong_kwargs(cfg))
    from trainer.adv_inputs import reward_component_keys  # the training rewards' components (GDPO)

    return (check_reward_scorers(lambda: make(reward_component_keys(cfg)), key, datasets, reward_option_keys(cfg)),
            make())


def load_model_files(cfg: dict):
    """Import ``model.external_lib``, check the actor's model folder against the run (context length, EOS and stop
    tokens, the multi-turn chat template, the rollout's decode loop) and return its tokenizer (:func:`load_tokenizer`).

    Raises:
        ConfigError: the model path holds no ``config.json``, transformers does not load it
            (:func:`trainer.meta_shapes.load_config_problem`), or a check above fails.
    """
    from transformers import AutoConfig

    from trainer.meta_shapes import load_config_problem
    from trainer.model_folder_checks import read_model_config

    model = cfg["actor_rollout_ref"]["model"]
    import_external_lib(model)
    mpath, key, remote = model["path"], "actor_rollout_ref.model.path", bool(model["trust_remote_code"])
    if not os.path.exists(os.path.join(mpath, "config.json")):
        raise ConfigError(f"{key}={mpath!r} is not a Hugging Face model folder (no config.json there)")
    problem = load_config_problem(read_model_config(key, mpath), mpath, remote)[1]  # before the tokenizer reads it
    if problem:
        raise ConfigError(f"{key}={mpath!r}: {problem}")
    tok = load_tokenizer(cfg)
    try:
        hf_config = AutoConfig.from_pretrained(mpath, trust_remote_code=remote, **dict(model["override_config"] or {}))
    except Exception as exc:  # noqa: BLE001 - the config class refuses an override (ValueError, TypeError, ...)
        raise ConfigError(f"actor_rollout_ref.model.override_config={dict(model['override_config'])!r}: transformers "
                          f"refuses it ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from exc
    check_model_context(cfg, hf_config, tok)
    check_decode_loop(cfg, hf_config)
    check_packed_attention(cfg, hf_config)
    check_multi_turn_template(cfg, tok)
    return tok


def run(hydra_cfg: DictConfig) -> dict:
    """Check the config, prepare data and model, start the workers and train. Returns the last metrics (with
    ``_stopped_by_sigterm`` when a SIGTERM ended the run early: ``trainer/main.py`` then exits 143)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "datasets", "filelock", "urllib3", "DeepSpeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from trainer.run_folder import log_sizes, settle_run_folder
    from trainer.run_lock import hold_run_dir, hold_run_folders

    hold_run_dir(hydra_cfg)  # before the first log line: a refused run writes nothing into a live run's main.log
    logs = log_sizes()  # what the log holds before this run's first line: an earlier run's (set aside when fresh)
    cfg = prestart(hydra_cfg)
    hold_run_folders(cfg["trainer"])  # a live run's folders are refused before anything there changes
    from trainer.placement import check_placement
    from trainer.rollout_placement import RolloutPlacement

    check_placement(cfg["trainer"], RolloutPlacement.from_config(cfg).rollout_bundles)  # fit, or PlacementError
    step_dir = resume_path(cfg)  # None: a fresh run
    from trainer.interrupt import as_interrupt, own_checkpoints, run_complete

    own_checkpoints(cfg["trainer"]["default_local_dir"] if step_dir is not None else None)
    data = prepare_embedded(cfg, resuming=step_dir is not None)
    tok = load_model_files(cfg)
    loader, val_ds = build_data(cfg, data, tok, load_processor(cfg))
    if step_dir is not None:  # the rows the saved loader position counts are this run's (files, tokenizer)
        from trainer.resume_checks import check_resume_rows

        check_resume_rows(step_dir, loader.dataset, data.train_files, cfg)
    from trainer.ppo_trainer import RayPPOTrainer

    trainer = RayPPOTrainer(cfg, tok, loader, val_ds,
                            *build_reward_managers(cfg, data, tok, [loader.dataset, val_ds]))
    total = plan_run_length(cfg, len(trainer.loader), not cfg["algorithm"]["filter_groups"]["enable"])
    check_training_happens(cfg)  # the warm-ups against the length just planned from the data
    for line in lr_warmup_warnings(cfg) + validation_sampling_warnings(cfg):
        logger.warning(line)
    # the driver's trainer section was built before the run length was planned: the planned value replaces null
    trainer.trainer_cfg = t = replaced(trainer.trainer_cfg, "trainer", total_training_steps=total)
    start = resumed_step(step_dir)
    if step_dir is not None and not t.val_only and start >= trainer.last_step():
        return already_complete(t.output_dir, step_dir, start, trainer.last_step(), t)
    try:
        trainer.init_workers()
        # every check passed (the workers' placement last): a fresh run sets the earlier run's outputs aside
        settle_run_folder(cfg, step_dir is None, [loader.dataset, val_ds], logs, step_dir)
        own_checkpoints(t.default_local_dir)
        last = trainer.fit()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: trainer/main.py prints the step in progress
        raise as_interrupt(exc, trainer.global_step) from None
    finally:  # trainer.single_process: the worker's models, process group and settings go (Ray's end with Ray)
        trainer.roles.shutdown() if t.single_process else None
    summary = {k: v for k, v in last.items() if not k.startswith("_")}
    write_final_metrics(t.output_dir, summary, trained=trainer.global_step > start, val_only=t.val_only)
    print(f"done: step {trainer.global_step} of {total}{trainer.stop_reason}; output in {t.output_dir}",
          file=sys.stderr)
    if last.get("_stopped_by_sigterm"):  # not finished: a scheduler must not count the job as done (exit 143)
        summary["_stopped_by_sigterm"] = True
    else:
        run_complete()  # the work is saved: an interrupt from here on only cuts the shut-down short (exit 0)
    return summary


def resumed_step(step_dir: str | None) -> int:
    """The global step of the checkpoint ``step_dir`` (its ``data.pt``, else its folder name); 0 for None."""
    if step_dir is None:
        return 0
    from trainer.checkpoint.base import load_trainer_state, parse_step

    try:
        return int(load_trainer_state(step_dir).get("global_step", parse_step(step_dir)))
    except (FileNotFoundError, ValueError):
        return parse_step(step_dir)
