"""The settings that choose an attention implementation (trainer/attention_checks.py): an
``override_config.attn_implementation`` reaches the model that the workers build, and an implementation that cannot
run on the run's device, or without its package, stops before start-up in one line. Found by trying them on a CPU
run: ``rollout.attn_implementation=flash_attention_2`` started the workers, which died with transformers'
ImportError (after trying to fetch the kernel from the Hub); ``override_config.attn_implementation`` was set as a
plain attribute that transformers does not read, so the model kept sdpa."""
import importlib.util
import logging

import pytest

from tests.test_launch_checks import _cfg
from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.launch import ConfigError, preflight, validate

ROLLOUT = "actor_rollout_ref.rollout.attn_implementation"
ACTOR = "actor_rollout_ref.model.override_config"
CRITIC = "critic.model.override_config"


@pytest.mark.parametrize("value_head", [False, True])
def test_p30_override_attn_implementation_reaches_the_built_model(tmp_path, value_head):
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer import embedded
    from trainer.workers.model_utils import apply_config_overrides, load_hf_model

    conf = embedded.tiny_model_config(23, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=32)
    AutoModelForCausalLM.from_config(conf).save_pretrained(str(tmp_path))
    hf = AutoConfig.from_pretrained(str(tmp_path))
    apply_config_overrides(hf, {"attn_implementation": "eager"})
    model = load_hf_model(str(tmp_path), hf, value_head=value_head, trust_remote_code=False)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("overrides,key", [
    ((f"{ROLLOUT}=flash_attention_2",), ROLLOUT),
    ((f"{ROLLOUT}=flash_attention_3",), ROLLOUT),
    ((f"+{ACTOR}.attn_implementation=flash_attention_2",), f"{ACTOR}.attn_implementation"),
    ((f"+{ACTOR}._attn_implementation=flash_attention_4",), f"{ACTOR}._attn_implementation"),
    (("algorithm=gae", f"+{CRITIC}.attn_implementation=flash_attention_2"), f"{CRITIC}.attn_implementation"),
])
def test_p30_flash_attention_on_cpu_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate(_cfg("trainer.device=cpu", *overrides))
    line = str(info.value)
    assert len(line.splitlines()) == 1 and line.startswith(f"{key}=") and "needs trainer.device=cuda" in line, line


FIND_SPEC = importlib.util.find_spec


def _without(monkeypatch, *modules):
    """``importlib.util.find_spec`` finds none of ``modules`` (the others as installed)."""
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name in modules else FIND_SPEC(name, *a, **k))


def test_p30_flash_attention_on_cuda_needs_its_package_or_the_hub_kernels(monkeypatch):
    _without(monkeypatch, "flash_attn", "kernels")
    with pytest.raises(ConfigError, match=rf"^{ROLLOUT}='flash_attention_2' needs the package flash-attn "):
        validate(_cfg("trainer.device=cuda", f"{ROLLOUT}=flash_attention_2"))
    _without(monkeypatch, "flash_attn")  # transformers then loads kernels-community/flash-attn2 from the Hub
    validate(_cfg("trainer.device=cuda", f"{ROLLOUT}=flash_attention_2"))


def test_p30_cpu_refusal_names_a_missing_package_too(monkeypatch):
    _without(monkeypatch, "flash_attn")
    with pytest.raises(ConfigError, match=r"got 'cpu', and the package flash-attn \(pip install flash-attn\)"):
        validate(_cfg("trainer.device=cpu", f"{ROLLOUT}=flash_attention_2"))


def test_p30_flex_attention_is_refused_for_a_trained_model_on_cpu_only():
    with pytest.raises(ConfigError, match=rf"^{ACTOR}.attn_implementation='flex_attention': FlexAttention has no "
                                          "backward pass on the CPU"):
        validate(_cfg("trainer.device=cpu", f"+{ACTOR}.attn_implementation=flex_attention"))
    validate(_cfg("trainer.device=cpu", f"{ROLLOUT}=flex_attention"))  # inference only: runs on the CPU


