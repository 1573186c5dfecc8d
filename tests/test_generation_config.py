"""rollout.generation_config: the transformers engine's GenerationConfig for one ``generate`` call."""
from types import SimpleNamespace

from rollout.base import SamplingConfig
from rollout.generation_config import generation_config


def test_static_cache_with_or_without_a_compile_mode_and_the_dynamic_cache():
    cfg = SimpleNamespace()
    for mode in ("reduce-overhead", None):
        g = generation_config(cfg, SamplingConfig(max_new_tokens=8), [2], 128, 0, True, mode)
        assert g.cache_implementation == "static" and g.max_cache_len == 128 and g.compile_config.mode == mode
    g = generation_config(cfg, SamplingConfig(max_new_tokens=8), [2], 128, 0, False, "reduce-overhead")
    assert g.cache_implementation is None


def test_sampling_settings_stop_ids_and_a_vlm_placeholder():
    vlm = SimpleNamespace(image_token_id=7, video_token_id=None)
    g = generation_config(vlm, SamplingConfig(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, ignore_eos=True),
                          [2, 3], 64, 1, False, None)
    assert (g.do_sample, g.temperature, g.top_p, g.top_k) == (True, 0.7, 0.9, 0)
    assert g.eos_token_id == [2, 3] and g.pad_token_id == 1 and g.min_new_tokens == 5 and g.suppress_tokens == [7]
    greedy = generation_config(SimpleNamespace(), SamplingConfig(do_sample=False), [2], 64, 0, False, None)
    assert greedy.do_sample is False and greedy.min_new_tokens == 0 and greedy.suppress_tokens is None
