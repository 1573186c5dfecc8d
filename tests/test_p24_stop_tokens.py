"""Responses end at every end-of-turn token a chat model may write, in every engine and every consumer.

Tiny models whose weights are rigged to always emit one token (the end-of-turn token, which is not the
tokenizer's EOS); the engines are built the way the actor worker builds them (``_build_rollout``).
"""
from __future__ import annotations

import json
import types

import pytest
import torch

import rollout.vllm_engine as vllm_engine
from rollout.base import SamplingConfig
from rollout.stop_tokens import as_id_list, chat_end_of_turn_id, resolve_stop_token_ids
from trainer.protocol import DataProto
from trainer.workers.actor import ActorRolloutRefWorker

PAD = 0

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def _tokenizer(words, specials, eos, template=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token=eos, unk_token="<unk>",
                                 additional_special_tokens=[s for s in specials if s not in (eos, "<pad>", "<unk>")])
    if template:
        hf.chat_template = template
    return hf


def _rig(model, target: int) -> None:
    """All weights 0 except the norms, embeddings = 1 and the lm_head row of ``target`` = 1: greedy decoding
    then emits ``target`` at every step."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                continue
            p.zero_()
            if "embed_tokens" in name:
                p.fill_(1.0)
        model.get_output_embeddings().weight[target].fill_(1.0)


def _worker(tok, hf_config, path, name="hf", stop_token_ids=None):
    from trainer.config.packaged import packaged_config
    from trainer.config.workers import actor_worker_config

    r = "actor_rollout_ref.rollout"
    config = actor_worker_config(packaged_config([
        f"rollout={name}", f"{r}.max_batch_size=8", f"{r}.prompt_length_bucket=8", "data.max_prompt_length=8",
        "data.max_response_length=4", f"{r}.gpu_memory_utilization=0.3", "trainer.seed=0",
        f"{r}.stop_token_ids=[{','.join(map(str, stop_token_ids or []))}]",
        *([f"{r}.static_cache=false"] if name == "hf" else [])], 1))
    return types.SimpleNamespace(rollout_cfg=config.rollout, tokenizer=tok, config=config, rank=0, lora=False,
                                 actor=types.SimpleNamespace(hf_config=hf_config, model_path=str(path)),
                                 device_type="cpu", device=torch.device("cpu"), param_dtype=lambda: torch.float32)


def _generate_hf(tok, model, path, prompt, **kw):
    worker = _worker(tok, model.config, path, **kw)
    ActorRolloutRefWorker._build_rollout(worker)
    worker.engine.wake_up()
    worker.engine.load_weights(model.state_dict().items())
    out = worker.engine.generate([prompt], SamplingConfig(n=1, max_new_tokens=4, do_sample=False))
    return worker, out


@pytest.fixture()
def rigged_llama(tmp_path):
    """The case's model: config and generation_config say eos_token_id=[1, 5], the tokenizer's EOS is 1, and the
    weights always emit 5."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    words = ["<pad>", "<eos>", "<unk>", "a", "b", "<stop>", "c", "d"]
    tok = _tokenizer(words, ["<pad>", "<eos>", "<unk>", "<stop>"], "<eos>")
    cfg = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=PAD, eos_token_id=[1, 5],
                      bos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    _rig(model, 5)
    model.save_pretrained(tmp_path)
    GenerationConfig(eos_token_id=[1, 5], pad_token_id=PAD).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return tok, model, tmp_path


def test_p24_hf_engine_stops_at_generation_config_eos(rigged_llama):
    tok, model, path = rigged_llama
    assert tok.eos_token_id == 1
    worker, out = _generate_hf(tok, model, path, [3, 4])
    assert worker.stop_token_ids[:2] == [1, 5]
    assert out.responses.tolist() == [[5, PAD, PAD, PAD]]
    assert out.response_mask.tolist() == [[1, 0, 0, 0]]


def test_p24_generation_config_alone_is_read(rigged_llama):
    """The model config without the list: generation_config.json still gives 5."""
    tok, model, path = rigged_llama
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = 1
    (path / "config.json").write_text(json.dumps(cfg))
    from transformers import AutoConfig

    assert resolve_stop_token_ids(tok, AutoConfig.from_pretrained(path), str(path)) == [1, 5]


