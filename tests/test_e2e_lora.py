"""LoRA through the real entry point (Ray + 2 DeepSpeed workers on gloo, the embedded tiny model, CPU).

* GRPO with the README's LoRA settings for the embedded default: the reward rises within 30 steps, and the run
  ends with the merged actor and its peft adapter folder.
* Exact resume with LoRA on the actor (KL loss against the adapters-disabled reference) and on the GAE critic:
  an uninterrupted 4-step run saving at step 2, and a run resumed from that save; steps 3-4 metrics and the final
  merged weights must be bit-identical (the adapter-only checkpoints bring back adapters, Adam state, LR schedule,
  data position, RNG).
"""
import json
import os

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import read_metrics
from tests.test_e2e_resume import BASE, assert_same_steps, assert_same_weights

pytestmark = pytest.mark.slow

# the README's settings for the embedded default (its tiny model's head is untied so that an adapter can sit on it)
LORA = ["actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.model.tiny.tie_word_embeddings=false",
        "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]",
        "actor_rollout_ref.actor.optim.lr=5e-3"]


def test_lora_grpo_reward_rises_on_the_embedded_default(tmp_path):
    out = str(tmp_path / "run")
    run_main_forked(out, *LORA, "trainer.total_training_steps=30")
    scores = [r["critic/score/mean"] for r in read_metrics(out) if "critic/score/mean" in r]
    assert len(scores) == 30
    first, last = sum(scores[:5]) / 5, sum(scores[-10:]) / 10
    assert last > first + 0.2 and last > 0.35, scores
    with open(os.path.join(out, "hf_actor", "lora_adapter", "adapter_config.json")) as f:
        adapter = json.load(f)
    assert adapter["r"] == 16 and adapter["lora_alpha"] == 32 and "lm_head" in adapter["target_modules"]
    assert os.path.isfile(os.path.join(out, "hf_actor", "model.safetensors"))  # the merged model


def test_lora_actor_and_critic_resume_exactly(tmp_path):
    full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
    common = ["deepspeed=zero2", *BASE, *LORA[:4], "algorithm=gae", "critic.model.lora_rank=8",
              "critic.model.lora_alpha=16", "actor_rollout_ref.actor.use_kl_loss=true",
              "actor_rollout_ref.actor.kl_loss_coef=0.01"]
    run_main_forked(full, *common)
    # resume from an explicit path into another output folder
    run_main_forked(resumed, *common, f"trainer.resume_mode={os.path.join(full, 'checkpoints', 'global_step_2')}")
    assert_same_steps(full, resumed, steps=(3, 4),
                      must_have=("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/vf_loss",
                                 "critic/grad_norm", "critic/values/mean", "actor/lr"))
    last = [r for r in read_metrics(full) if "actor/kl_loss" in r][-1]
    assert last["actor/kl_loss"] > 0  # the reference (adapters disabled) differs from the trained actor
    assert_same_weights(full, resumed)
    for role in ("actor", "critic"):
        folder = os.path.join(full, "checkpoints", "global_step_2", role)
        assert os.path.isfile(os.path.join(folder, "lora_adapter", "adapter_config.json")), role
