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
       "list_of_strings": (SIG + "    return ['1.0x']\n", "could not convert"),
       "list_of_two_scores": (SIG + "    return [0.0, float(solution_str == ground_truth)]\n",
                              "got a list of 2 values: [0.0, 0.0]")}
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


def test_a_scorer_returning_several_values_is_refused_and_one_value_in_a_sequence_is_its_score():
    """A list or tuple of several values was scored by its first element (a ``[format, accuracy]`` pair trained on
    the format score, silently); verl's naive manager fails on it. One value in a sequence is that score."""
    from rewards.pool import run_scorer, to_plain_result

    assert to_plain_result([0.5]) == 0.5 and to_plain_result((1,)) == 1.0
    for value, kind in (([0.0, 1.0], "list of 2"), ((1.0, 0.0, 1.0), "tuple of 3"), ([], "list of 0")):
        with pytest.raises(TypeError, match=f"must return one score .*got a {kind} values"):
            to_plain_result(value)
    status, message, _ = run_scorer(lambda s, g: [0.0, 1.0], ("x", "y"), {})
    assert status == "error" and message.startswith("TypeError: a scorer must return one score"), message


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
    from rewards.failures import ScorerError, check_not_all_failed

    check_not_all_failed(3, 4, "ValueError: odd")  # some: counted by the manager, training goes on
    check_not_all_failed(1, 1, "ValueError: odd")  # a single response is not a pattern
    with pytest.raises(ScorerError, match=r"raised on all 4 responses .*first: ValueError: odd"):
        check_not_all_failed(4, 4, "ValueError: odd")


def test_a_scorer_that_gives_nan_on_every_response_stops_the_run():
    """A scorer returning NaN for every response trained on all-zero rewards and exited 0 (only reward/num_nan said
    so); like one that raises on all of them, it is broken. NaN on some responses is counted and warned."""
    from rewards.failures import ScorerError, check_not_all_failed

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
    from rewards.failures import ScorerError

    data = make_batch(["42", "7"], response_len=4)
    with RewardManager(tok, scorer=lambda s, g, extra_info=None, **k: float("nan"), num_workers=0) as rm:
        with pytest.raises(ScorerError, match="no finite score"):
            rm(data)
    with RewardManager(tok, scorer=lambda s, g, extra_info=None, **k: float("nan") if s.strip() == "7" else 1.0,
                       num_workers=0) as rm, caplog.at_level("WARNING"):
        assert rm(data).metrics["reward/num_nan"] == 1.0
    assert "1 NaN/inf score(s) in a batch of 2 scored 0" in caplog.text


def test_a_score_beyond_float32_range_counts_as_nan_and_is_named(tok, caplog):  # noqa: F811
    """A score finite as a Python float but beyond float32's range (1e39) became inf in the reward tensor: NaN
    advantages, skipped optimizer steps, and ``reward/num_nan=0``. It is counted, zeroed and warned like NaN, the
    warning naming the value and the scorer; a batch of nothing else stops the run."""
    import torch

    from rewards.failures import FLOAT32_MAX, ScorerError, finite_score
    from rewards.manager import RewardManager

    assert finite_score(FLOAT32_MAX) and finite_score(-3.4e38) and not finite_score(1e39)
    assert torch.isfinite(torch.tensor([FLOAT32_MAX], dtype=torch.float32)).all()

    def huge_when_7(s, g, extra_info=None):
        return {"score": 1e39, "acc": 1e39} if s.strip() == "7" else 1.0

    data = make_batch(["42", "7"], response_len=4)
    with RewardManager(tok, scorer=huge_when_7, num_workers=0) as rm, caplog.at_level("WARNING"):
        out = rm(data)
        assert rm.verify(data) == [1.0, 0.0]
    assert out.metrics["reward/num_nan"] == 1.0 and out.reward_extra_info["score"] == [1.0, 0.0]
    assert torch.isfinite(out.token_level_scores).all()
    assert "1 NaN/inf score(s) in a batch of 2 scored 0 (first: 1e+39 from the scorer huge_when_7 of" in caplog.text
    with RewardManager(tok, scorer=lambda s, g, extra_info=None: -1e39, num_workers=0) as rm:
        with pytest.raises(ScorerError, match="no finite score"):
            rm(data)


def _fails_unless_empty(solution_str, ground_truth, extra_info=None, **kw):
    """Scores the empty response (as the start-up probe sees it) and fails on every other one, by ``extra_info``."""
    import os
    import sys
    import time

    if not solution_str:
        return 0.0
    if (extra_info or {}).get("log"):  # one byte per call that started, from any scoring process
        fd = os.open(extra_info["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, b".")
        os.close(fd)
    kind = (extra_info or {}).get("kind", "raise")
    if kind == "none":
        return None
    if kind == "nan":
        return float("nan")
    if kind == "sys_exit":
        sys.exit(3)
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt("oops")
    if kind == "os_exit":
        os._exit(3)
    if kind == "hang":
        time.sleep(60)
    if kind == "garbage" and solution_str.split()[-1] != ground_truth:
        raise ValueError("no answer")
    if kind == "garbage":
        return 1.0
    raise ValueError("boom")


def _mostly_non_empty(kind, n=6, empty=2, log=None):
    info = {"kind": kind, **({"log": log} if log else {})}
    return make_batch(["42"] * n + [""] * empty, non_tensors={"extra_info": [info] * (n + empty)})


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind,needle", [("raise", "6 raised (first: ValueError: boom)"),
                                         ("none", "6 raised (first: TypeError: a scorer must return a float"),
                                         ("nan", "6 NaN/inf"),
                                         ("sys_exit", "6 raised (first: SystemExit: 3 (the scorer called sys.exit))"),
                                         ("keyboard_interrupt", "6 raised (first: KeyboardInterrupt: oops)")])