def test_p24_stop_token_ids_key_adds_ids(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    words = ["<pad>", "<eos>", "<unk>", "a", "b", "c"]
    tok = _tokenizer(words, ["<pad>", "<eos>", "<unk>"], "<eos>")
    cfg = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=PAD, eos_token_id=1,
                      bos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    _rig(model, 4)
    _, out = _generate_hf(tok, model, tmp_path, [3], stop_token_ids=[4])
    assert out.responses.tolist() == [[4, PAD, PAD, PAD]] and out.response_mask.tolist() == [[1, 0, 0, 0]]
    _, out = _generate_hf(tok, model, tmp_path, [3])
    assert out.response_mask.tolist() == [[1, 1, 1, 1]]  # without the key, 4 is an ordinary token


def _llama3_style():
    from transformers import LlamaConfig, LlamaForCausalLM

    words = ["<pad>", "<unk>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eot_id|>", "user", "assistant", "hi", "1"]
    tok = _tokenizer(words, words[:7], "<|end_of_text|>", LLAMA3_TEMPLATE)
    tok.bos_token = "<|begin_of_text|>"
    cfg = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=PAD, bos_token_id=2,
                      eos_token_id=3, tie_word_embeddings=False)
    return tok, LlamaForCausalLM(cfg).eval(), tok.convert_tokens_to_ids("<|eot_id|>")


def _gemma2_style():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    words = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "user", "model", "hi", "1"]
    tok = _tokenizer(words, words[:6], "<eos>", GEMMA2_TEMPLATE)
    tok.bos_token = "<bos>"
    cfg = Gemma2Config(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=8, pad_token_id=PAD, bos_token_id=2,
                       eos_token_id=1, tie_word_embeddings=False)
    return tok, Gemma2ForCausalLM(cfg).eval(), tok.convert_tokens_to_ids("<end_of_turn>")


@pytest.mark.parametrize("build", [_llama3_style, _gemma2_style], ids=["llama3", "gemma2"])
def test_p24_chat_end_of_turn_stops_every_consumer(build, tmp_path):
    """Neither the tokenizer's EOS nor the config names the end-of-turn token: the chat template does."""
    tok, model, eot = build()
    assert eot not in as_id_list(model.config.eos_token_id) and eot != tok.eos_token_id
    assert chat_end_of_turn_id(tok) == eot
    _rig(model, eot)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    worker, out = _generate_hf(tok, model, tmp_path, list(prompt))
    assert eot in worker.stop_token_ids
    assert out.responses.tolist() == [[eot, PAD, PAD, PAD]] and out.response_mask.tolist() == [[1, 0, 0, 0]]

    # the reward goes on the end-of-turn token, not on the last column
    from rewards.manager import RewardManager

    data = DataProto.from_dict({"responses": out.responses, "response_mask": out.response_mask.float()},
                               {"data_source": ["x"], "reward_model": [{"ground_truth": "1"}]})
    with RewardManager(tok, scorer=lambda s, gt, extra_info=None: 1.0, num_workers=0) as rm:
        scores = rm(data).token_level_scores
    assert scores.tolist() == [[1.0, 0.0, 0.0, 0.0]]

    # PRIME's truncation flag: a full-width row that ends with the end-of-turn token was not cut
    from trainer.hooks.prime import truncated_rows

    full = torch.tensor([[9, 9, 9, eot], [9, 9, 9, 9]])
    flags = truncated_rows(full, torch.ones_like(full), worker.stop_token_ids)
    assert flags.tolist() == [False, True]


class _FakeLLM:
    """vLLM's ``LLM`` as far as the engine uses it: stops a row at any of ``stop_token_ids`` (as vLLM does,
    keeping the stop token) and emits the rigged sequence otherwise."""

    emit = [5, 6, 6, 6]

    def __init__(self, **kw):
        self.kw = kw

    def sleep(self, level):
        pass

    def wake_up(self, tags=None):
        pass

    def generate(self, prompts, params, use_tqdm=False):
        stops = set(params["stop_token_ids"] or [])
        ids = []
        for t in self.emit[: params["max_tokens"]]:
            ids.append(t)
            if t in stops:
                break
        comp = types.SimpleNamespace(token_ids=ids, logprobs=[{t: -0.5} for t in ids])
        return [types.SimpleNamespace(outputs=[comp] * params["n"]) for _ in prompts]


