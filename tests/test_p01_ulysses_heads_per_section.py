"""Each role's Ulysses size is checked, before any worker starts, against the heads of the model that role loads:
the critic's own ``critic.model.path``, PRIME's ``reward_model.model.path`` / ``ref_path``, else the actor's. A
vision-language model's heads and context are read from its ``text_config`` (where Qwen2-VL keeps them), as the
workers read them (``get_text_config()``). A size that does not fit would otherwise only fail inside Ray, at the
worker's ``init_model``."""
import json

import pytest

from tests.test_reliability_config import _cfg
from trainer.launch import ConfigError, preflight, validate

GAE = ["algorithm.adv_estimator=gae", "critic.enable=true", "trainer.n_gpus_per_node=2"]


def _folder(root, name: str, heads: int, kv: int, ctx: int = 4096, vlm: bool = False) -> str:
    """A model folder preflight accepts (its ``config.json``, a weights file with no tensors, a tokenizer and a
    chat template); ``vlm``: a Qwen2-VL ``config.json`` (heads and context only in ``text_config``) with its
    processor."""
    d = root / name
    d.mkdir()
    if vlm:
        from trainer.embedded_vlm import build_vlm_processor, tiny_vlm_config

        proc = build_vlm_processor(str(d))
        conf = tiny_vlm_config(proc.tokenizer, hidden_size=8 * heads, num_attention_heads=heads,
                               num_key_value_heads=kv)
        conf.text_config.max_position_embeddings = ctx
        conf.save_pretrained(str(d))
        hf = json.loads((d / "config.json").read_text())
        assert "num_attention_heads" not in hf and hf["text_config"]["num_key_value_heads"] == kv
    else:
        (d / "config.json").write_text(json.dumps({"num_attention_heads": heads, "num_key_value_heads": kv,
                                                   "max_position_embeddings": ctx}))
        (d / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\x02" + bytes(7) + b"{}")  # a sound header, no tensors
    (d / "chat_template.jinja").write_text("{{ messages }}")
    return str(d)


def _preflight(tmp_path, *overrides) -> None:
    cfg = _cfg(f"trainer.output_dir={tmp_path / 'out'}", *overrides)
    validate(cfg)
    preflight(cfg)


def test_p01_a_critic_with_its_own_model_is_checked_against_that_models_heads(tmp_path):
    actor, critic = _folder(tmp_path, "actor", 4, 2), _folder(tmp_path, "critic", 6, 3)
    run = [f"actor_rollout_ref.model.path={actor}", f"critic.model.path={critic}", *GAE]
    with pytest.raises(ConfigError) as info:
        _preflight(tmp_path, *run, "critic.ulysses_sequence_parallel_size=2")
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"critic.ulysses_sequence_parallel_size=2 does not fit the heads of the model "
                           f"critic.model.path={critic!r} (num_attention_heads=6, num_key_value_heads=3)"), line
    assert "must divide one another" in line
    _preflight(tmp_path, *run, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")  # the actor's 4/2 fit
    _preflight(tmp_path, *run)  # sp=1 fits any model


def test_p01_a_critic_that_fits_passes_when_the_actors_model_would_not(tmp_path):
    actor, critic = _folder(tmp_path, "actor", 6, 3), _folder(tmp_path, "critic", 4, 2)
    run = [f"actor_rollout_ref.model.path={actor}", f"critic.model.path={critic}", *GAE]
    _preflight(tmp_path, *run, "critic.ulysses_sequence_parallel_size=2")
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=2 does not fit "
                                          r"the heads of the model actor_rollout_ref\.model\.path="):
        _preflight(tmp_path, *run, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                   "critic.ulysses_sequence_parallel_size=2")


def test_p01_a_critic_without_a_path_of_its_own_follows_the_actors_model(tmp_path):
    actor = _folder(tmp_path, "actor", 6, 3)
    run = [f"actor_rollout_ref.model.path={actor}", *GAE, "critic.ulysses_sequence_parallel_size=2"]
    with pytest.raises(ConfigError, match=rf"^critic\.ulysses_sequence_parallel_size=2 does not fit the heads of the "
                                          rf"model critic\.model\.path='{actor}' \(num_attention_heads=6, "):
        _preflight(tmp_path, *run)  # critic.model.path's default is the actor's path
    with pytest.raises(ConfigError, match=rf"^critic\.ulysses_sequence_parallel_size=2 does not fit the heads of the "
                                          rf"model actor_rollout_ref\.model\.path='{actor}' \("):
        _preflight(tmp_path, *run, "critic.model.path=null")


def test_p01_prime_reward_model_and_its_reference_are_checked_against_their_own_models(tmp_path):
    actor, fits, wide = (_folder(tmp_path, n, h, kv) for n, h, kv in (("actor", 4, 2), ("fits", 4, 2),
                                                                      ("wide", 6, 3)))
    run = ["algorithm=prime", f"actor_rollout_ref.model.path={actor}", "reward_model.ulysses_sequence_parallel_size=2"]
    _preflight(tmp_path, *run, f"reward_model.model.path={fits}")
    with pytest.raises(ConfigError, match=rf"^reward_model\.ulysses_sequence_parallel_size=2 does not fit the heads of "
                                          rf"the model reward_model\.model\.path='{wide}' \(num_attention_heads=6, "):
        _preflight(tmp_path, *run, f"reward_model.model.path={wide}")
    with pytest.raises(ConfigError, match=r"^reward_model\.ulysses_sequence_parallel_size=2 does not fit the heads of "
                                          r"the model reward_model\.model\.ref_path="):
        _preflight(tmp_path, *run, f"reward_model.model.path={fits}", f"reward_model.model.ref_path={wide}")


