"""The command line before Hydra composes it: every override is checked against the config's keys at once.

:func:`prepare_overrides` returns the overrides Hydra is given and every error found, one line each:

* a key of ``configs/`` (or below a free-form dict such as ``reward_model.scorer_kwargs``) passes;
* one of verl's keys that is not ours (``trainer/verl_keys.py``) passes as ``++key=value`` (Hydra would refuse it
  without ``+``) and is handled after composition (``trainer.verl_compat``); a refused value is reported here;
* a key that only another group option has (PRIME's keys without ``algorithm=prime``) names the option to add;
* any other key is unknown (a close key of the config is suggested); so is a group option that does not exist.

Two verl habits become group choices: ``actor_rollout_ref.rollout.name=vllm|hf`` selects the ``rollout`` group
of that name, and ``actor_rollout_ref.model.path=DIR`` without a ``model=`` group selects ``model=hf`` (a plain
Hugging Face folder with the root config's settings, not the embedded tiny model's).
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

from trainer.config_checks import ConfigError, ConfigErrors

# keys that were renamed in this framework: old dotted key -> new dotted key (verl's renames are in trainer/verl_keys)
RENAMED_KEYS = {
    "actor_rollout_ref.actor.clip_ratio_lower": "actor_rollout_ref.actor.clip_ratio_low",
    "algorithm.rollout_correction.tis_threshold": "algorithm.rollout_correction.rollout_is_threshold (with "
                                                  "algorithm.rollout_correction.rollout_is=token)",
}

# dict-valued keys read as a whole (their entries are free-form arguments of a library call)
FREE_FORM = ("reward_model.scorer_kwargs", "reward_model.custom_reward_function.reward_kwargs",
             "deepspeed.ds_config", "actor_rollout_ref.model.override_config",
             "critic.model.override_config", "reward_model.model.override_config", "actor_rollout_ref.model.tiny",
             "data.apply_chat_template_kwargs")

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
GROUP_LABELS = {("algorithm", "prime"): " (PRIME)"}
# Hydra's flags whose value is the next argument (that argument has no '=')
_VALUE_FLAGS = frozenset({"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                          "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"})


@dataclass
class PreparedOverrides:
    """``overrides`` to give Hydra, ``errors`` (one line each) and ``notes`` on rewritten overrides."""

    overrides: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def config_groups(config_dir: str = CONFIG_DIR) -> dict[str, list[str]]:
    """``{group: [option, ...]}`` of the config folder (one sub-folder of yaml files per group)."""
    out = {}
    for name in sorted(os.listdir(config_dir)):
        sub = os.path.join(config_dir, name)
        if os.path.isdir(sub):
            out[name] = sorted(f[:-5] for f in os.listdir(sub) if f.endswith(".yaml"))
    return out


def _compose(config_dir: str, config_name: str, overrides: list[str]) -> tuple[dict, dict]:
    """The composed config (unresolved, as a dict) and the group choices Hydra made."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    cfg = OmegaConf.to_container(cfg, resolve=False)
    cfg.pop("hydra", None)
    return cfg, choices


def key_status(schema: dict, key: str) -> str | None:
    """``"ours"`` (a key of ``schema``), ``"free"`` (inside a :data:`FREE_FORM` dict) or None (not a key)."""
    node, parts = schema, key.split(".")
    for i, part in enumerate(parts):
        if ".".join(parts[:i]) in FREE_FORM:
            return "free"
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return "free" if key in FREE_FORM else "ours"


