"""A model folder's ``config.json`` judged by transformers itself, before any worker starts: the config loads (a
``model_type`` this transformers knows, values its config class accepts), the model builds from it on the meta
device (no memory, no download; the auto class the workers use), and every parameter whose name the weights hold
(after transformers' own renaming of checkpoint keys, with the base-model prefix added or stripped) has the shape the
weights hold: shapes from the safetensors headers, or from a zip-format ``.bin`` loaded onto the meta device
(:func:`trainer.weight_shapes.header_shapes`; single files or the shards of either format's index).

A config that transformers refuses, or whose shapes disagree with the weights (``intermediate_size``,
``num_key_value_heads``, ``head_dim``, ...), used to end in a traceback from the driver or from every worker's
``from_pretrained``; :func:`transformers_config_problem` names it in one line. Not judged (never refused): parameters
the weights do not hold (tied weights, other prefixes, fused experts), keys that transformers converts on load
(their shapes change), quantized weights, remote code's model (``auto_map``), a ``.bin`` in the legacy (pickle, not
zip) format or one that torch does not read (no shapes without reading the whole file), and a model that cannot be
built here for another reason than its config, and a ``config.json`` without ``model_type`` (these are left to the
workers).
"""
from __future__ import annotations

import logging
import re

from trainer.weight_shapes import header_shapes

logger = logging.getLogger(__name__)

__all__ = ["transformers_config_problem", "load_config_problem", "one_line"]

FIX = "use the config.json that came with these weights"
REMOTE_KEY = "actor_rollout_ref.model.trust_remote_code"
#: config keys named as the likely cause of a mismatch, strongest first (other integer keys follow)
SHAPE_KEYS = ("intermediate_size", "hidden_size", "head_dim", "num_key_value_heads", "num_attention_heads",
              "vocab_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
              "num_local_experts", "n_routed_experts", "kv_lora_rank", "q_lora_rank", "n_embd", "n_inner", "n_head")
HEAD_KEYS = ("num_attention_heads", "num_key_value_heads", "n_head")
ATTENTION = re.compile(r"attn|attention|[qkvo]_proj|qkv")
NOT_SHAPES = re.compile(r"token_id|_id$|max_position|position_embeddings|window|seed|ratio|version")


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``exc`` as ``Type: message`` on one line, the message cut after ``limit`` characters (``...`` then)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def load_config_problem(hf: dict, path: str, remote: bool):
    """``(config, problem)``: the transformers config of the model folder ``path`` (``hf``: its ``config.json``) and
    None, or None and one line saying why transformers does not load it (an unknown ``model_type``, a value its
    config class refuses, a package it needs). ``remote``: ``trust_remote_code``. Never raises."""
    from transformers import AutoConfig, __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = hf.get("model_type")
    ships_code = "AutoConfig" in (hf.get("auto_map") or {}) if isinstance(hf.get("auto_map"), dict) else False
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING and not (ships_code and remote):
        if ships_code:
            return None, (f"config.json gives model_type={model_type!r}, which transformers {__version__} does not "
                          f"know, and the folder ships its own code (auto_map); set {REMOTE_KEY}=true if you trust "
                          "that code, or install a transformers that has this architecture")
        return None, (f"config.json gives model_type={model_type!r}, which transformers {__version__} does not know; "
                      "install a newer transformers that has this architecture, set "
                      f"{REMOTE_KEY}=true if the folder ships its code (auto_map in config.json), "
                      "or fix config.json's model_type")
    try:
        # transformers' own reader (it decodes the values its writer encodes, e.g. an infinite float)
        return AutoConfig.from_pretrained(path, trust_remote_code=remote), None
    except ImportError as exc:
        return None, f"config.json needs a package that is not installed ({one_line(exc)}); install it"
    except Exception as exc:  # noqa: BLE001 - a config class raises ValueError, KeyError, TypeError, ...
        fix = (f"set {REMOTE_KEY}=true if you trust the folder's code" if "trust_remote_code" in str(exc)
               and not remote else f"fix config.json ({FIX})")
        return None, f"transformers refuses config.json ({one_line(exc)}); {fix}"


def _build(hf_config, remote: bool):
    """The causal LM (or image-text-to-text model, for a config with a ``vision_config``) of ``hf_config`` on the
    meta device, as the workers choose the auto class."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(hf_config, trust_remote_code=remote)


def _renamer(model, params: dict):
    """``key -> (name in the model, whether transformers converts its tensor)`` for a checkpoint key, as
    ``from_pretrained`` renames it; without transformers' loader helpers, the base-model prefix only."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model, None, None)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]

        def rename(key):
            name, converted = rename_source_key(key, renamings, converters, prefix, params)
            if name not in params and key in params:
                name, converted = key, None
            return name, converted is not None
        return rename
    except Exception as exc:  # noqa: BLE001 - another transformers: the prefix rule alone
        logger.info("checkpoint key renaming not available (%s)", one_line(exc))

    def by_prefix(key):
        if key in params or not prefix:
            return key, False
        if key.startswith(prefix + ".") and key[len(prefix) + 1:] in params:
            return key[len(prefix) + 1:], False
        return f"{prefix}.{key}", False
    return by_prefix


