"""Settings that were accepted and then did nothing, or did something other than asked (the kind of P30/P31):
``clip_ratio_low`` >= 1 under a loss that clips the ratio at ``1 - clip_ratio_low`` (a bound no ratio reaches: warned),
``reward_manager=batch`` without the batch function it calls, validation's ``do_sample=true`` at temperature 0
(greedy), and ``data.apply_chat_template_kwargs`` entries the chat template never reads."""
import os

import pytest

A, VK = "actor_rollout_ref.actor", "actor_rollout_ref.rollout.val_kwargs"


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.e2e_utils import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


@pytest.mark.parametrize("key", ["clip_ratio_low", "clip_ratio"])
@pytest.mark.parametrize("mode", ["vanilla", "gspo", "clip_cov"])
def test_p31_a_lower_clip_no_ratio_reaches_is_warned(key, mode):
    """clip_ratio_low >= 1 puts the lower clip 1 - clip_ratio_low at or under 0: no lower clip, said in one line
    (a deliberate setting stays accepted)."""
    from trainer.config_validate import validate
    from trainer.unused_settings import switched_off_warnings

    cfg = _cfg(f"{A}.{key}=1.5", f"{A}.policy_loss.loss_mode={mode}")
    validate(cfg)
    warned = [w for w in switched_off_warnings(cfg) if "has no lower clip" in w]
    assert warned and warned[0].startswith(f"{A}.{key}=1.5: ignored: {A}.policy_loss.loss_mode={mode} clips"), warned
    assert not any("no lower clip" in w for w in switched_off_warnings(
        _cfg(f"{A}.{key}=0.99", f"{A}.policy_loss.loss_mode={mode}")))


@pytest.mark.parametrize("mode", ["cispo", "geo_mean", "dppo_kl"])
def test_p31_a_large_lower_clip_is_quiet_where_it_is_the_documented_setting_or_no_ratio_bound(mode):
    """CISPO's paper sets clip_ratio_low large to drop the lower bound on purpose; geo_mean clips in log space and
    dppo_kl reads a KL threshold."""
    from trainer.config_validate import validate
    from trainer.unused_settings import switched_off_warnings

    cfg = _cfg(f"{A}.clip_ratio_low=10", f"{A}.clip_ratio_high=0.28", f"{A}.policy_loss.loss_mode={mode}")
    validate(cfg)
    assert not any("no lower clip" in w for w in switched_off_warnings(cfg))


def test_p31_the_batch_reward_manager_without_its_batch_function_is_refused():
    from trainer.config_checks import ConfigError
    from trainer.config_validate import validate

    with pytest.raises(ConfigError, match=r"^reward_model.reward_manager=batch without reward_model."
                                          r"custom_reward_function.path: the batch manager calls") as info:
        validate(_cfg("reward_model.reward_manager=batch"))
    assert len(str(info.value).splitlines()) == 1
    validate(_cfg("reward_model.reward_manager=naive"))


def test_validation_sampling_at_temperature_zero_is_warned():
    from trainer.unused_settings import switched_off_warnings

    val = ("data.val_files=x.parquet", "trainer.test_freq=1")
    warned = [w for w in switched_off_warnings(_cfg(*val, f"{VK}.do_sample=true", f"{VK}.top_p=0.9"))
              if "temperature=0 decodes greedily" in w]
    assert warned and warned[0].startswith(f"{VK}.do_sample=true, {VK}.top_p=0.9: ignored:"), warned
    for quiet in ((f"{VK}.do_sample=true", f"{VK}.temperature=0.7"), (f"{VK}.do_sample=false",)):
        assert not any("temperature=0 decodes" in w for w in switched_off_warnings(_cfg(*val, *quiet)))


class _Tok:
    """A tokenizer stand-in: its ``chat_template`` and transformers' ``apply_chat_template`` parameters."""

    def __init__(self, template):
        self.chat_template = template

    def apply_chat_template(self, conversation, tools=None, add_generation_prompt=False,
                            continue_final_message=False, tokenize=True, **kwargs):
        raise AssertionError("not rendered by the check")


def test_chat_template_kwargs_the_template_never_reads_are_warned():
    from trainer.chat_template_checks import unread_template_kwargs

    plain = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    thinking = "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}" + plain
    warned = unread_template_kwargs({"enable_thinking": False, "tools": None}, _Tok(plain))
    assert warned == ["data.apply_chat_template_kwargs.enable_thinking=false: ignored: the chat template never "
                      "reads 'enable_thinking'; check the key's spelling or the template "
                      "(actor_rollout_ref.model.custom_chat_template)"]
    assert unread_template_kwargs({"enable_thinking": False}, _Tok(thinking)) == []
    typo = unread_template_kwargs({"enable_thinkin": True}, _Tok(thinking))
    assert len(typo) == 1 and "'enable_thinkin'" in typo[0]
    # a processor's template counts too (a VLM renders with it); an unparsed or missing template: nothing known
    assert unread_template_kwargs({"enable_thinking": False}, _Tok(plain), _Tok({"default": thinking})) == []
    assert unread_template_kwargs({"x": 1}, _Tok("{% generation %}a{% endgeneration %}")) == []
    assert unread_template_kwargs({"x": 1}, _Tok(None)) == []


def test_chat_template_kwargs_are_warned_before_the_run_starts(tmp_path):
    from tests.test_reliability_config import run_cli

    proc = run_cli(tmp_path, "+data.apply_chat_template_kwargs.enable_thinkin=true", "trainer.total_training_steps=1",
                   forked=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "data.apply_chat_template_kwargs.enable_thinkin=true: ignored: the chat template never reads" in out
