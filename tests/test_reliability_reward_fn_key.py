"""A data row without the column that picks its reward scorer (``data.reward_fn_key``, ``data_source`` by default).
Found by trying it: a JSON-lines row without ``data_source`` (read as None) stopped the run with ``no reward scorer
registered for None``, naming neither the key, the file nor the row. Now the rows are checked before any worker
starts (:func:`trainer.data_rows.check_reward_key`, run for every scorer that routes by the key) in one line naming
``data.reward_fn_key``, the file and the row (or that the file lacks the column) and the ways out."""
import json
from types import SimpleNamespace

import pytest

from trainer import embedded
from trainer.config_checks import ConfigError, check_reward_scorers
from trainer.dataset import DataError, PromptDataset

FIXES = ("data.reward_fn_key=", "reward_model.scorer=<name>")


@pytest.fixture(scope="module")
def tok():
    return embedded.build_tokenizer()


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _row(gt="1", **extra):
    return {"prompt": [{"role": "user", "content": "last of 1 ?"}], "reward_model": {"ground_truth": gt}, **extra}


class CharTokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(map(chr, r)) for r in rows]


def _make(**kw):
    from rewards.manager import RewardManager

    return lambda: RewardManager(CharTokenizer(), num_workers=0, **kw)


def test_a_row_without_data_source_is_named_with_its_file_and_index(tmp_path, tok):
    # row 0 is skipped (no ground truth): the index named is the row's place in its file, not among kept rows
    path = _write(tmp_path / "train.jsonl", [_row(gt="", data_source="gsm8k"), _row(data_source="gsm8k"),
                                              _row(), _row(data_source="gsm8k"), _row()])
    ds = PromptDataset(path, tok, max_prompt_length=32)
    assert [o[1] for o in ds.origins] == [1, 2, 3, 4] and ds.rows[1].get("data_source") is None
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(_make(), "data_source", [ds, None])
    msg = str(info.value)
    assert "no reward scorer registered" not in msg and "\n" not in msg
    for needle in ("data.reward_fn_key='data_source'", f"row 2 of {path}", "1 more row", *FIXES):
        assert needle in msg, (needle, msg)


def test_a_file_without_the_column_is_named(tmp_path, tok):
    from trainer.data_rows import check_reward_key

    good = _write(tmp_path / "a.jsonl", [_row(ability="math")])
    bad = _write(tmp_path / "b.jsonl", [_row(), _row()])
    ds = PromptDataset([good, bad], tok, max_prompt_length=32)
    with pytest.raises(DataError, match=rf"data.reward_fn_key='ability': the column 'ability' is missing from {bad} "):
        check_reward_key(ds, "ability")
    with pytest.raises(ConfigError, match=r"data.reward_fn_key='ability': the column 'ability' is missing from "):
        check_reward_scorers(_make(), "ability", [ds])
    check_reward_key(PromptDataset(good, tok, max_prompt_length=32), "ability")
    # a fixed scorer does not route by the key: rows without it are fine
    check_reward_scorers(_make(scorer="gsm8k"), "ability", [ds])


def test_rows_without_origins_are_named_by_their_index():
    from trainer.data_rows import check_reward_key

    ds = SimpleNamespace(files=["t.parquet"], rows=[{"data_source": "gsm8k"}, {"data_source": None}])
    with pytest.raises(DataError, match=r"row 1 of t.parquet \(counted from 0\) has no 'data_source' value"):
        check_reward_key(ds, "data_source")


def test_the_reward_manager_names_the_key_for_a_row_without_it():
    """At run time (a batch that did not come from checked data) the error names the key and the row."""
    import torch

    from trainer.protocol import DataProto

    data = DataProto.from_dict({"responses": torch.ones(2, 2, dtype=torch.long), "response_mask": torch.ones(2, 2)},
                               {"data_source": ["gsm8k", None], "reward_model": [{"ground_truth": "1"}] * 2})
    with pytest.raises(KeyError, match=r"data.reward_fn_key='data_source': row 1 of the batch has no 'data_source'"):
        _make()()(data)


