"""The checks of a resolved config against the files it names: model folders, checkpoints to resume, data files,
the model's heads and context against the parallel sizes and lengths, a vision-language model's processor, and
(once the tokenizer is loaded) its EOS and stop tokens. ``trainer.launch`` runs them before any worker starts.

:func:`preflight` runs every section and raises their errors together, one line each.
"""
from __future__ import annotations

import logging
import os
import tempfile

from trainer.config_checks import ConfigError, ErrorCollector, run_checks
from trainer.megatron_checks import check_megatron_model
from trainer.model_folder_checks import check_model_files, check_model_folders
from trainer.resume_checks import (check_resume_checkpoint, check_resume_data, check_resume_model, check_resume_optim,
                                   resume_seed_warnings)
from trainer.resume_schedule import resume_schedule_warnings
from trainer.role_models import (has_config, loaded_models, model_config_dict, model_label, override_note,
                                 role_config, section_models, text_value)
from trainer.run_roles import critic_on
from trainer.tokenizer_files import eos_outside_vocab_problem, no_eos_problem

logger = logging.getLogger(__name__)

#: the head counts a Ulysses size splits
HEAD_NAMES = ("num_attention_heads", "num_key_value_heads")


def _as_list(files) -> list[str]:
    return [files] if isinstance(files, str) else list(files or [])


def preflight(cfg: dict) -> None:
    """Fast checks of paths and model limits before anything heavy is imported or any worker starts.

    ``trainer.output_dir`` (and ``trainer.default_local_dir`` when ``trainer.save_freq > 0``) can be written
    (:func:`check_writable_folder`); model folders must hold ``config.json``, sound weights and the tokenizer the run
    reads (:func:`trainer.model_folder_checks.check_model_folders`); data files must exist; each role's Ulysses
    size must divide the attention heads of the model that role loads (:func:`trainer.config.actor.check_ulysses_heads`,
    the patch's own rule; :func:`trainer.role_models.section_models`), each role's ``override_config`` must keep its
    model's weights (:func:`trainer.override_checks.check_override_shapes`) and the critic's model must have the
    class its value model is built with (:func:`_check_critic_model`); prompt + response must fit
    ``max_position_embeddings`` (each model's config read as the workers build it,
    :func:`trainer.role_models.role_config`: a vision-language model's heads and context from its ``text_config``).
    Every section runs; their errors are raised together.

    Raises:
        ConfigError: naming the key and the bad value (:class:`ConfigErrors` for several, one per line).
    """
    run_checks(cfg, (_check_output_folders, _check_model_paths, check_model_folders, _check_resume, _check_data_files,
                     _check_model_files, _check_model_fit))


def check_writable_folder(key: str, path: str, what: str) -> None:
    """``path`` (the value of config ``key``) is a folder, new or existing, that ``what`` can be written to: when it
    exists it is a folder, else its nearest existing ancestor is; that folder is proven writable by creating and
    removing a temporary folder in it (``tempfile.mkdtemp`` + ``os.rmdir``), so nothing is left behind and nothing
    is created for a run that is refused.

    Raises:
        ConfigError: one line naming the key, the value and what is wrong (a file, a path under a file, a broken
            symbolic link, a folder that cannot be written).
    """
    expected = f"expected a folder (new or existing) that {what} can be written to"
    here = os.path.abspath(path)
    while not os.path.exists(here):
        if os.path.islink(here):
            raise ConfigError(f"{key}={path!r}: {here!r} is a broken symbolic link; {expected}")
        here = os.path.dirname(here)  # the root exists, so this ends
    if not os.path.isdir(here):
        kind = "a file" if os.path.isfile(here) else "not a folder"
        where = f"is {kind}" if here == os.path.abspath(path) else f"is under {here!r}, which is {kind}"
        raise ConfigError(f"{key}={path!r} {where}; {expected}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write_check_", dir=here))
    except OSError as exc:
        where = "" if here == os.path.abspath(path) else f" (in its nearest existing folder {here!r})"
        raise ConfigError(f"{key}={path!r} cannot be written{where}: creating a folder there failed "
                          f"({exc.strerror or exc}); {expected}") from None


