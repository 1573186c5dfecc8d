"""Scorer of the tool-arithmetic task (``synthetic/arith_tool``): exact integer match of the final answer.

The answer is the number after the last ``#### `` marker (:func:`rewards.gsm8k.extract_solution`, strict), searched
only in the text after the last tool answer (after the last ``answer_after`` string, ``</tool_response>`` for
Hermes/Qwen templates): the model has to state the result itself, a program that prints ``#### N`` earns nothing.
The comparison is exact (integers of any length, ``1,234`` = ``1234``; ``1234.0`` is not an integer answer).
Registered in :mod:`rewards.registry` as ``arith_tool`` and under its data_source.
"""
from __future__ import annotations

from typing import Any

from rewards.gsm8k import TOOL_RESPONSE_END, extract_solution, final_answer_text, normalize_number

__all__ = ["TASK_NAME", "compute_score"]

TASK_NAME = "synthetic/arith_tool"


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  answer_after: str | None = TOOL_RESPONSE_END, format_score: float = 0.0,
                  score: float = 1.0) -> dict:
    """Score one trajectory.

    Args:
        solution_str: the decoded response, tool answers included.
        ground_truth: the exact integer answer (int or decimal string).
        extra_info: unused (the row's ``extra_info``).
        answer_after: only the text after the last occurrence of this string is searched; None searches all.
        format_score: reward for a well-formed (``#### N``) but wrong answer.
        score: reward for the right answer.

    Returns:
        ``{"score": float, "acc": 0.0|1.0, "tool_used": 0.0|1.0}``; ``tool_used`` is 1 when ``answer_after``
        occurs in the text (a tool answered at least once).
    """
    text, used = final_answer_text(solution_str, answer_after)
    answer = extract_solution(text, method="strict")
    got, want = normalize_number(answer), normalize_number(ground_truth)
    correct = (answer is not None and "." not in answer and got is not None and want is not None
               and want.denominator == 1 and got == want)
    value = score if correct else (format_score if answer is not None else 0.0)
    return {"score": float(value), "acc": float(correct), "tool_used": float(used)}
