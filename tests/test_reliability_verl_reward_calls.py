"""verl's custom reward functions work as verl calls them: a ``compute_score(**kwargs)`` is called by keyword
(verl's naive manager: ``data_source=, solution_str=, ground_truth=, extra_info=``; it was refused, "cannot be
called as fn(solution_str, ground_truth, ...)"), and ``reward_model.reward_manager=batch`` calls a batch function
once per batch (``data_sources=, solution_strs=, ground_truths=, extra_infos=``; it was called one row at a time,
"missing a required argument: 'ground_truths'"); an ``async def compute_score`` is awaited, as verl's reward loop
awaits it."""
import os

import pytest

from rewards.batch_manager import BatchRewardManager, check_batch_scorer
from rewards.failures import ScorerError
from rewards.manager import RewardManager
from rewards.options import check_scorer_options
from rewards.registry import wants_data_source
from tests.test_rewards_manager import make_batch, tok  # noqa: F401  (the fixture)
from trainer.launch import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kwargs_only(**kwargs):
    return {"score": float(kwargs["solution_str"].strip() == str(kwargs["ground_truth"])),
            "source": kwargs["data_source"], "extra": kwargs["extra_info"]["i"]}


def positional_kwargs(solution_str, ground_truth, **kwargs):
    return float(solution_str.strip() == ground_truth)


CALLS = []


def batch_fn(data_sources, solution_strs, ground_truths, extra_infos=None, bonus=0.0):
    CALLS.append(len(solution_strs))
    return [float(s.strip() == g) + bonus for s, g in zip(solution_strs, ground_truths)]


def test_d15_which_functions_are_called_by_keyword():
    assert wants_data_source(kwargs_only)
    assert not wants_data_source(positional_kwargs)  # (solution_str, ground_truth) by position, as before
    check_scorer_options(kwargs_only, {"anything": 1})  # was: "cannot be called as fn(solution_str, ...)"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_d15_a_kwargs_only_compute_score_gets_verls_keywords(tok, num_workers):  # noqa: F811
    data = make_batch(["42", "7"], non_tensors={"data_source": ["a", "b"], "extra_info": [{"i": 0}, {"i": 1}]})
    with RewardManager(tok, scorer=kwargs_only, num_workers=num_workers) as rm:
        out = rm(data)
    assert out.reward_extra_info["score"] == [1.0, 0.0]
    assert out.reward_extra_info["source"] == ["a", "b"] and out.reward_extra_info["extra"] == [0, 1]
    assert out.metrics["reward/num_errors"] == 0.0


async def async_compute_score(data_source, solution_str, ground_truth, extra_info=None):
    import asyncio

    await asyncio.sleep(0)
    if solution_str.strip() == "boom":
        raise ValueError("async boom")
    return float(solution_str.strip() == ground_truth)


