"""Name registries for advantage estimators and policy losses, with each entry's traits.

Adding an estimator is one decorated function; its traits are declared with it and every other part of the
framework (config checks, the trainer's input stages, the config-error messages) asks the registry::

    @register_adv_est("my_est", group_based=True, inputs=("old_log_probs",), config_kwargs=("epsilon",))
    def my_est(token_level_rewards, response_mask, index=None, old_log_probs=None, epsilon=1e-6, **kwargs): ...

An input that no stage produces yet comes with its producer, ``inputs={"my_col": fn}``, where
``fn(step, batch) -> tensor`` (see :mod:`trainer.adv_inputs`). Names follow verl (``algorithm.adv_estimator``,
``actor.policy_loss.loss_mode``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Mapping

__all__ = ["AdvantageEstimator", "EstimatorSpec", "PolicyLossSpec", "ADV_ESTIMATOR_REGISTRY", "ADV_ESTIMATOR_SPECS",
           "POLICY_LOSS_REGISTRY", "POLICY_LOSS_SPECS", "register_adv_est", "get_adv_estimator_fn",
           "get_adv_estimator_spec", "register_policy_loss", "get_policy_loss_fn", "get_policy_loss_spec"]

ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}
ADV_ESTIMATOR_SPECS: dict[str, "EstimatorSpec"] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable] = {}
POLICY_LOSS_SPECS: dict[str, "PolicyLossSpec"] = {}


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator and what it needs.

    Attributes:
        name: ``algorithm.adv_estimator`` value.
        fn: ``fn(token_level_rewards, response_mask, index=None, **inputs, **config_kwargs) -> (adv, returns)``.
        needs_critic: the estimator reads critic ``values`` (``critic.enable`` defaults to this).
        group_based: its baseline is the other responses of the same prompt (needs ``rollout.n >= 2``).
        inputs: batch columns it reads besides ``token_level_rewards``, ``response_mask`` and ``uid``, passed as
            keyword arguments of the same name.
        producers: ``{column: fn(step, batch) -> tensor}`` for inputs no built-in stage produces (``step``: the
            training step's :class:`trainer.hooks.base.StepContext`).
        config_kwargs: ``algorithm.<key>`` values passed as keyword arguments when set.
    """

    name: str
    fn: Callable
    needs_critic: bool = False
    group_based: bool = False
    inputs: tuple[str, ...] = ()
    producers: Mapping[str, Callable] = field(default_factory=dict)
    config_kwargs: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss and its traits.

    Attributes:
        name: ``actor.policy_loss.loss_mode`` value.
        fn: ``fn(old_log_probs, log_probs, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
            **agg_kwargs) -> (loss, metrics)``; every metric is a mean over the call's valid tokens.
        micro_batch_local: the loss selects tokens by a statistic of the micro-batch it is called on (Clip-Cov,
            KL-Cov), so its value depends on the micro-batch split, as in its reference implementation.
    """

    name: str
    fn: Callable
    micro_batch_local: bool = False


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (a ``str`` enum: ``AdvantageEstimator.GRPO == "grpo"``)."""

    GAE = "gae"
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    GDPO = "gdpo"


def _key(name) -> str:
    return name.value if isinstance(name, Enum) else str(name)


def _same_function(a: Callable, b: Callable) -> bool:
    # A module reloaded in the same process re-creates its functions; treat those as the same function.
    return a is b or (getattr(a, "__module__", None) == getattr(b, "__module__", None)
                      and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None))


def _register(registry: dict, specs: dict, kind: str, name, make_spec) -> Callable[[Callable], Callable]:
    key = _key(name)

    def decorator(fn: Callable) -> Callable:
        if key in registry and not _same_function(registry[key], fn):
            raise ValueError(f"{kind} {key!r} is already registered to {registry[key].__qualname__}; "
                             f"cannot register {getattr(fn, '__qualname__', fn)} under the same name")
        fresh = key not in registry or key not in specs  # the same function again keeps the traits it was given
        specs[key] = make_spec(key, fn) if fresh else replace(specs[key], fn=fn)
        registry[key] = fn
        return fn

    return decorator


def _get(registry: dict, kind: str, name):
    key = _key(name)
    if key not in registry:
        raise ValueError(f"unknown {kind} {key!r}; known: {sorted(registry)}")
    return registry[key]


def register_adv_est(name: str | AdvantageEstimator, *, needs_critic: bool = False, group_based: bool = False,
                     inputs: tuple[str, ...] | Mapping[str, Callable | None] = (),
                     config_kwargs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name`` with its traits (see :class:`EstimatorSpec`).

    ``inputs`` is a tuple of column names, or a mapping ``{column: producer or None}`` (None: a built-in stage
    produces it).

    Raises:
        ValueError: if a different function is already registered under ``name``.
    """
    producers = {k: v for k, v in inputs.items() if v is not None} if isinstance(inputs, Mapping) else {}
    return _register(ADV_ESTIMATOR_REGISTRY, ADV_ESTIMATOR_SPECS, "advantage estimator", name,
                     lambda key, fn: EstimatorSpec(key, fn, needs_critic, group_based, tuple(inputs), producers,
                                                   tuple(config_kwargs)))


def get_adv_estimator_fn(name: str | AdvantageEstimator) -> Callable:
    """The estimator registered under ``name``. Raises ``ValueError`` listing the known names if unknown."""
    return _get(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_spec(name: str | AdvantageEstimator) -> EstimatorSpec:
    """The :class:`EstimatorSpec` registered under ``name``. Raises ``ValueError`` listing the known names."""
    _get(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)
    return ADV_ESTIMATOR_SPECS[_key(name)]


def register_policy_loss(name: str, *, micro_batch_local: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name`` (``actor.policy_loss.loss_mode`` in configs).

    Raises:
        ValueError: if a different function is already registered under ``name``.
    """
    return _register(POLICY_LOSS_REGISTRY, POLICY_LOSS_SPECS, "policy loss", name,
                     lambda key, fn: PolicyLossSpec(key, fn, micro_batch_local))


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered under ``name``. Raises ``ValueError`` listing the known names if unknown."""
    return _get(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_spec(name: str) -> PolicyLossSpec:
    """The :class:`PolicyLossSpec` registered under ``name``. Raises ``ValueError`` listing the known names."""
    _get(POLICY_LOSS_REGISTRY, "policy loss", name)
    return POLICY_LOSS_SPECS[_key(name)]