def test_a_scorer_failing_on_every_non_empty_response_stops_though_empty_ones_score(
        tok, num_workers, kind, needle):  # noqa: F811
    """A scorer that scores only the empty response passed the probe and trained to the end on all-zero rewards
    (the batch's empty responses scored, so the all-responses stop never fired): the batch stops in one line naming
    the scorer, the counts and the first error."""
    from rewards.manager import RewardManager
    from rewards.failures import ScorerError

    if kind in ("sys_exit", "keyboard_interrupt") and num_workers == 0:
        pytest.skip("sys.exit or KeyboardInterrupt in this process ends it")
    with RewardManager(tok, scorer=_fails_unless_empty, num_workers=num_workers) as rm:
        with pytest.raises(ScorerError) as err:
            rm(_mostly_non_empty(kind))
        if num_workers:
            assert rm._pool.num_restarts == 0  # sys.exit is the scorer's error, not a process to start again
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"reward: the scorer _fails_unless_empty of {__file__} failed on all "
                                                "6 non-empty responses of the batch of 8 (")
    assert needle in line and "the 2 that scored were empty" in line, line


def test_a_scorer_raising_keyboard_interrupt_in_a_worker_is_its_error_without_tracebacks(tok, capfd):  # noqa: F811
    """A scorer raising ``KeyboardInterrupt`` (any ``BaseException``) killed its scoring process, which printed a
    traceback per response, and the stop line said only ``scorer worker died (exit code 1)``. It is the scorer's
    error, named, like ``sys.exit``: no traceback, no process to start again."""
    from rewards.failures import ScorerError
    from rewards.manager import RewardManager

    with RewardManager(tok, scorer=_fails_unless_empty, num_workers=2) as rm:
        with pytest.raises(ScorerError, match=r"\(6 raised \(first: KeyboardInterrupt: oops\)\)"):
            rm(_mostly_non_empty("keyboard_interrupt"))
        assert rm._pool.num_restarts == 0
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "oops" not in out + err, err[-2000:]


