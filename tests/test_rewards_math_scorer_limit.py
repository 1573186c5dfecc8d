"""The MATH scorer's own time limit (``timeout_seconds``) is not a wrong answer, and the scoring workers do not pay
math-verify's cold start inside it.

Before: a comparison the scorer cut short (``is_equiv``'s ``except ScorerTimeout: return False``) scored 0 like a
verified wrong answer, with nothing counted and nothing logged; and each freshly forked scoring worker paid
math-verify's first parse (~0.3 s idle, over 1 s on a loaded 2-core machine) inside the first comparison's 1 s limit,
so a correct answer could score 0. Now such a response still scores 0 (as in verl) but is counted in
``reward/num_scorer_timeouts`` and warned once, naming the scorer, the limit key and how to raise it; and the manager
warms math-verify in the parent before it forks its workers (:func:`rewards.math.warm_math_verify`).
"""
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from rewards import math as M
from rewards.manager import RewardManager
from rewards.math_guards import note_limit_hit, take_limit_hits
from trainer.protocol import DataProto

pytestmark = pytest.mark.skipif(M.load_math_verify() is None, reason="needs math-verify")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "The answer is \\boxed{2x^2+1}."


class Tok:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(map(chr, r)) for r in rows]


def _batch(n=4, gold="1+2x^2", source="math500"):
    resp = torch.tensor([[ord(c) for c in TEXT]] * n)
    return DataProto.from_dict({"responses": resp, "response_mask": torch.ones_like(resp)},
                               {"data_source": [source] * n, "reward_model": [{"ground_truth": gold}] * n,
                                "extra_info": [{}] * n})


@pytest.fixture
def slow_comparison(monkeypatch):
    """math-verify's comparison of this test's answer made slow (a Python loop the scorer's SIGALRM bound interrupts);
    patched before the pool forks, so its workers inherit it. Other comparisons (the warm-up's) run as they are."""
    real = M._verify_exact

    def slow(pred, gold):
        if pred == "2x^2+1":
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                pass
        return real(pred, gold)

    monkeypatch.setattr(M, "_verify_exact", slow)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_comparison_past_the_scorers_own_limit_scores_0_and_is_counted_and_warned(slow_comparison, num_workers,
                                                                                    caplog):
    caplog.set_level(logging.WARNING, logger="rewards.manager")
    with RewardManager(Tok(), num_workers=num_workers, timeout_s=10,
                       scorer_kwargs={"timeout_seconds": 0.05}) as rm:
        out = rm(_batch())
        assert out.reward_extra_info["score"] == [0.0] * 4  # as verl: not finished is not a score of 1
        assert out.metrics["reward/num_scorer_timeouts"] == 4.0
        assert out.metrics["reward/num_timeouts"] == 0.0 and out.metrics["reward/num_errors"] == 0.0
        warned = [r.getMessage() for r in caplog.records if "own time limit" in r.getMessage()]
        assert len(warned) == 1, warned
        for needle in ("4 of 4 responses", "the scorer of data_source 'math500'", "timeout_seconds=0.05 s",
                       "+reward_model.scorer_kwargs.timeout_seconds=", "reward/num_scorer_timeouts"):
            assert needle in warned[0], (needle, warned[0])
        out = rm(_batch(2))  # counted at every step, warned once
        assert out.metrics["reward/num_scorer_timeouts"] == 2.0
        assert len([r for r in caplog.records if "own time limit" in r.getMessage()]) == 1


def test_a_finished_comparison_or_a_wrong_answer_is_not_a_scorer_timeout():
    take_limit_hits()
    assert M.is_equiv("x^2+1", "1+x^2", timeout_seconds=None) and not take_limit_hits()
    assert not M.is_equiv("x^2+2", "1+x^2", timeout_seconds=None) and not take_limit_hits()
    with RewardManager(Tok(), num_workers=0, timeout_s=60, scorer_kwargs={"timeout_seconds": 30}) as rm:
        note_limit_hit(1.0)  # one left over from before the batch is not the batch's
        out = rm(_batch(2))
        assert out.reward_extra_info["score"] == [1.0, 1.0] and out.metrics["reward/num_scorer_timeouts"] == 0.0
        out = rm(_batch(2, gold="2+2x^2"))
        assert out.reward_extra_info["score"] == [0.0, 0.0] and out.metrics["reward/num_scorer_timeouts"] == 0.0


def test_is_equiv_keeps_its_return_type_and_records_the_limit(slow_comparison):
    take_limit_hits()
    assert M.is_equiv("2x^2+1", "1+2x^2", timeout_seconds=0.05) is False
    assert M.compute_score(TEXT, "1+2x^2", timeout_seconds=0.05) == 0.0
    assert take_limit_hits() == [0.05, 0.05] and take_limit_hits() == []


# A fresh interpreter (nothing of math-verify or sympy loaded yet by other tests): pool workers forked after
# warm_math_verify() load no module in their first comparison of an answer they have not seen and find math-verify
# warmed, while workers forked after a mere import (the manager before) import antlr4.LL1Analyzer and
# sympy.combinatorics / sympy.tensor in it (the cold start that took over 1 s on a loaded machine). Deterministic: no
# timing is asserted. (No torch here: its import alone takes seconds.)
_CHILD = textwrap.dedent("""
    import json, sys
    from rewards import math as M
    from rewards.pool import ScoringPool

    def first_comparison(solution_str, ground_truth):
        before = set(sys.modules)
        ok = M.is_equiv("y^3+2y", "2y+y^3", timeout_seconds=None)
        return {"score": float(ok), "new_modules": len(set(sys.modules) - before), "warmed": float(M._WARMED)}

    def first_comparisons():
        pool = ScoringPool(2, table={"f": first_comparison})
        out = pool.run([("f", ("", ""), {})] * 2, 60.0)
        pool.close()
        return [o[1] for o in out]

    M.load_math_verify()  # what the manager did before: imported, never parsed
    cold = first_comparisons()
    M.warm_math_verify()
    print(json.dumps({"cold": cold, "warm": first_comparisons()}))
""")


def test_forked_workers_inherit_math_verify_warmed():
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["warm"] == [{"score": 1.0, "new_modules": 0, "warmed": 1.0}] * 2, got
    # a worker forked cold pays the cold start in its first is_equiv, which warms math-verify before it starts the
    # comparison's clock (the manager warms before forking, so its workers never do)
    assert all(o["score"] == 1.0 and o["new_modules"] > 0 and o["warmed"] == 1.0 for o in got["cold"]), got


def test_the_manager_warms_math_verify_before_it_forks_its_workers(monkeypatch):
    import rewards.manager as manager

    order = []
    monkeypatch.setattr(M, "warm_math_verify", lambda: order.append("warm") or True)

    class Pool:
        def __init__(self, *a, **kw):
            order.append("fork")

        def close(self):
            pass

    monkeypatch.setattr(manager, "ScoringPool", Pool)
    rm = RewardManager(Tok(), num_workers=2)
    rm._get_pool()
    assert order == ["warm", "fork"]


def test_warm_up_runs_a_real_comparison_once_per_process(monkeypatch):
    calls = []
    real = M._verify_exact
    monkeypatch.setattr(M, "_verify_exact", lambda p, g: calls.append((p, g)) or real(p, g))
    monkeypatch.setattr(M, "_WARMED", False)
    take_limit_hits()
    assert M.warm_math_verify() is True
    assert calls == list(M._WARM_UP)  # a parse and verify of each small pair
    assert M.warm_math_verify() is True and len(calls) == len(M._WARM_UP)  # once
    assert not take_limit_hits()  # no limit: nothing recorded
