"""Value types against the packaged defaults: a key whose default is an integer takes an integer, a number takes
a number, a boolean a boolean. Checked on the Hydra config before anything starts, so that ``data.train_batch_size=abc``
or ``trainer.save_freq=1.5`` stop in one line naming the key instead of failing deep inside a worker."""
from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Any, Iterator

from trainer.config_checks import ConfigErrors

# keys whose integer default also accepts a fraction (documented in configs/ppo_trainer.yaml)
FRACTIONAL_INTS = frozenset({"actor_rollout_ref.rollout.n_gpus"})
# keys whose boolean default also accepts null, meaning that default (documented in configs/, as decode_loop's null)
NULL_IS_DEFAULT = frozenset({"actor_rollout_ref.rollout.decode_compile_regions"})


def _expected(default: Any) -> str | None:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    return None  # strings, null and containers take what their own checks allow


def _fits(value: Any, default: Any, key: str) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(default, int) and key not in FRACTIONAL_INTS:
        return isinstance(value, int) or float(value).is_integer()
    return True


def mistyped(cfg: dict, defaults: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, value, default)`` of every leaf of ``cfg`` whose value does not have the type of the same key
    in ``defaults``. Keys missing from ``defaults`` and defaults that are null, strings or containers are not
    checked here; a null value is accepted only where the default is null or the key is in
    :data:`NULL_IS_DEFAULT`."""
    out: list[tuple[str, Any, Any]] = []
    for key, value in cfg.items():
        if key not in defaults:
            continue
        path, default = f"{prefix}{key}", defaults[key]
        if isinstance(value, dict) and isinstance(default, dict):
            out += mistyped(value, default, f"{path}.")
        elif value is None and path in NULL_IS_DEFAULT:
            continue
        elif _expected(default) is not None and not _fits(value, default, path):
            out.append((path, value, default))
    return out


def _type_message(path: str, value: Any, default: Any) -> str:
    return f"{path}={value!r}; expected {_expected(default)} (default {default!r})"


def type_errors(cfg: dict, defaults: dict) -> list[str]:
    """One message per :func:`mistyped` leaf: ``key=value; expected an integer (default D)``."""
    return [_type_message(*bad) for bad in mistyped(cfg, defaults)]


_ROUNDS = 6
_NONE = object()


def _default_at(defaults: dict, path: str):
    node = defaults
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _NONE
        node = node[part]
    return _NONE if isinstance(node, dict) else node


@contextmanager
def _logs_off(off: bool) -> Iterator[None]:
    """With ``off``: no log record up to WARNING is emitted meanwhile (errors still are)."""
    before = logging.root.manager.disable
    if off:
        logging.disable(max(before, logging.WARNING))
    try:
        yield
    finally:
        logging.disable(before)


def start_errors(cfg, defaults: dict, prestart, logged: bool = False) -> list[str]:
    """Every error a run config has, at once: the :func:`type_errors` of ``cfg`` (a DictConfig) against
    ``defaults``, then those of ``prestart(cfg)`` (the launcher's checks) run on a copy whose mistyped values are
    put back to their defaults (so that a value check does not trip over ``train_batch_size='abc'``). A check
    section stops at its first bad value, so the checks run again (up to 6 rounds) with each key an error line
    names (``<key>=<value>; ...``) put back to its default, until no new line appears; a line that mentions a key
    put back is left out (it may be about the default). A check that fails otherwise than with a ConfigError adds
    nothing (its key is among the errors already). [] when all pass.

    The warnings and notes of the checks (a verl key read as another, a setting with no effect) are logged by the
    first round only, and by none with ``logged`` (the run's own start-up logged them already)."""
    from omegaconf import OmegaConf

    from trainer.config_checks import ErrorCollector, named_key

    bad = mistyped(OmegaConf.to_container(cfg, resolve=True), defaults)
    errors = ErrorCollector([_type_message(*b) for b in bad])
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    reset = set()
    for path, _, default in bad:
        OmegaConf.update(copy, path, default, merge=False)
        reset.add(path)
    for round_ in range(_ROUNDS):
        found = ErrorCollector()
        try:
            with _logs_off(logged or round_ > 0), found.check():
                prestart(copy)
        except Exception:  # noqa: BLE001 (see the docstring)
            pass
        # a line that mentions a key put back to its default may be about that default (it can disagree with the
        # run's other values), not about what the user wrote: the key's own error is already listed
        new = [m for m in found.messages if m not in errors.messages and not any(k in m for k in reset)]
        for m in new:
            errors.add(m)
        keys = {k for k in map(named_key, new) if k} - reset
        keys = {k for k in keys if _default_at(defaults, k) is not _NONE and OmegaConf.select(copy, k) is not None}
        if not keys:
            break
        for k in keys:
            OmegaConf.update(copy, k, _default_at(defaults, k), merge=False)
        reset |= keys
    return errors.messages


def all_errors(cfg, exc: Exception, prestart, logged: bool = False):
    """``exc`` (a ConfigError of the launcher) with every other error of the Hydra run config ``cfg`` added
    (:func:`start_errors` against :func:`packaged_defaults`; ``logged``: the launcher's start-up logged the
    config's warnings and notes already, they are not logged again); ``exc`` itself outside a Hydra app, when
    nothing is added, or when ``exc.alone`` is set (a refusal the other checks' lines would only confuse)."""
    from trainer.config_checks import ConfigError, ErrorCollector

    if not isinstance(exc, ConfigError) or getattr(exc, "alone", False):  # e.g. a folder a live run holds
        return exc
    defaults = packaged_defaults()
    first = str(exc).splitlines()
    more = [] if defaults is None else start_errors(cfg, defaults, prestart, logged=logged)
    lines = without_copies(ErrorCollector(first + more).messages, copied_keys(cfg))
    return ConfigErrors(lines) if lines != first else exc


_COPY = re.compile(r"^\$\{(\.*)([A-Za-z_][\w.]*)\}$")  # a value that is one interpolation: ${a.b}, ${.b}, ${..a.b}


def copied_keys(cfg) -> dict[str, str]:
    """``{dotted key: dotted key it copies}`` for every leaf of the OmegaConf config ``cfg`` written as a single
    interpolation (``ref.log_prob_max_token_len_per_gpu: ${..actor.ppo_max_token_len_per_gpu}``), relative paths made
    absolute; ``{}`` for a plain mapping."""
    from omegaconf import DictConfig

    out: dict[str, str] = {}

    def walk(node, path: list[str]) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                walk(child, path + [str(key)])
                continue
            found = _COPY.match(str(child._value())) if child is not None else None
            if found:
                dots, target = len(found.group(1)), found.group(2)
                base = path[:len(path) - dots + 1] if dots else []
                out[".".join(path + [str(key)])] = ".".join(base + [target])

    if isinstance(cfg, DictConfig):
        walk(cfg, [])
    return out


def copy_sources(key: str, copies: dict[str, str]) -> Iterator[str]:
    """The keys that ``key`` copies through ``copies`` (:func:`copied_keys`), nearest first; a loop ends it."""
    seen = {key}
    while key in copies and copies[key] not in seen:
        key = copies[key]
        seen.add(key)
        yield key


def without_copies(lines: list[str], copies: dict[str, str]) -> list[str]:
    """``lines`` less those about keys that copy (through :func:`copied_keys`, at any depth) the keys of another line:
    a line is left out when it reads as another line with each dotted key it names the same key or a copy of it
    (``critic.ppo_mini_batch_size=5 must divide ...`` beside the actor's line, a token budget refused with the same
    sizes and the copied switch): mending the source mends the copy. So is a line quoting the value of a copy whose
    source's own line refuses the same value by itself (``<key>=<value>; expected ...``): the value is refused once,
    where it was written. A copy refused for another reason (its own sizes or switch, set apart, beside it) keeps
    its line."""
    from trainer.config_checks import refused_value

    refused = {v.partition("=")[0]: v.partition("=")[2] for v in map(refused_value, lines) if v}
    split = {m: _DOTTED.split(m) for m in lines}  # text, key, text, key, ..., text

    def follows(mine: list[str], theirs: list[str]) -> bool:
        return mine != theirs and len(mine) == len(theirs) and all(
            a == b if i % 2 == 0 else (a == b or b in copy_sources(a, copies))
            for i, (a, b) in enumerate(zip(mine, theirs)))

    def source_refused(message: str) -> bool:
        key, _, value = (refused_value(message) or "").partition("=")
        return bool(key) and any(refused.get(k) == value for k in copy_sources(key, copies))

    return [m for m in lines
            if not (source_refused(m) or any(follows(split[m], split[other]) for other in lines if other != m))]


_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w.])")  # a dotted config key inside a line