def test_p24_vllm_engine_gets_the_same_stop_set(rigged_llama, monkeypatch):
    tok, model, path = rigged_llama
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: types.SimpleNamespace(LLM=_FakeLLM, SamplingParams=dict))
    worker = _worker(tok, model.config, path, name="vllm")
    ActorRolloutRefWorker._build_rollout(worker)
    out = worker.engine.generate([[3, 4]], SamplingConfig(n=1, max_new_tokens=4, do_sample=False))
    assert out.responses.tolist() == [[5, PAD, PAD, PAD]] and out.response_mask.tolist() == [[1, 0, 0, 0]]


def test_p24_bad_stop_ids_refused_before_start(rigged_llama):
    from transformers import AutoConfig

    from trainer.config_checks import ConfigError
    from trainer.launch import check_model_context

    tok, model, path = rigged_llama
    cfg = {"data": {"max_prompt_length": 8, "max_response_length": 4},
           "actor_rollout_ref": {"model": {"path": str(path)}, "rollout": {"stop_token_ids": [99]}}}
    with pytest.raises(ConfigError) as info:
        check_model_context(cfg, AutoConfig.from_pretrained(path), tok)
    assert str(info.value) == ("stop token ids [99] are outside the vocabulary (size 8): "
                               "actor_rollout_ref.rollout.stop_token_ids gives [99]; the model can never generate "
                               "them; expected ids below 8 there")
    cfg["actor_rollout_ref"]["rollout"]["stop_token_ids"] = ["eot"]
    with pytest.raises(ConfigError, match="'eot' is not an integer"):
        check_model_context(cfg, AutoConfig.from_pretrained(path), tok)


@pytest.mark.parametrize("file", ["config.json", "generation_config.json", "override_config"])
def test_an_eos_id_outside_the_vocabulary_is_blamed_on_the_file_that_holds_it(rigged_llama, file):
    """A model's own ``eos_token_id`` past its ``vocab_size`` was reported as a bad
    ``actor_rollout_ref.rollout.stop_token_ids`` (a key the user never set); the line names the file and field."""
    from transformers import AutoConfig

    from trainer.config_checks import ConfigError
    from trainer.launch import check_model_context

    tok, model, path = rigged_llama
    override = {}
    if file == "override_config":
        override, where = {"eos_token_id": [1, 99]}, "actor_rollout_ref.model.override_config.eos_token_id"
    else:
        data = json.loads((path / file).read_text())
        (path / file).write_text(json.dumps({**data, "eos_token_id": [1, 99]}))
        where = f"eos_token_id in {path / file}"
    cfg = {"data": {"max_prompt_length": 8, "max_response_length": 4},
           "actor_rollout_ref": {"model": {"path": str(path), "override_config": override},
                                 "rollout": {"stop_token_ids": []}}}
    with pytest.raises(ConfigError) as info:
        check_model_context(cfg, AutoConfig.from_pretrained(path, **override), tok)
    assert str(info.value) == (f"stop token ids [99] are outside the vocabulary (size 8): {where} gives [99]; the "
                               "model can never generate them; expected ids below 8 there"), str(info.value)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": "eot"}))
    with pytest.raises(ConfigError, match=rf"^eos_token_id in {path / 'generation_config.json'}: stop token id 'eot'"):
        check_model_context(cfg, AutoConfig.from_pretrained(path), tok)


def test_p24_completion_lengths_end_at_any_stop_id():
    from trainer.metric_utils import completion_length_stats

    comp = torch.tensor([[5, 6, 2, 0], [5, 7, 0, 0], [5, 5, 5, 5]])
    s = completion_length_stats(comp, eos_id=[2, 7], max_len=4)
    assert s.min == 2.0 and s.clipped_ratio == pytest.approx(1 / 3)
    assert s.loss_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]


def test_ignore_eos_runs_every_row_to_the_limit(rigged_llama, monkeypatch):
    """rollout.ignore_eos: the rigged model's stop token is masked until max_new_tokens, in both engines."""
    tok, model, path = rigged_llama
    worker, _ = _generate_hf(tok, model, path, [3, 4])
    out = worker.engine.generate([[3, 4]], SamplingConfig(n=1, max_new_tokens=4, do_sample=False, ignore_eos=True))
    assert out.response_mask.tolist() == [[1, 1, 1, 1]] and 5 not in out.responses.tolist()[0]
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: types.SimpleNamespace(LLM=_FakeLLM, SamplingParams=dict))
    vw = _worker(tok, model.config, path, name="vllm")
    ActorRolloutRefWorker._build_rollout(vw)
    params = vw.engine._sampling_params(SamplingConfig(max_new_tokens=4, ignore_eos=True))
    assert params["ignore_eos"] is True and params["min_tokens"] == 4
