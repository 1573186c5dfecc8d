"""``actor_rollout_ref.model.override_config`` (verl's key) is set on the model's config before its weights load;
an entry that changes the shape of a weight (``num_attention_heads``, ``hidden_size``, ``vocab_size``, ...) makes the
folder's weights impossible to load, which used to fail inside every worker with transformers' size-mismatch
report. :func:`check_override_shapes` builds each role's model (the critic's and PRIME's reward model's with their
own ``override_config`` merged over the actor's) on the meta device (no memory) with and without the overrides
before start-up and refuses such an entry in one line.
"""
from __future__ import annotations

import logging

from trainer.config_checks import ConfigError
from trainer.role_models import TEXT_CONFIG_NAMES

logger = logging.getLogger(__name__)

__all__ = ["check_override_shapes", "check_tiny_model", "override_key_warnings", "override_sources",
           "attention_entries", "without_attention"]

KEY = "actor_rollout_ref.model.override_config"
TINY = "actor_rollout_ref.model.tiny"
_ACTOR_PATH = object()
TINY_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "max_position_embeddings")
ATTN_KEYS = ("attn_implementation", "_attn_implementation")


def attention_entries(override: dict, prefix: str) -> list[tuple[str, object]]:
    """``(dotted key, value)`` of each attention entry of an ``override_config`` (``prefix``: its dotted key),
    sub-config mappings included."""
    out = []
    for key, value in override.items():
        if key in ATTN_KEYS:
            out.append((f"{prefix}.{key}", value))
        elif isinstance(value, dict):
            out += attention_entries(value, f"{prefix}.{key}")
    return out


def without_attention(override: dict) -> dict:
    """``override`` without its attention entries (no weight's shape depends on them)."""
    return {k: without_attention(v) if isinstance(v, dict) else v for k, v in override.items() if k not in ATTN_KEYS}


def _hf_config(cfg: dict, path=_ACTOR_PATH):
    """The HF config of the model folder ``path`` (default: the actor's ``model.path``), the embedded tiny model's
    for None (:func:`trainer.role_models.folder_config`)."""
    from trainer.role_models import folder_config

    model = cfg["actor_rollout_ref"]["model"]
    path = model.get("path") if path is _ACTOR_PATH else path
    return folder_config(cfg, path, bool(model.get("trust_remote_code")))


