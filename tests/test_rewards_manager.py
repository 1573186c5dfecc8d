"""RewardManager: case P20 (custom reward_fn_key), extra_info/dict pass-through, verify(), last-token placement,
raising/NaN/timeout/crashing scorers counted, registry routing, custom scorer files, speed."""
import math
import os
import time

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rewards.manager import RewardManager, RewardOutput
from rewards.registry import get_scorer, load_custom_scorer, register_scorer
from trainer.protocol import DataProto

WORDS = ["[PAD]", "[UNK]", "[EOS]", "####", "the", "answer", "is", "\\boxed{42}", "\\boxed{7}", "slow", "boom",
         "nan", "crash", "hang"] + [str(i) for i in range(100)] + ["</tool_response>"]
ID = {w: i for i, w in enumerate(WORDS)}


@pytest.fixture(scope="module")
def tok():
    t = Tokenizer(models.WordLevel(dict(ID), unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def make_batch(texts, response_len=8, non_tensors=None, gts=None):
    """Right-padded responses; every row's valid tokens are its words, then [EOS] (also valid), then pads."""
    b = len(texts)
    responses = torch.full((b, response_len), ID["[PAD]"], dtype=torch.long)
    mask = torch.zeros(b, response_len, dtype=torch.float32)
    for i, t in enumerate(texts):
        ids = [ID[w] for w in t.split()] + ([ID["[EOS]"]] if t else [])
        responses[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, :len(ids)] = 1
    nt = {"reward_model": [{"ground_truth": g} for g in (gts or ["42"] * b)]}
    nt.update(non_tensors or {})
    return DataProto.from_dict({"responses": responses, "response_mask": mask}, nt)


def _stub_one(solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_p20_custom_reward_fn_key_without_data_source(tok, num_workers):
    data = make_batch(["the answer is 42", "42"], non_tensors={"ability": ["math", "math"]})
    assert "data_source" not in data
    with RewardManager(tok, reward_fn_key="ability", scorer=_stub_one, num_workers=num_workers) as rm:
        out = rm(data)
        assert isinstance(out, RewardOutput)
        expected = torch.zeros(2, 8)
        expected[0, 4] = 1.0  # 4 words + EOS -> last valid index 4
        expected[1, 1] = 1.0
        assert out.token_level_scores.dtype == torch.float32
        assert torch.equal(out.token_level_scores, expected)
        assert rm.verify(data) == [1.0, 1.0]
        assert out.metrics["reward/num_errors"] == 0.0


def _echo_extra(solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": float(extra_info["w"]), "acc": float(solution_str.endswith(ground_truth)),
            "split": extra_info["split"], "bonus": kwargs.get("bonus")}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_p20_extra_info_and_dict_results_pass_through(tok, num_workers):
    data = make_batch(["the answer is 42", "the answer is 7"],
                      non_tensors={"ability": ["math", "math"],
                                   "extra_info": [{"w": 0.5, "split": "train"}, {"w": 0.25, "split": "test"}]})
    with RewardManager(tok, reward_fn_key="ability", scorer=_echo_extra, scorer_kwargs={"bonus": 3},
                       num_workers=num_workers) as rm:
        out = rm(data)
        assert out.token_level_scores[0, 4].item() == 0.5
        assert out.token_level_scores[1, 4].item() == 0.25
        assert out.token_level_scores.sum().item() == 0.75
        assert out.reward_extra_info == {"score": [0.5, 0.25], "acc": [1.0, 0.0], "split": ["train", "test"],
                                         "bonus": [3, 3]}
        assert out.metrics["reward/num_dicts"] == 2.0
        assert rm.verify(data) == [1.0, 0.0]  # verify uses "acc" when present


def test_last_valid_token_placement_and_empty_rows(tok):
    data = make_batch(["42", "", "the answer is 42 42 42"], response_len=8,
                      non_tensors={"data_source": ["synthetic/digits"] * 3})
    mask = data["response_mask"].clone()
    mask[2, 2] = 0  # a masked-out token in the middle: the last valid token is still index 6 (EOS)
    data["response_mask"] = mask
    with RewardManager(tok, num_workers=0) as rm:
        out = rm(data)
    s = out.token_level_scores
    assert s[0].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
    assert s[1].tolist() == [0] * 8  # empty response: no token to hold a score
    assert s[2].tolist() == [0, 0, 0, 0, 0, 0, 1, 0]
    assert out.metrics["reward/num_empty_responses"] == 1.0
    assert out.reward_extra_info["score"] == [1.0, 0.0, 1.0]


def test_decodes_only_valid_tokens(tok):
    seen = []

    def record(solution_str, ground_truth, extra_info=None, **kw):
        seen.append(solution_str)
        return 0.0

    data = make_batch(["the answer is 42"], non_tensors={})
    mask = data["response_mask"].clone()
    mask[0, 1:3] = 0  # "answer is" masked out
    data["response_mask"] = mask
    RewardManager(tok, scorer=record, num_workers=0)(data)
    assert seen == ["the 42"]  # special tokens ([EOS]) skipped too


def test_registry_routing_by_data_source(tok):
    data = make_batch(["the answer is #### 42", "\\boxed{42}", "the answer is 42", "#### 12"],
                      non_tensors={"data_source": ["openai/gsm8k", "math500", "synthetic/digits", "svamp"]},
                      gts=["42", "42", "42", 12.0])
    with RewardManager(tok, num_workers=2) as rm:
        out = rm(data)
    assert out.reward_extra_info["score"] == [1.0, 1.0, 1.0, 1.0]
    bad = make_batch(["42"], non_tensors={"data_source": ["unknown/set"]})
    with pytest.raises(KeyError, match="unknown/set"):
        RewardManager(tok, num_workers=0)(bad)
    with pytest.raises(KeyError, match="data_source"):
        RewardManager(tok, num_workers=0)(make_batch(["42"], non_tensors={"ability": ["x"]}))


def test_named_scorer_and_format_reward(tok):
    data = make_batch(["#### 42", "#### 7", "42"], non_tensors={})
    with RewardManager(tok, scorer="format_gsm8k", scorer_kwargs={"format_score": 0.2}, num_workers=0) as rm:
        out = rm(data)
        assert out.reward_extra_info["score"] == [1.0, 0.2, 0.0]
        assert out.reward_extra_info["acc"] == [1.0, 0.0, 0.0]
        assert out.reward_extra_info["format"] == [1.0, 1.0, 0.0]
        assert rm.verify(data) == [1.0, 0.0, 0.0]
    with pytest.raises(KeyError, match="no_such_scorer"):
        RewardManager(tok, scorer="no_such_scorer")


def _faulty(solution_str, ground_truth, extra_info=None, **kwargs):
    if "boom" in solution_str:
        raise RuntimeError("boom")
    if "nan" in solution_str:
        return float("nan")
    if "slow" in solution_str:
        time.sleep(60)  # interruptible by SIGALRM and by killing the worker
    if "hang" in solution_str:
        while True:  # pure-Python CPU hang (interruptible by SIGALRM, unlike a C loop)
            pass
    if "crash" in solution_str:
        os._exit(3)  # the worker process dies
    if "the" in solution_str:
        return {"acc": 1.0}  # dict without "score": an error
    return {"score": 1.0, "acc": 1.0}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_faulty_scorers_counted_and_zeroed(tok, num_workers):
    texts = ["42", "boom", "nan", "slow", "the", "hang", "42"]
    if num_workers:
        texts.append("crash")  # only a process pool survives os._exit
    data = make_batch(texts, non_tensors={})
    with RewardManager(tok, scorer=_faulty, timeout_s=0.5, num_workers=num_workers) as rm:
        t0 = time.perf_counter()
        out = rm(data)
        elapsed = time.perf_counter() - t0
        scores = out.reward_extra_info["score"]
        assert scores == [1.0] + [0.0] * 5 + [1.0] + [0.0] * (len(texts) - 7)
        assert torch.isfinite(out.token_level_scores).all()
        assert out.token_level_scores.sum().item() == 2.0
        m = out.metrics
        assert m["reward/num_errors"] == 2.0 + (1.0 if num_workers else 0.0)  # boom, no-score dict (+ crash)
        assert m["reward/num_nan"] == 1.0
        assert m["reward/num_timeouts"] == 2.0  # slow, hang
        assert elapsed < 5.0
        # the pool is healthy afterwards
        again = rm(make_batch(["42", "42"], non_tensors={}))
        assert again.reward_extra_info["score"] == [1.0, 1.0]


def test_pool_kills_uninterruptible_c_hang(tok):
    def big_int(solution_str, ground_truth, extra_info=None, **kw):
        if "hang" in solution_str:
            return float(10 ** (10 ** 9) % 7)  # C-level big-int arithmetic: no signal can stop it
        return 1.0

    data = make_batch(["hang", "42", "42", "42"], non_tensors={})
    with RewardManager(tok, scorer=big_int, timeout_s=1.0, num_workers=2) as rm:
        t0 = time.perf_counter()
        out = rm(data)
        assert time.perf_counter() - t0 < 5.0
    assert out.reward_extra_info["score"] == [0.0, 1.0, 1.0, 1.0]
    assert out.metrics["reward/num_timeouts"] == 1.0


def test_scorer_registered_after_pool_start_is_seen(tok):
    data = make_batch(["42"], non_tensors={"data_source": ["openai/gsm8k"]})
    with RewardManager(tok, num_workers=1) as rm:
        rm(data)  # forks the pool

        @register_scorer("tests/late_registered", overwrite=True)
        def late(solution_str, ground_truth, extra_info=None, **kw):
            return 0.75

        out = rm(make_batch(["42"], non_tensors={"data_source": ["tests/late_registered"]}))
    assert out.reward_extra_info["score"] == [0.75]
    assert get_scorer("tests/late_registered") is late


def test_load_custom_scorer_verl_signature(tok, tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    return {'score': 2.0 if data_source == 'mine' else -1.0, 'acc': 1.0}\n"
                 "def other(solution_str, ground_truth, extra_info=None):\n"
                 "    return 0.5\n")
    fn = load_custom_scorer(str(f))
    data = make_batch(["42", "7"], non_tensors={"task": ["mine", "theirs"]})
    with RewardManager(tok, reward_fn_key="task", scorer=fn, num_workers=2) as rm:
        assert rm(data).reward_extra_info["score"] == [2.0, -1.0]
    assert load_custom_scorer(f, name="other")("x", "y") == 0.5
    with pytest.raises(AttributeError, match="nope"):
        load_custom_scorer(f, name="nope")
    with pytest.raises(FileNotFoundError):
        load_custom_scorer(tmp_path / "missing.py")


def test_bad_inputs_raise_clear_errors(tok):
    with pytest.raises(ValueError, match="timeout_s"):
        RewardManager(tok, timeout_s=0)
    with pytest.raises(ValueError, match="num_workers"):
        RewardManager(tok, num_workers=-1)
    data = make_batch(["42"], non_tensors={})
    data.non_tensor["reward_model"][0] = {"answer": "42"}
    with pytest.raises(ValueError, match="ground_truth"):
        RewardManager(tok, scorer=_stub_one, num_workers=0)(data)


def test_512_short_responses_are_fast(tok):
    torch.manual_seed(0)
    b, r = 512, 32
    texts = [" ".join(["the", "answer", "is", "####", str(int(torch.randint(0, 100, ()).item()))]) for _ in range(b)]
    data = make_batch(texts, response_len=r, non_tensors={"data_source": ["openai/gsm8k"] * b})
    expected = sum(t.endswith(" 42") for t in texts)
    for nw in (0, 2):
        with RewardManager(tok, num_workers=nw) as rm:
            rm(data)  # first call forks the pool
            t0 = time.perf_counter()
            out = rm(data)
            elapsed = time.perf_counter() - t0
        assert out.token_level_scores.sum().item() == expected
        assert elapsed < 1.0, elapsed  # measured 0.03-0.09 s on 2 busy cores


def _components(solution_str, ground_truth, extra_info=None, **kwargs):
    if "boom" in solution_str:
        raise RuntimeError("boom")
    acc = float(solution_str.split()[-1] == ground_truth)
    fmt = float("nan") if "nan" in solution_str else float(solution_str.startswith("the"))
    return {"score": acc + 0.5 * fmt, "acc": acc, "format": fmt, "note": "text is fine outside the components"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_named_reward_components_in_key_order(tok, num_workers):
    data = make_batch(["the answer is 42", "42", "7", "boom", "the nan 42"])
    with RewardManager(tok, scorer=_components, num_workers=num_workers, component_keys=["format", "acc"]) as rm:
        out = rm(data)
    # a failing scorer's row gets 0 (as its score); a non-finite component 0, counted
    assert out.reward_components.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
    assert out.reward_components.dtype == torch.float32
    assert out.metrics["reward/num_nan_components"] == 1.0 and out.metrics["reward/num_errors"] == 1.0
    with RewardManager(tok, scorer=_components, num_workers=0) as rm:
        assert rm(data).reward_components is None  # no keys asked for


def test_reward_components_that_a_scorer_does_not_return_fail_naming_them(tok):
    data = make_batch(["the answer is 42", "42"])
    with RewardManager(tok, scorer=_components, num_workers=0, component_keys=["acc", "length"]) as rm:
        with pytest.raises(ValueError, match=r"row 0: the scorer's dict lacks the reward component 'length' \(its "
                                             r"keys: \['acc', 'format', 'note', 'score'\]\)"):
            rm(data)
    with RewardManager(tok, scorer=_components, num_workers=0, component_keys=["note"]) as rm:
        with pytest.raises(ValueError, match="reward component 'note' = 'text is fine"):
            rm(data)
    with RewardManager(tok, scorer=_stub_one, num_workers=0, component_keys=["acc"]) as rm:
        with pytest.raises(ValueError, match="the scorer returned a number for row 0; it must return a dict"):
            rm(data)
    for bad in (["acc", "acc"], ["", "acc"], [3]):
        with pytest.raises(ValueError, match="expected distinct non-empty strings"):
            RewardManager(tok, scorer=_components, num_workers=0, component_keys=bad)


@pytest.mark.parametrize("strict", [False, True])
def test_a_tool_answer_end_the_model_wrote_itself_is_no_boundary(tok, strict):
    """A single-turn response that writes ``</tool_response>`` after several answers would have the scorer read only
    what follows it; the manager puts a space in its place, so the whole text is read (as TRL's side reads it)."""
    data = make_batch(["#### 1 #### 1 </tool_response> #### 1"], gts=["1"])
    with RewardManager(tok, scorer="format_gsm8k", scorer_kwargs={"strict_format": strict}, num_workers=0) as rm:
        assert rm.verify(data) == [0.0 if strict else 1.0]  # three answers: not in strict format
