"""The checks of a run's LoRA settings before any worker starts (``trainer.launch.prestart`` runs :func:`check_lora`).

Each role that trains (``actor_rollout_ref.model``, and ``critic.model`` when the critic is on) may set verl's
``lora_rank`` (0: full fine-tuning), ``lora_alpha``, ``target_modules`` (``all-linear`` or a list of module names) and
``exclude_modules``. Refused, one line each: a rank that is not an integer >= 0, an alpha <= 0, a target or excluded
name that no module of the model has (the message lists the model's linear modules), a name that matches only modules
peft cannot adapt, a name that picks a module whose adapter the merged weights cannot carry (a multi-head attention
or grouped convolution layer, any layer peft cannot adapt), LoRA on the Megatron path, ``rollout.lora_sync=adapter``
without vLLM or without LoRA, and a reference with another Ulysses size than the actor it is computed by.
"""
from __future__ import annotations

import logging

from trainer.config_checks import ConfigError, run_checks

logger = logging.getLogger(__name__)

ALL_LINEAR = "all-linear"


def check_lora(cfg: dict) -> None:
    """Every LoRA check of ``cfg`` (a resolved config); their errors are raised together.

    Raises:
        ConfigError: naming the key, the bad value and what was expected (:class:`ConfigErrors` for several).
    """
    run_checks(cfg, (_check_values, _check_strategy, _check_sync, _check_reference, _check_module_names))


def lora_roles(cfg: dict) -> list[tuple[str, dict, bool]]:
    """``(config key, model settings, value_head)`` of the roles that may train LoRA adapters: the actor, and the
    critic when it is on."""
    roles = [("actor_rollout_ref.model", cfg["actor_rollout_ref"]["model"], False)]
    if cfg["critic"]["enable"]:
        roles.append(("critic.model", cfg["critic"]["model"], True))
    return roles


def _rank(key: str, model_cfg: dict) -> int:
    value = model_cfg["lora_rank"]
    value = 0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key}.lora_rank={value!r}; expected an integer >= 0 (0: train every weight, > 0: the "
                          "LoRA rank, e.g. 32)")
    return value


def _names(key: str, field: str, value, allow_all_linear: bool) -> list[str] | None:
    """The list of names of ``target_modules`` / ``exclude_modules`` (None for ``all-linear`` or null)."""
    if value is None and not allow_all_linear:
        return None
    if allow_all_linear and value == ALL_LINEAR:
        return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    want = "all-linear or a list of module names, e.g. [q_proj,v_proj]" if allow_all_linear else \
        "null or a list of module names, e.g. [lm_head]"
    raise ConfigError(f"{key}.{field}={value!r}; expected {want}")


