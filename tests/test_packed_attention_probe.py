"""Models whose decoder the packed (varlen) attention does not reproduce (case P01's kind: other models' attention).
With the default ``use_remove_padding=true`` the workers' packed log-probs of GPT-OSS (attention sinks), Llama 4
(chunked attention) and Bloom (ALiBi, an attention outside transformers' interface) silently differed from the
padded ones, and DeepSeek-V3's latent attention (values narrower than queries) failed at the first forward. Now a
probe on a small random model of the same class decides (trainer/packing_probe.py): such a model runs padded
batches, Ulysses SP is refused for it before start-up, and latent attention packs exactly."""
import pytest
import torch
import transformers as T

from trainer.config.actor import ULYSSES_SECTIONS
from trainer.config_checks import ConfigError
from trainer.packing_probe import check_packed_attention, packed_attention_obstacle, small_twin_config
from trainer.workers.model_utils import packs_sequences

C = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
         initializer_range=0.5)
CONFIGS = {
    "gpt_oss": lambda: T.GptOssConfig(**C, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                      num_experts_per_tok=1, sliding_window=4,
                                      layer_types=["sliding_attention", "full_attention"]),
    "llama4": lambda: T.Llama4TextConfig(**C, num_key_value_heads=2, head_dim=8, attention_chunk_size=4,
                                         no_rope_layers=[1, 0], num_local_experts=2, interleave_moe_layer_step=1,
                                         intermediate_size_mlp=32, layer_types=["chunked_attention",
                                                                                "full_attention"]),
    "bloom": lambda: T.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4, initializer_range=0.5),
    "deepseek_v3": lambda: T.DeepseekV3Config(**C, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                                              qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
                                              n_routed_experts=2, num_experts_per_tok=1, first_k_dense_replace=2,
                                              moe_intermediate_size=16, n_group=1, topk_group=1),
    "gpt_bigcode": lambda: T.GPTBigCodeConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, initializer_range=0.5),
}


def _packed_minus_padded(config, patch_sp=1) -> float:
    """Largest |packed - padded| response log-prob of three rows of different lengths, the workers' forward."""
    import copy

    from patches.ulysses import apply_ulysses_patch
    from trainer.forward import forward_log_probs

    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, 60, (3, 11))
    mask = torch.zeros(3, 11, dtype=torch.long)
    for i, (p, r) in enumerate([(6, 5), (3, 2), (4, 3)]):
        mask[i, 6 - p:6 + r] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = forward_log_probs(model, ids, mask, pos, 5, use_remove_padding=False)[0]
        out = forward_log_probs(apply_ulysses_patch(copy.deepcopy(model), patch_sp), ids, mask, pos, 5,
                                use_remove_padding=True, device=torch.device("cpu"))[0]
    return float((out - ref)[mask[:, 6:].bool()].abs().max())


def _sp_cfg(actor_sp: int) -> dict:
    cfg = {}
    for key in ULYSSES_SECTIONS:
        node = cfg
        for part in key.split("."):
            node = node.setdefault(part, {})
        node["ulysses_sequence_parallel_size"] = 1
    cfg["actor_rollout_ref"]["actor"]["ulysses_sequence_parallel_size"] = actor_sp
    cfg["actor_rollout_ref"]["model"] = {"trust_remote_code": False}
    return cfg


@pytest.mark.parametrize("name", ["gpt_oss", "llama4"])
def test_p01_a_decoder_the_varlen_attention_does_not_reproduce_runs_padded(name):
    config = CONFIGS[name]()
    assert _packed_minus_padded(config) > 1e-2  # what packing computed: sinks / chunks ignored
    reason = packed_attention_obstacle(config)
    assert "computes other log-probs than padded" in reason
    assert packs_sequences(True, 1, config) is False
    with pytest.raises(ValueError, match="^ulysses_sequence_parallel_size=2: this model cannot run packed forwards"):
        packs_sequences(True, 2, config)
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=2: Ulysses "
                                          r"sequence parallelism runs packed forwards, which this model cannot: "):
        check_packed_attention(_sp_cfg(2), config)
    check_packed_attention(_sp_cfg(1), config)  # without SP nothing is refused: the role runs padded


def test_p01_an_attention_outside_transformers_interface_runs_padded():
    config = CONFIGS["bloom"]()
    assert _packed_minus_padded(config) > 1e-2
    assert "BloomForCausalLM's attention does not go through transformers' attention interface" in \
        packed_attention_obstacle(config)
    assert packs_sequences(True, 1, config) is False and packs_sequences(False, 1, config) is False


def test_p01_latent_attention_with_narrower_values_packs_exactly_with_and_without_sp_boundaries():
    config = CONFIGS["deepseek_v3"]()
    assert _packed_minus_padded(config, 1) < 1e-5 and _packed_minus_padded(config, None) < 1e-5
    assert packed_attention_obstacle(config, sequence_parallel=True) is None
    assert packs_sequences(True, 1, config) is True


