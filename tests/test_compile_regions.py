"""Decoder layers as one nested compile region (rollout/compile_regions.py, ``rollout.decode_compile_regions``):
the marked layers compute what they did, the graph decode loop compiled with them gives the eager loop's tokens and
log-probs, dynamo traces the layers as ``invoke_subgraph`` calls of one subgraph, and the config key reaches the
engine."""
from __future__ import annotations

import functools

import pytest
import torch

from rollout.compile_regions import mark_layer_regions
from rollout.graph_decode import GraphDecoder
from tests.test_graph_decode import PROMPTS, _left_pad


def _model(kind: str = "llama", layers: int = 3):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
                  max_position_embeddings=256)
    cfg = LlamaConfig(tie_word_embeddings=True, **common) if kind == "llama" else Qwen2Config(**common)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def test_marked_layers_compute_the_same_logits_outside_compile():
    model = _model(layers=3)
    ids = torch.tensor([[0, 5, 9, 12, 3]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        assert mark_layer_regions(model) == 3
        assert mark_layer_regions(model) == 3  # marking again keeps one mark per layer
        after = model(input_ids=ids).logits
    torch.testing.assert_close(before, after, rtol=0, atol=0)


def test_a_model_naming_no_layer_class_is_left_as_it_was():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

    model = Plain()
    assert mark_layer_regions(model) == 0 and "forward" not in vars(model.lin)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_compiled_decode_with_layer_regions_equals_the_eager_loop(kind):
    """One subgraph for all layers (dynamo's invoke_subgraph, AOT autograd through ``aot_eager``); the tokens and
    log-probs of a sampled call with a seed equal the eager loop's."""
    from torch._dynamo.backends.debugging import aot_eager

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    eager_model, model = _model(kind), _model(kind)
    compiled = GraphDecoder(model, dict(backend=backend, fullgraph=True, dynamic=False), layer_regions=True)
    eager = GraphDecoder(eager_model)
    ids, mask = _left_pad(PROMPTS, 1)
    outs = []
    for dec in (eager, compiled):
        torch.manual_seed(7)
        with torch.no_grad():
            outs.append(dec.decode(ids, mask, 32, 10, [1], 1, 0.8, False, top_k=20))
    assert torch.equal(outs[0][0], outs[1][0]) and outs[0][2] == outs[1][2]
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=0)
    assert len(graphs) == 1  # the step is one graph; its 3 layers call one subgraph
    assert [name for name, _ in graphs[0].named_children()] == ["subgraph_0"]
    assert graphs[0].code.count("invoke_subgraph") >= 3
    assert all(isinstance(layer.forward, functools.partial) for layer in model.model.layers)


def test_the_config_key_reaches_the_engine(monkeypatch):
    from types import SimpleNamespace

    from trainer.workers import actor as actor_mod

    seen = {}

    class FakeEngine:
        def __init__(self, hf_config, **kw):
            seen.update(kw)

    monkeypatch.setattr("rollout.hf_engine.HFRolloutEngine", FakeEngine)
    rc = SimpleNamespace(name="hf", static_cache="auto", max_batch_size=8, prompt_length_bucket=8,
                         attn_implementation="auto", decode_loop="graph", decode_compile_regions=True)
    actor_mod.build_engine(SimpleNamespace(rollout=rc), None, "m", [1], 0, torch.device("cpu"), "cpu",
                           torch.float32, 0)
    assert seen["compile_regions"] is True and seen["decode_loop"] == "graph"


def test_an_engine_with_regions_keeps_its_own_weights():
    """A region refuses parameters that are views of one buffer (DeepSpeed's flat ZeRO buffers), so an engine with
    ``compile_regions`` is given copies (``load_weights``), never the trainer's tensors (``share_weights``)."""
    from rollout.hf_engine import HFRolloutEngine

    cfg = _model(layers=1).config
    assert not HFRolloutEngine(cfg, device="cpu", decode_loop="graph", compile_regions=True).can_share_weights
    assert HFRolloutEngine(cfg, device="cpu", decode_loop="graph").can_share_weights


@pytest.mark.slow
def test_training_with_compiled_layer_regions_runs(tmp_path):
    """The embedded default with the graph loop compiled (static cache on the CPU) and layer regions: two steps on
    2 ZeRO-2 ranks, whose actor weights are views of DeepSpeed's flat buffer."""
    from tests.e2e_utils import read_metrics, run_main

    run_main(str(tmp_path), "trainer.total_training_steps=2", "actor_rollout_ref.rollout.decode_loop=graph",
             "actor_rollout_ref.rollout.static_cache=true", "actor_rollout_ref.rollout.decode_compile_regions=true")
    assert len(read_metrics(str(tmp_path))) == 2


@pytest.mark.parametrize("device,rollout,warned", [
    ("cpu", {}, "decodes with transformers' generate"),
    ("cuda", {"decode_loop": "generate"}, "decode_loop=generate"),
    ("cuda", {"static_cache": False}, "no static cache"),
    ("cuda", {"decode_loop": "graph", "static_cache": False}, "runs uncompiled"),
    ("cpu", {"decode_loop": "graph", "static_cache": "auto"}, "static_cache=auto: off without CUDA"),
    ("cpu", {"decode_loop": "graph", "static_cache": "false"}, None),  # refused by its section, not read here
    ("cpu", {"decode_loop": "graph", "static_cache": None}, None), ("cpu", {"decode_loop": "graph", "static_cache": 0}, None),
    ("cuda", {}, None), ("cpu", {"decode_loop": "graph", "static_cache": True}, None),
    ("cuda", {"decode_compile_regions": False, "decode_loop": "generate"}, None)])
def test_regions_where_no_decode_step_is_compiled_are_warned(device, rollout, warned):
    from trainer.unused_settings import decode_regions_warnings

    rc = {"name": "hf", "decode_compile_regions": True, **rollout}
    lines = decode_regions_warnings({"trainer": {"device": device}, "actor_rollout_ref": {"rollout": rc}})
    assert (lines == []) if warned is None else (len(lines) == 1 and warned in lines[0] and "no effect" in lines[0])
