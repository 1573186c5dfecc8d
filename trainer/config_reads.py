"""Which config keys a run reads: a recording dict for the test that every key of the composed config is read.

With ``DSRL_CONFIG_READS=<folder>`` in the environment, :func:`track_reads` wraps the resolved config in
:class:`TrackedDict`; every key read through it (``cfg["a"]``, ``.get``, ``in``, iteration, ``dict(...)``,
``{**...}``) is appended once to ``<folder>/<pid>.txt`` as a dotted path, in the driver and in every Ray worker
(the wrapper survives pickling). Without the variable the config stays a plain dict and nothing is recorded.

What it covers: reads through the config object during a real run. Values copied out of the config before
the recording starts, or a whole dict handed to a library (read as a whole: all of its keys count as read when
it is copied or iterated) are covered as far as those operations go; what the test does with the record is
stated in tests/test_config_reads.py.
"""
from __future__ import annotations

import os

ENV = "DSRL_CONFIG_READS"
_seen: set[str] = set()


def _record(path: str) -> None:
    folder = os.environ.get(ENV)
    if not folder or path in _seen:
        return
    _seen.add(path)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{os.getpid()}.txt"), "a", encoding="utf-8") as f:
        f.write(path + "\n")


def tracking() -> bool:
    """Whether this process records the keys it reads (``DSRL_CONFIG_READS`` is set)."""
    return bool(os.environ.get(ENV))


def record_read(path: str) -> None:
    """Record that the key ``path`` (dotted) was read, when :func:`tracking` (typed config sections call it when a
    field is read, :class:`trainer.config.section.Section`)."""
    _record(path)


class TrackedDict(dict):
    """A dict that records the dotted path of every key read from it (see the module docstring).

    Child dicts are wrapped when the tree is built, so ``cfg["trainer"]["seed"]`` records ``trainer`` and
    ``trainer.seed``. Writes are not recorded. Pickling and :func:`plain` copy without recording.
    """

    def __init__(self, data: dict, prefix: str = ""):
        super().__init__()
        self._prefix = prefix
        for k, v in data.items():
            dict.__setitem__(self, k, _wrap(v, self._path(k)))

    def _path(self, key) -> str:
        return f"{self._prefix}.{key}" if self._prefix else str(key)

    def __getitem__(self, key):
        _record(self._path(key))
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            _record(self._path(key))
        return dict.get(self, key, default)

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key):
            _record(self._path(key))
            return True
        return False

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, _wrap(value, self._path(key)))

    def setdefault(self, key, default=None):
        if not dict.__contains__(self, key):
            self[key] = default
        return self[key]

    def pop(self, key, *default):
        if dict.__contains__(self, key):
            _record(self._path(key))
        return dict.pop(self, key, *default)

    def __iter__(self):  # also makes dict(x) and {**x} go through keys() and __getitem__
        for k in dict.keys(self):
            _record(self._path(k))
            yield k

    def keys(self):
        return list(iter(self))

    def items(self):
        return [(k, self[k]) for k in dict.keys(self)]

    def values(self):
        return [self[k] for k in dict.keys(self)]

    def copy(self):
        return {k: self[k] for k in dict.keys(self)}

    def __reduce__(self):
        return (_rebuild, (plain(self), self._prefix))


def _rebuild(data: dict, prefix: str) -> TrackedDict:
    return TrackedDict(data, prefix)


def _wrap(value, path: str):
    if isinstance(value, TrackedDict):
        return value
    if isinstance(value, dict):
        return TrackedDict(value, path)
    return value


def section_fields(section, cls, **renamed) -> dict:
    """The values of ``section`` (a config mapping, None: empty) for the fields of the dataclass ``cls`` that it
    sets, as keyword arguments for ``cls(...)``: a key the section lacks keeps the field's default. ``renamed``
    maps a field to the section's key when they differ. Each key is read through the mapping (so a
    :class:`TrackedDict` records it)."""
    import dataclasses

    section = section if section is not None else {}
    out = {}
    for f in dataclasses.fields(cls):
        key = renamed.get(f.name, f.name)
        if key in section:
            out[f.name] = section[key]
    return out


def plain(cfg):
    """A plain deep copy of ``cfg`` (dicts and lists), recording nothing (for saving or logging the config)."""
    if isinstance(cfg, dict):
        return {k: plain(dict.__getitem__(cfg, k)) for k in dict.keys(cfg)}
    if isinstance(cfg, list):
        return [plain(v) for v in cfg]
    return cfg


def track_reads(cfg: dict) -> dict:
    """``cfg`` wrapped in :class:`TrackedDict` when ``DSRL_CONFIG_READS`` is set, else ``cfg`` itself."""
    return TrackedDict(cfg) if os.environ.get(ENV) else cfg


def read_keys(folder: str) -> set[str]:
    """Every dotted path recorded in ``folder`` (all processes of a run)."""
    out: set[str] = set()
    for name in os.listdir(folder):
        if name.endswith(".txt"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out.update(line.strip() for line in f if line.strip())
    return out