def _leaf_keys(node: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in node.items():
        p = f"{prefix}.{k}" if prefix else str(k)
        out += _leaf_keys(v, p) if isinstance(v, dict) and v and p not in FREE_FORM else [p]
    return out


def _parse(args: list[str], out: PreparedOverrides):
    """Split ``args`` into parsed overrides and pass-through arguments (Hydra flags, ``hydra.*`` keys)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for i, arg in enumerate(args):
        if "=" not in arg and not arg.startswith(("-", "~")) and (i == 0 or args[i - 1] not in _VALUE_FLAGS):
            out.errors.append(f"the argument {arg!r} is not an override: expected key=value (e.g. {arg}=...), "
                              f"+key=value or ~key")
            continue
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")) or \
                arg.lstrip("+~").startswith("hydra."):
            out.overrides.append(arg)
            continue
        key, _, value = arg.partition("=")
        if value.startswith("~"):  # a home-relative path, as the shell would have expanded it (Hydra's grammar
            arg = f"{key}={os.path.expanduser(value)}"  # cannot read a leading ~)
        try:
            parsed.append(parser.parse_override(arg))
        except HydraException as exc:
            out.errors.append(f"could not parse the override {arg!r}: {' '.join(str(exc).split())}")
    return parsed


def _group_overrides(parsed, groups: dict, out: PreparedOverrides) -> tuple[list[str], list]:
    """Group selections (checked against the option files, verl habits rewritten) and the remaining key overrides."""
    chosen = {o.key_or_group for o in parsed if o.key_or_group in groups}
    selections, rest = [], []
    for o in parsed:
        key, line = o.key_or_group, o.input_line
        if key in groups and not o.is_sweep_override():
            if not o.is_delete() and o.value() not in groups[key]:
                out.errors.append(f"unknown option {key}={o.value()} (configs/{key}/{o.value()}.yaml does not "
                                  f"exist): expected one of {groups[key]}")
            else:
                selections.append(line)
        elif key == "actor_rollout_ref.rollout.name" and "rollout" not in chosen and not o.is_sweep_override() \
                and o.value() in groups.get("rollout", []):
            selections.append(f"rollout={o.value()}")
            out.notes.append(f"{line}: selects the rollout group rollout={o.value()}")
        else:
            rest.append(o)
            if key == "actor_rollout_ref.model.path" and "model" not in chosen and "hf" in groups.get("model", []) \
                    and not o.is_sweep_override() and o.value() is not None:
                selections.append("model=hf")
                chosen.add("model")
                out.notes.append(f"{line}: selects model=hf (a Hugging Face folder, the root config's settings)")
    return selections, rest


def _other_group_keys(config_dir: str, config_name: str, selections: list[str], choices: dict,
                      groups: dict) -> list[tuple[str, str, set]]:
    """``(group, option, keys)`` of every option not chosen, for the hint "add group=option"."""
    out = []
    for group, options in groups.items():
        for option in options:
            if choices.get(group) == option:
                continue
            try:
                cfg, _ = _compose(config_dir, config_name, [*selections, f"{group}={option}"])
            except Exception:  # noqa: BLE001 (an option that does not compose with the others gives no hint)
                continue
            out.append((group, option, set(_leaf_keys(cfg))))
    return out


def prepare_overrides(args: list[str], config_dir: str | None = None,
                      config_name: str = "ppo_trainer") -> PreparedOverrides:
    """Check every override of ``args`` against the composed config's keys and verl's; see the module docstring.

    Returns:
        :class:`PreparedOverrides`: the overrides for Hydra (verl keys as ``++key=value``) and all errors found.
    """
    from trainer.verl_compat import leaves, match, override_errors

    config_dir = config_dir or CONFIG_DIR
    out = PreparedOverrides()
    parsed = _parse(args, out)
    groups = config_groups(config_dir)
    selections, rest = _group_overrides(parsed, groups, out)
    out.overrides.extend(selections)
    try:
        schema, choices = _compose(config_dir, config_name, selections)
    except Exception as exc:  # noqa: BLE001 (a composition error of the groups themselves, reported as one line)
        out.errors.append(" ".join(str(exc).split()).split(" Config search path:")[0])
        return out
    unknown = []
    for o in rest:
        key, line = o.key_or_group, o.input_line
        body = line.lstrip("+~")
        renamed = next((new for old, new in RENAMED_KEYS.items() if key == old or key.startswith(old + ".")), None)
        status = key_status(schema, key)
        value = None if o.is_delete() or o.is_sweep_override() else o.value()
        if renamed:
            out.errors.append(f"config key {key!r} was renamed: use {renamed!r}")
        elif status == "ours":
            out.overrides.append(f"++{body}" if o.is_add() else line)
        elif status == "free":
            out.overrides.append(line if o.is_delete() else f"++{body}")
        elif o.is_delete():
            out.overrides.append(line)
        elif all(match(k) is not None for k, _ in (leaves(value, key) if isinstance(value, dict) and value
                                                   else [(key, value)])):
            out.overrides.append(f"++{body}")
            out.errors.extend(override_errors(key, value))
        else:
            unknown.append(key)
    if unknown:
        _unknown_key_errors(unknown, schema, config_dir, config_name, selections, choices, groups, out)
    if not out.errors:
        _check_composes(config_dir, config_name, out)
    return out


def _check_composes(config_dir: str, config_name: str, out: PreparedOverrides) -> None:
    """Compose the config with every override as Hydra will (a deletion of a key that is not there, a type that
    OmegaConf refuses): its error becomes one line instead of Hydra's report."""
    keys = [o for o in out.overrides if not o.startswith("-") and not o.lstrip("+~").startswith("hydra.")
            and ("=" in o or o.startswith("~"))]
    try:
        _compose(config_dir, config_name, keys)
    except Exception as exc:  # noqa: BLE001 (Hydra and OmegaConf raise several kinds)
        message = " ".join(str(exc).split()).split(" Config search path:")[0]
        out.errors.append(f"could not apply the overrides: {message}")


def _unknown_key_errors(unknown, schema, config_dir, config_name, selections, choices, groups, out) -> None:
    others = _other_group_keys(config_dir, config_name, selections, choices, groups)
    hints: dict[tuple[str, str], list[str]] = {}
    known = _leaf_keys(schema)
    for key in unknown:
        where = next(((g, o) for g, o, keys in others if key in keys or any(k.startswith(key + ".") for k in keys)),
                     None)
        if where is not None:
            hints.setdefault(where, []).append(key)
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        out.errors.append(f"unknown config key {key!r}: it is not in configs/{config_name}.yaml or its groups, nor one "
                          f"of verl's keys (check the spelling{hint})")
    for (group, option), keys in hints.items():
        what = "a key" if len(keys) == 1 else "keys"
        out.errors.append(f"{', '.join(keys)}: {what} of {group}={option}{GROUP_LABELS.get((group, option), '')}; "
                          f"add {group}={option}")


def check_overrides(overrides: list[str], config_dir: str | None = None, config_name: str = "ppo_trainer") -> list[str]:
    """:func:`prepare_overrides`, raising every error found; returns the overrides to give Hydra.

    Raises:
        ConfigError: one error (renamed or unknown key, unknown group option, refused verl value);
            :class:`ConfigErrors` for several, one per line.
    """
    prepared = prepare_overrides(overrides, config_dir, config_name)
    if len(prepared.errors) == 1:
        raise ConfigError(prepared.errors[0])
    if prepared.errors:
        raise ConfigErrors(prepared.errors)
    return prepared.overrides