def check_types(cfg: dict, defaults: dict) -> None:
    """Raise :class:`ConfigErrors` with every message of :func:`type_errors` (nothing when all fit)."""
    errors = type_errors(cfg, defaults)
    if errors:
        raise ConfigErrors(errors)


def packaged_defaults() -> dict | None:
    """The packaged config with this run's config-group choices (``algorithm=``, ``model=``, ...) and none of its
    value overrides, unresolved (interpolations stay strings); None outside a Hydra app."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    choices = HydraConfig.get().runtime.choices
    overrides = [f"{k}={v}" for k, v in choices.items() if not k.startswith("hydra") and v is not None]
    return OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=overrides), resolve=False)


def check_run_config(cfg) -> None:
    """Every value of a Hydra run config (a ``DictConfig``) resolves (:func:`unresolved_values`), then
    :func:`check_types` against :func:`packaged_defaults` (the entry point adds the errors of the other values:
    :func:`all_errors`).

    Raises:
        ConfigErrors: one line per value that does not resolve (alone: nothing else can be checked then), else one
            per mistyped value.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        values = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:  # find every value that does not resolve (only then: a walk of the whole config)
        exc = ConfigErrors(unresolved_values(cfg))
        exc.alone = True  # the other checks read resolved values
        raise exc from None
    defaults = packaged_defaults()
    if defaults is not None:
        check_types(values, defaults)