def _shapes(hf_config, remote: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(hf_config, trust_remote_code=remote)
    return {n: tuple(p.shape) for n, p in model.state_dict().items()}


def check_override_shapes(cfg: dict) -> None:
    """Each model the run's roles load with a non-empty ``override_config``
    (:func:`trainer.role_models.loaded_models`: the actor's; the critic's and PRIME's reward model's, their own
    ``override_config`` merged over the actor's, on their own folders or the actor's) builds with it, and has the
    weight names and shapes of the model without it (a model this process cannot build without the overrides is not
    judged). Each model is checked once; a folder without ``config.json`` is reported by the folder checks.

    Raises:
        ConfigError: naming the override (the role's own key, and the actor's it is merged over), the model when it
            is not the actor's, and the first weights whose shapes change, a sub-config mapping the model's config
            class has no sub-config for, or the build's error; one line per model
            (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    from trainer.config_checks import ErrorCollector
    from trainer.role_models import has_config, loaded_models

    errors = ErrorCollector()
    for group in loaded_models(cfg):
        if has_config(group[0][1].path):
            errors.run(_check_model_override, cfg, group[0][1])
    errors.raise_if_any()


def _override_names(model) -> tuple[str, str, str]:
    """``(the override as written, the model's name, its weights' name)`` of a :class:`trainer.role_models.RoleModel`
    for the error lines: the role's own ``override_config`` over the actor's; "the model" for the actor's own."""
    from trainer.role_models import ACTOR_PATH, model_label

    parts = [f"{key}={without_attention(entries)!r}" for key, entries in reversed(model.sources)
             if without_attention(entries)]
    written = parts[0] + (f" (over {parts[1]})" if len(parts) > 1 else "")
    if model.key == ACTOR_PATH and [k for k, _ in model.sources] == [KEY]:
        return written, "the model", "the model's weights"
    label = model_label(model.key, model.path)
    return written, label, f"the weights of {label}"


def _check_model_override(cfg: dict, model) -> None:
    """:func:`check_override_shapes` for one :class:`trainer.role_models.RoleModel`."""
    import copy

    from trainer.role_models import apply_config_overrides, folder_config

    # the attention entries are trainer.attention_checks' to judge: building with one that cannot run here would
    # fail, or fetch a kernel from the Hub, for a reason that is not the weights'
    override = without_attention(model.override)
    if not override:
        return
    try:
        base = folder_config(cfg, model.path, model.remote)
        before = _shapes(base, model.remote)
    except Exception as exc:  # noqa: BLE001 (an architecture this process cannot build: the workers report it)
        logger.info("override_config not checked before start-up (%s: %s)", type(exc).__name__, exc)
        return
    written, whose, weights = _override_names(model)
    for name in TEXT_CONFIG_NAMES:  # get_text_config() would hand the model this mapping as its text config
        if isinstance(override.get(name), dict) and not hasattr(getattr(base, name, None), "to_dict"):
            raise ConfigError(f"{written}: {type(base).__name__} has no {name} sub-config, so the workers would set "
                              f"the mapping {name}={override[name]!r} in its place and {whose} could not be built; "
                              f"set those keys at the top level of the override_config instead")
    changed = copy.deepcopy(base)
    try:
        apply_config_overrides(changed, override)
        after = _shapes(changed, model.remote)
    except Exception as exc:  # noqa: BLE001 (the model refuses the overridden config)
        raise ConfigError(f"{written}: {whose} cannot be built with it "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from exc
    diff = [f"{n}: {list(before[n])} -> {list(after[n])}" for n in before if n in after and before[n] != after[n]]
    diff += [f"{n}: missing" for n in before if n not in after] + [f"{n}: new" for n in after if n not in before]
    if diff:
        more = f" (and {len(diff) - 2} more)" if len(diff) > 2 else ""
        raise ConfigError(f"{written} changes {weights} ({'; '.join(diff[:2])}{more}), so the saved weights cannot "
                          "load; override only settings that keep every weight's shape (e.g. dropout, rope_scaling, "
                          "attn_implementation)")


def check_tiny_model(cfg: dict) -> None:
    """The embedded tiny model's sizes (``actor_rollout_ref.model.tiny``, with ``model.path`` null): each of
    :data:`TINY_SIZES` an integer >= 1, ``hidden_size`` a multiple of ``num_attention_heads`` and
    ``num_attention_heads`` of ``num_key_value_heads`` (Llama's attention), and the model builds (on the meta
    device, no memory).

    Raises:
        ConfigError: one line naming the key, the value and what was expected, or the build's error.
    """
    model = cfg["actor_rollout_ref"]["model"]
    tiny = model.get("tiny")
    if model.get("path") is not None or tiny is None:
        return
    if not isinstance(tiny, dict):
        raise ConfigError(f"{TINY}={tiny!r}; expected a mapping of the tiny model's sizes")
    from trainer import embedded
    from trainer.config_checks import as_int

    sizes = {name: as_int(tiny[name], f"{TINY}.{name}", minimum=1) for name in TINY_SIZES if name in tiny}
    defaults = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}  # tiny_model_config's
    heads = sizes.get("num_attention_heads", defaults["num_attention_heads"])
    kv = sizes.get("num_key_value_heads", defaults["num_key_value_heads"])
    hidden = sizes.get("hidden_size", defaults["hidden_size"])
    if hidden % heads:
        raise ConfigError(f"{TINY}.hidden_size={hidden} with num_attention_heads={heads}; expected hidden_size a "
                          "multiple of num_attention_heads")
    if heads % kv:
        raise ConfigError(f"{TINY}.num_key_value_heads={kv} with num_attention_heads={heads}; expected a divisor of "
                          "num_attention_heads")
    vocab = len(embedded.SPECIAL) + len(embedded.DIGITS) + len(embedded.WORDS)
    try:
        _shapes(embedded.tiny_model_config(vocab, **dict(tiny)), remote=False)
    except Exception as exc:  # noqa: BLE001 (transformers refuses the config)
        raise ConfigError(f"{TINY}={dict(tiny)!r}: the tiny model cannot be built with it "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from None


def _known_key(hf_config, key: str) -> bool:
    """Whether ``key`` is a setting of ``hf_config``'s class: an attribute of the config (its class's, or one its
    folder's config.json set), an argument of an ``__init__`` of the class or its bases, an alias of its
    ``attribute_map``, or a property over a private attribute (``attn_implementation``)."""
    import inspect

    if hasattr(hf_config, key) or hasattr(hf_config, f"_{key}") or key in (getattr(hf_config, "attribute_map", None)
                                                                              or {}):
        return True
    for cls in type(hf_config).__mro__:
        try:
            if key in inspect.signature(cls.__init__).parameters:
                return True
        except (TypeError, ValueError):
            continue
    return False


def _unknown_keys(hf_config, override: dict, prefix: str) -> list[str]:
    """The dotted keys of ``override`` that ``hf_config``'s class does not define; a mapping over a sub-config
    (``text_config``) is looked into, one over a plain dict value (``rope_scaling``) is not, and one under a
    sub-config's name the class does not define is left to :func:`check_override_shapes`, which refuses it."""
    out = []
    for key, value in override.items():
        if key in TEXT_CONFIG_NAMES and isinstance(value, dict) and not _known_key(hf_config, str(key)):
            continue  # not ignored: the model does not build with it (refused by check_override_shapes)
        if not _known_key(hf_config, str(key)):
            out.append(f"{prefix}.{key}")
        elif isinstance(value, dict) and hasattr(getattr(hf_config, key, None), "to_dict"):
            out += _unknown_keys(getattr(hf_config, key), value, f"{prefix}.{key}")
    return out


def override_sources(cfg: dict) -> list[tuple[str, dict, object]]:
    """``(dotted key, override_config, model folder)`` of the actor's and, when the run has a critic, the critic's
    own ``override_config`` (merged over the actor's, whose keys are checked once)."""
    from trainer.run_roles import critic_on

    model = cfg["actor_rollout_ref"]["model"]
    out = [(KEY, dict(model.get("override_config") or {}), model.get("path"))]
    critic = (cfg.get("critic") or {}).get("model") or {}
    if critic_on(cfg) and critic.get("override_config"):
        out.append(("critic.model.override_config", dict(critic["override_config"]),
                    critic.get("path") or model.get("path")))
    return out


def override_key_warnings(cfg: dict) -> list[str]:
    """One warning line per ``override_config`` (actor's; the critic's own, when the run has a critic) naming its
    keys that the model's config class does not define (:func:`_known_key`): the workers set them on the config,
    and no model code reads them (a typo such as ``attn_dropout`` for ``attention_dropout`` changes nothing). A
    model whose config this process cannot load is not judged (its own check reports it)."""
    import difflib

    out = []
    for key, override, path in override_sources(cfg):
        if not override:
            continue
        try:
            hf_config = _hf_config(cfg, path)
        except Exception:  # noqa: BLE001 (a folder or class this process cannot load: reported elsewhere)
            continue
        unknown = _unknown_keys(hf_config, override, key)
        if not unknown:
            continue
        names = [n for n in dir(hf_config) if not n.startswith("_")]
        hints = [f"{u.rsplit('.', 1)[1]} -> {m[0]}" for u in unknown
                 if (m := difflib.get_close_matches(u.rsplit(".", 1)[1], names, n=1))]
        hint = f" (did you mean: {', '.join(hints)})" if hints else ""
        it = "it" if len(unknown) == 1 else "them"
        out.append(f"{', '.join(unknown)}: ignored: {type(hf_config).__name__} does not define {it} (no attribute "
                   f"or __init__ argument of that name), so no model code reads {it}{hint}")
    return out
