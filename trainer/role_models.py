"""The model each role loads, read before any worker starts: which folder (and ``override_config``) a section with a
``ulysses_sequence_parallel_size`` runs (:func:`section_models`, the workers' own choice), that folder's
``config.json`` as a dict with the overrides applied (:func:`model_config_dict`), and the text model's settings of a
config, which a vision-language model keeps in its ``text_config`` (:func:`text_config`, :func:`text_value`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TEXT_CONFIG_NAMES", "text_config", "text_value", "merge_overrides", "model_config_dict",
           "section_models", "model_label"]

#: the sub-configs that hold a composite model's text model (``PretrainedConfig.get_text_config``'s names)
TEXT_CONFIG_NAMES = ("text_encoder", "decoder", "generator", "text_config")

ACTOR_PATH = "actor_rollout_ref.model.path"


def text_config(conf: Any) -> Any:
    """The text model's part of a model config, the one the workers read: for a transformers config its
    ``get_text_config()``; for a dict (``config.json``) the one sub-config under :data:`TEXT_CONFIG_NAMES`
    (``text_config`` for Qwen2-VL). The config itself for a text-only model, or when several such sub-configs make
    the choice ambiguous (transformers then raises; the worker reports it)."""
    if isinstance(conf, Mapping):
        subs = [conf[name] for name in TEXT_CONFIG_NAMES if isinstance(conf.get(name), Mapping)]
        return subs[0] if len(subs) == 1 else conf
    try:
        return conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    except ValueError:  # several text sub-configs
        return conf


def text_value(conf: Any, name: str) -> Any:
    """The setting ``name`` (e.g. ``num_attention_heads``, ``max_position_embeddings``) of the text model of
    ``conf`` (a dict or a transformers config, :func:`text_config`), else of ``conf`` itself; None when neither has
    it."""
    def get(c):
        return c.get(name) if isinstance(c, Mapping) else getattr(c, name, None)

    text = text_config(conf)
    value = get(text)
    return get(conf) if value is None and text is not conf else value


def merge_overrides(hf: dict, override: Mapping) -> dict:
    """``hf`` (a ``config.json`` dict) with ``override`` (``model.override_config``) set as the workers set it on
    the loaded config (:func:`trainer.workers.model_utils.apply_config_overrides`): each entry replaces the key of
    that name; a dict entry over a dict (a sub-config such as ``text_config``, or ``rope_scaling``) updates it key
    by key. Returns a new dict; ``hf`` is not changed."""
    out = dict(hf)
    for key, value in override.items():
        current = out.get(key)
        out[key] = merge_overrides(current, value) if isinstance(value, Mapping) and isinstance(current, Mapping) \
            else value
    return out


def model_config_dict(cfg: dict, key: str, path: str | None, override: Mapping | None = None) -> dict:
    """The HF config of the model folder ``path`` (named by config ``key``; read as JSON, no import), or for None
    the embedded tiny model's sizes (``actor_rollout_ref.model.tiny``), with ``override`` applied
    (:func:`merge_overrides`; default: ``actor_rollout_ref.model.override_config``).

    Raises:
        ConfigError: ``config.json`` is not a JSON object (:func:`trainer.model_folder_checks.read_model_config`).
    """
    from trainer.model_folder_checks import read_model_config

    model = cfg["actor_rollout_ref"]["model"]
    hf = dict(model.get("tiny") or {}) if path is None else read_model_config(key, path)
    if override is None:
        override = model.get("override_config") or {}
    return merge_overrides(hf, override)


def _role_model(actor: tuple[str, Any, dict], role: Mapping, key: str) -> tuple[str, Any, dict]:
    """``(path key, folder, override_config)`` of a role with a model section of its own (``key``): its ``path``
    when set, else the actor's folder; its ``override_config`` over the actor's
    (:meth:`trainer.config.model.ModelConfig.for_role`)."""
    override = {**actor[2], **dict(role.get("override_config") or {})}
    if role.get("path"):
        return f"{key}.path", role["path"], override
    return actor[0], actor[1], override


def section_models(cfg: dict) -> dict[str, list[tuple[str, Any, dict]]]:
    """For each section with a Ulysses size (:data:`trainer.config.actor.ULYSSES_SECTIONS`): ``(path key, folder,
    override_config)`` of each model its role loads with that size, as the workers choose them: the actor and its
    reference the actor's model (``actor_rollout_ref.model.path``; None: the embedded tiny model); the critic
    ``critic.model.path``, else the actor's (:func:`trainer.config.workers.critic_worker_config`); PRIME's reward
    model ``reward_model.model.path``, else the actor's, and its frozen reference ``reward_model.model.ref_path``,
    else the same (:func:`trainer.config.prm.prm_worker_config`)."""
    arr = cfg["actor_rollout_ref"]["model"]
    actor = (ACTOR_PATH, arr.get("path"), dict(arr.get("override_config") or {}))
    critic = _role_model(actor, (cfg.get("critic") or {}).get("model") or {}, "critic.model")
    rm = (cfg.get("reward_model") or {}).get("model") or {}
    prm = _role_model(actor, rm, "reward_model.model")
    prm_ref = ("reward_model.model.ref_path", rm["ref_path"], prm[2]) if rm.get("ref_path") else prm
    return {"actor_rollout_ref.actor": [actor], "actor_rollout_ref.ref": [actor], "critic": [critic],
            "reward_model": [prm] if prm_ref == prm else [prm, prm_ref]}


def model_label(key: str, path: str | None) -> str:
    """The model of ``key=path`` in an error line: ``the model <key>='<path>'``, or the embedded tiny model."""
    if path is None:
        return f"the embedded tiny model ({key}=null)"
    return f"the model {key}={path!r}"
