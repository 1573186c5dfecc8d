"""Config checks of the algorithm: the advantage estimator, the policy loss and the loss aggregation.

Called by :func:`trainer.launch.validate` before any worker starts; every error is one :class:`ConfigError` line
naming the key, the bad value and what was expected.
"""
from __future__ import annotations

from trainer.config_checks import ConfigError

__all__ = ["check_loss_aggregation"]


def check_loss_aggregation(cfg: dict) -> None:
    """``loss_agg_mode`` of the actor and critic is a known mode; ``loss_scale_factor`` is null or > 0.

    Raises:
        ConfigError: naming the key, the value and the known modes.
    """
    from trainer.algos.losses import LOSS_AGG_MODES

    for key, section in (("actor_rollout_ref.actor", cfg["actor_rollout_ref"]["actor"]), ("critic", cfg["critic"])):
        mode = section.get("loss_agg_mode", "token-mean")
        if mode not in LOSS_AGG_MODES:
            raise ConfigError(f"{key}.loss_agg_mode={mode!r}; expected one of {list(LOSS_AGG_MODES)}")
        factor = section.get("loss_scale_factor")
        if factor is not None:
            try:
                ok = float(factor) > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ConfigError(f"{key}.loss_scale_factor={factor!r}; expected null (rollout.response_length) "
                                  "or a positive number")