async def async_batch_fn(data_sources, solution_strs, ground_truths, extra_infos=None):
    return [float(s.strip() == g) for s, g in zip(solution_strs, ground_truths)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_async_compute_score_is_awaited_as_verls_reward_loop_does(tok, num_workers, capfd):  # noqa: F811
    """An ``async def compute_score`` returned a coroutine: refused with ``float() argument must be ... not
    'coroutine'`` and a ``RuntimeWarning: coroutine ... was never awaited`` with its source line. verl's reward loop
    awaits it; so does every scorer call here (the scoring processes, this process, the start-up probe), and what
    it raises is that row's error."""
    import gc
    import warnings

    data = make_batch(["42", "7", "boom"], non_tensors={"data_source": ["a", "b", "c"]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with RewardManager(tok, scorer=async_compute_score, num_workers=num_workers) as rm:
            out = rm(data)
        gc.collect()
    assert out.reward_extra_info["score"] == [1.0, 0.0, 0.0]
    assert out.metrics["reward/num_errors"] == 1.0
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    assert "never awaited" not in "".join(capfd.readouterr())


def test_an_async_scorer_is_awaited_where_an_event_loop_runs_and_by_the_batch_manager(tok):  # noqa: F811
    import asyncio

    from rewards.scorer_call import call_scorer

    async def inside_a_loop():
        return call_scorer(async_compute_score, (), {"data_source": "a", "solution_str": "42", "ground_truth": "42"})

    assert asyncio.run(inside_a_loop()) == 1.0
    with pytest.raises(ValueError, match="async boom"):
        call_scorer(async_compute_score, ("a", "boom", "42"), {})
    out = BatchRewardManager(tok, scorer=async_batch_fn, num_workers=0)(
        make_batch(["42", "7"], non_tensors={"data_source": ["a", "b"]}))
    assert out.reward_extra_info["score"] == [1.0, 0.0] and out.metrics["reward/num_errors"] == 0.0


def test_d16_the_batch_manager_calls_the_function_once_per_batch(tok):  # noqa: F811
    data = make_batch(["42", "7", "42"], non_tensors={"data_source": ["a", "b", "c"]})
    CALLS.clear()
    rm = BatchRewardManager(tok, scorer=batch_fn, scorer_kwargs={"bonus": 0.5}, num_workers=0)
    out = rm(data)
    assert CALLS == [3]
    assert out.reward_extra_info["score"] == [1.5, 0.5, 1.5]
    assert out.metrics["reward/num_errors"] == 0.0 and rm.verify(data) == [1.5, 0.5, 1.5]


def test_d16_a_batch_function_of_the_wrong_shape_is_one_line(tok):  # noqa: F811
    with pytest.raises(TypeError, match="reward_manager=batch calls .* once per batch .*reward_manager=naive"):
        check_batch_scorer(lambda solution_str, ground_truth: 0.0, {})
    with pytest.raises(TypeError, match="'solution_strs' .* passed by the reward manager"):
        check_batch_scorer(batch_fn, {"solution_strs": 1})
    rm = BatchRewardManager(tok, scorer=lambda **kw: [1.0], num_workers=0)
    with pytest.raises(ScorerError, match="returned a list of 1 for a batch of 2 responses"):
        rm(make_batch(["42", "7"], non_tensors={"data_source": ["a", "b"]}))


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("manager,source", [
    ("naive", "def compute_score(**kwargs):\n    return float(kwargs['solution_str'].strip() == "
              "str(kwargs['ground_truth']))\n"),
    ("batch", "def compute_score(data_sources, solution_strs, ground_truths, extra_infos=None):\n"
              "    return [1.0 for _ in solution_strs]\n"),
    ("naive", "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
              "    return float(solution_str.strip() == str(ground_truth))\n")])
def test_d15_d16_verl_reward_files_pass_the_start_up_checks(tmp_path, manager, source):
    """The driver's reward managers from a config (the start-up probe calls each function on an empty response)."""
    from hydra import compose, initialize_config_dir

    from trainer.config.data import DataConfig
    from trainer.launch import build_reward_managers, resolve_config

    path = _write(tmp_path / "rw.py", source)
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=[
            f"reward_model.custom_reward_function.path={path}", f"reward_model.reward_manager={manager}"]))
    data = DataConfig.from_dict(cfg["data"], "data")
    train, val = build_reward_managers(cfg, data, None, [])
    assert type(train) is (BatchRewardManager if manager == "batch" else RewardManager)


def test_d16_a_row_function_with_the_batch_manager_is_one_config_line(tmp_path):
    from hydra import compose, initialize_config_dir

    from trainer.config.data import DataConfig
    from trainer.launch import build_reward_managers, resolve_config

    path = _write(tmp_path / "rw.py", "def compute_score(solution_str, ground_truth, extra_info=None):\n"
                                      "    return 1.0\n")
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=[
            f"reward_model.custom_reward_function.path={path}", "reward_model.reward_manager=batch"]))
    with pytest.raises(ConfigError, match="reward_manager=batch calls .* once per batch") as info:
        build_reward_managers(cfg, DataConfig.from_dict(cfg["data"], "data"), None, [])
    assert len(str(info.value).splitlines()) == 1
