"""tools/bench/rollout.py --engine hf,vllm: both engines on the same prompts, vLLM faked on CPU."""
import json
import types

import torch

import rollout.vllm_engine as vllm_engine
from tools.bench import rollout as bench


class _LLM:
    def __init__(self, **kw):
        self.kw = kw

    def sleep(self, level):
        pass

    def wake_up(self, tags=None):
        pass

    def generate(self, prompts, params, use_tqdm=False):
        comp = types.SimpleNamespace(token_ids=[5] * params["max_tokens"], logprobs=None)
        return [types.SimpleNamespace(outputs=[comp] * params["n"]) for _ in prompts]


def test_hf_and_vllm_rows_on_a_saved_random_model(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: types.SimpleNamespace(LLM=_LLM, SamplingParams=dict))
    monkeypatch.setattr(bench, "random_config", lambda name: bench.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, eos_token_id=1, bos_token_id=None))
    monkeypatch.setattr(bench.tempfile, "mkdtemp", lambda prefix="": str(tmp_path / "m"))
    out = tmp_path / "r.json"
    bench.main(["--engine", "hf,vllm", "--prompts", "3", "--n", "2", "--new-tokens", "4", "--min-prompt", "2",
                "--max-prompt", "4", "--skip-plain", "--skip-sync", "--engine-calls", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"].split(" ")[0] for r in rows] == ["HFRolloutEngine", "VLLMRolloutEngine"]
    assert rows[1]["tokens"] == 3 * 2 * 4 and rows[1]["tok_per_s"] > 0
    assert (tmp_path / "m" / "config.json").exists() and (tmp_path / "m" / "tokenizer.json").exists()
    assert torch.cuda.is_available() or rows[0]["tokens"] > 0


def test_sleep_wake_rows_decode_the_awake_tokens_after_each_level(tmp_path, monkeypatch):
    """--sleep-wake: each call after sleep(level)/wake (level 2: the weights loaded again) decodes, greedily, the tokens
    of a call made awake; a level-2 engine whose weights were not loaded again refuses to decode."""
    monkeypatch.setattr(bench, "random_config", lambda name: bench.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, eos_token_id=1, bos_token_id=None))
    for level in (1, 2):
        out = tmp_path / f"s{level}.json"
        bench.main(["--prompts", "3", "--n", "2", "--new-tokens", "4", "--min-prompt", "2", "--max-prompt", "4",
                    "--skip-plain", "--skip-sync", "--engine-calls", "2", "--temperature", "0", "--sleep-wake",
                    "--sleep-level", str(level), "--out", str(out)])
        row = json.loads(out.read_text())["rows"][-1]
        assert row["sleep_level"] == level and row["same_tokens_as_awake"] == [True, True], row
    monkeypatch.setattr(bench.HFRolloutEngine, "load_weights", lambda self, named: None)
    try:
        bench.main(["--prompts", "3", "--n", "2", "--new-tokens", "4", "--min-prompt", "2", "--max-prompt", "4",
                    "--skip-plain", "--skip-sync", "--engine-calls", "1", "--temperature", "0", "--sleep-wake",
                    "--sleep-level", "2", "--out", str(tmp_path / "x.json")])
    except RuntimeError as exc:
        assert "not loaded" in str(exc) or "level-2" in str(exc), exc
    else:
        raise AssertionError("a level-2 engine without its weights decoded")
