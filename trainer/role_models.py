"""The model each role loads, read before any worker starts as the workers read it: which folder and
``override_config`` each role loads (:func:`section_models`, :func:`loaded_models`: the workers' own choice), the
config the workers build from it (:func:`role_config`: transformers' config with the overrides set by the workers'
own code; :func:`model_config_dict`: the ``config.json`` dict), and the text model's settings of a config, which a
vision-language model keeps in its ``text_config`` (:func:`text_config`, :func:`text_value`)."""
from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

__all__ = ["TEXT_CONFIG_NAMES", "RoleModel", "text_config", "text_value", "apply_config_overrides", "merge_overrides",
           "model_config_dict", "has_config", "folder_config", "role_config", "section_models", "loaded_models", "model_label",
           "override_note"]

#: the sub-configs that hold a composite model's text model (``PretrainedConfig.get_text_config``'s names)
TEXT_CONFIG_NAMES = ("text_encoder", "decoder", "generator", "text_config")

ACTOR_PATH = "actor_rollout_ref.model.path"
ACTOR_OVERRIDE = "actor_rollout_ref.model.override_config"


class RoleModel(NamedTuple):
    """One model a role loads: ``key`` the config key that names its folder ``path`` (None: the embedded tiny
    model), ``override`` the ``override_config`` the role sets on it (its own merged over the actor's), ``sources``
    the ``(key, entries)`` of the non-empty ``override_config`` sections that make it (the actor's first), and
    ``remote`` the role's ``trust_remote_code``."""

    key: str
    path: str | None
    override: dict
    sources: tuple = ()
    remote: bool = False

    def same_model(self, other: "RoleModel") -> bool:
        """Whether ``other`` is built alike: the same folder, overrides and ``trust_remote_code``."""
        return (self.path, self.override, self.remote) == (other.path, other.override, other.remote)


def text_config(conf: Any) -> Any:
    """The text model's part of a model config, the one the workers read: for a transformers config its
    ``get_text_config()``; for a dict (``config.json``) the one sub-config under :data:`TEXT_CONFIG_NAMES`
    (``text_config`` for Qwen2-VL). The config itself for a text-only model, when several such sub-configs make the
    choice ambiguous (transformers then raises; the worker reports it), or when what ``get_text_config()`` finds is
    no config (a mapping an ``override_config`` set under such a name on a class that has no such sub-config: the
    model does not build with it, :func:`trainer.override_checks.check_override_shapes`)."""
    if isinstance(conf, Mapping):
        subs = [conf[name] for name in TEXT_CONFIG_NAMES if isinstance(conf.get(name), Mapping)]
        return subs[0] if len(subs) == 1 else conf
    try:
        text = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    except ValueError:  # several text sub-configs
        return conf
    return text if hasattr(text, "to_dict") else conf


def text_value(conf: Any, name: str) -> Any:
    """The setting ``name`` (e.g. ``num_attention_heads``, ``max_position_embeddings``) of the text model of
    ``conf`` (a dict or a transformers config, :func:`text_config`), else of ``conf`` itself; None when neither has
    it."""
    def get(c):
        return c.get(name) if isinstance(c, Mapping) else getattr(c, name, None)

    text = text_config(conf)
    value = get(text)
    return get(conf) if value is None and text is not conf else value


def apply_config_overrides(hf_config, override: dict) -> None:
    """Set ``override`` (``model.override_config``, verl's key) on a transformers config, in place: each entry
    replaces the attribute of that name; a dict entry updates a sub-config (e.g. ``rope_scaling``, a ``text_config``)
    key by key. Verl's rule (``update_model_config``). ``attn_implementation`` is set as the config's
    ``_attn_implementation``, the one transformers builds the model's attention from (its sub-configs follow)."""
    for key, value in override.items():
        current = getattr(hf_config, key, None)
        if key == "attn_implementation":
            hf_config._attn_implementation = value
        elif isinstance(value, dict) and current is not None and hasattr(current, "to_dict"):
            apply_config_overrides(current, value)
        elif isinstance(value, dict) and isinstance(current, dict):
            setattr(hf_config, key, {**current, **value})
        else:
            setattr(hf_config, key, value)


