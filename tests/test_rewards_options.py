"""Scorer options (case P27): an option reaches the scorer (GSM8K's extraction method is selectable), and an option
that a scorer does not take is refused before start-up, naming the option and the scorer, for every scorer that
routing reaches (each data source) and for custom reward functions (``custom_reward_function.reward_kwargs``)."""
import textwrap
from types import SimpleNamespace

import pytest
import torch

from rewards.manager import RewardManager
from rewards.options import OptionValueError, check_scorer_options, scorer_options
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
    with pytest.raises(ConfigError, match=r"'method'.*'math500'.*\['answer_after', 'timeout_seconds'\]"):
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


def test_a_shaped_gsm8k_score_leaves_acc_as_correctness(tmp_path):
    """``format_score``/``score`` shape the reward, not the accuracy: ``acc`` (validation's ``val/<ds>/acc``, dynamic
    sampling's ``acc``, PRIME's accuracy band) is 1 for a correct answer and 0 otherwise."""
    from rewards.verify import accuracy_from_reward

    assert get_scorer("gsm8k")("#### 41", "42") == 0.0 and get_scorer("gsm8k")("#### 42", "42") == 1.0  # plain
    assert get_scorer("gsm8k")("#### 41", "42", format_score=0.5) == {"score": 0.5, "acc": 0.0}
    assert get_scorer("gsm8k_flexible")("so 42", "42", score=2.0) == {"score": 2.0, "acc": 1.0}
    assert get_scorer("gsm8k")("no answer", "42", format_score=0.5, score=2.0) == {"score": 0.0, "acc": 0.0}
    batch = _batch(["#### 7", "#### 8", "none"], ["openai/gsm8k", "svamp", "gsm8k"], ["7", "7", "7"])
    with RewardManager(CharTokenizer(), num_workers=0, scorer_kwargs={"format_score": 0.5, "score": 2.0}) as rm:
        out = rm(batch)
    assert out.token_level_scores.sum(-1).tolist() == [2.0, 0.5, 0.0]
    assert accuracy_from_reward(out.reward_extra_info, 3) == [1.0, 0.0, 0.0]


def test_a_named_scorer_beside_a_custom_reward_function_is_refused_in_one_line(tmp_path):
    """Both name the scorer: the custom function would score every row and ``reward_model.scorer`` none."""
    from trainer.config_checks import custom_scorer

    path = tmp_path / "r.py"
    path.write_text("def compute_score(solution_str, ground_truth, extra_info=None):\n    return 0.77\n")
    cfg = {"reward_model": {"scorer": "math", "custom_reward_function": {"path": str(path)}}}
    with pytest.raises(ConfigError, match=r"^reward_model.scorer=math and custom_reward_function.path=.*r\.py' both "
                                          r"name the scorer; expected one: .*reward_model.scorer=null"):
        custom_scorer(cfg)
    cfg["reward_model"]["scorer"] = None
    assert custom_scorer(cfg)("x", "1") == 0.77
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}", "reward_model.scorer=math",
                   forked=True)
    assert_one_line_error(proc, "reward_model.scorer=math and custom_reward_function.path=")


def test_p27_no_built_in_scorer_swallows_an_option():
    """A scorer that takes ``**kwargs`` passes every option the start-up check sees and drops it: none of the
    registered scorers may, and an option the tool task's scorer does not take is refused like any other."""
    import inspect

    built_in = [n for n in list_scorers() if get_scorer(n).__module__.startswith("rewards.")]  # not tests' own
    assert {"gsm8k", "math", "format_boxed", "arith_tool"} <= set(built_in)
    for name in built_in:
        params = inspect.signature(get_scorer(name)).parameters.values()
        assert all(p.kind is not p.VAR_KEYWORD for p in params), name
    with pytest.raises(TypeError, match=r"'method' is not taken by scorer 'arith_tool'"):
        check_scorer_options(get_scorer("arith_tool"), {"method": "flexible"}, "arith_tool")


# ---- an option value of the wrong type (case P27, values): an unannotated parameter takes its default's type -------

def _unannotated(solution_str, ground_truth, extra_info=None, bonus=0.0, n=3, strict=False, tag="x", none=None,
                 table=()):
    return 0.0


@pytest.mark.parametrize("option,value,ok", [
    ("bonus", "abc", False), ("bonus", True, False), ("bonus", 1, True), ("bonus", 0.5, True), ("bonus", None, True),
    ("n", 1.5, False), ("n", True, False), ("n", "2", False), ("n", 2, True),
    ("strict", 1, False), ("strict", "true", False), ("strict", True, True),
    ("tag", 1, False), ("tag", "y", True),
    ("none", "anything", True), ("none", 1, True), ("table", "anything", True),  # None / a tuple: no type
])
def test_p27_an_unannotated_options_value_is_checked_against_its_defaults_type(option, value, ok):
    if ok:
        check_scorer_options(_unannotated, {option: value})
        return
    with pytest.raises(OptionValueError, match=rf"^scorer option {option}={value!r:.10}.*_unannotated: expected .*"
                                               rf"the type of its default") as info:
        check_scorer_options(_unannotated, {option: value})
    assert (info.value.option, info.value.value) == (option, value)


def test_p27_an_annotation_decides_over_the_default():
    from typing import Any

    def annotated(solution_str, ground_truth, bonus: Any = 0.0, scale: int = 1.0):
        return 0.0

    check_scorer_options(annotated, {"bonus": "abc"})  # Any: not checked
    check_scorer_options(annotated, {"scale": 2})
    with pytest.raises(OptionValueError, match=r"scale=0.5.*expected int$"):
        check_scorer_options(annotated, {"scale": 0.5})


