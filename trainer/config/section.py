"""The base of the typed config sections: a frozen dataclass built from one mapping of the resolved config.

A section's fields carry the YAML's key names (verl's). :meth:`Section.from_dict` reads exactly those keys (a
:class:`trainer.config_reads.TrackedDict` records each read), converts each value by the field's annotation and
runs the section's own :meth:`Section.check`. There are no defaults in Python: every key comes from
``configs/`` (a key that only some group options have, e.g. an engine's own key, is a field marked
:data:`ABSENT_OK`, None when the section lacks it).

Which keys a run reads (:mod:`trainer.config_reads`, ``DSRL_CONFIG_READS``): building a section reads its keys
without recording them; a field counts as read when code reads the attribute (its :meth:`Section.check`, or code
in the driver or a worker: the section survives pickling), so a key that fills a field nothing uses stays
unread.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from trainer.config_checks import ConfigError

__all__ = ["Section", "ABSENT_OK", "AUTO_BOOL", "finite", "bounded", "built_by", "replaced", "auto_bool"]

#: field metadata: the key may be missing from the section (then the field is None)
ABSENT_OK = {"absent_ok": True}


def built_by(fn, records_reads: bool = False) -> dict:
    """Field metadata: the value is built by ``fn(value, dotted_key)`` instead of by its annotation. With
    ``records_reads`` ``fn`` receives the config's own mapping, so the keys it reads are recorded as read (a value
    that is not a section, e.g. :class:`rollout.multiturn.MultiTurnConfig`, records nothing later)."""
    return {"build": fn, "records_reads": records_reads}


def auto_bool(value: Any, path: str) -> Any:
    """``value`` of a key that takes ``auto``, ``true`` or ``false`` (the string auto or a boolean).

    Raises:
        ConfigError: another value, ``<path>=<value>; expected auto, true or false``.
    """
    if value == "auto" or isinstance(value, bool):
        return value
    raise ConfigError(f"{path}={value!r}; expected auto, true or false")


#: field metadata: the key takes auto, true or false (:func:`auto_bool`)
AUTO_BOOL = built_by(auto_bool)


def finite(key: str, value: float) -> float:
    """``value`` when it is finite, else a ConfigError ``<key>=<value>; expected a finite number``."""
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}; expected a finite number")
    return value


def bounded(key: str, value: float, given=None, *, gt: float | None = None, ge: float | None = None,
            lt: float | None = None, le: float | None = None, why: str = "") -> float:
    """``value`` when it is finite and within the bounds given (``gt`` / ``ge`` below, ``lt`` / ``le`` above), else a
    ConfigError ``<key>=<given>; expected <the bounds>`` (``given``: the value as the config wrote it; ``why``: a
    note on what the key does, added in parentheses)."""
    finite(key, value)
    parts = [f"> {gt:g}" if gt is not None else f">= {ge:g}" if ge is not None else None,
             f"< {lt:g}" if lt is not None else f"<= {le:g}" if le is not None else None]
    ok = (gt is None or value > gt) and (ge is None or value >= ge) and (lt is None or value < lt) and \
        (le is None or value <= le)
    if not ok:
        want = " and ".join(p for p in parts if p)
        raise ConfigError(f"{key}={value if given is None else given!r}; expected a number {want}"
                          + (f" ({why})" if why else ""))
    return value


class Section:
    """Mixin of a frozen dataclass whose fields are the keys of one config section."""

    def __getattribute__(self, name: str):
        paths = object.__getattribute__(self, "__dict__").get("_paths")
        if paths is not None and name in paths:
            from trainer.config_reads import record_read

            record_read(paths[name])
        return object.__getattribute__(self, name)

    @classmethod
    def from_dict(cls, section: Mapping, key: str):
        """The section ``key`` (a dotted path, for messages) built from the mapping ``section``.

        Raises:
            ConfigError: (a ValueError) one line naming the dotted key, the value and what was expected: a
                missing key, a value of the wrong type, or a value the section's :meth:`check` refuses.
        """
        if not isinstance(section, Mapping):
            raise ConfigError(f"{key}={section!r}; expected a mapping")
        hints = typing.get_type_hints(cls)
        values, paths, given = {}, {}, {}
        for f in dataclasses.fields(cls):
            path = paths[f.name] = f"{key}.{f.name}"
            if not _has(section, f.name):
                if f.metadata.get("absent_ok"):
                    values[f.name] = None
                    continue
                raise ConfigError(f"{path} is missing; expected the key of the packaged config (configs/)")
            build = f.metadata.get("build")
            raw = given[f.name] = _raw(section, f.name)
            if build:
                values[f.name] = build(section[f.name] if f.metadata["records_reads"] else raw, path)
            else:
                values[f.name] = convert(raw, hints[f.name], path)
        return cls.made(values, paths, key, given)

    @classmethod
    def made(cls, values: dict, paths: dict[str, str], key: str, given: dict | None = None):
        """``cls(**values)``, checked by :meth:`check` (``given``: the values as the config wrote them, for its
        messages, see :meth:`given`); with ``DSRL_CONFIG_READS`` set, each field read (by the check too) is
        recorded under ``paths`` (field -> dotted key).

        Raises:
            ConfigError: from :meth:`check`.
        """
        from trainer.config_reads import tracking

        out = cls(**values)
        if tracking():  # a value a check reads counts as read: a setting the check refuses is no silent no-op
            object.__setattr__(out, "_paths", dict(paths))
        object.__setattr__(out, "_given", given or {})
        try:
            out.check(key)
        finally:
            object.__delattr__(out, "_given")
        return out

    def given(self, name: str):
        """During :meth:`check`: the value of field ``name`` as the config wrote it (e.g. ``-1`` for a float field
        holding ``-1.0``), for messages."""
        given = object.__getattribute__(self, "__dict__").get("_given") or {}
        return given.get(name, object.__getattribute__(self, name))

    def check(self, key: str) -> None:
        """Checks of this section's values beyond their types (``key``: the section's dotted path).

        Raises:
            ConfigError: naming ``<key>.<field>``, the value and what was expected.
        """


def replaced(section: Section, key: str, **changes):
    """A copy of ``section`` (the section ``key``, dotted) with the fields ``changes`` replaced, checked again by
    its :meth:`Section.check` and recording its reads as a built section does (for a value derived after the
    section was built, e.g. ``trainer.total_training_steps`` by :func:`trainer.launch.plan_run_length`).

    Raises:
        ConfigError: from :meth:`Section.check`; TypeError: a name in ``changes`` that is no field.
    """
    mine = object.__getattribute__(section, "__dict__")
    names = [f.name for f in dataclasses.fields(section)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"{type(section).__name__} has no field(s) {unknown}")
    values = {**{n: mine[n] for n in names}, **changes}
    return type(section).made(values, {n: f"{key}.{n}" for n in names}, key)


def _has(section: Mapping, name: str) -> bool:
    return dict.__contains__(section, name) if isinstance(section, dict) else name in section


def _raw(section: Mapping, name: str):
    """The value without recording a read (:class:`trainer.config_reads.TrackedDict`), as a plain copy."""
    from trainer.config_reads import plain

    return plain(dict.__getitem__(section, name)) if isinstance(section, dict) else section[name]


def convert(value: Any, hint: Any, path: str) -> Any:
    """``value`` as the annotation ``hint`` says: a :class:`Section` subclass (built from a mapping), ``int``
    (an integral number), ``float``, ``bool``, ``str``, ``dict`` (a plain copy), ``tuple`` (from a list), a union
    with None (None passes), or ``Any`` (as is).

    Raises:
        ConfigError: ``<path>=<value>; expected <what the annotation allows>``.
    """
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return convert(value, rest[0], path)
        return value  # a union of several kinds (e.g. str | list): the section's check decides
    if isinstance(hint, type) and issubclass(hint, Section):
        return hint.from_dict(value, path)
    origin = typing.get_origin(hint) or hint
    if origin is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}={value!r}; expected true or false")
        return value
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{path}={value!r}; expected an integer")
        return int(value)
    if origin is float:
        try:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}={value!r}; expected a number") from None
    if origin is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}={value!r}; expected a string")
        return value
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}={value!r}; expected a mapping")
        return dict(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}={value!r}; expected a list")
        return tuple(value)
    return value
