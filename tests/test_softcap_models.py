"""A model whose attention uses logit soft-capping (Gemma 2) with the default ``use_remove_padding=true``: the
Ulysses patch's packed (varlen) attention has no soft-capping, and the run died at the first log-prob pass, after
the workers and the first rollout (``ulysses varlen attention does not support attention logit softcapping``).
Now such a model runs padded batches through its own attention, and SP above 1 is refused before start-up."""
import pytest

from trainer.config.actor import attention_softcap, check_ulysses_softcap
from trainer.config_checks import ConfigError
from trainer.workers.model_utils import packs_sequences


def _gemma2_config():
    from transformers import Gemma2Config

    return Gemma2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def test_a_soft_capped_model_runs_padded_without_sp_and_others_pack():
    from transformers import LlamaConfig

    gemma = _gemma2_config()
    assert attention_softcap(gemma.to_dict()) == 50.0
    assert attention_softcap({"text_config": {"attn_logit_softcapping": 30.0}}) == 30.0
    assert attention_softcap(LlamaConfig().to_dict()) is None
    assert packs_sequences(True, 1, gemma) is False
    assert packs_sequences(False, 1, gemma) is False
    assert packs_sequences(True, 1, LlamaConfig()) is True and packs_sequences(False, 2, LlamaConfig()) is True


def test_p01_sp_above_one_with_a_soft_capped_model_is_refused_naming_the_key():
    from tests.test_packed_attention_probe import _sp_cfg

    cfg = _sp_cfg(2)
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=2: the model's "
                                          r"attention uses logit soft-capping \(attn_logit_softcapping=50, "):
        check_ulysses_softcap(cfg, 50.0)
    check_ulysses_softcap(cfg, None)
    cfg["actor_rollout_ref"]["actor"]["ulysses_sequence_parallel_size"] = 1
    check_ulysses_softcap(cfg, 50.0)


def test_the_padded_forward_of_a_soft_capped_model_matches_packing_off():
    """The model's own (eager) attention applies the soft-capping on a padded batch; the patched packed path refuses
    it, which is why packing is turned off for such a model."""
    import torch
    from transformers import AutoModelForCausalLM

    from patches.ulysses import apply_ulysses_patch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_gemma2_config())
    ids = torch.tensor([[0, 5, 6, 7], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    out = model(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(out).all()
    apply_ulysses_patch(model, 1)
    with pytest.raises(ValueError, match="softcap"):
        model(input_ids=ids[1:], position_ids=torch.arange(4)[None]).logits