WRONG_BONUS = """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return {"score": float(solution_str.strip() == str(ground_truth)) + bonus}
    """


def _check_config(*overrides, sources=("gsm8k", "math500")):
    """The start-up check of the scorers and their options (:func:`check_reward_scorers`) on the config that
    ``overrides`` make as Hydra types them (``bonus=abc`` a string, ``bonus=1`` an int)."""
    from tests.e2e_utils import resolved_config
    from trainer.config_checks import custom_scorer, reward_option_keys

    cfg = resolved_config(*overrides)
    scorer = custom_scorer(cfg) or cfg["reward_model"]["scorer"]
    make = _make(scorer=scorer, scorer_kwargs=reward_options(cfg))
    return check_reward_scorers(make, "data_source", _datasets(*sources), reward_option_keys(cfg))


def test_p27_a_wrong_type_option_value_is_one_line_naming_its_key(tmp_path):
    """Before: ``custom_reward_function.reward_kwargs.bonus=abc`` passed start-up and every response of step 1 raised
    ``TypeError`` in the scorer (the run stopped blaming it). Both option keys are named, the custom function's and
    the built-in scorers'."""
    path = _custom_file(tmp_path, WRONG_BONUS)
    with pytest.raises(ConfigError) as info:
        _check_config(f"reward_model.custom_reward_function.path={path}",
                      "+reward_model.custom_reward_function.reward_kwargs.bonus=abc")
    assert str(info.value) == (f"reward_model.custom_reward_function.reward_kwargs.bonus='abc': expected a number "
                               f"(float or int), the type of its default 0.0 (a parameter of scorer "
                               f"{path}:compute_score)")
    with pytest.raises(ConfigError, match=r"^reward_model.custom_reward_function.reward_kwargs.bonus=True: expected a "
                                          r"number"):
        _check_config(f"reward_model.custom_reward_function.path={path}",
                      "+reward_model.custom_reward_function.reward_kwargs.bonus=true")
    # the built-in scorers' options: reward_model.scorer_kwargs, routed (math500 -> math) or fixed
    with pytest.raises(ConfigError, match=r"^reward_model.scorer_kwargs.timeout_seconds='abc': expected float \| None "
                                          r"\(a parameter of scorer 'math500'"):
        _check_config("+reward_model.scorer_kwargs.timeout_seconds=abc", sources=["math500"])
    with pytest.raises(ConfigError, match=r"^reward_model.scorer_kwargs.format_score='high': expected float "
                                          r"\(a parameter of scorer 'format_boxed'"):
        _check_config("reward_model.scorer=format_boxed", "+reward_model.scorer_kwargs.format_score=high")
    # a custom function's option under scorer_kwargs is named by that key
    with pytest.raises(ConfigError, match=r"^reward_model.scorer_kwargs.bonus='abc': expected a number"):
        _check_config(f"reward_model.custom_reward_function.path={path}", "+reward_model.scorer_kwargs.bonus=abc")


@pytest.mark.parametrize("value,want", [("0.5", 1.5), ("1", 2.0)])
def test_p27_a_right_type_option_value_passes_and_scores(tmp_path, value, want):
    path = _custom_file(tmp_path, WRONG_BONUS)
    manager = _check_config(f"reward_model.custom_reward_function.path={path}",
                            f"+reward_model.custom_reward_function.reward_kwargs.bonus={value}")
    assert manager.scorer_kwargs == {"bonus": float(value) if "." in value else int(value)}
    out = manager(_batch(["7"], ["gsm8k"], ["7"]))
    assert out.token_level_scores.sum(-1).tolist() == [want] and out.metrics["reward/num_errors"] == 0.0


def test_p27_a_batch_functions_option_value_is_checked_too(tmp_path):
    from rewards.batch_manager import check_batch_scorer
    from rewards.registry import load_custom_scorer

    fn = load_custom_scorer(_custom_file(tmp_path, """
        def compute_score(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
            return [bonus for _ in solution_strs]
        """))
    check_batch_scorer(fn, {"bonus": 1})
    with pytest.raises(OptionValueError, match=r"bonus='abc'.*expected a number"):
        check_batch_scorer(fn, {"bonus": "abc"})


def test_p27_a_wrong_type_option_value_stops_main_before_workers(tmp_path):
    path = _custom_file(tmp_path, WRONG_BONUS)
    proc = run_cli(str(tmp_path / "out"), "trainer.total_training_steps=1", f"custom_reward_function.path={path}",
                   "custom_reward_function.reward_kwargs.bonus=abc", forked=True)
    assert_one_line_error(proc, "reward_model.custom_reward_function.reward_kwargs.bonus='abc': expected a number",
                          "the type of its default 0.0")


@pytest.mark.parametrize("option", ["score", "format_score"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_p27_a_non_finite_option_is_refused_naming_it(option, value):
    """``score=nan`` was accepted: every reward of the run would have been nan."""
    with pytest.raises(OptionValueError, match=rf"^scorer option {option}={value!r} for scorer 'gsm8k' .*: expected a "
                                               r"finite number"):
        check_scorer_options(get_scorer("gsm8k"), {option: value}, "gsm8k")
    check_scorer_options(get_scorer("gsm8k"), {option: 0.5}, "gsm8k")
