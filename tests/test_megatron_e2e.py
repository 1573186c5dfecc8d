"""The real entry point with ``trainer.strategy=megatron`` on CPU: Ray + 2 MegatronActorRefWorker processes (gloo),
embedded tiny Llama, 2 GRPO steps, once with data parallelism 2 and once with tensor parallelism 2; the TP=2
run's dist checkpoint then resumes at TP=1 for a third step.

``rollout/log_prob_diff_max`` compares the rollout engine's log-probs of the sampled tokens with the Megatron
actor's: both fp32, so a small value means the engine held the synced actor weights at every step.
"""
import math
import os

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.e2e_shared import run_main_forked  # noqa: E402
from tests.e2e_utils import SHORT, read_metrics  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_two_steps(tmp_path, tp):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = str(tmp_path / f"tp{tp}")
    run_main_forked(out, "trainer.strategy=megatron",
                    f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
                    "actor_rollout_ref.actor.use_kl_loss=true", "trainer.save_freq=2", *SHORT)
    steps = [r for r in read_metrics(out) if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean", "timing_s/step"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (key, r.get(key))
        assert r["rollout/log_prob_diff_max"] < 1e-4, r["rollout/log_prob_diff_max"]
    ckpt = os.path.join(out, "checkpoints", "global_step_2", "actor")
    assert os.path.isfile(os.path.join(ckpt, "dist_ckpt", "metadata.json"))   # ckpt_format=torch_dist (default)
    assert all(os.path.isfile(os.path.join(ckpt, "extra", f"extra_tp{t}_pp0_dp{d}.pt"))
               for t in range(tp) for d in range(2 // tp))
    hf = os.path.join(out, "hf_actor")
    assert AutoModelForCausalLM.from_pretrained(hf).config.num_hidden_layers == 2
    init = load_file(os.path.join(out, "init_model", "model.safetensors"))
    final = load_file(os.path.join(hf, "model.safetensors"))
    assert set(final) <= set(init)
    assert any(not torch.equal(init[k].float(), final[k].float()) for k in final), "the actor did not change"
    # tools/export_hf.py turns the Megatron step folder into the same weights offline (no megatron-core needed)
    from tools.export_hf import export_checkpoint

    offline = export_checkpoint(ckpt, os.path.join(out, "hf_offline"), dtype="float32")
    again = load_file(os.path.join(offline, "model.safetensors"))
    assert set(again) == set(final)
    for k in final:
        assert torch.equal(again[k].float(), final[k].float()), k
    if tp == 2:  # the TP=2 dist checkpoint resumes at TP=1 x DP=2 (resharded on load) for a third step
        run_main_forked(str(tmp_path / "resumed"), "trainer.strategy=megatron",
                        "actor_rollout_ref.actor.use_kl_loss=true", f"trainer.resume_mode={os.path.dirname(ckpt)}",
                        *SHORT[1:], "trainer.total_training_steps=3")
        assert [r["step"] for r in read_metrics(str(tmp_path / "resumed")) if "actor/pg_loss" in r] == [3]
