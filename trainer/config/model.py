"""The model section of a role: ``actor_rollout_ref.model`` and, merged over it, a role's own ``critic.model``."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.config.section import Section, convert

__all__ = ["ModelConfig", "ROLE_MODEL_KEYS", "LORA_KEYS", "check_chat_template"]

# keys of a role's own model section (verl's critic.model.*, PRIME's reward_model.model.*) that replace the actor's
# model settings (actor_rollout_ref.model) when not null
ROLE_MODEL_KEYS = ("tokenizer_path", "trust_remote_code", "use_remove_padding", "enable_gradient_checkpointing",
                   "external_lib")
#: a role's LoRA keys (verl's names), read from ``actor_rollout_ref.model`` or ``critic.model``
LORA_KEYS = ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")


@dataclass(frozen=True)
class ModelConfig(Section):
    """``actor_rollout_ref.model`` (verl's keys): the Hugging Face model a role loads and how it is trained.

    Attributes:
        path: the HF model folder (None before the embedded tiny model is written, ``model=tiny``).
        tokenizer_path: the tokenizer's folder; None: ``path``.
        override_config: set on the HF config before the model is built (a dict entry updates a sub-config).
        custom_chat_template: a Jinja chat template replacing the tokenizer's, or None.
        lora_rank: > 0 trains LoRA adapters of this rank (0: every weight); lora_alpha scales them by alpha / rank.
        target_modules: ``all-linear`` or a list of module names; exclude_modules: names never adapted, or None.
        use_liger, use_torch_compile, torch_compile_mode: kernel options (:mod:`trainer.workers.kernels`).
    """

    path: str | None
    tokenizer_path: str | None
    trust_remote_code: bool
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    use_liger: bool
    use_torch_compile: bool
    torch_compile_mode: str
    override_config: dict
    custom_chat_template: str | None
    external_lib: str | None
    # the LoRA keys are checked by trainer.lora_checks.check_lora (with the model's module names)
    lora_rank: Any
    lora_alpha: Any
    target_modules: Any  # all-linear | a list of names
    exclude_modules: Any

    def check(self, key: str) -> None:
        """``custom_chat_template``, when set, is a Jinja template that reads the ``messages``
        (:func:`check_chat_template`)."""
        if object.__getattribute__(self, "__dict__")["custom_chat_template"] is not None:  # unset: nothing read
            check_chat_template(f"{key}.custom_chat_template", self.custom_chat_template)

    def for_role(self, role: Mapping, key: str, own_lora: bool) -> "ModelConfig":
        """The model of a role with a model section of its own (``critic.model``; ``key`` its dotted path): this
        model with the role's non-null :data:`ROLE_MODEL_KEYS` and ``path`` over it, the role's
        ``override_config`` merged over this one's, and (``own_lora``) the role's own :data:`LORA_KEYS` (verl's
        critic has its own LoRA). Raises ConfigError for a value of the wrong type (naming ``key.<name>``)."""
        hints = typing.get_type_hints(ModelConfig)
        names = [*ROLE_MODEL_KEYS, "path"] + (list(LORA_KEYS) if own_lora else [])
        over = {k: convert(role[k], hints[k], f"{key}.{k}") for k in names if role.get(k) is not None}
        if own_lora:  # null entries of the role's LoRA keys are the role's own (no LoRA), not the actor's
            over.update({k: role[k] for k in LORA_KEYS if k in role and role[k] is None})
        extra = convert(role.get("override_config") or {}, dict, f"{key}.override_config")
        mine = object.__getattribute__(self, "__dict__")  # read without recording: a role's copy is no use
        values = {f.name: mine[f.name] for f in dataclasses.fields(self)}
        values.update(over, override_config={**mine["override_config"], **extra})
        paths = {**(mine.get("_paths") or {}), **{k: f"{key}.{k}" for k in over}}
        return ModelConfig.made(values, paths, key)


def check_chat_template(key: str, template: str) -> None:
    """A chat template given in the config is Jinja source that compiles and reads ``messages``: the text of a file
    name (``custom_chat_template=tools/chat_templates/x.jinja``) would otherwise render every prompt as that text,
    without the conversation.

    Raises:
        ConfigError: naming the key; for a file name, how to pass the file's content.
    """
    import os

    import jinja2
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from trainer.config_checks import ConfigError

    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"{key}={template!r}; expected the Jinja source of a chat template, or null")
    if "\n" not in template and os.path.isfile(os.path.expanduser(template)):
        raise ConfigError(f"{key}={template!r} is a file name; the key takes the template's source: "
                          f"{key}=\"$(cat {template})\"")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    try:
        names = meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{key}: not a valid Jinja template (line {exc.lineno}: {exc.message})") from exc
    if "messages" not in names:
        raise ConfigError(f"{key}={template[:80]!r}: the template never reads `messages`, so every prompt would "
                          "render without its conversation; expected the Jinja source of a chat template")
