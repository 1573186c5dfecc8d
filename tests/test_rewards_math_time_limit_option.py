"""The MATH scorer's own time limit (``timeout_seconds``) takes a finite number of seconds > 0, or null (None) for no
limit (case P27). Before, ``timeout_seconds=-1`` or ``0`` silently meant no limit and ``nan`` made every math-verify
comparison score 0, and ``+reward_model.scorer_kwargs.timeout_seconds=-1`` started and ran with exit 0. Now such a
value stops the run before start-up in one line naming the key, and a direct call raises ValueError."""
import math

import pytest

from rewards import math as M
from rewards.math_guards import time_bound
from rewards.options import OptionValueError, ValueRule, check_scorer_options
from rewards.registry import get_scorer
from tests.test_reliability_config import assert_one_line_error, run_cli
from tests.test_rewards_options import _check_config

BAD = [-1, 0, 0.0, -0.5, math.nan, math.inf]


@pytest.mark.parametrize("value", BAD)
def test_p27_a_time_limit_that_is_not_a_finite_positive_number_is_refused_as_an_option(value):
    for name in ("math", "math500"):
        with pytest.raises(OptionValueError, match=r"timeout_seconds=.*expected a finite number of seconds > 0, or "
                                                   r"null \(None\) for no limit"):
            check_scorer_options(get_scorer(name), {"timeout_seconds": value}, name)


@pytest.mark.parametrize("value", BAD)
def test_p27_a_time_limit_that_is_not_a_finite_positive_number_raises_when_called(value):
    with pytest.raises(ValueError, match=r"^timeout_seconds=.*: expected a finite number of seconds > 0"):
        M.compute_score("\\boxed{x^2+1}", "1+x^2", timeout_seconds=value)
    with pytest.raises(ValueError, match=r"^timeout_seconds="):
        M.is_equiv("x^2+1", "1+x^2", timeout_seconds=value)
    with pytest.raises(ValueError, match=r"^timeout_seconds="):
        get_scorer("math")("\\boxed{2}", "2", timeout_seconds=value)
    with pytest.raises(ValueError), time_bound(value):
        pass


@pytest.mark.parametrize("value", [None, 0.05, 1, 2.5, 30])
def test_p27_a_positive_time_limit_or_none_passes_and_scores(value):
    check_scorer_options(get_scorer("math"), {"timeout_seconds": value}, "math")
    assert M.compute_score("\\boxed{\\frac{1}{2}}", "0.5", timeout_seconds=value) == 1.0


def test_p27_a_bad_time_limit_is_one_line_naming_its_key_before_start():
    for given, shown in (("-1", "-1"), ("0", "0"), ("nan", "nan"), ("inf", "inf")):
        with pytest.raises(Exception) as info:
            _check_config(f"+reward_model.scorer_kwargs.timeout_seconds={given}", sources=["math500"])
        assert str(info.value).startswith(f"reward_model.scorer_kwargs.timeout_seconds={shown}: expected a finite "
                                          "number of seconds > 0, or null (None) for no limit (a parameter of scorer "
                                          "'math500'"), str(info.value)
    # the wrong type is still named by the type
    with pytest.raises(Exception, match=r"^reward_model.scorer_kwargs.timeout_seconds='abc': expected float \| None"):
        _check_config("+reward_model.scorer_kwargs.timeout_seconds=abc", sources=["math500"])
    _check_config("+reward_model.scorer_kwargs.timeout_seconds=null", sources=["math500"])
    _check_config("+reward_model.scorer_kwargs.timeout_seconds=0.5", sources=["math500"])


def test_p27_a_value_rule_only_judges_values_of_its_type():
    rule = ValueRule(lambda v: v > 0, "> 0")
    rule.check("k", None)
    rule.check("k", 1)
    with pytest.raises(ValueError, match=r"^k=-1: expected > 0$"):
        rule.check("k", -1)


def test_p27_a_bad_time_limit_stops_main_before_workers(tmp_path):
    proc = run_cli(str(tmp_path / "out"), "trainer.total_training_steps=1", "reward_model.scorer=math",
                   "+reward_model.scorer_kwargs.timeout_seconds=-1", forked=True)
    assert_one_line_error(proc, "reward_model.scorer_kwargs.timeout_seconds=-1: expected a finite number of seconds > 0,"
                                " or null (None) for no limit")


def test_a_limit_that_passes_before_the_block_starts_leaves_no_timer_armed():
    """A 1-microsecond limit fired before the timer's cleanup was set up: the 5 ms interval timer stayed armed and
    its handler in place, and later code (the next scoring call) was interrupted by ``ScorerTimeout``."""
    import signal
    import time

    M.compute_score(r"\boxed{1}", "1")
    for _ in range(20):
        M.compute_score(r"\boxed{\frac{2}{4}x}", r"\frac{x}{2}", timeout_seconds=1e-6)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert [M.compute_score(r"\boxed{x/2+1}", r"\frac{x}{2}+1") for _ in range(3)] == [1.0, 1.0, 1.0]
    end = time.monotonic() + 0.05
    while time.monotonic() < end:  # no alarm left to interrupt unrelated code
        sum(range(1000))
