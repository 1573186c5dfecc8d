"""The algorithm's plug-ins of the training step (:mod:`trainer.hooks.base`): the PPO/GRPO default
(:class:`~trainer.hooks.base.EstimatorAdvantage`), the critic, PRIME and DAPO's dynamic sampling.
:func:`build_hooks` picks them from the config."""
from __future__ import annotations

from trainer.hooks.base import AlgorithmHooks, EstimatorAdvantage, StepContext, StepHook

__all__ = ["AlgorithmHooks", "EstimatorAdvantage", "StepContext", "StepHook", "build_hooks"]


def build_hooks(config, world: int, pad_token_id: int, batches_per_epoch: int) -> AlgorithmHooks:
    """The run's hooks, in the order the step asks them: dynamic sampling (``algorithm.filter_groups.enable``),
    the critic (``critic.enable``), then the advantage's owner: PRIME (``algorithm.use_prime``) or the registry's
    estimator (``algorithm.adv_estimator``).

    Args:
        config: the resolved config.
        world: workers per role.
        pad_token_id: the tokenizer's pad id (dynamic sampling joins prompt batches of different widths).
        batches_per_epoch: prompt batches of the loader per epoch (dynamic sampling without a cap stops there).

    Raises:
        ValueError: a PRIME setting out of range, or an unknown estimator.
    """
    from trainer.hooks.critic import CriticHook
    from trainer.hooks.dynamic_sampling import DynamicSampling, FilterGroupsConfig
    from trainer.hooks.prime import PrimeHook, prime_enabled

    algo = config["algorithm"]
    hooks: list[StepHook] = []
    fg = FilterGroupsConfig.from_config(algo.get("filter_groups"))
    if fg.enable:
        hooks.append(DynamicSampling(fg, want_groups=int(config["data"]["train_batch_size"]),
                                     n=int(config["actor_rollout_ref"]["rollout"]["n"]), pad_token_id=pad_token_id,
                                     no_cap_limit=batches_per_epoch))
    if config["critic"]["enable"]:
        hooks.append(CriticHook(config["critic"]))
    hooks.append(PrimeHook(config, world) if prime_enabled(config) else EstimatorAdvantage(algo))
    return AlgorithmHooks(hooks)