def _check_output_folders(cfg: dict) -> None:
    """``trainer.output_dir`` (metrics, exports: always written) and ``trainer.default_local_dir`` (when the run
    saves) can be written; a checkpoint folder inside an output folder already refused is not reported again."""
    t = cfg["trainer"]
    errors = ErrorCollector()
    out = t.get("output_dir")
    if out:
        errors.run(check_writable_folder, "trainer.output_dir", out, "the run's metrics and exports")
    ckpt = t.get("default_local_dir")
    bad_out = bool(errors.messages)
    inside = bool(out) and (os.path.abspath(str(ckpt)) + os.sep).startswith(os.path.join(os.path.abspath(out), ""))
    if ckpt and int(t.get("save_freq") or 0) > 0 and not (bad_out and inside):
        errors.run(check_writable_folder, "trainer.default_local_dir", ckpt, "checkpoints")
    errors.raise_if_any()


def _check_model_paths(cfg: dict) -> None:
    from trainer.model_folder_checks import is_hub_id

    arr = cfg["actor_rollout_ref"]
    paths = [("actor_rollout_ref.model.path", arr["model"].get("path"))]
    if critic_on(cfg):
        paths.append(("critic.model.path", cfg["critic"]["model"].get("path")))
    for key, path in paths:
        if not has_config(path):
            what = "does not exist" if not os.path.exists(path) else "is not a Hugging Face model folder (no config.json)"
            if not os.path.exists(path) and is_hub_id(str(path)):
                what += (f" (model paths are local folders; download a Hub model first: huggingface-cli download "
                         f"{path} --local-dir <folder>, then {key}=<folder>)")
            raise ConfigError(f"{key}={path!r} {what}")
    if arr["model"].get("path") is None and arr["model"].get("tiny") is None:
        raise ConfigError("actor_rollout_ref.model.path=null with model=hf: expected a Hugging Face model folder "
                          "(or model=tiny for the embedded tiny model)")


def resume_path(cfg: dict) -> str | None:
    """The checkpoint folder ``trainer.resume_mode`` resumes from, or None (``disable``, or no checkpoint yet: a
    fresh run).

    Raises:
        ConfigError: a ``resume_mode`` path that does not exist or holds no checkpoint.
    """
    mode, named = cfg["trainer"]["resume_mode"], cfg["trainer"].get("resume_from_path")
    if mode in ("disable", "resume_path"):  # resume_path still here: no resume_from_path (resolve_config says so)
        return None
    if named and mode != str(named):  # resume_from_path without resume_mode=resume_path: refused by resolve_config,
        return None  # so nothing is resolved (nor logged) for a resume that will not run
    from trainer.checkpoint.resume import resolve_resume_path

    try:
        return resolve_resume_path(mode, cfg["trainer"]["default_local_dir"])[0]
    except (ValueError, FileNotFoundError) as exc:
        line = str(exc)  # a message that names the key already is not prefixed twice
        raise ConfigError(line if line.startswith("trainer.resume_mode") else f"trainer.resume_mode: {line}") from exc


def _check_resume(cfg: dict) -> None:
    _check_no_overwrite(cfg)
    step_dir = resume_path(cfg)
    if step_dir is not None:
        check_resume_checkpoint(cfg, step_dir)
        check_resume_optim(cfg, step_dir)
        check_resume_data(cfg, step_dir)
        _check_later_steps(cfg, step_dir)
        for line in resume_schedule_warnings(cfg, step_dir) + resume_seed_warnings(cfg, step_dir):
            logger.warning(line)


def _check_later_steps(cfg: dict, step_dir: str) -> None:
    """A resume from an older step whose checkpoint folder, outside ``trainer.output_dir``, holds later steps is
    refused (:func:`trainer.later_steps.later_steps_problem`); inside it they are set aside at start-up."""
    from trainer.checkpoint.base import parse_step
    from trainer.later_steps import later_steps_problem

    t = cfg["trainer"]
    if not t.get("val_only"):
        problem = later_steps_problem(t["output_dir"], t["default_local_dir"], parse_step(step_dir))
        if problem:
            raise ConfigError(problem)


