"""A reward function that returns what no reward can be made of (None, a string, a dict without ``score``) stops
the run before start-up in one line naming the function, its file and what it returned. Found by trying it: such a
``custom_reward_function`` scored 0 on every response (each counted in ``reward/num_errors``), and the run trained
on all-zero rewards and exited 0. A function that raises on the probe's empty response is not judged (scorer
failures at run time stay counted, not fatal)."""
import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from tests.test_rewards_manager import make_batch, tok  # noqa: F401  (fixture)

SIG = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
BAD = {"none": (SIG + "    return None\n", "got NoneType"),
       "string": (SIG + "    return 'good'\n", "got str"),
       "dict_without_score": (SIG + "    return {'acc': 1.0}\n", "must include 'score'"),
       "list_of_strings": (SIG + "    return ['1.0x']\n", "could not convert")}
GOOD = {"float": SIG + "    return 1.0\n",
        "int": SIG + "    return 0\n",
        "dict": SIG + "    return {'score': 1.0, 'acc': True}\n",
        "raises_on_empty": SIG + "    return float(solution_str.split()[-1] == ground_truth)\n",
        "nan": SIG + "    return float('nan')\n"}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_scorer_returning_an_unusable_value_stops_before_start_up(tmp_path, name):
    source, needle = BAD[name]
    path = tmp_path / "my_reward.py"
    path.write_text(source)
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}", forked=True)
    assert_one_line_error(proc, "compute_score", str(path), needle)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_usable_scorer_passes_the_probe(tmp_path, name):
    from hydra import compose, initialize_config_dir

    from trainer.launch import prestart
    from trainer.overrides import CONFIG_DIR

    path = tmp_path / "my_reward.py"
    path.write_text(GOOD[name])
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        prestart(compose(config_name="ppo_trainer", overrides=[f"trainer.output_dir={tmp_path / 'out'}",
                                                               f"reward_model.custom_reward_function.path={path}"]))


def test_a_scorer_that_raises_on_every_response_stops_the_run_in_one_line(tmp_path):
    """Past the probe (an empty response may be refused), a scorer that raises on every response of a batch is
    broken: the run stops at its first step with one line naming the error (it trained on all-zero rewards and
    exited 0), while a scorer failing on some responses only counts them."""
    path = tmp_path / "my_reward.py"
    path.write_text(SIG + "    import missing_module_of_the_user\n    return 1.0\n")
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}", "trainer.total_training_steps=2",
                   "trainer.val_before_train=false", forked=True)
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, out[-3000:]
    assert "raised on all" in errors[0] and "missing_module_of_the_user" in errors[0] and "Traceback" not in out


def test_scorer_errors_on_some_responses_are_counted_on_all_they_stop():
    from rewards.pool import ScorerError, check_not_all_failed

    check_not_all_failed(3, 4, "ValueError: odd")  # some: counted by the manager, training goes on
    check_not_all_failed(1, 1, "ValueError: odd")  # a single response is not a pattern
    with pytest.raises(ScorerError, match=r"raised on all 4 responses .*first: ValueError: odd"):
        check_not_all_failed(4, 4, "ValueError: odd")


def test_a_scorer_that_gives_nan_on_every_response_stops_the_run():
    """A scorer returning NaN for every response trained on all-zero rewards and exited 0 (only reward/num_nan said
    so); like one that raises on all of them, it is broken. NaN on some responses is counted and warned."""
    from rewards.pool import ScorerError, check_not_all_failed

    check_not_all_failed(0, 4, None, nan=3)
    with pytest.raises(ScorerError, match=r"no finite score for any of the 4 responses of the batch \(4 NaN/inf\)"):
        check_not_all_failed(0, 4, None, nan=4)
    with pytest.raises(ScorerError, match=r"\(2 NaN/inf, 2 raised \(first: KeyError: x\)\)"):
        check_not_all_failed(2, 4, "KeyError: x", nan=2)
    check_not_all_failed(0, 4, None, timeouts=3)  # a scorer that hangs on every response trained on zeros too
    with pytest.raises(ScorerError, match=r"no score for any of the 4 responses .*4 ran past reward_model.timeout_s"):
        check_not_all_failed(0, 4, None, timeouts=4)


def test_the_manager_stops_on_an_all_nan_batch_and_warns_on_some(tok, caplog):  # noqa: F811
    from rewards.manager import RewardManager
    from rewards.pool import ScorerError

    data = make_batch(["42", "7"], response_len=4)
    with RewardManager(tok, scorer=lambda s, g, extra_info=None, **k: float("nan"), num_workers=0) as rm:
        with pytest.raises(ScorerError, match="no finite score"):
            rm(data)
    with RewardManager(tok, scorer=lambda s, g, extra_info=None, **k: float("nan") if s.strip() == "7" else 1.0,
                       num_workers=0) as rm, caplog.at_level("WARNING"):
        assert rm(data).metrics["reward/num_nan"] == 1.0
    assert "1 NaN/inf score(s) in a batch of 2 scored 0" in caplog.text
