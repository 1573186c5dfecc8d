"""PPO-family algorithm pieces (pure tensor functions), re-exported by :mod:`trainer.core_algos`.

``masked``: masked statistics; ``registry``: name registries; ``advantages``: advantage estimators;
``kl``: KL estimators and controllers; ``losses``: loss aggregation, policy/value/entropy losses.
"""
