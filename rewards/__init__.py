"""Rewards: rule scorers (GSM8K, MATH, format-shaped), a scorer registry and the reward manager.

Scorers are plain functions ``score(solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict``
(a dict must hold ``"score"``). Heavy imports (math-verify, sympy, torch) happen in the sub-modules only.
"""
