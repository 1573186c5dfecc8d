"""Each role's model is judged before any worker starts as that role's workers build it: the packed-attention check
(Ulysses SP runs packed forwards) probes the critic's and PRIME's reward model's own folders, not the actor's; each
role's ``override_config`` (its own merged over the actor's) is checked against that model's weights; a model's
config is read by transformers with the workers' own ``apply_config_overrides`` (an older flat Qwen2-VL layout, the
class's defaults, an override the class has no use for); every section that shares a model gets its own line; the
reference loads no model with LoRA; and a critic whose model has no token-classification class (a vision-language
model) is refused. Otherwise such a run fails inside a worker after start-up, or a run that works is refused."""
import json
import os
import shutil

import pytest

from tests.test_reliability_config import _cfg as compose, assert_one_line_error, run_cli
from trainer.launch import ConfigError, load_model_files, preflight, prestart, validate

GAE = ["algorithm.adv_estimator=gae", "critic.enable=true", "trainer.n_gpus_per_node=2"]
ONE_STEP = ["trainer.total_training_steps=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]


def _saved(root, name: str, make) -> str:
    """A model folder: the embedded tokenizer and a random model of the config ``make(vocab size)``."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import embedded

    d = os.path.join(root, name)
    tok = embedded.build_tokenizer(d)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(make(len(tok))).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny model folders: Llama with 4/2 and 6/3 heads, a Gemma 2 (attention soft-capping), a Bloom (attention
    outside transformers' attention interface), a Qwen2-VL and the same with the older flat config.json."""
    from transformers import BloomConfig, Gemma2Config

    from trainer.embedded import tiny_model_config
    from trainer.embedded_vlm import write_tiny_vlm

    root = str(tmp_path_factory.mktemp("models"))
    out = {"h42": _saved(root, "h42", lambda v: tiny_model_config(v, num_attention_heads=4, num_key_value_heads=2)),
           "h63": _saved(root, "h63", lambda v: tiny_model_config(v, hidden_size=48, num_attention_heads=6,
                                                                  num_key_value_heads=3)),
           "gemma2": _saved(root, "gemma2", lambda v: Gemma2Config(
               vocab_size=v, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=128, max_position_embeddings=128, attn_logit_softcapping=50.0,
               pad_token_id=0, eos_token_id=1, bos_token_id=None)),
           "bloom": _saved(root, "bloom", lambda v: BloomConfig(vocab_size=v, hidden_size=64, n_layer=2, n_head=4,
                                                                pad_token_id=0, eos_token_id=1, bos_token_id=None)),
           "vlm": write_tiny_vlm(os.path.join(root, "vlm"))}
    flat = shutil.copytree(out["vlm"], os.path.join(root, "vlmflat"))
    with open(os.path.join(flat, "config.json")) as f:
        hf = json.load(f)
    text = hf.pop("text_config")
    hf.update({k: v for k, v in text.items() if k not in hf})  # the older layout: the text keys at the top level
    with open(os.path.join(flat, "config.json"), "w") as f:
        json.dump(hf, f)
    out["vlmflat"] = flat
    return out


def _cfg(tmp_path, *overrides) -> dict:
    return compose("model=hf", f"trainer.output_dir={tmp_path / 'out'}", *overrides)


def _preflight(tmp_path, *overrides) -> None:
    cfg = _cfg(tmp_path, *overrides)
    validate(cfg)
    preflight(cfg)


def _refused(fn, tmp_path, *overrides) -> list[str]:
    with pytest.raises(ConfigError) as info:
        fn(tmp_path, *overrides)
    return str(info.value).splitlines()


def _launch(tmp_path, *overrides) -> None:
    """The launch's checks up to the model files it loads (where the packed-attention probe runs)."""
    load_model_files(prestart(compose("model=hf", f"trainer.output_dir={tmp_path / 'out'}", *overrides)))


def test_p01_packed_attention_is_judged_on_the_model_each_role_loads(models, tmp_path):
    """A soft-capped actor (Gemma 2) with a plain critic at SP=2: the critic's own model packs, so the launch goes
    on, whatever the actor's soft-capping; the other way round the critic is refused, by name."""
    from transformers import AutoConfig

    from trainer.packing_probe import check_packed_attention

    run = [f"actor_rollout_ref.model.path={models['gemma2']}", f"critic.model.path={models['h42']}", *GAE,
           "critic.ulysses_sequence_parallel_size=2"]
    _launch(tmp_path, *run)
    cfg = _cfg(tmp_path, f"actor_rollout_ref.model.path={models['h42']}", f"critic.model.path={models['gemma2']}",
               *GAE, "critic.ulysses_sequence_parallel_size=2")
    with pytest.raises(ConfigError) as info:
        check_packed_attention(cfg, AutoConfig.from_pretrained(models["h42"]))
    assert str(info.value) == (
        f"critic.ulysses_sequence_parallel_size=2: Ulysses sequence parallelism runs packed forwards, which the model "
        f"critic.model.path={models['gemma2']!r} cannot: its attention uses logit soft-capping "
        "(attn_logit_softcapping=50), which the packed (varlen) kernels do not support; expected 1 for this model")


@pytest.mark.slow
def test_p01_a_soft_capped_actor_trains_a_step_with_a_plain_critic_at_sp2(models, tmp_path):
    proc = run_cli(str(tmp_path / "out"), "model=hf", *ONE_STEP, f"actor_rollout_ref.model.path={models['gemma2']}",
                   f"critic.model.path={models['h42']}", *GAE, "critic.ulysses_sequence_parallel_size=2",
                   forked=True, timeout=300)
    assert proc.returncode == 0 and "done: step 1 of 1" in proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_p01_a_critic_or_reward_model_that_cannot_pack_is_refused_before_the_workers(models, tmp_path):
    """Bloom's attention does not go through transformers' attention interface: at SP=2 its role is refused at the
    launch, naming the role's key and folder, not in CriticWorker.init_model."""
    bloom = models["bloom"]
    why = ("Ulysses sequence parallelism runs packed forwards, which the model {}={!r} cannot: BloomForCausalLM's "
           "attention does not go through transformers' attention interface")
    lines = _refused(_launch, tmp_path, f"actor_rollout_ref.model.path={models['h42']}", f"critic.model.path={bloom}",
                     *GAE, "critic.ulysses_sequence_parallel_size=2")
    assert lines == [lines[0]] and lines[0].startswith("critic.ulysses_sequence_parallel_size=2: "
                                                       + why.format("critic.model.path", bloom)), lines
    prime = ["algorithm=prime", f"actor_rollout_ref.model.path={models['h42']}", "trainer.n_gpus_per_node=2",
             "reward_model.ulysses_sequence_parallel_size=2"]
    for key in ("path", "ref_path"):
        (line,) = _refused(_launch, tmp_path, *prime, f"reward_model.model.{key}={bloom}")
        assert line.startswith("reward_model.ulysses_sequence_parallel_size=2: "
                               + why.format(f"reward_model.model.{key}", bloom)), line
    proc = run_cli(str(tmp_path / "cli"), "model=hf", f"actor_rollout_ref.model.path={models['h42']}",
                   f"critic.model.path={bloom}", *GAE, "critic.ulysses_sequence_parallel_size=2", forked=True)
    assert_one_line_error(proc, "critic.ulysses_sequence_parallel_size=2", "BloomForCausalLM's attention")


def test_p01_a_roles_override_config_is_checked_against_its_own_models_weights(models, tmp_path):
    h42, h63 = models["h42"], models["h63"]
    (line,) = _refused(_preflight, tmp_path, f"actor_rollout_ref.model.path={h42}", f"critic.model.path={h63}", *GAE,
                       "+critic.model.override_config.num_key_value_heads=1")
    assert line.startswith(f"critic.model.override_config={{'num_key_value_heads': 1}} changes the weights of the "
                           f"model critic.model.path={h63!r} (model.layers.0.self_attn.k_proj.weight: [24, 48] -> "
                           "[8, 48]"), line
    (line,) = _refused(_preflight, tmp_path, "algorithm=prime", f"actor_rollout_ref.model.path={h42}",
                       "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
                       "+reward_model.model.override_config.num_key_value_heads=1")
    assert line.startswith("reward_model.model.override_config={'num_key_value_heads': 1} (over "
                           "actor_rollout_ref.model.override_config={'attention_dropout': 0.0}) changes the weights "
                           f"of the model actor_rollout_ref.model.path={h42!r}"), line
    # the actor's own override keeps its line; a critic on the same folder with no override of its own adds none
    (line,) = _refused(_preflight, tmp_path, f"actor_rollout_ref.model.path={h42}", *GAE,
                       "+actor_rollout_ref.model.override_config.num_key_value_heads=1")
    assert line.startswith("actor_rollout_ref.model.override_config={'num_key_value_heads': 1} changes the model's "
                           "weights"), line
    _preflight(tmp_path, f"actor_rollout_ref.model.path={h42}", f"critic.model.path={h63}", *GAE,
               "+critic.model.override_config.attention_dropout=0.1")


def test_p01_a_sub_config_override_on_a_model_without_one_is_refused_not_read_as_heads(models, tmp_path):
    """``text_config.num_attention_heads`` on a Llama: the workers set a plain mapping as its text config and fail
    to build the model; preflight refuses it and reads the heads the model has, not the mapping's."""
    over = ["+critic.model.override_config.text_config.num_attention_heads=4",
            "+critic.model.override_config.text_config.num_key_value_heads=2"]
    run = [f"actor_rollout_ref.model.path={models['h42']}", f"critic.model.path={models['h63']}", *GAE, *over]
    (line,) = _refused(_preflight, tmp_path, *run)
    assert line.startswith("critic.model.override_config={'text_config': {'num_attention_heads': 4, "
                           "'num_key_value_heads': 2}}: LlamaConfig has no text_config sub-config, so the workers "
                           "would set the mapping"), line
    from trainer.override_checks import override_key_warnings
    from trainer.role_models import role_config, section_models, text_value

    cfg = _cfg(tmp_path, *run)
    assert override_key_warnings(cfg) == []  # refused, not "ignored"
    conf = role_config(cfg, section_models(cfg)["critic"][0])
    assert (text_value(conf, "num_attention_heads"), text_value(conf, "num_key_value_heads")) == (6, 3)
    lines = _refused(_preflight, tmp_path, *run, "critic.ulysses_sequence_parallel_size=2")
    assert lines[0].startswith(f"critic.ulysses_sequence_parallel_size=2 does not fit the heads of the model "
                               f"critic.model.path={models['h63']!r} (num_attention_heads=6, num_key_value_heads=3)")


def test_p01_a_flat_vision_language_config_is_read_as_the_workers_read_it(models, tmp_path):
    """An older Qwen2-VL config.json (text keys at the top level): transformers reads them into text_config, and
    a top-level override the class has no use for changes nothing in the workers, nor in preflight."""
    flat = f"actor_rollout_ref.model.path={models['vlmflat']}"
    key = "+actor_rollout_ref.model.override_config"
    _preflight(tmp_path, flat, f"{key}.num_attention_heads=3", "trainer.n_gpus_per_node=2",
               "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    _preflight(tmp_path, flat, f"{key}.max_position_embeddings=16", "data.max_prompt_length=32",
               "data.max_response_length=2")
    with pytest.raises(ConfigError, match=r"exceeds the model's context max_position_embeddings=256"):
        _preflight(tmp_path, flat, "data.max_prompt_length=256", "data.max_response_length=2")


def test_p01_a_config_keys_class_default_is_what_preflight_reads(tmp_path):
    """A Mistral config.json without num_key_value_heads: the workers' config has the class's default (8), which
    SP=3 does not fit with 24 heads (though the file's 24 heads alone would)."""
    d = tmp_path / "mistral"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "mistral", "num_attention_heads": 24, "hidden_size": 48,
                                               "num_hidden_layers": 1, "intermediate_size": 32, "vocab_size": 64,
                                               "max_position_embeddings": 4096}))
    (d / "model.safetensors").write_bytes(b"\x02" + bytes(7) + b"{}")  # a sound header, no tensors
    (d / "tokenizer.json").write_text("{}")
    (d / "chat_template.jinja").write_text("{{ messages }}")
    (line,) = _refused(lambda p, *o: preflight(_cfg(p, *o)), tmp_path, f"actor_rollout_ref.model.path={d}",
                       "trainer.n_gpus_per_node=3", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3")
    assert "(num_attention_heads=24, num_key_value_heads=8)" in line, line


def test_p01_every_section_that_shares_a_model_has_its_line(models, tmp_path):
    h63 = models["h63"]
    lines = _refused(_preflight, tmp_path, f"actor_rollout_ref.model.path={h63}", *GAE,
                     "actor_rollout_ref.actor.use_kl_loss=true", "critic.ulysses_sequence_parallel_size=2",
                     *[f"actor_rollout_ref.{s}.ulysses_sequence_parallel_size=2" for s in ("actor", "ref")])
    assert [ln.split(" does not fit the heads of ")[0] for ln in lines] == [
        f"{section}.ulysses_sequence_parallel_size=2"
        for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")], lines
    assert all("(num_attention_heads=6, num_key_value_heads=3)" in ln for ln in lines), lines


def test_p01_the_reference_loads_no_model_with_lora(models, tmp_path):
    """With LoRA the reference is the actor with its adapters off: its SP is refused by the LoRA check alone."""
    run = [f"actor_rollout_ref.model.path={models['h63']}", "trainer.n_gpus_per_node=2",
           "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"]
    _preflight(tmp_path, *run, "actor_rollout_ref.model.lora_rank=8")
    (line,) = _refused(_preflight, tmp_path, *run)
    assert line.startswith("actor_rollout_ref.ref.ulysses_sequence_parallel_size=2 does not fit the heads"), line
    (line,) = _refused(lambda p, *o: prestart(_cfg(p, *o)), tmp_path, *run, "actor_rollout_ref.model.lora_rank=8")
    assert line.startswith("actor_rollout_ref.ref.ulysses_sequence_parallel_size=2 with LoRA: the reference is the "
                           "actor with its adapters disabled"), line


def test_p01_heads_an_override_gives_are_said_to_come_from_it(models, tmp_path):
    h42 = models["h42"]
    lines = _refused(_preflight, tmp_path, f"actor_rollout_ref.model.path={h42}", *GAE,
                     "+critic.model.override_config.num_attention_heads=3", "critic.ulysses_sequence_parallel_size=2")
    assert lines[0].startswith(f"critic.ulysses_sequence_parallel_size=2 does not fit the heads of the model "
                               f"critic.model.path={h42!r} with critic.model.override_config (num_attention_heads=3, "
                               "num_key_value_heads=2)"), lines


def test_p01_a_vision_language_critic_is_refused_before_start(models, tmp_path):
    vlm = models["vlm"]
    expected = ("{}: the critic's value model is built with transformers' AutoModelForTokenClassification (the "
                "model with a one-output head on every token), which has no class for Qwen2VLConfig (a "
                "vision-language model); expected for critic.model.path a text model that has one")
    (line,) = _refused(_preflight, tmp_path, f"actor_rollout_ref.model.path={models['h42']}",
                       f"critic.model.path={vlm}", *GAE)
    assert line.startswith(expected.format(f"critic.model.path={vlm!r}")), line
    (line,) = _refused(_preflight, tmp_path, f"actor_rollout_ref.model.path={vlm}", *GAE)  # the actor's folder
    assert line.startswith(expected.format(f"critic.model.path={vlm!r}")), line
    _preflight(tmp_path, f"actor_rollout_ref.model.path={vlm}")  # no critic: nothing to say
    _preflight(tmp_path, f"actor_rollout_ref.model.path={vlm}", *GAE, f"critic.model.path={models['h42']}")


def test_p01_the_packed_attention_warning_follows_each_roles_own_model(models, tmp_path):
    """An attention entry of the critic's override_config is unused while the critic's model packs; a soft-capped
    critic runs padded, so its entry is used, whatever the actor's model."""
    from trainer.attention_checks import packed_attention_warnings

    entry = "+critic.model.override_config.attn_implementation=eager"
    run = [*GAE, entry, "trainer.device=cpu"]
    capped_critic = _cfg(tmp_path, f"actor_rollout_ref.model.path={models['h42']}",
                         f"critic.model.path={models['gemma2']}", *run)
    assert packed_attention_warnings(capped_critic) == []
    plain_critic = _cfg(tmp_path, f"actor_rollout_ref.model.path={models['gemma2']}",
                        f"critic.model.path={models['h42']}", *run)
    (line,) = packed_attention_warnings(plain_critic)
    assert line.startswith("critic.model.override_config.attn_implementation='eager': not used by the decoder"), line