def test_a_custom_function_taking_data_source_is_given_none_but_needs_the_column(tmp_path, tok):
    """A custom reward function with a ``data_source`` parameter gets each row's value, None included (as before);
    a file without the column is refused, naming it."""
    from rewards.registry import load_custom_scorer

    fn_path = tmp_path / "my_reward.py"
    fn_path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return 1.0\n")
    fn = load_custom_scorer(str(fn_path))
    some = _write(tmp_path / "some.jsonl", [_row(data_source="a"), _row()])
    check_reward_scorers(_make(scorer=fn), "data_source", [PromptDataset(some, tok, max_prompt_length=32)])
    none = _write(tmp_path / "none.jsonl", [_row()])
    with pytest.raises(ConfigError, match=rf"'data_source' is missing from {none} .*drop the data_source parameter"):
        check_reward_scorers(_make(scorer=fn), "data_source", [PromptDataset(none, tok, max_prompt_length=32)])


@pytest.mark.parametrize("value, why", [(None, "has no 'data_source' value"),
                                        ("", "has an empty 'data_source' value ('')"),
                                        ("  ", "has an empty 'data_source' value ('  ')"),
                                        (3, "has data_source=3 (int), not a scorer name"),
                                        (["gsm8k"], "has data_source=['gsm8k'] (list), not a scorer name")])
def test_every_value_that_names_no_scorer_is_named_with_its_file_and_index(tmp_path, tok, value, why):
    """An empty string, a number or a list is refused like a missing value: one line naming the key, the file, the
    row and its value (an empty string read ``no reward scorer registered for ''``, without file or row). A custom
    function taking ``data_source`` is still given the value as it is."""
    path = _write(tmp_path / "train.jsonl", [_row(data_source="gsm8k"), _row(data_source="gsm8k"),
                                             _row(data_source=value)])
    ds = PromptDataset(path, tok, max_prompt_length=32)
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(_make(), "data_source", [ds])
    msg = str(info.value)
    assert msg.startswith(f"data.reward_fn_key='data_source': row 2 of {path} (counted from 0) {why}; "), msg
    assert "no reward scorer registered" not in msg and "\n" not in msg and all(f in msg for f in FIXES), msg
    from rewards.registry import load_custom_scorer

    fn_path = tmp_path / "my_reward.py"
    fn_path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return 1.0\n")
    check_reward_scorers(_make(scorer=load_custom_scorer(str(fn_path))), "data_source", [ds])


def test_a_name_without_a_scorer_is_named_with_the_first_row_that_has_it(tmp_path, tok):
    path = _write(tmp_path / "train.jsonl", [_row(data_source="gsm8k"), _row(data_source="gsm9k"),
                                             _row(data_source="gsm9k")])
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(_make(), "data_source", [PromptDataset(path, tok, max_prompt_length=32)])
    msg = str(info.value)
    assert msg.startswith(f"data.reward_fn_key='data_source': row 1 of {path} (counted from 0) has "
                          "data_source='gsm9k': no reward scorer registered for 'gsm9k'; registered: "), msg
    assert "\n" not in msg and "reward_model.scorer=<name>" in msg, msg


@pytest.mark.parametrize("truth", [["6"], {"target": ["6"]}])
def test_a_ground_truth_a_built_in_scorer_cannot_compare_is_named_with_its_row_and_scorer(tmp_path, tok, truth):
    """A list ground truth (``["6"]``) routed to a built-in scorer scored 0 on every response, silently (verl's gsm8k
    compares with ``==``, its MATH scorers the text ``"['6']"``): refused before start-up in one line naming the file,
    the row, the value and the scorer; strings and numbers pass, and a custom function is given any value."""
    from rewards.registry import load_custom_scorer

    path = _write(tmp_path / "train.jsonl", [_row(gt="6", data_source="gsm8k"), _row(gt=6, data_source="math"),
                                             _row(gt=truth, data_source="synthetic/digits"),
                                             _row(gt=truth, data_source="gsm8k")])
    ds = PromptDataset(path, tok, max_prompt_length=32)
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(_make(), "data_source", [ds])
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(
        f"row 2 of {path} (counted from 0) has reward_model.ground_truth={truth!r} (a {type(truth).__name__}) and is "
        "scored by data_source='synthetic/digits': the built-in scorer gsm8k_flexible compares the answer with one "
        "reference answer, a string or a number, so every response would score 0; 1 more row(s) too; "), msg
    with pytest.raises(ConfigError, match=r"row 2 of .* scored by reward_model.scorer=math: the built-in scorer "
                                          "math_boxed compares"):
        check_reward_scorers(_make(scorer="math"), "data_source", [ds])
    fn_path = tmp_path / "rw.py"
    fn_path.write_text("def compute_score(solution_str, ground_truth, extra_info=None):\n"
                       "    return float(solution_str.strip() in ground_truth)\n")
    check_reward_scorers(_make(scorer=load_custom_scorer(str(fn_path))), "data_source", [ds])
    ok = _write(tmp_path / "ok.jsonl", [_row(gt="6", data_source="gsm8k"), _row(gt=6.0, data_source="math")])
    check_reward_scorers(_make(), "data_source", [PromptDataset(ok, tok, max_prompt_length=32)])


