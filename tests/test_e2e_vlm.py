"""A vision-language model through the real entry point on CPU: the tiny random Qwen2-VL and the generated colour
task (trainer/embedded_vlm.py), GRPO with Ulysses SP=2 over 2 workers (Ray + DeepSpeed, gloo), one step; and the
bad inputs of a multimodal run, refused before any worker starts with one line naming the value."""
import json
import math
import os

import pytest
import torch

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import read_metrics

VLM_RUN = ["reward_model.scorer=gsm8k_flexible", "data.max_prompt_length=32", "data.max_response_length=2",
           "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=true"]


def _task(tmp_path):
    from trainer.embedded_vlm import write_colour_task, write_tiny_vlm

    model = write_tiny_vlm(str(tmp_path / "vlm"))
    train, val = write_colour_task(str(tmp_path / "data"), train_rows=32, val_rows=4)
    return model, train, val


@pytest.mark.slow
def test_grpo_step_on_the_colour_task_with_ulysses_sp2(tmp_path):
    from safetensors.torch import load_file

    model, train, val = _task(tmp_path)
    out = str(tmp_path / "run")
    run_main_forked(out, f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
                  "trainer.total_training_steps=1", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                  "actor_rollout_ref.actor.entropy_coeff=0.01", *VLM_RUN)  # entropy bonus: the weights move at score 0
    (step,) = [r for r in read_metrics(out) if "actor/pg_loss" in r]
    for key in ("actor/pg_loss", "actor/kl_loss", "critic/score/mean", "rollout/log_prob_diff_max"):
        assert math.isfinite(step[key]), (key, step[key])
    assert step["actor/grad_norm"] > 0
    init, final = load_file(os.path.join(model, "model.safetensors")), load_file(os.path.join(out, "hf_actor",
                                                                                                 "model.safetensors"))
    assert any(k.startswith("visual.") and not torch.equal(init[k], final[k].to(init[k].dtype)) for k in init), \
        "the vision tower was not trained"


def test_image_rows_for_a_text_only_model_are_refused(tmp_path):
    _, train, val = _task(tmp_path)
    proc = run_main_forked(str(tmp_path / "out"), f"data.train_files={train}", f"data.val_files={val}", check=False,
                           timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "has images but the model has no processor (a text-only model" in last, last


def test_a_vision_language_model_without_its_processor_is_refused(tmp_path):
    from tests.test_megatron_launch import _cfg
    from trainer.launch import ConfigError, preflight

    model, _, _ = _task(tmp_path)
    os.remove(os.path.join(model, "preprocessor_config.json"))
    cfg = _cfg("trainer.strategy=deepspeed", f"actor_rollout_ref.model.path={model}")
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.model.path='.*vlm' is a vision-language model "
                                          r"\(model_type='qwen2_vl'\) without a processor: no preprocessor_config"):
        preflight(cfg)
    assert json.load(open(os.path.join(model, "config.json")))["model_type"] == "qwen2_vl"


def test_vllm_rollout_and_the_megatron_path_refuse_a_vision_language_model(tmp_path):
    from tests.test_megatron_launch import _cfg
    from trainer.launch import ConfigError, preflight, validate

    model, _, _ = _task(tmp_path)
    with pytest.raises(ConfigError, match=r"rollout.name=vllm: image prompts of a vision-language model"):
        preflight(_cfg("trainer.strategy=deepspeed", f"actor_rollout_ref.model.path={model}", "rollout=vllm"))
    pytest.importorskip("megatron.core")
    cfg = _cfg(f"actor_rollout_ref.model.path={model}")
    validate(cfg)
    with pytest.raises(ConfigError, match="qwen2_vl"):
        preflight(cfg)