def merge_overrides(hf: dict, override: Mapping) -> dict:
    """``hf`` (a ``config.json`` dict) with ``override`` (``model.override_config``) set as the workers set it on
    the loaded config (:func:`apply_config_overrides`): each entry replaces the key of
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


def has_config(path: str | None) -> bool:
    """Whether the model folder ``path`` (None: the embedded tiny model) has a ``config.json``; a folder without one
    is reported by the folder checks (``trainer.config_preflight``), not again by the checks of its model."""
    import os

    return path is None or os.path.isfile(os.path.join(path, "config.json"))


def folder_config(cfg: dict, path: str | None, remote: bool = False):
    """transformers' config of the model folder ``path`` as the workers load it (``AutoConfig.from_pretrained``:
    the class's defaults for keys ``config.json`` leaves out, an older flat vision-language layout read into its
    ``text_config``), or for None the embedded tiny model's (``actor_rollout_ref.model.tiny``,
    :func:`trainer.embedded.tiny_model_config`). ``remote``: ``trust_remote_code``.

    Raises:
        Exception: whatever transformers raises for a config it does not load (no or an unknown ``model_type``, a
            value its class refuses, remote code not trusted, ...).
    """
    if path is None:
        from trainer import embedded

        vocab = len(embedded.SPECIAL) + len(embedded.DIGITS) + len(embedded.WORDS)
        return embedded.tiny_model_config(vocab, **dict(cfg["actor_rollout_ref"]["model"].get("tiny") or {}))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, trust_remote_code=remote)


def role_config(cfg: dict, model: RoleModel, overrides: bool = True):
    """The config the workers build for ``model`` (:meth:`trainer.workers.model_utils.ModelRole.build`): its
    :func:`folder_config` with its ``override_config`` set by the workers' own :func:`apply_config_overrides` (an
    entry the class has no use for is set and read by nothing, as in the workers); ``overrides`` False: without
    them. A folder whose config transformers does not load here is read as its ``config.json`` with the overrides
    merged (:func:`model_config_dict`, a dict): the folder checks report it, or the workers do.

    Raises:
        ConfigError: that ``config.json`` is not a JSON object.
        OSError: the folder has no ``config.json`` (the callers check for it first).
    """
    override = model.override if overrides else {}
    try:
        conf = copy.deepcopy(folder_config(cfg, model.path, model.remote))
        apply_config_overrides(conf, override)
        return conf
    except Exception:  # noqa: BLE001 - a config transformers does not load here: read as JSON
        return model_config_dict(cfg, model.key, model.path, override)


def _role_model(actor: RoleModel, role: Mapping, key: str) -> RoleModel:
    """The model of a role with a model section of its own (``key``): its ``path`` when set, else the actor's folder;
    its ``override_config`` over the actor's; its ``trust_remote_code`` when set, else the actor's
    (:meth:`trainer.config.model.ModelConfig.for_role`)."""
    own = dict(role.get("override_config") or {})
    sources = actor.sources + ((f"{key}.override_config", own),) if own else actor.sources
    remote = actor.remote if role.get("trust_remote_code") is None else bool(role["trust_remote_code"])
    where = (f"{key}.path", role["path"]) if role.get("path") else (actor.key, actor.path)
    return RoleModel(*where, {**actor.override, **own}, sources, remote)


def _lora(model: Mapping) -> bool:
    try:
        return int(model.get("lora_rank") or 0) > 0
    except (TypeError, ValueError):  # refused by the LoRA checks
        return False


def section_models(cfg: dict) -> dict[str, list[RoleModel]]:
    """For each section with a Ulysses size (:data:`trainer.config.actor.ULYSSES_SECTIONS`): the
    :class:`RoleModel` of each model its role loads with that size, as the workers choose them: the actor the
    actor's model (``actor_rollout_ref.model.path``; None: the embedded tiny model), and so does its reference, which
    loads none with LoRA (``actor_rollout_ref.model.lora_rank > 0``: the actor with its adapters disabled, at the
    actor's size); the critic ``critic.model.path``, else the actor's
    (:func:`trainer.config.workers.critic_worker_config`); PRIME's reward model ``reward_model.model.path``, else
    the actor's, and its frozen reference ``reward_model.model.ref_path``, else the same
    (:func:`trainer.config.prm.prm_worker_config`)."""
    arr = cfg["actor_rollout_ref"]["model"]
    own = dict(arr.get("override_config") or {})
    actor = RoleModel(ACTOR_PATH, arr.get("path"), own, ((ACTOR_OVERRIDE, own),) if own else (),
                      bool(arr.get("trust_remote_code")))
    critic = _role_model(actor, (cfg.get("critic") or {}).get("model") or {}, "critic.model")
    rm = (cfg.get("reward_model") or {}).get("model") or {}
    prm = _role_model(actor, rm, "reward_model.model")
    prm_ref = prm._replace(key="reward_model.model.ref_path", path=rm["ref_path"]) if rm.get("ref_path") else prm
    return {"actor_rollout_ref.actor": [actor], "actor_rollout_ref.ref": [] if _lora(arr) else [actor],
            "critic": [critic], "reward_model": [prm] if prm_ref == prm else [prm, prm_ref]}


def loaded_models(cfg: dict, sections: Collection[str] | None = None) -> list[list[tuple[str, RoleModel]]]:
    """The distinct models (:meth:`RoleModel.same_model`) that the sections ``sections`` load (default: every section
    whose role runs, :func:`trainer.run_roles.section_runs`; :func:`section_models`), each as the ``(section, model)``
    pairs that load it, in the order of :func:`section_models`: a check judges each model once and names each
    section's own keys."""
    from trainer.run_roles import section_runs

    groups: list[list[tuple[str, RoleModel]]] = []
    for section, models in section_models(cfg).items():
        if not (section_runs(cfg, section) if sections is None else section in sections):
            continue
        for model in models:
            same = [group for group in groups if group[0][1].same_model(model)]
            if same:
                same[0].append((section, model))
            else:
                groups.append([(section, model)])
    return groups


def model_label(key: str, path: str | None) -> str:
    """The model of ``key=path`` in an error line: ``the model <key>='<path>'``, or the embedded tiny model."""
    if path is None:
        return f"the embedded tiny model ({key}=null)"
    return f"the model {key}={path!r}"


def _mentions(override: Mapping, names: Collection[str]) -> bool:
    return any(k in names or isinstance(v, Mapping) and _mentions(v, names) for k, v in override.items())


def override_note(model: RoleModel, names: Collection[str]) -> str:
    """`` with <key>`` for a value of ``model`` that its ``override_config`` gave: the sections of
    :attr:`RoleModel.sources` with an entry of one of ``names`` (at any depth), all of them when none has."""
    keys = [key for key, entries in model.sources if _mentions(entries, names)] or [k for k, _ in model.sources]
    return f" with {' and '.join(keys)}" if keys else ""