def test_p30_an_unknown_override_implementation_is_refused():
    with pytest.raises(ConfigError, match=rf"^{ACTOR}.attn_implementation='nope'; expected eager, sdpa or one of "):
        validate(_cfg("trainer.device=cpu", f"+{ACTOR}.attn_implementation=nope"))
    for value in ("eager", "sdpa"):  # they run on the CPU
        validate(_cfg("trainer.device=cpu", f"{ROLLOUT}={value}", f"+{ACTOR}.attn_implementation={value}"))


def test_p30_an_override_the_packed_forward_replaces_is_warned(tmp_path, caplog):
    from tests.test_reliability_override_config import _cfg as resolved

    with caplog.at_level(logging.WARNING):
        preflight(resolved(f"trainer.output_dir={tmp_path}", f"+{ACTOR}.attn_implementation=eager"))
    lines = [r.getMessage() for r in caplog.records if "attn_implementation" in r.getMessage()]
    assert lines == [f"{ACTOR}.attn_implementation='eager': not used by the decoder, whose attention is the packed "
                     "(varlen) kernel while actor_rollout_ref.model.use_remove_padding is on (or Ulysses SP > 1); set "
                     "actor_rollout_ref.model.use_remove_padding=false to use it"], lines
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        preflight(resolved(f"trainer.output_dir={tmp_path}", f"+{ACTOR}.attn_implementation=eager",
                           "actor_rollout_ref.model.use_remove_padding=false"))
    assert not [r for r in caplog.records if "attn_implementation" in r.getMessage()]


def test_p30_cli_stops_before_workers(tmp_path):
    proc = run_cli(str(tmp_path / "out"), "trainer.device=cpu", f"{ROLLOUT}=flash_attention_2", forked=True)
    assert_one_line_error(proc, f"{ROLLOUT}='flash_attention_2' needs trainer.device=cuda")


def test_p30_a_paged_prefix_is_read_as_transformers_reads_it():
    """transformers drops ``paged|`` (its continuous-batching prefix) and builds the named implementation."""
    for value in ("paged|sdpa", "paged|eager"):
        validate(_cfg("trainer.device=cpu", f"{ROLLOUT}='{value}'", f"+{ACTOR}.attn_implementation='{value}'"))
    for value in ("paged|sdpa_gqa", "paged|auto"):  # the engine's own choices take no transformers prefix
        with pytest.raises(ConfigError, match=rf"^{ROLLOUT}='{value.replace('|', '[|]')}'; expected "):
            validate(_cfg("trainer.device=cpu", f"{ROLLOUT}='{value}'"))
    with pytest.raises(ConfigError, match=rf"^{ACTOR}.attn_implementation='paged\|flash_attention_2' needs "
                                          "trainer.device=cuda"):
        validate(_cfg("trainer.device=cpu", f"+{ACTOR}.attn_implementation='paged|flash_attention_2'"))


def test_p30_no_packed_warning_for_a_softcapped_model_a_null_or_a_refused_entry():
    """A soft-capped model (Gemma 2) runs padded forwards through the attention the entry chooses; null is
    transformers' default; a refused entry has its own line."""
    from tests.test_reliability_override_config import _cfg as resolved
    from trainer.attention_checks import packed_attention_warnings

    cfg = resolved(f"+{ACTOR}.attn_implementation=eager")
    assert len(packed_attention_warnings(cfg)) == 1 and packed_attention_warnings(cfg, softcapped=True) == []
    cfg["actor_rollout_ref"]["actor"]["ulysses_sequence_parallel_size"] = 2  # packed whatever the model
    assert len(packed_attention_warnings(cfg, softcapped=True)) == 1
    for value in (None, "flash_attention_2", "nope"):
        cfg = resolved("trainer.device=cpu", f"+{ACTOR}.attn_implementation={value if value else 'null'}")
        assert packed_attention_warnings(cfg) == [], value