def _batch_fn(data_sources, solution_strs, ground_truths, extra_infos=None):
    return [float(s == "synthetic") for s in data_sources]


def test_p20_the_batch_manager_refuses_a_reward_fn_key_that_names_no_column(tmp_path, tok):
    """``reward_model.reward_manager=batch`` passes the column's values as ``data_sources``: a key naming no column
    gave the function ``[None, ...]`` and the run trained on zero rewards without a word (verl raises a KeyError)."""
    import torch

    from rewards.batch_manager import BatchRewardManager
    from trainer.protocol import DataProto

    path = _write(tmp_path / "train.jsonl", [_row(data_source="synthetic"), _row(data_source="synthetic")])
    ds = PromptDataset(path, tok, max_prompt_length=32)
    make = lambda: BatchRewardManager(CharTokenizer(), scorer=_batch_fn, reward_fn_key="data_sourc",  # noqa: E731
                                      num_workers=0)
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(make, "data_sourc", [ds])
    msg = str(info.value)
    assert msg.startswith(f"data.reward_fn_key='data_sourc': the column 'data_sourc' is missing from {path} ") and \
        "reward_manager=batch passes this column to the batch reward function as data_sources" in msg, msg
    ok = lambda: BatchRewardManager(CharTokenizer(), scorer=_batch_fn, num_workers=0)  # noqa: E731
    check_reward_scorers(ok, "data_source", [ds])  # the right key passes
    data = DataProto.from_dict({"responses": torch.ones(2, 2, dtype=torch.long), "response_mask": torch.ones(2, 2)},
                               {"data_source": ["synthetic"] * 2, "reward_model": [{"ground_truth": "1"}] * 2})
    assert ok()(data).reward_extra_info["score"] == [1.0, 1.0]
    with pytest.raises(KeyError, match=r"reward_fn_key column 'data_sourc' is not in the batch .* data_sources"):
        make()(data)  # a batch that did not come from checked data


UNREADABLE = [("synthetic/digits", "six", "gsm8k_flexible", "one number"),
              ("openai/gsm8k", "1,2", "gsm8k_score", "one number"),
              ("gsm8k", "10 - 3", "gsm8k_score", "one number"),
              ("math", "\\quad", "math_boxed", "an answer that typesets as something"),
              ("synthetic/arith_tool", "2.5", "compute_score", "one whole number")]


@pytest.mark.parametrize("source, truth, scorer, expects", UNREADABLE)
def test_unreadable_ground_truth_is_refused_before_start(tmp_path, tok, source, truth, scorer, expects):
    """A string (or number) ground truth that the routed built-in scorer cannot read as a reference answer (``"six"``
    for the number scorers, ``"1,2"``, an expression) scored 0 on every response without a word: refused before
    start-up in one line naming the file, the first such row, its value, what the scorer reads and the count."""
    rows = [_row(gt="6", data_source=source)] + [_row(gt=truth, data_source=source)] * 3
    path = _write(tmp_path / "train.jsonl", rows)
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(_make(), "data_source", [PromptDataset(path, tok, max_prompt_length=32)])
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(
        f"row 1 of {path} (counted from 0) has reward_model.ground_truth={truth!r} (a {type(truth).__name__}) and "
        f"is scored by data_source={source!r}: the built-in scorer {scorer} reads "), msg
    assert expects in msg and "2 more row(s) too" in msg and "custom_reward_function" in msg, msg


