"""PRIME end to end through the real entry point: ``algorithm=prime``, 2 steps on CPU (actor, ref, PRM, PRM ref)."""
import math
import os

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import SHORT, read_metrics

pytestmark = pytest.mark.slow


def test_prime_two_steps_entry_point(tmp_path):
    out = str(tmp_path / "prime")
    # the embedded task's answers fill max_response_length without EOS: do not filter them as truncated
    run_main_forked(out, "algorithm=prime", *SHORT, "data.filter_truncate=false", "trainer.save_freq=2",
                  "reward_model.model.optim.lr=1e-3")
    rows = [r for r in read_metrics(out) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # 8 prompts x oversample 4 = 32 groups scored and filtered back to 8
        assert r["prime/groups_total"] == 32.0
        for key in ("prime/acc", "prime/pass_ratio", "reward_model/ce_loss", "reward_model/grad_norm",
                    "reward_model/dpo_acc", "reward_model/reward", "actor/pg_loss", "actor/grad_norm",
                    "critic/advantages/mean", "timing_s/prm"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (key, r.get(key))
        assert abs(r["critic/advantages/mean"]) < 1e-4  # batch-global whitening
        assert r["reward_model/skipped_steps"] == 0.0
    ckpt = os.path.join(out, "checkpoints", "global_step_2")
    assert os.path.isdir(os.path.join(ckpt, "actor")) and os.path.isdir(os.path.join(ckpt, "reward"))
