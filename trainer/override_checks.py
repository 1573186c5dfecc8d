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

__all__ = ["check_override_shapes"]

KEY = "actor_rollout_ref.model.override_config"


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
