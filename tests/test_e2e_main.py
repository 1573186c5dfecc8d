"""The real entry point (Ray + 2 DeepSpeed workers on gloo, tiny model) end to end, 2 steps: with ZeRO-2 as a user
runs it (a new process that starts its own Ray), with ZeRO-3 forked from the session's pre-imported driver on its
Ray instance (:mod:`tests.e2e_shared`)."""
import math
import os

import pytest
import torch

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import SHORT, read_metrics, run_main

pytestmark = pytest.mark.slow


def _weights(path):
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


@pytest.mark.parametrize("zero", [2, 3])
def test_grpo_two_steps_zero(tmp_path, zero):
    out = str(tmp_path / f"run_z{zero}")
    run = run_main if zero == 2 else run_main_forked
    run(out, f"deepspeed=zero{zero}", "actor_rollout_ref.actor.use_kl_loss=true", *SHORT)
    rows = read_metrics(out)
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean",
                    "response_length/mean", "timing_s/step", "perf/throughput"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (key, r.get(key))
    from transformers import AutoModelForCausalLM

    hf = os.path.join(out, "hf_actor")
    model = AutoModelForCausalLM.from_pretrained(hf)
    assert model.config.num_hidden_layers == 2
    init, final = _weights(os.path.join(out, "init_model")), _weights(hf)
    changed = [k for k in init if not torch.equal(init[k].float(), final[k].float())]
    assert changed, "the actor did not change after 2 steps"