def _check_values(cfg: dict) -> None:
    for key, model_cfg, _ in lora_roles(cfg):
        if _rank(key, model_cfg) == 0:
            continue
        alpha = model_cfg["lora_alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ConfigError(f"{key}.lora_alpha={alpha!r}; expected a number > 0 (the update is scaled by "
                              "lora_alpha / lora_rank)")
        _names(key, "target_modules", model_cfg["target_modules"], allow_all_linear=True)
        _names(key, "exclude_modules", model_cfg["exclude_modules"], allow_all_linear=False)


def _ranks(cfg: dict) -> dict[str, int]:
    out = {}
    for key, model_cfg, _ in lora_roles(cfg):
        try:
            out[key] = _rank(key, model_cfg)
        except ConfigError:  # reported by _check_values
            out[key] = 0
    return out


def _check_strategy(cfg: dict) -> None:
    from trainer.config.trainer import run_strategy

    on = [k for k, r in _ranks(cfg).items() if r > 0]
    if on and run_strategy(cfg) == "megatron":
        raise ConfigError(f"{on[0]}.lora_rank={_ranks(cfg)[on[0]]} with trainer.strategy=megatron: LoRA adapters are "
                          "built on the DeepSpeed path only; use trainer.strategy=deepspeed or lora_rank=0")


def _check_sync(cfg: dict) -> None:
    from trainer.workers.lora_sync import LORA_SYNC_MODES, VLLM_MAX_LORA_RANKS

    rc = cfg["actor_rollout_ref"]["rollout"]
    mode = rc["lora_sync"]
    if mode not in LORA_SYNC_MODES:
        raise ConfigError(f"actor_rollout_ref.rollout.lora_sync={mode!r}; expected one of {', '.join(LORA_SYNC_MODES)}")
    if mode != "adapter":
        return
    rank = _ranks(cfg)["actor_rollout_ref.model"]
    if rc["name"] != "vllm":
        raise ConfigError(f"actor_rollout_ref.rollout.lora_sync=adapter needs rollout=vllm (vLLM's LoRA); "
                          f"actor_rollout_ref.rollout.name={rc['name']} takes lora_sync=merged")
    if rank == 0:
        raise ConfigError("actor_rollout_ref.rollout.lora_sync=adapter needs actor_rollout_ref.model.lora_rank > 0")
    if rank > VLLM_MAX_LORA_RANKS[-1]:
        raise ConfigError(f"actor_rollout_ref.model.lora_rank={rank} with lora_sync=adapter: vLLM's LoRA serves ranks "
                          f"up to {VLLM_MAX_LORA_RANKS[-1]}; use lora_sync=merged")


def _check_reference(cfg: dict) -> None:
    from trainer.config.runtime import needs_reference

    arr = cfg["actor_rollout_ref"]
    if not needs_reference(cfg) or _ranks(cfg)["actor_rollout_ref.model"] == 0:
        return
    actor_sp = arr["actor"]["ulysses_sequence_parallel_size"]
    ref_sp = arr["ref"]["ulysses_sequence_parallel_size"]
    if ref_sp != actor_sp:
        raise ConfigError(f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={ref_sp} with LoRA: the reference is "
                          f"the actor with its adapters disabled and runs at the actor's size ({actor_sp}); set them "
                          "equal")


def _check_module_names(cfg: dict) -> None:
    for key, model_cfg, value_head in lora_roles(cfg):
        try:
            rank = _rank(key, model_cfg)
            targets = _names(key, "target_modules", model_cfg["target_modules"], allow_all_linear=True)
            exclude = _names(key, "exclude_modules", model_cfg["exclude_modules"], allow_all_linear=False)
        except ConfigError:  # reported by _check_values
            continue
        if rank == 0 or (targets is None and exclude is None):
            continue
        model = _meta_model(cfg, model_cfg, value_head)
        if model is not None:
            check_module_names(model, key, targets, exclude)
            if not value_head:
                _check_adapter_sync_targets(cfg, model, targets or [])


def check_module_names(model, key: str, targets: list[str] | None, exclude: list[str] | None) -> None:
    """Each name of ``targets`` must match (peft's rule: the module's dotted name equals it or ends with
    ``.<name>``) a module of ``model`` that peft can adapt (a linear, embedding or convolution layer); each name of
    ``exclude`` must match some module.

    Raises:
        ConfigError: naming the key, the names that match nothing and the model's adaptable module names.
    """
    modules = list(model.named_modules())
    adaptable = [(n, m) for n, m in modules if _adaptable(m)]
    short = sorted({n.rsplit(".", 1)[-1] for n, _ in adaptable})

    def matches(name: str, pool) -> bool:
        return any(n == name or n.endswith("." + name) for n, _ in pool)

    for field, names, pool in (("target_modules", targets, adaptable), ("exclude_modules", exclude, modules)):
        missing = [n for n in names or [] if not matches(n, pool)]
        if missing:
            lacks = "no linear/embedding module" if field == "target_modules" else "no module"
            raise ConfigError(f"{key}.{field}={names}: {type(model).__name__} has {lacks} named "
                              f"{', '.join(map(repr, missing))}; its linear and embedding modules are: "
                              f"{', '.join(short)}")
    _check_something_adapted(model, key, targets, exclude)
    _check_tied(model, key, targets or [])
    _check_mergeable(model, key, targets or [], exclude or [])


def _check_something_adapted(model, key: str, targets: list[str] | None, exclude: list[str] | None) -> None:
    """At least one module stays adapted once ``exclude`` is taken out of ``targets`` (None: all-linear, every
    linear layer but the output head), by peft's matching rule (the name, or a dotted name ending in it)."""
    import torch

    from transformers.pytorch_utils import Conv1D

    def hit(name: str, names: list[str]) -> bool:
        return any(name == n or name.endswith("." + n) for n in names)

    head = model.get_output_embeddings()
    if targets is None:
        chosen = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head]
    else:
        chosen = [n for n, m in model.named_modules() if _adaptable(m) and hit(n, targets)]
    left = [n for n in chosen if not hit(n, exclude or [])]
    if not left:
        raise ConfigError(f"{key}.exclude_modules={exclude} leaves no module to adapt of target_modules="
                          f"{targets if targets is not None else ALL_LINEAR}; exclude fewer modules")


