"""When the actor's old log-probs need a pass of their own, and when the update's forward gives them.

PPO's ratio compares ``pi_theta`` with ``pi_old``, the policy that the step starts from. When the actor update is
ONE optimizer step over the whole batch (``actor.ppo_epochs = 1`` and the batch is one mini-batch,
``ppo_mini_batch_size * rollout.n`` rows), every row's forward in the update runs with exactly those starting
weights, so ``pi_old = pi_theta`` there: the update can take ``pi_old`` from its own forward, detached
(:func:`trainer.workers.update.check_on_policy`), and the separate no-gradient pass over the batch (the
``old_log_prob`` stage) is not needed. TRL skips that pass in this case (it uses the current log-probs detached)
and verl's actor update uses ``log_prob.detach()`` when ``len(mini_batches) == 1 and ppo_epochs == 1``
(``dp_actor.update_policy``'s ``on_policy``). Loss, gradient and the logged metrics are the same either way
(tests/test_on_policy_update.py); the two metrics the pass used to give come from the update's forward instead:
``actor/entropy`` and ``rollout/log_prob_diff_mean`` / ``_max`` (:class:`trainer.algos.rollout_correction.
LogProbGap`).

The pass still runs whenever something reads ``old_log_probs`` before the update or the update is more than one
step (:meth:`OnPolicyRule.reasons`):

* ``actor.ppo_epochs > 1`` or more than one mini-batch in the step's batch;
* ``algorithm.use_kl_in_reward`` (the in-reward KL penalty reads ``old_log_probs``);
* ``algorithm.rollout_correction.rollout_is`` (importance weights from ``old_log_probs - rollout_log_probs``);
* an advantage estimator that reads ``old_log_probs``, ``entropys`` or ``sum_pi_squared``;
* a separate rollout placement (``trainer.rollout_placement=separate``: the pipelined, possibly stale rollout);
* a step whose actor is not updated (``trainer.critic_warmup``): the pass's metrics are then the only ones.

No config key: the rule decides, and the step's ``perf/old_log_prob_pass`` metric (1: the pass ran, 0: the
update's forward gave ``pi_old``) says which path ran.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["OnPolicyRule", "PASS_COLUMNS", "OLD_FROM_UPDATE", "pass_blockers", "pass_never_runs"]

#: ``batch.meta`` key the trainer sets instead of running the pass: the actor update takes ``pi_old`` from its own
#: forward (:func:`trainer.workers.update.ppo_update`); a batch without it and without ``old_log_probs`` is an error
OLD_FROM_UPDATE = "old_log_probs_from_update"
#: columns of the actor's old-log-prob pass; an estimator reading any of them needs the pass before the advantage
PASS_COLUMNS = ("old_log_probs", "entropys", "sum_pi_squared")


@dataclass(frozen=True)
class OnPolicyRule:
    """The old-log-prob rule of one run (see the module docstring).

    Attributes:
        update_rows: rows of one optimizer step of the actor, ``ppo_mini_batch_size * rollout.n``.
        blockers: why the pass always runs in this run (config reasons, empty when only the batch decides).
    """

    update_rows: int
    blockers: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict, separate_rollout: bool) -> "OnPolicyRule":
        """The rule of a resolved run config (plain dict); ``separate_rollout``: the run has rollout workers of its
        own (``trainer.rollout_placement=separate``)."""
        blockers = pass_blockers(config, separate_rollout)
        arr = config["actor_rollout_ref"]
        rule = cls(int(arr["actor"]["ppo_mini_batch_size"]) * int(arr["rollout"]["n"]), blockers)
        if not blockers:
            logger.info("old log-probs: from the update's forward in steps whose batch is one actor mini-batch of %d "
                        "rows (no separate pass; actor_rollout_ref.rollout.log_prob_* size that pass when it runs)",
                        rule.update_rows)
        return rule

    def reasons(self, rows: int, actor_updates: bool) -> list[str]:
        """Why a step of ``rows`` rows needs the separate pass (empty: the update's forward gives ``pi_old``).

        Args:
            rows: rows of the step's batch after filtering.
            actor_updates: the actor is updated in this step (False during ``trainer.critic_warmup``).
        """
        out = list(self.blockers)
        if rows != self.update_rows:
            out.append(f"{rows} rows are not one actor mini-batch of {self.update_rows} rows")
        if not actor_updates:
            out.append("the actor is not updated in this step (trainer.critic_warmup)")
        return out

    def needs_pass(self, rows: int, actor_updates: bool) -> bool:
        """Whether a step of ``rows`` rows runs the old-log-prob pass (:meth:`reasons` is not empty)."""
        return bool(self.reasons(rows, actor_updates))


def pass_blockers(config: dict, separate_rollout: bool) -> tuple[str, ...]:
    """Why the old-log-prob pass always runs in the run of ``config`` (a resolved run config, plain dict), whatever
    its batch: :attr:`OnPolicyRule.blockers` (empty when only the batch decides)."""
    from trainer import core_algos
    from trainer.algos.rollout_correction import RolloutCorrection

    arr, algo = config["actor_rollout_ref"], config["algorithm"]
    actor = arr["actor"]
    blockers = []
    if int(actor["ppo_epochs"]) != 1:
        blockers.append(f"actor_rollout_ref.actor.ppo_epochs={actor['ppo_epochs']}")
    if algo.get("use_kl_in_reward"):
        blockers.append("algorithm.use_kl_in_reward=true")
    correction = RolloutCorrection.from_config(algo.get("rollout_correction"))
    if correction.enabled:
        blockers.append(f"algorithm.rollout_correction.rollout_is={correction.rollout_is}")
    try:
        spec = core_algos.get_adv_estimator_spec(algo.get("adv_estimator"))
    except (KeyError, ValueError):  # not a registered estimator: the config check names it
        spec = None
    reads = [c for c in PASS_COLUMNS if spec is not None and c in spec.inputs]
    if reads:
        blockers.append(f"algorithm.adv_estimator={spec.name} reads {', '.join(reads)}")
    if separate_rollout:
        blockers.append("trainer.rollout_placement=separate")
    return tuple(blockers)


def pass_never_runs(config: dict) -> bool:
    """Whether no step of the run of ``config`` (a resolved run config, plain dict) runs the old-log-prob pass: no
    :func:`pass_blockers`, one actor mini-batch per step (``ppo_mini_batch_size`` = ``data.train_batch_size``:
    every filter keeps that many groups) and no ``trainer.critic_warmup`` steps. False for values that are not
    numbers (their checks name them)."""
    try:
        separate = (config.get("trainer") or {}).get("rollout_placement") == "separate"
        one_step = int(config["data"]["train_batch_size"]) == int(config["actor_rollout_ref"]["actor"]
                                                                   ["ppo_mini_batch_size"])
        warmup = int((config.get("trainer") or {}).get("critic_warmup") or 0) > 0
        return one_step and not warmup and not pass_blockers(config, separate)
    except (TypeError, ValueError, KeyError):
        return False
