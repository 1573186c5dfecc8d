"""Name registries for advantage estimators and policy losses.

Adding an estimator or a policy loss is one decorated function::

    @register_adv_est("my_est")
    def my_est(token_level_rewards, response_mask, index=None, values=None, gamma=1.0, lam=1.0, **kwargs): ...

Names follow verl (``algorithm.adv_estimator``, ``actor.policy_loss.loss_mode``).
"""
from __future__ import annotations

from enum import Enum
from typing import Callable

__all__ = ["AdvantageEstimator", "ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY", "register_adv_est",
           "get_adv_estimator_fn", "register_policy_loss", "get_policy_loss_fn"]

ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable] = {}


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (a ``str`` enum: ``AdvantageEstimator.GRPO == "grpo"``)."""

    GAE = "gae"
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"


def _key(name) -> str:
    return name.value if isinstance(name, Enum) else str(name)


def _same_function(a: Callable, b: Callable) -> bool:
    # A module reloaded in the same process re-creates its functions; treat those as the same function.
    return a is b or (getattr(a, "__module__", None) == getattr(b, "__module__", None)
                      and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None))


def _register(registry: dict, kind: str, name) -> Callable[[Callable], Callable]:
    key = _key(name)

    def decorator(fn: Callable) -> Callable:
        if key in registry and not _same_function(registry[key], fn):
            raise ValueError(f"{kind} {key!r} is already registered to {registry[key].__qualname__}; "
                             f"cannot register {getattr(fn, '__qualname__', fn)} under the same name")
        registry[key] = fn
        return fn

    return decorator


def _get(registry: dict, kind: str, name) -> Callable:
    key = _key(name)
    if key not in registry:
        raise ValueError(f"unknown {kind} {key!r}; known: {sorted(registry)}")
    return registry[key]


def register_adv_est(name: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name``.

    Raises:
        ValueError: if a different function is already registered under ``name``.
    """
    return _register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str | AdvantageEstimator) -> Callable:
    """The estimator registered under ``name``. Raises ``ValueError`` listing the known names if unknown."""
    return _get(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name`` (``actor.policy_loss.loss_mode`` in configs).

    Raises:
        ValueError: if a different function is already registered under ``name``.
    """
    return _register(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered under ``name``. Raises ``ValueError`` listing the known names if unknown."""
    return _get(POLICY_LOSS_REGISTRY, "policy loss", name)
