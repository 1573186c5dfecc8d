"""The tool-arithmetic task: generated rows, the exact-match scorer, and the chain generator -> multi-turn loop with
the python tool -> scorer for a scripted policy that uses the tool and one that guesses."""
from __future__ import annotations

import json
import re

import pytest

from rewards.arith_tool import TASK_NAME, compute_score
from rewards.registry import get_scorer
from rollout.base import SamplingConfig
from rollout.multiturn import multi_turn_generate, prepare_multi_turn
from tests.multiturn_utils import ScriptedEngine, build_chat_tokenizer
from trainer.embedded_tool import make_rows, with_tool_instruction, write_task


def test_rows_layout_and_exact_answers(tmp_path):
    rows = make_rows(50, seed=3, ops=("*", "+", "-"))
    assert rows == make_rows(50, seed=3, ops=("*", "+", "-")) and rows != make_rows(50, seed=4, ops=("*", "+", "-"))
    for r in rows:
        x = r["extra_info"]
        assert r["data_source"] == TASK_NAME and r["reward_model"]["style"] == "rule"
        assert 6 <= len(str(x["a"])) <= 9 and 6 <= len(str(x["b"])) <= 9
        want = {"*": x["a"] * x["b"], "+": x["a"] + x["b"], "-": x["a"] - x["b"]}[x["op"]]
        assert r["reward_model"]["ground_truth"] == str(want)
        (msg,) = r["prompt"]
        assert msg["role"] == "user" and f"{x['a']} {x['op']} {x['b']}" in msg["content"]
        assert "python tool" in msg["content"] and "####" in msg["content"]
    train, val = write_task(str(tmp_path), train_rows=5, val_rows=2, seed=1)
    assert [json.loads(line) for line in open(train)] == make_rows(5, 1)
    assert len(open(val).readlines()) == 2
    with pytest.raises(ValueError, match=r"ops=\['/'\]"):
        make_rows(1, 0, ops=("/",))
    with pytest.raises(ValueError, match="min_digits <= max_digits"):
        make_rows(1, 0, min_digits=9, max_digits=6)
    with pytest.raises(ValueError, match="tool='shell'"):
        make_rows(1, 0, tool="shell")


def test_tool_instruction_added_to_math_rows():
    rows = [{"data_source": "svamp", "prompt": [{"role": "user", "content": "Tom has 3 apples. "}],
             "reward_model": {"ground_truth": "3"}}]
    out = with_tool_instruction(rows, tool="calculator")
    assert out[0]["prompt"][0]["content"].startswith("Tom has 3 apples. Use the calculator tool")
    assert rows[0]["prompt"][0]["content"] == "Tom has 3 apples. "  # input untouched
    with pytest.raises(ValueError, match="row 0: prompt must be a list"):
        with_tool_instruction([{"prompt": "plain text"}])


@pytest.mark.parametrize("text,acc,score", [
    ("<tool_response>\n54232971876528566\n</tool_response> The answer is #### 54232971876528566", 1, 1.0),
    ("<tool_response>\n54232971876528566\n</tool_response> #### 54,232,971,876,528,566", 1, 1.0),
    ("<tool_response>\n#### 54232971876528566\n</tool_response> I am not sure.", 0, 0.0),  # the program's marker
    ("<tool_response>\n54232971876528566\n</tool_response> #### 54232971876528567", 0, 0.1),  # off by one
    ("#### 54232971876528566.0", 0, 0.1),  # not an integer answer
    ("#### 54232971876528566", 1, 1.0),  # no tool used, still right
    ("no answer", 0, 0.0),
])
def test_scorer_exact_match_after_the_last_tool_answer(text, acc, score):
    out = compute_score(text, "54232971876528566", format_score=0.1)
    assert out["acc"] == acc and out["score"] == score
    assert out["tool_used"] == float("</tool_response>" in text)
    assert get_scorer(TASK_NAME) is compute_score and get_scorer("arith_tool") is compute_score


def test_the_task_needs_the_tool_and_the_tool_solves_it():
    tk = build_chat_tokenizer()
    rows = make_rows(4, seed=0, min_digits=7, max_digits=9)
    prompts = [tk.encode(tk.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False) for r in rows]

    def with_tool(ctx, k):  # writes a program for the question, then copies the printed result
        if "<tool_response>" in ctx:
            return "#### " + re.findall(r"<tool_response>\n(-?\d+)", ctx)[-1] + "<|im_end|>"
        a, op, b = re.search(r"What is (\d+) ([*+-]) (\d+)\?", ctx).groups()
        return f"```python\nprint({a} {op} {b})\n```<|im_end|>"

    def guess(ctx, k):  # multiplies the leading digits in its head
        a, b = re.search(r"What is (\d+) \* (\d+)\?", ctx).groups()
        return f"#### {int(a[:2]) * int(b[:2]) * 10 ** (len(a) + len(b) - 4)}<|im_end|>"

    cfg, tools, template = prepare_multi_turn({"enable": True, "format": "python_block", "tools": [
        {"class_name": "python", "config": {"timeout_s": 5, "min_isolation": "process"}}]}, tk)
    for script, want in ((with_tool, 1.0), (guess, 0.0)):
        res = multi_turn_generate(ScriptedEngine(tk, script), tk, prompts, SamplingConfig(max_new_tokens=200),
                                  tools, cfg, template)
        texts = [tk.decode(res.rollout.responses[i][res.attention_mask[i] == 1], skip_special_tokens=False)
                 for i in range(len(rows))]
        scores = [compute_score(t, r["reward_model"]["ground_truth"])["score"] for t, r in zip(texts, rows)]
        assert scores == [want] * len(rows)
