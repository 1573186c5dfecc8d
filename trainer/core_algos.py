"""PPO-family core algorithms (pure tensor functions), the public import point.

The code lives in :mod:`trainer.algos` (``masked``, ``registry``, ``advantages``, ``kl``, ``losses``); this
module re-exports it so that callers write ``from trainer import core_algos`` as in verl. Importing it
registers the built-in advantage estimators (gae, grpo, dr_grpo, rloo, reinforce_plus_plus,
reinforce_plus_plus_baseline, remax) and policy losses (vanilla, gspo, gpg).
"""
from trainer.algos.advantages import (compute_advantage, compute_dr_grpo_outcome_advantage,  # noqa: F401
                                      compute_gae_advantage_return, compute_grpo_outcome_advantage,
                                      compute_reinforce_plus_plus_baseline_outcome_advantage,
                                      compute_reinforce_plus_plus_outcome_advantage, compute_remax_outcome_advantage,
                                      compute_rloo_outcome_advantage, group_ids)
from trainer.algos.kl import (AdaptiveKLController, FixedKLController, apply_kl_penalty,  # noqa: F401
                              get_kl_controller, kl_penalty)
from trainer.algos.losses import (LOSS_AGG_MODES, agg_loss, compute_policy_loss_gpg,  # noqa: F401
                                  compute_policy_loss_gspo, compute_policy_loss_vanilla, compute_value_loss,
                                  entropy_from_logits)
from trainer.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten  # noqa: F401
from trainer.algos.registry import (ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY,  # noqa: F401
                                    AdvantageEstimator, get_adv_estimator_fn, get_policy_loss_fn,
                                    register_adv_est, register_policy_loss)