def test_p01_an_attention_layer_not_given_the_positions_packs_without_sp_and_is_refused_with_sp():
    """GPT-BigCode's layers do not hand ``position_ids`` to the attention: the boundaries passed as keyword
    arguments (no SP) are exact, the eager SP path's (from the positions) are not."""
    config = CONFIGS["gpt_bigcode"]()
    assert _packed_minus_padded(config, 1) < 1e-5 and _packed_minus_padded(config, None) > 1e-2
    assert packed_attention_obstacle(config) is None and packs_sequences(True, 1, config) is True
    assert "with sequence parallelism" in packed_attention_obstacle(config, sequence_parallel=True)
    with pytest.raises(ConfigError, match="which this model cannot: packed with sequence parallelism"):
        check_packed_attention(_sp_cfg(4), config)


@pytest.mark.parametrize("config_cls", [T.LlamaConfig, T.Qwen2Config, T.MistralConfig, T.Gemma3TextConfig,
                                        T.Qwen3MoeConfig])
def test_p01_common_decoders_at_their_default_sizes_pack(config_cls):
    """The probe makes the default (billions of parameters) configuration small and finds the packed path exact,
    with and without SP boundaries (Mistral's and Gemma 3's sliding windows cut the probe's longest row)."""
    assert packed_attention_obstacle(config_cls(), sequence_parallel=True) is None


def test_small_twin_config_keeps_the_layout_and_makes_the_sizes_small():
    twin = small_twin_config(T.Gemma3TextConfig())
    assert (twin.hidden_size, twin.num_hidden_layers, len(twin.layer_types), twin.sliding_window) == (64, 4, 4, 8)
    assert twin.layer_types == ["sliding_attention"] * 3 + ["full_attention"]  # every kind of layer is kept
    late = T.Lfm2Config(num_hidden_layers=8, layer_types=["full_attention"] * 4 + ["conv"] * 4)
    assert small_twin_config(late).layer_types == ["full_attention"] * 3 + ["conv"]
    ds = small_twin_config(T.DeepseekV3Config())
    assert ds.v_head_dim != ds.qk_nope_head_dim + ds.qk_rope_head_dim and ds.n_routed_experts == 4
    assert small_twin_config(T.Qwen2VLConfig()) is None  # a vision part: not probed


def test_p01_a_convolution_layer_after_the_first_four_is_found_and_float_noise_is_not_a_difference():
    """The twin keeps one layer of every kind (a hybrid's convolutions after four attention layers were cut off and
    the model accepted), its short rows show a mixer reaching across a boundary at once, and it runs in float64
    (JetMoE's float32 noise, 1.6e-4 nats, was taken for a difference)."""
    lfm2 = T.Lfm2Config(vocab_size=256, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, num_hidden_layers=8, layer_types=["full_attention"] * 4 + ["conv"] * 4)
    assert "computes other log-probs than padded" in packed_attention_obstacle(lfm2)
    assert packed_attention_obstacle(T.JetMoeConfig(), sequence_parallel=True) is None


def test_p01_a_mamba_hybrid_is_found_and_a_model_that_cannot_be_checked_runs_padded():
    """A Granite-4.0-H-like hybrid's small twin was refused by its config class (Mamba heads left at full size) and
    the model accepted unchecked; a model whose small twin does not run is now treated as one that cannot pack."""
    hybrid = T.GraniteMoeHybridConfig(hidden_size=1536, num_hidden_layers=10, mamba_n_heads=48, mamba_d_head=64,
                                      mamba_expand=2, layer_types=["mamba"] * 4 + ["attention"] + ["mamba"] * 4 +
                                      ["attention"])
    assert "computes other log-probs than padded" in packed_attention_obstacle(hybrid)
    dbrx = T.DbrxConfig()  # its default configuration does not build a model at any size
    assert packed_attention_obstacle(dbrx).startswith("it could not be checked: a small random DbrxForCausalLM")
    assert packs_sequences(True, 1, dbrx) is False


def test_p01_a_longrope_model_is_probed_with_its_factor_lists_cut_to_the_small_heads():
    """Phi-3.5-mini's longrope lists (48 entries) made its small twin invalid, so it was taken for a model that
    cannot pack; the lists are cut to the twin's 16-wide heads."""
    phi = T.Phi3Config(hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32,
                       vocab_size=32064, max_position_embeddings=131072, original_max_position_embeddings=4096,
                       rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.1] * 48})
    assert len(small_twin_config(phi).rope_scaling["short_factor"]) == 8
    assert packed_attention_obstacle(phi, sequence_parallel=True) is None