def _config_ints(hf: dict, hf_config) -> dict[str, int]:
    """The integer settings of ``config.json`` (sub-configs as ``text_config.<key>``), with the ``head_dim`` that
    transformers derives when the file gives none."""
    out = {}
    for section, values in [("", hf)] + [(f"{k}.", v) for k, v in hf.items() if isinstance(v, dict)]:
        for key, value in values.items():
            if isinstance(value, int) and not isinstance(value, bool) and not NOT_SHAPES.search(key):
                out[section + key] = value
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    try:
        head_dim = getattr(text, "head_dim", None)
    except Exception:  # noqa: BLE001 - a per-layer attribute (heterogeneous configs) has no one value
        head_dim = None
    section = "text_config." if isinstance(hf.get("text_config"), dict) else ""
    if isinstance(head_dim, int) and section + "head_dim" not in out:
        out[section + "head_dim"] = head_dim
    return out


def _likely_keys(name: str, want: tuple, have: list, ints: dict[str, int]) -> str:
    """The config keys that most likely gave the dimensions of ``want`` (of the parameter ``name``) that the weights
    (``have``) contradict: a key whose value is that dimension, or heads x ``head_dim`` (first for attention)."""
    rank = {k: i for i, k in enumerate(SHAPE_KEYS)}
    order = sorted(ints, key=lambda k: rank.get(k.rpartition(".")[2], len(SHAPE_KEYS)))
    named = []
    for dim, held in zip(want, have):
        if dim == held:
            continue
        equal = [f"{k}={ints[k]}" for k in order if ints[k] == dim][:2]
        product = [f"{h}={ints[h]} x {d}={ints[d]}" for h in order for d in order if d.endswith("head_dim")
                   and h.rpartition(".")[2] in HEAD_KEYS and ints[h] * ints[d] == dim][:1]
        found = (product or equal) if ATTENTION.search(name) else (equal or product)
        named += [k for k in found if k not in named]
    return ", ".join(named) or "a size key of config.json"


def shape_mismatches(model, shapes: dict[str, list[int]]) -> list[tuple[str, tuple, list[int]]]:
    """``(parameter, shape in the model, shape in the weights)`` for every parameter of ``model`` (built on the
    meta device) whose checkpoint key in ``shapes`` (tensor name -> shape, from the weights) transformers loads
    into it without converting the tensor, where the two shapes differ."""
    params = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    rename = _renamer(model, params)
    out = []
    for key, have in shapes.items():
        name, converted = rename(key)
        if not converted and name in params and list(params[name]) != list(have):
            out.append((name, params[name], have))
    return out


def transformers_config_problem(folder: str, hf: dict, files: list[str], remote: bool) -> str | None:
    """What transformers finds wrong with the ``config.json`` of the model folder ``folder`` (``hf``: that file as a
    dict; ``files``: the weights files the loader reads, ``trainer.model_folder_checks.loaded_weight_files``;
    ``remote``: ``trust_remote_code``): it does not load (:func:`load_config_problem`), the model does not build
    from it (transformers' ValueError), or parameters built from it have other shapes than the weights
    (safetensors or zip-format ``.bin``; the first three, each with the config keys that likely gave it). None when
    they agree or when this cannot judge (see the module's docstring). Never raises."""
    if not isinstance(hf.get("model_type"), str):
        return None  # transformers may still find the architecture by the folder's name: left to the loader
    hf_config, problem = load_config_problem(hf, folder, remote)
    if problem or "auto_map" in hf:
        return problem
    try:
        model = _build(hf_config, remote)
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):  # not a causal LM: left to the workers' loader
            return None
        return f"transformers cannot build the model from config.json ({one_line(exc)}); fix config.json ({FIX})"
    except Exception as exc:  # noqa: BLE001 - an architecture this process cannot build: left to the workers
        logger.info("%s: config.json's shapes not checked against the weights (%s)", folder, one_line(exc))
        return None
    quantized = "quantization_config" in hf or "quantization_config" in (hf.get("text_config") or {})
    shapes = {} if quantized else header_shapes(folder, files)
    try:
        wrong = shape_mismatches(model, shapes) if shapes else []
    except Exception as exc:  # noqa: BLE001 - this check's own failure never refuses a folder
        logger.info("%s: config.json's shapes not checked against the weights (%s)", folder, one_line(exc))
        return None
    if not wrong:
        return None
    ints = _config_ints(hf, hf_config)
    causes: dict = {}  # the first parameter of each likely cause
    for name, want, have in wrong:
        causes.setdefault(_likely_keys(name, want, have, ints), (name, want, have))
    said = "; ".join(f"{name} shape {tuple(want)} but the weights hold {tuple(have)} ({keys})"
                     for keys, (name, want, have) in list(causes.items())[:3])
    shown = min(len(causes), 3)
    more = f" (and {len(wrong) - shown} more parameters)" if len(wrong) > shown else ""
    return f"config.json gives {said}{more}; the config and the weights come from different models; {FIX}"