def _check_no_overwrite(cfg: dict) -> None:
    """A run that trains from scratch (``resume_mode=disable``) into a ``trainer.default_local_dir`` that holds an
    earlier run's checkpoints: inside ``trainer.output_dir`` (the default) they are set aside with the earlier run's
    other outputs at start-up (:func:`trainer.tracking.set_aside_earlier_run`); outside it they are not moved, so the
    run is refused: it would write over them (``save_freq > 0``), and a later ``resume_mode=auto`` would resume them
    into this run's metrics (whatever ``save_freq``)."""
    t = cfg["trainer"]
    if t["resume_mode"] != "disable":
        return
    from trainer.checkpoint.base import list_checkpoints

    root, out = t["default_local_dir"], t.get("output_dir")
    steps = [s for s, _ in list_checkpoints(root)] if root else []
    if not steps:
        return
    if out:
        real_out, real_root = os.path.realpath(out), os.path.realpath(root)
        if real_root == real_out or real_root.startswith(real_out + os.sep):
            return  # set aside at start-up with the earlier run's metrics
    raise ConfigError(f"trainer.default_local_dir={root!r} holds checkpoints (steps {steps[0]}..{steps[-1]}) of an "
                      f"earlier run outside trainer.output_dir={out!r}, so a fresh run (trainer.resume_mode=disable) "
                      "cannot set them aside: it would write over them, or a later trainer.resume_mode=auto would "
                      "resume them into this run's outputs; expected trainer.resume_mode=auto (go on from them), "
                      "another trainer.default_local_dir, or move them away")


def _folder_files_hint(key: str, folder: str) -> str:
    """What to write instead of a data folder: the list of its ``.parquet`` / ``.jsonl`` files, or that it has none."""
    names = sorted(n for n in os.listdir(folder) if n.endswith((".parquet", ".jsonl", ".json")))
    if not names:
        return "it holds no .parquet or .jsonl file"
    shown = ",".join(os.path.join(folder, n) for n in names[:4]) + (",..." if len(names) > 4 else "")
    return f"name its files as a list: data.{key}=[{shown}]"


def _check_data_files(cfg: dict) -> None:
    """The data files exist and are files; ``data.val_files`` only when a validation pass runs (else the run warns
    that it is unused, :mod:`trainer.unused_settings`, and does not read it)."""
    from trainer.unused_conditions import validates

    errors = ErrorCollector()
    for key in ("train_files", "val_files") if validates(cfg) else ("train_files",):
        for f in _as_list(cfg["data"].get(key)):
            if os.path.isdir(f):
                errors.add(f"data.{key}: {f!r} is a folder (expected a .parquet or .jsonl file); "
                           + _folder_files_hint(key, f))
            elif not os.path.isfile(f):
                errors.add(f"data.{key}: file {f!r} does not exist (expected a .parquet or .jsonl file)")
    errors.raise_if_any()


def _check_model_files(cfg: dict) -> None:
    """The actor's model folder against the run: a VLM's processor and engine, a resumed checkpoint's model."""
    path = cfg["actor_rollout_ref"]["model"].get("path")
    if not has_config(path):
        return  # reported by _check_model_paths
    try:
        step_dir = resume_path(cfg)
    except ConfigError:
        step_dir = None  # reported by _check_resume
    hf = model_config_dict(cfg, "actor_rollout_ref.model.path", path)
    if step_dir is not None:
        check_resume_model(step_dir, hf)
    check_model_files(cfg, hf)


