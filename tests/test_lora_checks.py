"""LoRA settings are checked before any worker starts (trainer/lora_checks.py through ``launch.prestart``): one line
naming the key, the bad value and what is expected."""
import os

import pytest
from hydra import compose, initialize_config_dir

from tests.e2e_utils import ROOT
from trainer.config_checks import ConfigError, ConfigErrors
from trainer.launch import prestart
from trainer.lora_checks import check_lora

LLAMA_MODULES = "down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


def _prestart(tmp_path, *overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return prestart(compose("ppo_trainer", overrides=[f"trainer.output_dir={tmp_path}", *overrides]))


def _error(tmp_path, *overrides) -> str:
    with pytest.raises((ConfigError, ConfigErrors)) as exc:
        _prestart(tmp_path, *overrides)
    lines = getattr(exc.value, "messages", None) or [str(exc.value)]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    return lines[0]


def test_good_settings_pass(tmp_path):
    cfg = _prestart(tmp_path, "actor_rollout_ref.model.lora_rank=8",
                    "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
                    "actor_rollout_ref.model.exclude_modules=[layers.0.self_attn.q_proj]")
    assert cfg["actor_rollout_ref"]["model"]["lora_rank"] == 8
    _prestart(tmp_path, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.tiny.tie_word_embeddings=false",
              "actor_rollout_ref.model.target_modules=[q_proj,lm_head]")
    _prestart(tmp_path, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.tiny.tie_word_embeddings=false",
              "actor_rollout_ref.model.target_modules=[embed_tokens,q_proj]")  # merged like a linear target
    assert not os.path.exists(tmp_path / "checkpoints")


@pytest.mark.parametrize("targets,missing", [("[q_proj,query_key_value]", "'query_key_value'"),
                                             ("[c_attn]", "'c_attn'")])
def test_target_modules_the_model_lacks_name_its_modules(tmp_path, targets, missing):
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=8", f"actor_rollout_ref.model.target_modules={targets}")
    assert line.startswith("actor_rollout_ref.model.target_modules=")
    assert f"LlamaForCausalLM has no linear/embedding module named {missing}" in line
    assert line.endswith(f"its linear and embedding modules are: {LLAMA_MODULES}")


def test_module_names_of_the_critic_and_exclude_modules(tmp_path):
    line = _error(tmp_path, "algorithm=gae", "critic.model.lora_rank=4", "critic.model.target_modules=[qkv]")
    assert line.startswith("critic.model.target_modules=['qkv']: LlamaForTokenClassification has no")
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.exclude_modules=[vision]")
    assert "exclude_modules=['vision']: LlamaForCausalLM has no module named 'vision'" in line
    # a name matching only modules peft cannot adapt (a norm)
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[norm]")
    assert "no linear/embedding module named 'norm'" in line


@pytest.mark.parametrize("rank", ["-1", "-8", "2.5", "abc", "true"])
def test_rank_must_be_a_whole_number_at_least_zero(tmp_path, rank):
    line = _error(tmp_path, f"actor_rollout_ref.model.lora_rank={rank}")
    assert line.startswith("actor_rollout_ref.model.lora_rank=") and "expected an integer >= 0" in line


@pytest.mark.parametrize("override,needle", [
    ("actor_rollout_ref.model.lora_alpha=0", "lora_alpha=0; expected a number > 0"),
    ("actor_rollout_ref.model.lora_alpha=-2", "lora_alpha=-2; expected a number > 0"),
    ("actor_rollout_ref.model.target_modules=all_linear", "target_modules='all_linear'; expected all-linear or a list"),
    ("actor_rollout_ref.model.target_modules=[]", "target_modules=[]; expected all-linear or a list"),
    ("actor_rollout_ref.model.exclude_modules=lm_head", "exclude_modules='lm_head'; expected null or a list"),
])
def test_alpha_and_module_lists_are_checked(tmp_path, override, needle):
    assert needle in _error(tmp_path, "actor_rollout_ref.model.lora_rank=8", override)


def test_tied_embeddings_cannot_take_an_adapter(tmp_path):
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=8",
                  "actor_rollout_ref.model.target_modules=[q_proj,lm_head]")
    assert "'lm_head' shares its weight with the input/output embedding (tie_word_embeddings=true)" in line
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=8",
                  "actor_rollout_ref.model.target_modules=[embed_tokens]")
    assert "'embed_tokens' shares its weight" in line


def test_megatron_path_is_refused(tmp_path):
    cfg = _prestart(tmp_path)  # a resolved config; the Megatron path needs megatron-core to compose fully
    cfg["trainer"]["strategy"] = "megatron"
    cfg["actor_rollout_ref"]["model"]["lora_rank"] = 16
    with pytest.raises(ConfigError, match="lora_rank=16 with trainer.strategy=megatron: LoRA adapters are built on "
                                          "the DeepSpeed path only"):
        check_lora(cfg)
    cfg["actor_rollout_ref"]["model"]["lora_rank"] = 0
    check_lora(cfg)


def test_adapter_sync_needs_vllm_lora_and_a_served_rank(tmp_path):
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.rollout.lora_sync=adapter")
    assert line.startswith("actor_rollout_ref.rollout.lora_sync=adapter needs rollout=vllm")
    line = _error(tmp_path, "actor_rollout_ref.rollout.lora_sync=adapter")
    assert "lora_sync=adapter" in line and ("lora_rank > 0" in line or "rollout=vllm" in line)
    cfg = _prestart(tmp_path, "actor_rollout_ref.model.lora_rank=8",
                    "actor_rollout_ref.model.tiny.tie_word_embeddings=false",
                    "actor_rollout_ref.model.target_modules=[q_proj,lm_head]")
    cfg["actor_rollout_ref"]["rollout"].update(name="vllm", lora_sync="adapter")
    with pytest.raises(ConfigError, match=r"lora_sync=adapter: vLLM's LoRA does not serve an adapter on 'lm_head'"):
        check_lora(cfg)
    assert "lora_sync='both'; expected one of merged, adapter" in _error(
        tmp_path, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.rollout.lora_sync=both")


def test_reference_runs_at_the_actor_sp_size(tmp_path):
    line = _error(tmp_path, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.use_kl_loss=true",
                  "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                  "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1")
    assert "ref.ulysses_sequence_parallel_size=1 with LoRA" in line