def test_a_long_unreadable_ground_truth_is_shown_with_its_end(tmp_path, tok):
    """A full solution as the ground truth: the error shows its start and its end, where the unreadable answer is."""
    long = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 10 - 3"
    path = _write(tmp_path / "train.jsonl", [_row(gt=long, data_source="openai/gsm8k")])
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(_make(), "data_source", [PromptDataset(path, tok, max_prompt_length=32)])
    msg = str(info.value)
    assert "ground_truth='Natalia sold" in msg and "#### 10 - 3' (a str)" in msg and "\n" not in msg.replace(
        "\\n", ""), msg


READABLE = {"gsm8k": ["1,234", "$5", "5/2", "-3", "3.50", 12.0, 7, "so\n#### 18", "1.5e3"],
            "synthetic/digits": ["6", " 6 "], "math": ["\\frac{1}{2}", "x", "6", 0.5, "\\boxed{3}"],
            "synthetic/arith_tool": ["12", "1,234", 12.0, -3]}


def test_readable_ground_truths_pass_and_custom_scorers_are_not_checked(tmp_path, tok):
    """Every ground truth a built-in scorer reads passes (thousands separators, ``$``, fractions, signs, trailing
    zeros, a full ``#### N`` solution, SVAMP's floats); a custom function and the format scorers are given theirs."""
    from rewards.registry import get_scorer, ground_truth_problem, load_custom_scorer

    rows = [_row(gt=t, data_source=s) for s, truths in READABLE.items() for t in truths]
    for truth in (float("nan"), float("inf"), True):  # the loader skips a NaN row; a scorer asked directly refuses it
        assert "reads one number" in ground_truth_problem(get_scorer("gsm8k"), truth)
    check_reward_scorers(_make(), "data_source", [PromptDataset(_write(tmp_path / "ok.jsonl", rows), tok, 32)])
    bad = _write(tmp_path / "bad.jsonl", [_row(gt="six", data_source="gsm8k")])
    with pytest.raises(ConfigError, match=r"scored by reward_model.scorer=format_gsm8k: the built-in scorer "
                                          r"format_gsm8k reads .*one number"):
        check_reward_scorers(_make(scorer="format_gsm8k"), "data_source", [PromptDataset(bad, tok, 32)])
    check_reward_scorers(_make(scorer="format_boxed"), "data_source", [PromptDataset(bad, tok, 32)])
    fn_path = tmp_path / "rw.py"
    fn_path.write_text("def compute_score(solution_str, ground_truth, extra_info=None):\n"
                       "    return float(solution_str.strip() == ground_truth)\n")
    check_reward_scorers(_make(scorer=load_custom_scorer(str(fn_path))), "data_source", [PromptDataset(bad, tok, 32)])


def test_ground_truths_are_read_once_per_distinct_value(monkeypatch):
    """100,000 rows with a few distinct ground truths are read a few times, not once a row (start-up stays fast)."""
    from rewards import registry
    from trainer.config_checks import check_ground_truths

    calls = []
    real = registry.ground_truth_problem
    monkeypatch.setattr(registry, "ground_truth_problem", lambda fn, t: calls.append(t) or real(fn, t))
    rows = [{"data_source": "gsm8k", "reward_model": {"ground_truth": str(i % 10)}} for i in range(100_000)]
    manager = SimpleNamespace(scorer=None, scorer_name=None)
    check_ground_truths(manager, "data_source", [SimpleNamespace(rows=rows, files=["big.jsonl"])])
    assert len(calls) <= 20, len(calls)


def test_main_refuses_an_unreadable_ground_truth_before_start(tmp_path):
    """The real entry point: exit 2, one ``error:`` line naming the file and the row, nothing started."""
    from tests.e2e_shared import run_main_forked

    path = _write(tmp_path / "six.jsonl", [_row(gt="six", data_source="synthetic/digits")] * 16)
    proc = run_main_forked(str(tmp_path / "out"), f"data.train_files={path}", "data.train_batch_size=8",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=8", timeout=120, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"row 0 of {path} (counted from 0)" in lines[0] and "'six'" in lines[0], lines[0]
