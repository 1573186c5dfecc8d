"""``actor_rollout_ref.model.override_config`` (verl's key) is set on the model's config before its weights load;
an entry that changes the shape of a weight (``num_attention_heads``, ``hidden_size``, ``vocab_size``, ...) makes the
folder's weights impossible to load, which used to fail inside every worker with transformers' size-mismatch
report. :func:`check_override_shapes` builds the model on the meta device (no memory) with and without the
overrides before start-up and refuses such an entry in one line.
"""
from __future__ import annotations

import logging

from trainer.config_checks import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["check_override_shapes", "check_tiny_model"]

KEY = "actor_rollout_ref.model.override_config"
TINY = "actor_rollout_ref.model.tiny"
TINY_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "max_position_embeddings")


def _hf_config(cfg: dict):
    from transformers import AutoConfig

    model = cfg["actor_rollout_ref"]["model"]
    if model.get("path") is None:
        from trainer import embedded

        vocab = len(embedded.SPECIAL) + len(embedded.DIGITS) + len(embedded.WORDS)
        return embedded.tiny_model_config(vocab, **dict(model.get("tiny") or {}))
    return AutoConfig.from_pretrained(model["path"], trust_remote_code=bool(model.get("trust_remote_code")))


def _shapes(hf_config, remote: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(hf_config, trust_remote_code=remote)
    return {n: tuple(p.shape) for n, p in model.state_dict().items()}


def check_override_shapes(cfg: dict) -> None:
    """With a non-empty ``override_config``: the model it describes builds, and has the weight names and shapes of
    the model without it (a model this process cannot build without the overrides is not judged).

    Raises:
        ConfigError: naming the override and the first weights whose shapes change, or the build's error.
    """
    import copy

    from trainer.workers.model_utils import apply_config_overrides

    override = dict(cfg["actor_rollout_ref"]["model"].get("override_config") or {})
    if not override:
        return
    remote = bool(cfg["actor_rollout_ref"]["model"].get("trust_remote_code"))
    try:
        base = _hf_config(cfg)
        before = _shapes(base, remote)
    except Exception as exc:  # noqa: BLE001 (an architecture this process cannot build: the workers report it)
        logger.info("override_config not checked before start-up (%s: %s)", type(exc).__name__, exc)
        return
    changed = copy.deepcopy(base)
    try:
        apply_config_overrides(changed, override)
        after = _shapes(changed, remote)
    except Exception as exc:  # noqa: BLE001 (the model refuses the overridden config)
        raise ConfigError(f"{KEY}={override!r}: the model cannot be built with it "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from exc
    diff = [f"{n}: {list(before[n])} -> {list(after[n])}" for n in before if n in after and before[n] != after[n]]
    diff += [f"{n}: missing" for n in before if n not in after] + [f"{n}: new" for n in after if n not in before]
    if diff:
        more = f" (and {len(diff) - 2} more)" if len(diff) > 2 else ""
        raise ConfigError(f"{KEY}={override!r} changes the model's weights ({'; '.join(diff[:2])}{more}), so the "
                          "saved weights cannot load; override only settings that keep every weight's shape "
                          "(e.g. dropout, rope_scaling, attn_implementation)")


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
