"""Scorer options (case P27): an option reaches the scorer (GSM8K's extraction method is selectable), and an option
that a scorer does not take is refused before start-up, naming the option and the scorer, for every scorer that
routing reaches (each data source) and for custom reward functions (``custom_reward_function.reward_kwargs``)."""
import textwrap
from types import SimpleNamespace

import pytest
import torch

from rewards.manager import RewardManager
from rewards.options import check_scorer_options, scorer_options
from rewards.registry import DEFAULT_DATA_SOURCES, get_scorer, list_scorers
from tests.test_reliability_config import OK_BATCH, assert_one_line_error, run_cli
from trainer.config_checks import ConfigError, check_reward_scorers, reward_options
from trainer.protocol import DataProto

RESPONSE = "Adding the two numbers. The answer is 7."


class CharTokenizer:
    """Decodes a list of code points (enough for the reward manager's ``batch_decode``)."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(map(chr, r)) for r in rows]


def _batch(texts, data_sources, gts):
    width = max(len(t) for t in texts)
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width)
    for i, t in enumerate(texts):
        ids[i, :len(t)] = torch.tensor([ord(c) for c in t])
        mask[i, :len(t)] = 1
    return DataProto.from_dict({"responses": ids, "response_mask": mask},
                               {"data_source": list(data_sources),
                                "reward_model": [{"ground_truth": g} for g in gts]})


def _score(batch, **kw):
    with RewardManager(CharTokenizer(), num_workers=0, **kw) as rm:
        out = rm(batch)
    return out.token_level_scores.sum(-1).tolist(), out.metrics


def _datasets(*sources):
    return [SimpleNamespace(files=["train.parquet"], rows=[{"data_source": s, "reward_model": {"ground_truth": "7"}}
                                                           for s in sources])]


def _make(**kw):
    return lambda: RewardManager(CharTokenizer(), num_workers=0, **kw)


@pytest.mark.parametrize("source", ["openai/gsm8k", "gsm8k", "svamp"])
def test_p27_flexible_extraction_option_reaches_the_routed_scorer(source):
    batch = _batch([RESPONSE], [source], ["7"])
    assert _score(batch)[0] == [0.0]  # strict by default: no '####' marker
    scores, metrics = _score(batch, scorer_kwargs={"method": "flexible"})
    assert scores == [1.0] and metrics["reward/num_errors"] == 0.0
    scores, _ = _score(_batch([RESPONSE], [source], ["8"]), scorer_kwargs={"method": "flexible"})
    assert scores == [0.0]


def test_p27_unknown_option_names_the_option_and_the_scorer():
    with pytest.raises(ConfigError, match=r"'mehtod'.*'openai/gsm8k'.*gsm8k_score.*method"):
        check_reward_scorers(_make(scorer_kwargs={"mehtod": "flexible"}), "data_source", _datasets("openai/gsm8k"))
    # the math scorer takes no GSM8K option: routing to it with one is refused, naming it
    with pytest.raises(ConfigError, match=r"'method'.*'math500'.*\['timeout_seconds'\]"):
        check_reward_scorers(_make(scorer_kwargs={"method": "flexible"}), "data_source",
                             _datasets("openai/gsm8k", "math500"))
    with pytest.raises(ConfigError, match=r"method='fuzzy'.*'strict', 'flexible'"):
        check_reward_scorers(_make(scorer_kwargs={"method": "fuzzy"}), "data_source", _datasets("svamp"))
    with pytest.raises(ConfigError, match=r"no reward scorer registered for 'my/unregistered'"):
        check_reward_scorers(_make(), "data_source", _datasets("gsm8k", "my/unregistered"))
    with pytest.raises(ConfigError, match=r"reward_fn_key='ability'"):
        check_reward_scorers(_make(), "ability", _datasets("gsm8k"))
    # a fixed scorer is checked when the manager is built
    with pytest.raises(TypeError, match=r"'formt_score'.*'format_gsm8k'"):
        RewardManager(CharTokenizer(), scorer="format_gsm8k", scorer_kwargs={"formt_score": 0.2}, num_workers=0)
    with pytest.raises(ValueError, match=r"format_score='high'.*float"):
        RewardManager(CharTokenizer(), scorer="format_boxed", scorer_kwargs={"format_score": "high"}, num_workers=0)
    check_reward_scorers(_make(scorer_kwargs={"method": "flexible", "format_score": 0.1}), "data_source",
                         _datasets("gsm8k", "svamp", "synthetic/digits"))


def test_p27_no_builtin_scorer_drops_options():
    """Every registered scorer names its options; none takes ``**kwargs`` (which would drop a misspelt one)."""
    builtins = [n for n in list_scorers() if get_scorer(n).__module__ == "rewards.registry"]  # not tests' own
    assert {"gsm8k", "gsm8k_flexible", "math", "format_gsm8k", "format_boxed", *DEFAULT_DATA_SOURCES} <= set(builtins)
    for name in builtins:
        fn = get_scorer(name)
        _, any_option = scorer_options(fn)
        assert not any_option, name
        with pytest.raises(TypeError, match="not taken by scorer"):
            check_scorer_options(fn, {"no_such_option": 1}, name)
    with pytest.raises(TypeError, match="passed by the reward manager itself"):
        check_scorer_options(get_scorer("gsm8k"), {"ground_truth": "1"}, "gsm8k")


def _custom_file(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_p27_custom_reward_function_options(tmp_path):
    from rewards.registry import load_custom_scorer

    verl_style = load_custom_scorer(_custom_file(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            return float(solution_str.strip().endswith(str(ground_truth) + ".")) + bonus
        """))
    cfg = {"reward_model": {"scorer_kwargs": {}, "custom_reward_function": {"reward_kwargs": {"bonus": 0.5}}}}
    opts = reward_options(cfg)
    assert opts == {"bonus": 0.5}
    scores, _ = _score(_batch([RESPONSE], ["anything"], ["7"]), scorer=verl_style, scorer_kwargs=opts)
    assert scores == [1.5]
    cfg["reward_model"]["custom_reward_function"]["reward_kwargs"] = {"bonsu": 0.5}
    with pytest.raises(TypeError, match=r"'bonsu'.*compute_score.*\['bonus'\]") as info:
        RewardManager(CharTokenizer(), scorer=verl_style, scorer_kwargs=reward_options(cfg), num_workers=0)
    assert f"{tmp_path / 'my_reward.py'}:compute_score" in str(info.value)  # the user's file, not a module name
    cfg["reward_model"]["scorer_kwargs"] = {"bonsu": 1.0}
    with pytest.raises(ConfigError, match="'bonsu' is set to 1.0"):
        reward_options(cfg)
    # a function without extra_info is called without it; one that declares **kwargs takes any option
    plain = load_custom_scorer(_custom_file(tmp_path, name="plain.py", body="""
        def compute_score(solution_str, ground_truth, **kwargs):
            return float(kwargs.get("scale", 1.0)) * float("7" in solution_str)
        """))
    scores, metrics = _score(_batch([RESPONSE], ["x"], ["7"]), scorer=plain, scorer_kwargs={"scale": 2.0})
    assert scores == [2.0] and metrics["reward/num_errors"] == 0.0
    needs_more = load_custom_scorer(_custom_file(tmp_path, name="needs_more.py", body="""
        def compute_score(solution_str, ground_truth, extra_info, threshold):
            return 0.0
        """))
    with pytest.raises(TypeError, match="threshold"):
        RewardManager(CharTokenizer(), scorer=needs_more, num_workers=0)


def test_p27_unknown_option_stops_main_before_workers(tmp_path):
    proc = run_cli(str(tmp_path / "out"), *OK_BATCH, "+reward_model.scorer_kwargs.mehtod=strict", timeout=300,
                   forked=True)
    assert_one_line_error(proc, "'mehtod'", "'synthetic/digits'", "gsm8k_flexible")