def test_a_scorer_failing_on_some_non_empty_responses_keeps_training(tok, caplog):  # noqa: F811
    """Unparsable responses may make a working scorer raise: with one non-empty response scored the batch goes on,
    counted and warned."""
    from rewards.manager import RewardManager

    texts = ["the answer is 42", "the", "answer is", "7", "", ""]
    data = make_batch(texts, non_tensors={"extra_info": [{"kind": "garbage"}] * len(texts)})
    with RewardManager(tok, scorer=_fails_unless_empty, num_workers=0) as rm, caplog.at_level("WARNING"):
        out = rm(data)
    assert out.reward_extra_info["score"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out.metrics["reward/num_errors"] == 3.0
    assert "3 scorer error(s) in a batch of 6; first: ValueError: no answer" in caplog.text


# a dying scorer gets a timeout no new scoring process overruns on a loaded machine, so that only deaths count
@pytest.mark.parametrize("kind,needle,timeout_s", [
    ("hang", "16 ran past reward_model.timeout_s=0.2 s", 0.2),
    ("os_exit", "16 ended their scoring process (first: scorer worker died (exit code 3))", 60.0)])
def test_a_scorer_hanging_or_dying_on_every_non_empty_response_stops_the_batch_early(tok, kind, needle,  # noqa: F811
                                                                                    timeout_s, tmp_path):
    """Each timeout costs timeout_s and each death a new process (a step took 268 s, or 45-58 s instead of 0.2 s,
    and trained on zeros): after 16 such failures on non-empty responses with none scored the batch stops, and no
    other response of it is started; the pool scores the next batch."""
    import time

    from rewards.manager import RewardManager
    from rewards.failures import ScorerError

    log = tmp_path / "calls"
    with RewardManager(tok, scorer=_fails_unless_empty, timeout_s=timeout_s, num_workers=2) as rm:
        with pytest.raises(ScorerError) as err:
            rm(_mostly_non_empty(kind, n=100, log=str(log)))
        started = len(log.read_bytes())
        line = str(err.value)
        assert "gave no score for the first 16 non-empty responses of the batch of 102 that finished" in line, line
        assert needle in line and "other responses were not scored" in line, line
        # at most the 16 failures and one call in flight per worker, counted in calls rather than seconds (fewer
        # when, on a loaded machine, a call ran past its 0.2 s before its scorer started and wrote its line)
        assert 1 <= started <= 18, started
        time.sleep(0.5)
        assert len(log.read_bytes()) == started  # nothing of the stopped batch runs on after the error
        # the pool scores the next batch (a replaced worker's first call may itself run past 0.2 s on a loaded
        # machine, so up to three batches are tried)
        scores = [rm(_mostly_non_empty("garbage", n=2)).reward_extra_info["score"] for _ in range(3)]
        assert [1.0, 1.0, 0.0, 0.0] in scores, scores


def test_the_failure_watch_judges_non_empty_responses_only():
    """Empty responses neither prove nor disprove a scorer; one non-empty score ends the early stop; one judged
    response is not a pattern."""
    from rewards.failures import FailureWatch, ScorerError

    watch = FailureWatch([True, False] + [False] * 20, early_after=16)
    assert not watch.see(0, ("ok", 0.0, 0.0))
    assert not watch.see(1, ("ok", {"score": 1.0}, 0.0))  # scored: a healthy scorer whatever follows
    assert not any(watch.see(i, ("timeout", None, 1.0)) for i in range(2, 22))
    watch.check(22, 1.0)
    watch = FailureWatch([True] + [False] * 16, early_after=16)
    assert not watch.see(0, ("ok", 0.0, 0.0))
    assert [watch.see(i, ("timeout", None, 1.0)) for i in range(1, 17)] == [False] * 15 + [True]
    assert watch.see(16, ("ok", 1.0, 0.0)) and watch.stopped  # a score finishing after the stop does not undo it
    with pytest.raises(ScorerError, match=r"^reward: the scorer gave no score for the first 16 non-empty"):
        watch.check(17, 1.0)
    watch = FailureWatch([False, True, True])  # one non-empty response that failed
    for i, outcome in enumerate([("error", "ValueError: x", 0.0), ("ok", 0.0, 0.0), ("ok", 0.0, 0.0)]):
        watch.see(i, outcome)
    watch.check(3, 1.0)
    watch = FailureWatch([False, False, True])
    for i, outcome in enumerate([("error", "ValueError: x", 0.0), ("ok", float("inf"), 0.0), ("ok", 0.0, 0.0)]):
        watch.see(i, outcome)
    with pytest.raises(ScorerError, match=r"all 2 non-empty .*\(1 raised \(first: ValueError: x\), 1 NaN/inf\); "
                                          r"the 1 that scored were empty"):
        watch.check(3, 1.0)


def test_a_routed_scorer_failing_on_every_non_empty_response_is_named_by_its_data_source(tok):  # noqa: F811
    from rewards.manager import RewardManager
    from rewards.failures import ScorerError
    from rewards.registry import register_scorer

    register_scorer("tests/fails_unless_empty", overwrite=True)(_fails_unless_empty)
    data = make_batch(["42", "7", ""], non_tensors={"data_source": ["tests/fails_unless_empty"] * 3})
    with RewardManager(tok, num_workers=0) as rm, pytest.raises(
            ScorerError, match=r"^reward: the scorer of data_source 'tests/fails_unless_empty' failed on all 2 "):
        rm(data)


def _raises_for_math(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "math":
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
    return float(solution_str.strip() == ground_truth)


def test_a_data_source_its_scorer_fails_on_stops_the_run_while_the_others_score(tok):  # noqa: F811
    """verl's default_compute_score raises NotImplementedError for a data source it does not know: in a batch mixing
    sources, that source's rows scored 0 (counted, warned) and trained on zeros to the end. Now the batch stops in
    one line naming the source, once its responses to two different questions all failed; one question whose
    responses all fail (that row's problem), or some of a source's responses failing, keep training."""
    from rewards.failures import ScorerError
    from rewards.manager import RewardManager

    def batch(sources, truths):
        texts = ["42"] * len(sources)
        return make_batch(texts, non_tensors={"data_source": sources,
                                              "reward_model": [{"ground_truth": t} for t in truths]})

    with RewardManager(tok, scorer=_raises_for_math, num_workers=0) as rm:
        with pytest.raises(ScorerError) as err:
            rm(batch(["gsm8k"] * 4 + ["math"] * 4, ["42", "42", "7", "7", "1", "1", "2", "2"]))
        line = str(err.value)
        assert "\n" not in line and line.startswith(
            "reward: the scorer of data_source 'math' failed on all 4 non-empty responses of that source in the "
            "batch of 8 (4 raised (first: NotImplementedError: Reward function is not implemented for "
            "data_source='math')), while the other sources scored;"), line
        assert "leave data_source 'math' out of the data" in line
        out = rm(batch(["gsm8k"] * 4 + ["math"] * 4, ["42", "42", "7", "7", "1", "1", "1", "1"]))  # one question
        assert out.reward_extra_info["score"] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        assert rm(batch(["gsm8k"] * 4, ["42", "x", "y", "42"])).reward_extra_info["score"] == [1.0, 0.0, 0.0, 1.0]
