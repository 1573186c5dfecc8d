"""Format-aware (shaped) outcome reward: full reward for a correct final answer, a small reward for a
well-formed but wrong one, nothing otherwise.

This is the shaping used in verl's GSM8K example (``format_score``) and in many "RL works" demos: early in
training a small model rarely answers correctly, so a small bonus for emitting the expected answer format
(``#### N`` or ``\\boxed{...}``) gives a learning signal; the strict 0/1 correctness is reported separately
(``acc``) so that curves of real accuracy are not inflated by the shaping.

``strict_format=True`` asks for the whole response to be in format, as the format rewards of DeepSeek-R1-style
recipes do (a full-response pattern, not a search): exactly one answer (``#### N`` or ``\\boxed``/``\\fbox``)
and at most a short tail after it (:func:`single_final_answer`). Without it a response that repeats ``#### 1`` to the
length limit is well-formed and is right whenever the answer is 1; a small policy can collapse onto such a constant
answer (``docs/results.md``, "Learning per GPU-minute against TRL").
"""
from __future__ import annotations

import re
from typing import Any

from rewards import gsm8k
from rewards import math as math_reward

__all__ = ["compute_score", "ANSWER_FORMATS", "MAX_AFTER_ANSWER", "MAX_BOX_GAP", "single_final_answer"]

ANSWER_FORMATS = ("gsm8k", "boxed")
# a strict marker's head: four '#', one or two spaces or tabs, at most a sign and a currency sign, then the number
_STRICT_HEAD = re.compile(r"####[ \t]{1,2}[-+\u2212]?\$?[-+\u2212]?[0-9.]")
MAX_BOX_GAP = 2  # spaces a strict ``\boxed 7`` / ``\boxed {7}`` may hold between the command and its answer
MAX_AFTER_ANSWER = 64  # characters after a strict answer, whitespace included: a unit, "$.", a closing sentence


def single_final_answer(text: str, answer_format: str = "gsm8k") -> bool:
    """Whether ``text`` holds exactly one answer and at most a short tail after it (the check of
    ``strict_format``; whether the answer is readable is checked apart):

    - ``"gsm8k"``: one ``#### N`` marker (:func:`rewards.gsm8k.answer_markers`: any ``####`` followed by a number,
      a numbered heading such as ``#### 1. Add`` too; a ``####`` without a number is none), written as four ``#``,
      one or two spaces or tabs, at most a sign and a currency sign, then the number (``#### -$5``; not ``####``
      and blanks to the length limit);
    - ``"boxed"``: one ``\\boxed``/``\\fbox`` command (the two together; :func:`rewards.math.box_commands`: not
      ``\\fboxsep``), closed, at most :data:`MAX_BOX_GAP` spaces after the command (``\\boxed{7}``, ``\\boxed 7``, ``\\boxed7``);
    - after the answer (the number, or the box) at most :data:`MAX_AFTER_ANSWER` characters, whitespace included:
      ``#### 32\\nThe answer is 32.``, ``#### 3/4`` and ``$\\boxed{7}$.`` are fine; the answer repeated, or any
      text or blank lines to the length limit, are not.

    Raises:
        ValueError: if ``answer_format`` is not one of ``ANSWER_FORMATS``.
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    if not isinstance(text, str):
        return False
    if answer_format == "gsm8k":
        spans = gsm8k.answer_markers(text)
        if len(spans) != 1 or _STRICT_HEAD.match(text, spans[0][0]) is None:
            return False
        return len(text) - spans[0][1] <= MAX_AFTER_ANSWER
    if len(math_reward.box_commands(text)) != 1:
        return False
    end = _box_end(text)
    return end is not None and len(text) - end <= MAX_AFTER_ANSWER


def _box_end(text: str) -> int | None:
    """The index just after the last closed box of ``text`` (:func:`rewards.math.last_box`), or None; None too when
    more than :data:`MAX_BOX_GAP` spaces follow the command."""
    found = math_reward.last_box(text)
    if found is None:
        return None
    start, end, _ = found
    command = "\\fbox" if text.startswith("\\fbox", start) else "\\boxed"
    window = text[start + len(command):][:MAX_BOX_GAP + 1]
    if len(window) - len(window.lstrip(" \t")) > MAX_BOX_GAP:
        return None
    return end


def compute_score(solution_str: str, ground_truth: Any, correct_score: float = 1.0, format_score: float = 0.1,
                  answer_format: str = "gsm8k", answer_after: str | None = None,
                  strict_format: bool = False) -> dict[str, float]:
    """Shaped reward for one response.

    Args:
        solution_str: the decoded model response.
        ground_truth: the reference answer (GSM8K number such as ``"18"`` / ``12.0``, or MATH LaTeX).
        correct_score: reward for a correct final answer.
        format_score: reward for a well-formed but wrong final answer (``0 <= format_score <= correct_score``
            is the usual choice, not enforced).
        answer_format: ``"gsm8k"`` (the last ``#### N`` marker with a number, strict GSM8K extraction) or
            ``"boxed"`` (the last closed ``\\boxed{...}``/``\\fbox{...}`` whose content is not empty
            (:func:`rewards.math.is_empty_answer`: ``\\boxed{\\,}`` or ``\\boxed{\\text{}}`` is no answer), compared
            with :func:`rewards.math.is_equiv`). A gsm8k answer is well-formed only as a readable number (commas as
            thousands separators only, not ``1/0``; :func:`rewards.gsm8k.extract_solution`).
        answer_after: read the answer only after the last occurrence of this string, e.g. the end of the last
            tool answer (:func:`rewards.gsm8k.final_answer_text`); None reads the whole response.
        strict_format: a response (the part read, after ``answer_after``) is well-formed only with exactly one
            answer and at most :data:`MAX_AFTER_ANSWER` characters after it (:func:`single_final_answer`); one that
            is not scores 0 and counts as neither well-formed nor correct, whatever its last answer.

    Returns:
        ``{"score": shaped reward, "acc": 1.0 if correct else 0.0, "format": 1.0 if well-formed else 0.0}``
        (Python floats). Never raises on any ``solution_str``.

    Raises:
        ValueError: if ``answer_format`` is not one of ``ANSWER_FORMATS``.
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    if strict_format and not single_final_answer(gsm8k.final_answer_text(solution_str, answer_after)[0],
                                                 answer_format):
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    if answer_format == "gsm8k":
        well_formed, acc = gsm8k.judge(solution_str, ground_truth, method="strict", answer_after=answer_after)
    else:
        solution_str = gsm8k.final_answer_text(solution_str, answer_after)[0]
        answer = math_reward.remove_boxed(math_reward.last_boxed_only_string(solution_str))
        well_formed = answer is not None and not math_reward.is_empty_answer(answer)
        acc = well_formed and math_reward.compute_score(solution_str, ground_truth) == 1.0
    if acc:
        score = correct_score
    elif well_formed:
        score = format_score
    else:
        score = 0.0
    return {"score": float(score), "acc": 1.0 if acc else 0.0, "format": 1.0 if well_formed else 0.0}
