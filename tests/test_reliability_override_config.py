"""An ``actor_rollout_ref.model.override_config`` entry that changes the shape of a weight, or that the model
cannot be built with, stops before start-up in one line. Found by trying it: ``num_attention_heads=3`` on the
embedded model (hidden 64) started the workers, which died with transformers' size-mismatch report."""
import os

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.launch import ConfigError, preflight, resolve_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "actor_rollout_ref.model.override_config"


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return resolve_config(compose(config_name="ppo_trainer", overrides=list(overrides)))


@pytest.mark.parametrize("override,needles", [
    (f"+{KEY}.num_attention_heads=3", ["changes the model's weights", "q_proj.weight: [64, 64] -> [48, 64]"]),
    (f"+{KEY}.intermediate_size=100", ["changes the model's weights", "gate_proj.weight"]),
    (f"+{KEY}.num_hidden_layers=3", ["changes the model's weights", "model.layers.2", "new"]),
    (f"+{KEY}.hidden_act=nope", ["cannot be built with it", "'nope'"]),
])
def test_an_override_the_weights_cannot_take_is_refused(tmp_path, override, needles):
    with pytest.raises(ConfigError) as info:
        preflight(_cfg(f"trainer.output_dir={tmp_path}", override))
    line = str(info.value)
    assert len(line.splitlines()) == 1 and line.startswith(KEY), line
    for n in needles:
        assert n in line, (n, line)


@pytest.mark.parametrize("override", [f"+{KEY}.attention_dropout=0.1", f"+{KEY}.rope_theta=5000.0",
                                      f"+{KEY}.max_position_embeddings=256"])
def test_an_override_that_keeps_the_weights_passes(tmp_path, override):
    preflight(_cfg(f"trainer.output_dir={tmp_path}", override))


def test_cli_stops_before_workers(tmp_path):
    proc = run_cli(str(tmp_path / "out"), f"+{KEY}.num_attention_heads=3", forked=True)
    assert_one_line_error(proc, KEY, "changes the model's weights")


@pytest.mark.parametrize("overrides,named,hint", [
    ((f"+{KEY}.foo_bar=1",), f"{KEY}.foo_bar", None),
    ((f"+{KEY}.attn_dropout=0.1", f"+{KEY}.attention_dropout=0.0"), f"{KEY}.attn_dropout",
     "attn_dropout -> attention_dropout"),
    (("algorithm=gae", "+critic.model.override_config.use_cach=false"), "critic.model.override_config.use_cach",
     "use_cach -> use_cache")])
def test_cfg14_an_override_key_the_config_class_does_not_define_is_warned(overrides, named, hint):
    from trainer.override_checks import override_key_warnings

    (line,) = override_key_warnings(_cfg(*overrides))
    assert line.startswith(f"{named}: ignored: LlamaConfig does not define it") and "\n" not in line, line
    assert hint is None or hint in line, line


@pytest.mark.parametrize("override", [f"+{KEY}.attention_dropout=0.1", f"+{KEY}.attn_implementation=eager",
                                      f"+{KEY}.use_cache=false", f"+{KEY}.rope_scaling={{type:linear,factor:2.0}}",
                                      f"+{KEY}.max_position_embeddings=256", f"+{KEY}.dtype=float32"])
def test_an_override_key_of_the_config_class_is_not_warned(override):
    from trainer.override_checks import override_key_warnings

    assert override_key_warnings(_cfg(override)) == []


def test_an_unknown_override_key_is_logged_once_before_the_workers(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        preflight(_cfg(f"trainer.output_dir={tmp_path}", f"+{KEY}.foo_bar=1"))
    assert [r.getMessage() for r in caplog.records if "foo_bar" in r.getMessage()] == [
        f"{KEY}.foo_bar: ignored: LlamaConfig does not define it (no attribute or __init__ argument of that name), "
        "so no model code reads it"]
