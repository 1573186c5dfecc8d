"""Settings under which the run trains nothing, or trains on groups of identical samples, stop before any worker
starts in one line: a critic warm-up without a critic or as long as the run (the actor is not updated during it),
greedy rollouts under a group-relative estimator, and an importance-weight clamp below 1; an LR warm-up longer than
its schedule is warned (verl's example scripts keep theirs when a test cuts their length). Before, each ran to its
end with exit 0 and no message."""
import pytest

from tests.e2e_utils import refused_in_one_line, resolved_config
from trainer.launch import ConfigError, plan_run_length, validate
from trainer.run_length_checks import check_training_happens, lr_warmup_warnings

A, R, RC = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm.rollout_correction"
S = "trainer.total_training_steps=2"


BAD = [
    # k01 / k02: the actor is not updated during the warm-up
    ((S, "trainer.critic_warmup=5"), ("trainer.critic_warmup=5", "no critic", "adv_estimator=grpo")),
    ((S, "trainer.critic_warmup=1", "algorithm=rloo"), ("trainer.critic_warmup=1", "no critic")),
    ((S, "trainer.critic_warmup=5", "algorithm=gae"), ("trainer.critic_warmup=5", "total_training_steps=2",
                                                       "never train")),
    ((S, "trainer.critic_warmup=2", "algorithm=gae"), ("trainer.critic_warmup=2", "never train")),
    # c04 / c09: greedy samples of one prompt are identical
    ((f"{R}.temperature=0",), (f"{R}.temperature=0", "adv_estimator=grpo", "every advantage would be 0")),
    ((f"{R}.do_sample=false",), (f"{R}.do_sample=false", "adv_estimator=grpo", "every advantage would be 0")),
    ((f"{R}.temperature=0", "algorithm=rloo"), (f"{R}.temperature=0", "adv_estimator=rloo")),
    # top_k=1 keeps only the most likely token: greedy too
    ((f"{R}.top_k=1",), (f"{R}.top_k=1", "adv_estimator=grpo", "every advantage would be 0")),
    # rc02 / rc01 / rc03: an importance-weight clamp below 1 cuts every weight; a bad level was a traceback
    ((f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5"), (f"{RC}.rollout_is_threshold=0.5", ">= 1")),
    ((f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=-1"), (f"{RC}.rollout_is_threshold=-1", ">= 1")),
    ((f"{RC}.rollout_is=foo",), (f"{RC}.rollout_is='foo'", "token, sequence or auto")),
]


@pytest.mark.parametrize("overrides,needles", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_b05_b06_b09_settings_that_train_nothing_are_one_line(overrides, needles):
    refused_in_one_line(validate, resolved_config(*overrides), *needles)


@pytest.mark.parametrize("overrides", [
    (S, "trainer.critic_warmup=1", "algorithm=gae"), (S, f"{A}.optim.lr_warmup_steps=2"),
    (f"{R}.temperature=0", "algorithm=gae"), (f"{R}.do_sample=false", "algorithm=reinforce_plus_plus"),
    (f"{R}.top_k=1", "algorithm=gae"), (f"{R}.top_k=2",), (f"{R}.val_kwargs.top_k=1",),
    (f"{R}.val_kwargs.temperature=0", f"{R}.val_kwargs.do_sample=false"),
    (f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=1"), (S, f"{A}.optim.lr_warmup_steps_ratio=1.0")])
def test_settings_that_train_pass(overrides):
    validate(resolved_config(*overrides))


def test_b05_b10_warmups_are_checked_against_the_length_planned_from_the_data():
    """Without trainer.total_training_steps the length comes from the data: checked once it is planned."""
    cfg = resolved_config("algorithm=gae", "trainer.critic_warmup=3", f"{A}.optim.lr_warmup_steps=3")
    validate(cfg)  # the length is not known yet
    plan_run_length(cfg, batches_per_epoch=2)
    with pytest.raises(ConfigError, match="trainer.critic_warmup=3 with trainer.total_training_steps=2"):
        check_training_happens(cfg)
    (line,) = lr_warmup_warnings(cfg)
    assert f"{A}.optim.lr_warmup_steps=3 with {A}.optim.total_training_steps=2" in line and "never reaches" in line


@pytest.mark.parametrize("overrides,needle", [
    ((S, f"{A}.optim.lr_warmup_steps=5"), f"{A}.optim.lr_warmup_steps=5 with trainer.total_training_steps=2"),
    ((S, "algorithm=gae", "critic.optim.lr_warmup_steps=3"), "critic.optim.lr_warmup_steps=3 with trainer"),
    ((f"{A}.optim.lr_warmup_steps=5", f"{A}.optim.total_training_steps=4"),
     f"{A}.optim.lr_warmup_steps=5 with {A}.optim.total_training_steps=4")])
def test_b10_an_lr_warmup_longer_than_its_schedule_is_warned(overrides, needle):
    lines = lr_warmup_warnings(resolved_config(*overrides))
    assert len(lines) == 1 and needle in lines[0], lines
    assert lr_warmup_warnings(resolved_config(S, f"{A}.optim.lr_warmup_steps=1")) == []


@pytest.mark.parametrize("overrides,needle", [
    ((S, f"{A}.optim.lr_warmup_steps=2"), f"{A}.optim.lr_warmup_steps=2 with trainer.total_training_steps=2"),
    ((S, f"{A}.optim.lr_warmup_steps_ratio=1.0"), f"{A}.optim.lr_warmup_steps_ratio=1 with trainer"),
    ((S, "algorithm=gae", "critic.optim.lr_warmup_steps_ratio=1.0"), "critic.optim.lr_warmup_steps_ratio=1 with")])
def test_cfg62_cfg65_an_lr_warmup_as_long_as_its_schedule_is_warned_with_its_true_peak(overrides, needle):
    """The linear warm-up gives the last of the run's 2 steps half the rate: warned, and the peak named is 1/2."""
    lines = lr_warmup_warnings(resolved_config(*overrides))
    assert len(lines) == 1 and needle in lines[0] and "never reaches" in lines[0], lines
    assert "its last step starts at 1/2 of it" in lines[0], lines
    assert lr_warmup_warnings(resolved_config(S, f"{A}.optim.lr_warmup_steps_ratio=0.5")) == []


def test_a_warmup_filled_in_from_the_ratio_is_named_by_its_ratio():
    cfg = resolved_config(f"{A}.optim.lr_warmup_steps_ratio=1.0")
    plan_run_length(cfg, batches_per_epoch=2)
    (line,) = lr_warmup_warnings(cfg)
    assert f"{A}.optim.lr_warmup_steps=2 (lr_warmup_steps_ratio=1) with {A}.optim.total_training_steps=2" in line


@pytest.mark.parametrize("overrides,key", [
    ((S, f"{A}.optim.lr_scheduler_type=cosine", f"{A}.optim.total_training_steps=1000"), f"{A}.optim"),
    ((S, "algorithm=gae", "critic.optim.total_training_steps=7"), "critic.optim")])
def test_cfg61_a_set_optim_total_training_steps_other_than_the_run_is_kept_and_warned(overrides, key, caplog):
    """A set optim.total_training_steps decides the schedule (a run stopped early keeps the full run's schedule),
    but verl replaces it with the run's length: one line says the schedule spans another length."""
    cfg = resolved_config(*overrides)
    given = int(key.startswith("critic") and 7 or 1000)
    with caplog.at_level("WARNING"):
        plan_run_length(cfg, batches_per_epoch=8)
    section = cfg["critic"]["optim"] if key.startswith("critic") else cfg["actor_rollout_ref"]["actor"]["optim"]
    assert section["total_training_steps"] == given
    lines = [r.getMessage() for r in caplog.records if "the learning-rate schedule spans" in r.getMessage()]
    assert lines == [f"{key}.total_training_steps={given}: the learning-rate schedule spans {given} steps while the "
                     "run trains 2 (verl's trainer would replace it with the run's length; leave it at -1 for that)"]


@pytest.mark.parametrize("overrides", [(S,), (S, f"{A}.optim.total_training_steps=2"),
                                       (S, "critic.optim.total_training_steps=9")])  # no critic: the unused line
def test_an_optim_length_left_at_minus_1_or_equal_to_the_run_is_not_warned(overrides, caplog):
    cfg = resolved_config(*overrides)
    with caplog.at_level("WARNING"):
        plan_run_length(cfg, batches_per_epoch=8)
    assert cfg["actor_rollout_ref"]["actor"]["optim"]["total_training_steps"] == 2
    assert [r for r in caplog.records if "the learning-rate schedule spans" in r.getMessage()] == []


V = f"{R}.val_kwargs"
VAL_BAD = [
    (("trainer.val_before_train=true", f"{V}.n=3"), (f"{V}.n=3", f"{V}.do_sample=false", "best@n")),
    (("trainer.test_freq=1", f"{V}.n=2", f"{V}.do_sample=true", f"{V}.temperature=1.0", f"{V}.top_k=1"),
     (f"{V}.n=2", f"{V}.top_k=1")),
    (("trainer.val_before_train=true", f"{V}.n=2", f"{V}.do_sample=true", f"{V}.temperature=0"),
     (f"{V}.n=2", f"{V}.temperature=0", "best@n")),
]


@pytest.mark.parametrize("overrides,needles", VAL_BAD, ids=[" ".join(b[0]) for b in VAL_BAD])
def test_greedy_validation_asked_to_sample_is_one_line(overrides, needles):
    """Validation's sampling follows training's rule: several greedy answers per question are copies."""
    refused_in_one_line(validate, resolved_config(*overrides), *needles)


@pytest.mark.parametrize("overrides", [
    ("trainer.val_before_train=true", f"{V}.n=3", f"{V}.do_sample=true", f"{V}.temperature=0.7"),
    ("trainer.val_before_train=true", f"{V}.do_sample=true", f"{V}.temperature=1.0"),
    ("trainer.val_before_train=true", f"{V}.n=1"),
    ("trainer.val_before_train=false", "trainer.test_freq=-1", f"{V}.n=3")])  # no validation: warned as ignored
def test_validation_sampling_that_samples_or_does_not_run_passes(overrides):
    validate(resolved_config(*overrides))


def test_greedy_validation_with_do_sample_true_runs_greedily_with_a_warning():
    """``val_kwargs.do_sample=true`` alone (the shipped temperature is 0) is greedy validation, as the same pair is
    greedy training: accepted, with one warning that says so; none once the temperature samples."""
    from trainer.run_length_checks import validation_sampling_warnings

    cfg = resolved_config("trainer.val_before_train=true", f"{V}.do_sample=true")
    validate(cfg)
    (line,) = validation_sampling_warnings(cfg)
    assert f"{V}.do_sample=true" in line and "greedily" in line
    assert validation_sampling_warnings(resolved_config("trainer.val_before_train=true", f"{V}.do_sample=true",
                                                        f"{V}.temperature=0.7")) == []
    assert validation_sampling_warnings(resolved_config("trainer.val_before_train=false", "trainer.test_freq=-1",
                                                        f"{V}.do_sample=true")) == []