def _check_model_fit(cfg: dict) -> None:
    """The models against the run: each role's Ulysses size against its own model (:func:`_check_ulysses_models`),
    each role's ``override_config`` against its model's weights
    (:func:`trainer.override_checks.check_override_shapes`), the critic's model against the class its value model
    is built with (:func:`_check_critic_model`), the Megatron sizes and the actor's context length (its config as
    the workers build it, :func:`trainer.role_models.role_config`: a vision-language model's from its
    ``text_config``). The errors of the checks are raised together."""
    arr = cfg["actor_rollout_ref"]
    path = arr["model"].get("path")
    if not has_config(path):
        return  # reported by _check_model_paths
    if path is None:
        from trainer.override_checks import check_tiny_model

        check_tiny_model(cfg)  # the embedded model's sizes build a model
    hf = model_config_dict(cfg, "actor_rollout_ref.model.path", path)
    from trainer.attention_checks import packed_attention_warnings
    from trainer.config.trainer import run_strategy
    from trainer.override_checks import check_override_shapes, override_key_warnings

    errors = ErrorCollector()
    for check in (_check_ulysses_models, check_override_shapes, _check_critic_model):
        errors.run(check, cfg)
    errors.raise_if_any()
    for line in override_key_warnings(cfg) + packed_attention_warnings(cfg):
        logger.warning(line)
    if run_strategy(cfg) == "megatron":
        check_megatron_model(cfg, hf)
    actor = section_models(cfg)["actor_rollout_ref.actor"][0]
    _check_context(cfg, text_value(role_config(cfg, actor), "max_position_embeddings"))


def _check_ulysses_models(cfg: dict) -> None:
    """Each role's Ulysses size above 1 against the heads and the attention soft-capping of each model that role
    loads (:func:`trainer.role_models.loaded_models`: the critic's and PRIME's reward model's own folders, else the
    actor's; no reference model with LoRA), read from its config as the workers build it, the role's
    ``override_config`` applied (:func:`trainer.role_models.role_config`; a vision-language model's heads from its
    ``text_config``). Every model is checked; the errors are raised together, one line each.

    Raises:
        ConfigError: naming the key, the size, the model's path key and folder (and the ``override_config`` that
            gave the value) and its head counts (or its soft-capping).
    """
    from trainer.config.actor import ulysses_sizes

    split = {key.rsplit(".", 1)[0] for key, sp in ulysses_sizes(cfg) if int(sp) > 1}
    errors = ErrorCollector()
    for group in loaded_models(cfg, split):
        if has_config(group[0][1].path):
            errors.run(_check_ulysses_model, cfg, group)
    errors.raise_if_any()


def _check_ulysses_model(cfg: dict, group) -> None:
    """:func:`_check_ulysses_models` for one model and the sections that load it, each named by its own keys."""
    from trainer.config.actor import attention_softcap, check_ulysses_heads, check_ulysses_softcap

    model = group[0][1]
    conf = role_config(cfg, model)
    base = role_config(cfg, model, overrides=False) if model.override else conf
    heads = [text_value(conf, name) for name in HEAD_NAMES]
    softcap = attention_softcap(conf)
    heads_note = override_note(model, HEAD_NAMES) if heads != [text_value(base, n) for n in HEAD_NAMES] else ""
    cap_note = override_note(model, ("attn_logit_softcapping",)) if softcap != attention_softcap(base) else ""
    labels: dict[str, list[str]] = {}
    for section, own in group:
        labels.setdefault(model_label(own.key, own.path), []).append(section)
    errors = ErrorCollector()
    for label, sections in labels.items():
        errors.run(check_ulysses_heads, cfg, *heads, label + heads_note, sections)
        errors.run(check_ulysses_softcap, cfg, softcap, label + cap_note, sections)
    errors.raise_if_any()


