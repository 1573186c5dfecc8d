"""PPO-family core algorithms (pure tensor functions), the public import point.

The code lives in :mod:`trainer.algos` (``masked``, ``registry``, ``advantages``, ``kl``, ``losses``); this
module re-exports it so that callers write ``from trainer import core_algos`` as in verl. Importing it
registers the built-in advantage estimators (``trainer.algos.advantages``, ``trainer.algos.baselines``,
``trainer.algos.multi_reward``) and policy losses (``trainer.algos.losses``, ``trainer.algos.policy_losses``);
``ADV_ESTIMATOR_SPECS`` / ``POLICY_LOSS_SPECS`` hold each entry's traits.
"""
from trainer.algos.advantages import (compute_advantage, compute_dr_grpo_outcome_advantage,  # noqa: F401
                                      compute_gae_advantage_return, compute_grpo_outcome_advantage,
                                      compute_reinforce_plus_plus_baseline_outcome_advantage,
                                      compute_reinforce_plus_plus_outcome_advantage, compute_remax_outcome_advantage,
                                      compute_rloo_outcome_advantage, group_ids)
from trainer.algos.baselines import (compute_grpo_passk_outcome_advantage,  # noqa: F401
                                     compute_opo_outcome_advantage, compute_optimal_token_baseline_advantage)
from trainer.algos.kl import (AdaptiveKLController, FixedKLController, apply_kl_penalty,  # noqa: F401
                              get_kl_controller, kl_penalty)
from trainer.algos.losses import (LOSS_AGG_MODES, agg_loss, compute_policy_loss_gpg,  # noqa: F401
                                  compute_policy_loss_gspo, compute_policy_loss_vanilla, compute_value_loss,
                                  entropy_from_logits)
from trainer.algos.policy_losses import (compute_policy_loss_cispo, compute_policy_loss_clip_cov,  # noqa: F401
                                          compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv,
                                          compute_policy_loss_geo_mean, compute_policy_loss_kl_cov,
                                          compute_policy_loss_sapo)
from trainer.algos.multi_reward import compute_gdpo_outcome_advantage  # noqa: F401
from trainer.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten  # noqa: F401
from trainer.algos.registry import (ADV_ESTIMATOR_REGISTRY, ADV_ESTIMATOR_SPECS,  # noqa: F401
                                    POLICY_LOSS_REGISTRY, POLICY_LOSS_SPECS, AdvantageEstimator, EstimatorSpec,
                                    PolicyLossSpec, get_adv_estimator_fn, get_adv_estimator_spec,
                                    get_policy_loss_fn, get_policy_loss_spec, register_adv_est,
                                    register_policy_loss)