def _check_mergeable(model, key: str, targets: list[str], exclude: list[str]) -> None:
    """Every module a name of ``targets`` picks (peft's rule, less ``exclude``) takes an adapter that the merged
    weights (rollout sync, HF export, fingerprint: ``trainer.workers.lora.iter_merged_params``) carry: a linear,
    Conv1D, embedding or ungrouped convolution layer (``trainer.workers.lora.merge_refusal``). An adapter on any
    other layer (``nn.MultiheadAttention``, a grouped convolution) would be trained but never reach the engine."""
    from trainer.workers.lora import merge_refusal

    def hit(name: str, names: list[str]) -> bool:
        return any(name == n or name.endswith("." + n) for n in names)

    for name, module in model.named_modules():
        if not hit(name, targets) or hit(name, exclude):
            continue
        why = merge_refusal(module) if _adaptable(module) else \
            f"a {type(module).__name__}, which peft's LoRA cannot adapt"
        if why is not None:
            target = next(t for t in targets if name == t or name.endswith("." + t))
            raise ConfigError(f"{key}.target_modules={targets}: {target!r} picks {name!r}, {why}; its adapter would "
                              "not reach the rollout engine or the export. Leave it out of target_modules or add it "
                              "to exclude_modules")


def _embedding_hits(model, targets: list[str]) -> list[str]:
    """The names of ``targets`` that match the model's input embedding or output head."""
    ends = [m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None]
    names = [n for n, m in model.named_modules() if any(m is e for e in ends)]
    return [t for t in targets if any(n == t or n.endswith("." + t) for n in names)]


def _check_tied(model, key: str, targets: list[str]) -> None:
    """A model whose output head shares the input embedding's weight (``tie_word_embeddings``) cannot take an
    adapter on either: merging ``B A`` into the shared weight would change both, so the merged model (rollout, export)
    would not be the trained one."""
    hit = _embedding_hits(model, targets) if getattr(model.config, "tie_word_embeddings", False) else []
    if hit:
        raise ConfigError(f"{key}.target_modules={targets}: {', '.join(map(repr, hit))} shares its weight with the "
                          "input/output embedding (tie_word_embeddings=true), and a merged adapter would change both; "
                          "leave it out, or use a model with untied embeddings")


def _check_adapter_sync_targets(cfg: dict, model, targets: list[str]) -> None:
    """vLLM's LoRA adapts the decoder's linear layers: an adapter on the embedding or the output head cannot be
    served (``lora_sync=adapter``); the merged sync takes any target."""
    hit = _embedding_hits(model, targets)
    if hit and cfg["actor_rollout_ref"]["rollout"]["lora_sync"] == "adapter":
        raise ConfigError(f"actor_rollout_ref.model.target_modules={targets} with rollout.lora_sync=adapter: vLLM's "
                          f"LoRA does not serve an adapter on {', '.join(map(repr, hit))}; leave it out or use "
                          "lora_sync=merged")


def _adaptable(module) -> bool:
    """Whether peft's LoRA can wrap ``module`` (its ``Linear``, ``Embedding`` and ``Conv`` layers, transformers'
    ``Conv1D``)."""
    import torch

    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d,
                               torch.nn.Conv3d, Conv1D))


def _meta_model(cfg: dict, model_cfg: dict, value_head: bool):
    """The role's model built on the meta device (no weights) from its folder's config, or from the embedded tiny
    model's sizes; None when transformers cannot build it here (peft then checks the names when the worker starts)."""
    import torch
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText,
                              AutoModelForTokenClassification)

    arr_model = cfg["actor_rollout_ref"]["model"]
    path = model_cfg["path"] or arr_model["path"]
    remote = bool(model_cfg["trust_remote_code"])
    try:
        if path is None:
            from trainer import embedded

            vocab = len(embedded.SPECIAL) + len(embedded.DIGITS) + len(embedded.WORDS)  # its module names only
            hf_config = embedded.tiny_model_config(vocab, **dict(arr_model.get("tiny") or {}))
        else:
            hf_config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
        if value_head:
            hf_config.num_labels = 1
            auto = AutoModelForTokenClassification
        else:
            auto = AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) else AutoModelForCausalLM
        with torch.device("meta"):
            return auto.from_config(hf_config, trust_remote_code=remote)
    except Exception as exc:  # noqa: BLE001 (an architecture this process cannot build: the worker's peft checks)
        logger.info("LoRA module names not checked before start-up (%s: %s)", type(exc).__name__, exc)
        return None