def _check_critic_model(cfg: dict) -> None:
    """The critic's model (:func:`trainer.role_models.section_models`) has a class of transformers'
    ``AutoModelForTokenClassification``, the class its value model is built with
    (:func:`trainer.workers.model_utils.load_hf_model`: one output per token); a vision-language model (Qwen2-VL) or
    a text model without one (Gemma 3) otherwise fails in ``CriticWorker.init_model``. Not judged: a run without a
    critic, a config transformers does not load here, remote code (``auto_map``), a model ``external_lib`` may
    register.

    Raises:
        ConfigError: naming the critic's model key and folder, its config class and what is expected.
    """
    model = section_models(cfg)["critic"][0]
    libs = ((cfg.get("critic") or {}).get("model") or {}).get("external_lib") or \
        cfg["actor_rollout_ref"]["model"].get("external_lib")
    if not critic_on(cfg) or libs or not has_config(model.path):
        return
    conf = role_config(cfg, model)
    from transformers import AutoModelForTokenClassification

    if isinstance(conf, dict) or getattr(conf, "auto_map", None) or type(conf) in \
            AutoModelForTokenClassification._model_mapping:
        return
    kind = " (a vision-language model)" if getattr(conf, "vision_config", None) is not None else ""
    via = "" if model.key == "critic.model.path" else " (critic.model.path=null: the critic loads the actor's model)"
    raise ConfigError(f"{model.key}={model.path!r}{via}: the critic's value model is built with transformers' "
                      "AutoModelForTokenClassification (the model with a one-output head on every token), which "
                      f"has no class for {type(conf).__name__}{kind}; expected for critic.model.path a text model "
                      "that has one (e.g. Llama, Qwen2, Qwen3, Mistral, Gemma 2)")


def _check_context(cfg: dict, ctx) -> None:
    """The longest prompt plus the longest response the rollout generates (``rollout.response_length``, which follows
    ``data.max_response_length`` unless set apart) fit the model's context ``ctx`` (None: not known)."""
    d = cfg["data"]
    gen = int((cfg["actor_rollout_ref"].get("rollout") or {}).get("response_length") or d["max_response_length"])
    need = int(d["max_prompt_length"]) + max(gen, int(d["max_response_length"]))
    if ctx is not None and need > int(ctx):
        which = ("data.max_response_length" if gen <= int(d["max_response_length"])
                 else "actor_rollout_ref.rollout.response_length")
        raise ConfigError(f"data.max_prompt_length+{which}={need} exceeds the model's context "
                          f"max_position_embeddings={ctx}")


def check_model_context(cfg: dict, hf_config, tokenizer) -> None:
    """Prompt+response must fit the model's context; the tokenizer needs an EOS token inside the model's vocabulary
    (``vocab_size``); the stop token ids (``rollout.stop_token_ids`` and the model's own,
    :func:`rollout.stop_tokens.resolve_stop_token_ids`) are valid."""
    _check_context(cfg, text_value(hf_config, "max_position_embeddings"))
    if tokenizer.eos_token_id is None:
        raise ConfigError(no_eos_problem(cfg))
    from rollout.stop_tokens import model_vocab_size, resolve_stop_token_ids

    vocab = model_vocab_size(hf_config)
    if vocab is not None and tokenizer.eos_token_id >= vocab:  # a token added to the tokenizer past the embedding
        raise ConfigError(eos_outside_vocab_problem(cfg, tokenizer, vocab))

    model = cfg["actor_rollout_ref"]["model"]
    label = ("actor_rollout_ref.model.override_config.eos_token_id"
             if "eos_token_id" in dict(model.get("override_config") or {}) else None)
    try:  # the set every engine stops at (the workers resolve it the same way); the error names the bad id's source
        stops = resolve_stop_token_ids(tokenizer, hf_config, model["path"], config_label=label,
                                       extra=cfg["actor_rollout_ref"]["rollout"].get("stop_token_ids"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    logger.info("responses end at token ids %s (%s)", stops, tokenizer.convert_ids_to_tokens(stops))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # pad falls back to EOS (SmolLM2 has no pad token)


def check_decode_loop(cfg: dict, hf_config) -> None:
    """``rollout.decode_loop=graph`` (the transformers engine's own decode loop) only for a model it runs: not a
    vision-language model, no sliding-window or other non-full-attention layers
    (:func:`rollout.graph_decode.graph_decode_unsupported`); nothing to check for ``generate`` or vLLM.

    Raises:
        ConfigError: one line naming the key, what the model has and the setting to use.
    """
    rc = cfg["actor_rollout_ref"]["rollout"]
    if rc.get("name") != "hf" or rc.get("decode_loop") != "graph":
        return
    from rollout.graph_decode import graph_decode_unsupported

    why = graph_decode_unsupported(hf_config)
    if why:
        raise ConfigError(f"actor_rollout_ref.rollout.decode_loop=graph: the graph decode loop does not run {why}; "
                          "use decode_loop=generate")