def unresolved_values(cfg) -> list[str]:
    """``<key>=<value as written>: does not resolve (<OmegaConf's reason>)`` for every leaf of the OmegaConf
    config ``cfg`` whose interpolation (``${a.b}``, ``${oc.env:X}``) or ``???`` cannot be resolved, but for keys
    that copy one of them (:func:`copied_keys`); ``[]`` for a plain mapping."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.errors import OmegaConfBaseException

    out: list[tuple[str, str]] = []

    def walk(node, path: str) -> None:
        keys = range(len(node)) if isinstance(node, ListConfig) else node.keys()
        for key in keys:
            child, name = node._get_node(key), f"{path}{key}" if isinstance(node, DictConfig) else f"{path}[{key}]"
            if isinstance(child, (DictConfig, ListConfig)) and not child._is_interpolation():
                walk(child, f"{name}." if isinstance(child, DictConfig) else name)
                continue
            try:
                node[key]  # resolves an interpolation; raises for ??? and for what does not resolve
            except OmegaConfBaseException as err:
                reason = str(err).splitlines()[0]
                out.append((name, f"{name}={child._value()}: does not resolve ({reason})"))

    if not isinstance(cfg, (DictConfig, ListConfig)):
        return []
    walk(cfg, "")
    bad, copies = {name for name, _ in out}, copied_keys(cfg)

    # a copy of a value that does not resolve is reported where the value is written
    return [line for name, line in out if not any(k in bad for k in copy_sources(name, copies))]
