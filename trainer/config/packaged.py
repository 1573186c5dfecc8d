"""Sections of the packaged config (``configs/``) outside a run: for tools and tests that build one worker or one
section with the defaults a run would have (``python -m`` tools, benchmarks)."""
from __future__ import annotations

import copy
import functools
from typing import Any, Sequence

__all__ = ["packaged_config", "packaged_section"]


def packaged_config(overrides: Sequence[str] = (), planned_steps: int | None = None) -> dict:
    """The packaged config composed with Hydra ``overrides`` and resolved as a run resolves it
    (:func:`trainer.launch.resolve_config`); with ``planned_steps``, planned as a run of that many batches per epoch
    (:func:`trainer.launch.plan_run_length`). Not inside a running Hydra app (it initialises Hydra itself). Each
    call returns a fresh copy (composed once per set of arguments)."""
    return copy.deepcopy(_composed(tuple(overrides), planned_steps))


@functools.lru_cache(maxsize=32)
def _composed(overrides: tuple[str, ...], planned_steps: int | None) -> dict:
    from hydra import compose, initialize_config_dir

    from trainer.config_reads import plain
    from trainer.launch import plan_run_length, resolve_config
    from trainer.overrides import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=list(overrides)))
    if planned_steps is not None:
        plan_run_length(cfg, planned_steps)
    return plain(cfg)


def packaged_section(cls, key: str, overrides: Sequence[str] = (), **values: Any):
    """``cls.from_dict`` (a :class:`trainer.config.section.Section`) of the section ``key`` (dotted) of
    :func:`packaged_config` with ``overrides``, its entries ``values`` merged over it first (a dict value updates a
    nested section key by key)."""
    node = packaged_config(overrides, planned_steps=1)
    for part in key.split("."):
        node = node[part]
    _merge(node, values)
    return cls.from_dict(node, key)


def _merge(node: dict, values: dict) -> None:
    for k, v in values.items():
        if isinstance(v, dict) and isinstance(node.get(k), dict):
            _merge(node[k], v)
        else:
            node[k] = v
