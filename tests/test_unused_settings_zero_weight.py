"""A term switched on whose coefficient is 0 (``trainer/unused_settings.py``: :data:`ZERO_WEIGHTED`): the opposite of
a setting that a switched-off choice leaves unused. Found by trying it: ``algorithm.use_kl_in_reward=true`` with
``algorithm.kl_ctrl.kl_coef=0.0`` (a value configs/ ships, prime.yaml's) ran without a word while the penalty
weighed nothing (the adaptive controller only multiplies the coefficient: 0 forever), and likewise
``actor.use_kl_loss=true`` with ``kl_loss_coef=0``. Each now gets one warning line naming both keys."""
import pytest

A = "actor_rollout_ref.actor"
CASES = {
    "kl_in_reward_fixed": (["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.0"],
                           "algorithm.kl_ctrl.kl_coef=0.0 with algorithm.use_kl_in_reward=true: no effect"),
    "kl_in_reward_adaptive": (["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0",
                               "algorithm.kl_ctrl.type=adaptive"], "0 stays 0"),
    "kl_loss": ([f"{A}.use_kl_loss=true", f"{A}.kl_loss_coef=0"],
                f"{A}.kl_loss_coef=0 with {A}.use_kl_loss=true: no effect"),
    "overlong": (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=16",
                  "reward_model.overlong_buffer.penalty_factor=0"],
                 "reward_model.overlong_buffer.penalty_factor=0 with reward_model.overlong_buffer.enable=true"),
}


def _zero_warnings(overrides):
    from tests.verl_scripts import composed

    return [w for w in composed(overrides)[3].warnings if " with " in w and ": no effect: " in w]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_term_switched_on_with_a_zero_coefficient_warns(case):
    overrides, needle = CASES[case]
    hits = _zero_warnings(overrides)
    assert len(hits) == 1 and needle in hits[0] and "\n" not in hits[0], hits


@pytest.mark.parametrize("overrides", [
    ["algorithm.use_kl_in_reward=true"],                                  # kl_coef 0.001: weighs something
    [f"{A}.use_kl_loss=true"],
    ["algorithm=prime"],                                                  # kl_coef 0.0 shipped, the switch off
    ["algorithm.use_kl_in_reward=false", "algorithm.kl_ctrl.kl_coef=0"],
    [f"{A}.use_kl_loss=false", f"{A}.kl_loss_coef=0"],
])
def test_no_zero_weight_warning_when_the_term_weighs_or_is_off(overrides):
    assert _zero_warnings(overrides) == []


def test_prime_with_use_kl_in_reward_is_warned_once():
    """PRIME never reads the in-reward penalty (its own warning says so); its kl_coef 0 adds no second line."""
    from tests.verl_scripts import composed

    warnings = composed(["algorithm=prime", "algorithm.use_kl_in_reward=true"])[3].warnings
    assert [w for w in warnings if "use_kl_in_reward" in w] == [
        w for w in warnings if w.startswith("algorithm.use_kl_in_reward=true: no effect with algorithm=prime")]
    assert len([w for w in warnings if "use_kl_in_reward" in w]) == 1


def test_zero_weight_warnings_read_a_plain_config():
    from trainer.unused_settings import zero_weight_warnings

    cfg = {"algorithm": {"use_kl_in_reward": True, "kl_ctrl": {"type": "fixed", "kl_coef": 0}},
           "actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": "0.0"}},
           "reward_model": {"overlong_buffer": {"enable": False, "penalty_factor": 0.0}}}
    assert [w.split(" with ")[0] for w in zero_weight_warnings(cfg)] == [
        "algorithm.kl_ctrl.kl_coef=0", f"{A}.kl_loss_coef=0.0"]


def _warnings(overrides, prefix):
    from tests.verl_scripts import composed

    return [w for w in composed(overrides)[3].warnings if w.startswith(prefix)]


@pytest.mark.parametrize("overrides,key", [
    ([f"{A}.optim.lr=0"], f"{A}.optim.lr=0"),
    (["algorithm=gae", "critic.optim.lr=0.0"], "critic.optim.lr=0.0"),
    (["critic.enable=true", "critic.optim.lr=0"], "critic.optim.lr=0")])
def test_lr0_a_trained_role_with_a_zero_learning_rate_warns_that_it_is_never_updated(overrides, key):
    hits = _warnings(overrides, key)
    assert len(hits) == 1 and "its weights are never changed" in hits[0] and "\n" not in hits[0], hits


@pytest.mark.parametrize("overrides", [[f"{A}.optim.lr=1e-6"], ["algorithm=gae", "critic.optim.lr=1e-5"]])
def test_no_zero_lr_warning_for_a_learning_rate_above_0(overrides):
    assert [w for w in _warnings(overrides, "") if "never changed" in w] == []


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce_plus_plus"])
def test_cfg24_critic_enable_with_an_estimator_that_reads_no_values_warns(algo):
    hits = _warnings([f"algorithm={algo}", "critic.enable=true"], "critic.enable=true")
    assert hits == [f"critic.enable=true: no effect: algorithm.adv_estimator={algo} does not read values, so the "
                    "critic is trained every step and never used; set critic.enable=false (or null), or algorithm=gae"]


@pytest.mark.parametrize("overrides", [["algorithm=gae", "critic.enable=true"], ["algorithm=gae"],
                                       ["critic.enable=false"], []])
def test_no_unread_critic_warning_when_the_estimator_reads_values_or_the_critic_is_off(overrides):
    assert _warnings(overrides, "critic.enable") == []