def test_p01_a_vision_language_models_heads_are_read_from_its_text_config(tmp_path):
    bad, good = _folder(tmp_path, "vlm63", 6, 3, vlm=True), _folder(tmp_path, "vlm42", 4, 2, vlm=True)
    sp = "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
    with pytest.raises(ConfigError) as info:
        _preflight(tmp_path, f"actor_rollout_ref.model.path={bad}", sp)
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 does not fit the heads of the "
                           f"model actor_rollout_ref.model.path={bad!r} (num_attention_heads=6, "
                           "num_key_value_heads=3)"), line
    _preflight(tmp_path, f"actor_rollout_ref.model.path={good}", sp)


def test_p01_an_override_of_the_text_config_keeps_its_heads(tmp_path):
    vlm = _folder(tmp_path, "vlm", 6, 3, ctx=64, vlm=True)
    run = [f"actor_rollout_ref.model.path={vlm}", "+actor_rollout_ref.model.override_config.text_config."
           "max_position_embeddings=4096", "data.max_prompt_length=60", "data.max_response_length=8"]
    _preflight(tmp_path, *run)  # the override's context, merged into text_config as the workers merge it
    with pytest.raises(ConfigError, match=r"num_attention_heads=6, num_key_value_heads=3\)"):
        _preflight(tmp_path, *run, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")


def test_p01_attention_soft_capping_is_checked_against_each_roles_own_model(tmp_path):
    plain = _folder(tmp_path, "plain", 4, 2)
    capped = _folder(tmp_path, "capped", 4, 2)
    hf = json.loads(open(f"{capped}/config.json").read())
    with open(f"{capped}/config.json", "w") as f:
        json.dump({**hf, "attn_logit_softcapping": 50.0}, f)
    _preflight(tmp_path, f"actor_rollout_ref.model.path={capped}", f"critic.model.path={plain}", *GAE,
               "critic.ulysses_sequence_parallel_size=2")
    with pytest.raises(ConfigError, match=rf"^critic\.ulysses_sequence_parallel_size=2: the attention of the model "
                                          rf"critic\.model\.path='{capped}' uses logit soft-capping"):
        _preflight(tmp_path, f"actor_rollout_ref.model.path={plain}", f"critic.model.path={capped}", *GAE,
                   "critic.ulysses_sequence_parallel_size=2")


def test_p01_a_vision_language_models_context_is_read_from_its_text_config(tmp_path):
    from transformers import AutoConfig

    from trainer.config_preflight import check_model_context

    vlm = _folder(tmp_path, "vlm", 4, 2, ctx=64, vlm=True)
    run = [f"actor_rollout_ref.model.path={vlm}", "data.max_prompt_length=60", "data.max_response_length=8"]
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length\+data\.max_response_length=68 exceeds the "
                                          r"model's context max_position_embeddings=64"):
        _preflight(tmp_path, *run)
    cfg = _cfg(f"trainer.output_dir={tmp_path / 'out'}", *run)
    with pytest.raises(ConfigError, match="max_position_embeddings=64"):  # the loaded config, after the tokenizer
        check_model_context(cfg, AutoConfig.from_pretrained(vlm), tokenizer=None)
    _preflight(tmp_path, f"actor_rollout_ref.model.path={vlm}", "data.max_prompt_length=56",
               "data.max_response_length=8")


def test_p01_the_text_config_helper_follows_transformers():
    from transformers import AutoConfig, LlamaConfig

    from trainer.embedded_vlm import build_vlm_processor, tiny_vlm_config
    from trainer.role_models import text_config, text_value

    vlm = tiny_vlm_config(build_vlm_processor().tokenizer, hidden_size=48, num_attention_heads=6,
                          num_key_value_heads=3)
    for conf in (vlm, vlm.to_dict(), AutoConfig.for_model(**vlm.to_dict())):
        assert text_value(conf, "num_attention_heads") == 6 and text_value(conf, "num_key_value_heads") == 3
    llama = LlamaConfig(num_attention_heads=8, num_key_value_heads=4)
    assert text_value(llama, "num_key_value_heads") == 4 and text_value(llama.to_dict(), "num_key_value_heads") == 4
    assert text_config({"num_attention_heads": 2}) == {"num_attention_heads": 2}
    assert text_value({"text_config": {}, "max_position_embeddings": 32}, "max_position_embeddings") == 32
    assert text_value({}, "num_attention_heads") is None


def test_p01_the_embedded_default_is_unaffected(tmp_path):
    _preflight(tmp_path)
    _preflight(tmp_path, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", *GAE,
               "critic.ulysses_sequence_parallel_size=2")
    with pytest.raises(ConfigError, match=r"^critic\.ulysses_sequence_parallel_size=2 does not fit the heads of the "
                                          r"embedded tiny model \(actor_rollout_ref\.model\.path=null\) "
                                          r"\(num_attention_heads=6, num_key_value_heads=3\)"):
        _preflight(tmp_path, "actor_rollout_ref.model.tiny.hidden_size=48",
                   "actor_rollout_ref.model.tiny.num_attention_heads=6",
                   "actor_rollout_ref.model.tiny.num_key_value_heads=3", *GAE,
                   "critic.ulysses_sequence_parallel_size=2")
