"""LoRA adapters (peft) on a DeepSpeed engine, in one gloo process on CPU (fp32):

* the merged weights the rollout engines and the export see equal peft's ``merge_and_unload`` bitwise and leave
  the trained weights untouched (ZeRO 0/2/3); the reference (adapters disabled) is the base model;
* only the adapters are trained and hold optimizer state;
* a checkpoint holds the adapters (and their optimizer state) only, and resuming from it continues bit-exactly;
* ``tools/export_hf.py`` on a LoRA checkpoint writes the merged model (it loads with ``from_pretrained``; its logits
  equal peft's base + adapter) and, with ``--adapter``, the folder ``PeftModel.from_pretrained`` loads; a critic
  (value head) exports merged too;
* an adapter on an untied input embedding (peft's ``lora.Embedding``) and on GPT-2's ``Conv1D`` merges like
  ``merge_and_unload`` in the sync (full and changed-only) and the export; an adapter the merge cannot carry (grouped
  convolution, multi-head attention) is refused before start-up and by ``iter_merged_params``, never left out;
* the weight sync to the rollout engine: merged (all tensors first, then only those training changes) and vLLM's
  adapter mode (a new ``LoRARequest`` per step, the old one removed) with a fake ``vllm.LLM``.
"""
import copy
import json
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

deepspeed = pytest.importorskip("deepspeed")
peft = pytest.importorskip("peft")
import transformers  # noqa: E402

from tests.test_checkpoint_hf_export import dist_group, ids, tiny, tokenizer  # noqa: E402,F401  (fixtures)
from tools.export_hf import export_checkpoint, main as export_main  # noqa: E402
from trainer.checkpoint.base import step_dir  # noqa: E402
from trainer.checkpoint.deepspeed_manager import LORA_SUBDIR, DeepSpeedCheckpointManager  # noqa: E402
from trainer.checkpoint.hf_export import export_hf  # noqa: E402
from trainer.workers.lora import (LoraSettings, apply_lora, hf_name, iter_merged_params,  # noqa: E402
                                  reference_mode, trainable_numel)
from trainer.workers.lora_adapter import adapter_state_dict  # noqa: E402

SETTINGS = LoraSettings(rank=4, alpha=8.0, target_modules="all-linear")


def base_folder(tmp_path, tie=True, value_head=False):
    """A tiny Llama saved to ``tmp_path/base`` and loaded back from there (its ``name_or_path`` is the folder);
    ``tie`` applies when the folder is first written."""
    path = str(tmp_path / "base")
    if not os.path.isdir(path):
        tiny(tie).save_pretrained(path)
    cls = transformers.AutoModelForTokenClassification if value_head else transformers.AutoModelForCausalLM
    kw = {"num_labels": 1} if value_head else {}
    return path, cls.from_pretrained(path, dtype=torch.float32, **kw)


def lora_model(tmp_path, seed=0, value_head=False, settings=SETTINGS, tie=True):
    path, model = base_folder(tmp_path, tie=tie, value_head=value_head)
    return apply_lora(model, settings, value_head=value_head, seed=seed)


def perturb_adapters(model, seed=0, scale=0.1):
    """Move every trainable tensor (``A`` and ``B`` of each adapter) by seeded noise, as training steps would: peft
    starts one factor at zero, so the untrained delta is 0 and a merge that leaves it out would go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return model


def lora_engine(model, stage, steps=1, lr=1e-2):
    """A DeepSpeed engine over the trainable parameters only (as ``DistributedWorker.build_optimizer``), after
    ``steps`` optimizer steps on a fixed batch (so the adapters' ``B`` is no longer zero)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}, "bf16": {"enabled": False},
           "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    train_steps(engine, steps)
    return engine


def train_steps(engine, steps):
    for _ in range(steps):
        x = ids()
        out = engine(input_ids=x, labels=x) if not engine.module.peft_config["default"].task_type == "TOKEN_CLS" \
            else engine(input_ids=x)
        loss = out.loss if getattr(out, "loss", None) is not None else out.logits.pow(2).mean()
        engine.backward(loss)
        engine.step()


def gathered(engine, trainable_only=False):
    params = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad or not trainable_only]
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        return {n: p.detach().clone() for n, p in params}


def merged(engine, stage, **kw):
    return {n: t.clone() for bucket in iter_merged_params(engine.module, stage, bucket_bytes=4096, **kw)
            for n, t in bucket}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_merged_weights_equal_merge_and_unload_and_leave_the_trained_weights(tmp_path, stage):
    engine = lora_engine(lora_model(tmp_path), stage)
    before = gathered(engine)
    assert any(n.endswith("lora_B.default.weight") and p.abs().sum() > 0 for n, p in before.items())
    got = merged(engine, stage)
    assert gathered(engine).keys() == before.keys()
    assert all(torch.equal(p, before[n]) for n, p in gathered(engine).items())  # nothing merged in place
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        want = copy.deepcopy(engine.module).merge_and_unload().state_dict()
    _, base = base_folder(tmp_path)
    assert list(got) == [n for n, _ in base.named_parameters()]  # the base model's names and order
    for n, t in got.items():
        assert torch.equal(t, want[n]), n
    changed = merged(engine, stage, changed_only=True)
    assert changed and set(changed) < set(got) and all(n.endswith("proj.weight") for n in changed)
    frozen = merged(engine, stage, merge=False)  # the frozen base (vLLM's adapter mode)
    assert all(torch.equal(t, base.state_dict()[n]) for n, t in frozen.items())


EMBED_Q = LoraSettings(rank=4, alpha=8.0, target_modules=("embed_tokens", "q_proj"))


@pytest.mark.parametrize("stage", [0, 3])
def test_lora_embedding_adapter_is_merged_in_the_sync_and_the_export(tmp_path, tokenizer, stage):
    """An adapter on an untied input embedding (peft's ``lora.Embedding``: ``lora_embedding_A`` (r, vocab),
    ``lora_embedding_B`` (dim, r)) reaches the merged weights (every sync and the changed-only ones) and the HF
    export exactly as ``merge_and_unload`` writes it; under ZeRO-3 its factors are gathered with the bucket."""
    model = perturb_adapters(lora_model(tmp_path, settings=EMBED_Q, tie=False))
    kinds = {type(m).__name__ for m in model.modules() if hasattr(m, "lora_embedding_A")}
    assert {"Embedding", "Linear"} <= kinds
    engine = lora_engine(model, stage)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        want = copy.deepcopy(engine.module).merge_and_unload().state_dict()
    _, base = base_folder(tmp_path)
    emb = "model.embed_tokens.weight"
    assert (want[emb] - base.state_dict()[emb]).abs().max() > 0.1  # the adapter moves the embedding
    got = merged(engine, stage)
    assert list(got) == [n for n, _ in base.named_parameters()]
    assert [n for n, t in got.items() if not torch.equal(t, want[n])] == []
    changed = merged(engine, stage, changed_only=True)
    assert sorted(changed) == sorted([emb] + [n for n in got if n.endswith("q_proj.weight")])
    assert all(torch.equal(t, want[n]) for n, t in changed.items())
    out = export_hf(engine, str(tmp_path / "hf"), tokenizer, dtype="float32", zero_stage=stage)
    from tests.test_checkpoint_hf_export import safetensor_keys

    exported = safetensor_keys(out)
    assert exported.keys() == want.keys() and [n for n in want if not torch.equal(exported[n], want[n])] == []


def test_lora_embedding_adapter_and_conv1d_of_a_gpt2_merge_like_merge_and_unload():
    """GPT-2's ``wte`` (embedding) and ``c_attn`` (transformers' ``Conv1D``: peft's ``Linear`` with
    ``fan_in_fan_out``, its delta transposed) merge as ``merge_and_unload`` does."""
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                                  tie_word_embeddings=False)
    torch.manual_seed(0)
    model = perturb_adapters(apply_lora(transformers.GPT2LMHeadModel(cfg), LoraSettings(
        rank=2, alpha=4.0, target_modules=("wte", "c_attn"))))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    got = {n: t.clone() for bucket in iter_merged_params(model) for n, t in bucket}
    assert got and [n for n, t in got.items() if not torch.equal(t, want[n])] == []
    changed = {n for bucket in iter_merged_params(model, changed_only=True) for n, _ in bucket}
    assert changed == {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"}


class _Toy(torch.nn.Module):
    """Layers peft's LoRA adapts but ``iter_merged_params`` cannot merge (a grouped convolution, a multi-head
    attention), next to linear layers; ``side.mha`` is a linear layer that the name ``mha`` matches too, so that name
    passes the check that some adaptable module has it."""

    def __init__(self):
        super().__init__()
        self.config = transformers.PretrainedConfig(tie_word_embeddings=False)
        self.emb = torch.nn.Embedding(8, 8)
        self.conv = torch.nn.Conv1d(8, 8, 3, groups=2)
        self.mha = torch.nn.MultiheadAttention(8, 2)
        self.lin = torch.nn.Linear(8, 8)
        self.side = torch.nn.Module()
        self.side.mha = torch.nn.Linear(8, 8)

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return None


@pytest.mark.parametrize("target", ["conv", "mha"])
def test_lora_adapter_the_merge_cannot_carry_is_refused_not_skipped(target):
    from trainer.config_checks import ConfigError
    from trainer.lora_checks import check_module_names

    with pytest.raises(ConfigError) as exc:  # before start-up, one line naming the target and the module
        check_module_names(_Toy(), "actor_rollout_ref.model", ["lin", target], None)
    line = str(exc.value)
    assert "\n" not in line and f"'{target}' picks '{target}'" in line, line
    check_module_names(_Toy(), "actor_rollout_ref.model", ["lin", "emb", target], [target])  # excluded: fine
    toy = peft.get_peft_model(_Toy(), peft.LoraConfig(r=2, target_modules=["lin", target]))
    with pytest.raises(ValueError, match=f"LoRA adapter on '{target}': .*Leave this module out of target_modules"):
        next(iter_merged_params(toy))


def test_reference_mode_is_the_base_model_and_only_adapters_train(tmp_path):
    engine = lora_engine(lora_model(tmp_path), 2, steps=2)
    _, base = base_folder(tmp_path)
    x = ids()
    with torch.no_grad(), reference_mode(engine.module):
        ref = engine.module(input_ids=x).logits
    with torch.no_grad():
        assert torch.equal(ref, base(input_ids=x).logits)
        assert not torch.allclose(engine.module(input_ids=x).logits, ref)  # adapters back on after the context
    trained, total = trainable_numel(engine.module)
    assert 0 < trained < total // 4
    opt_numel = sum(p.numel() for g in engine.optimizer.optimizer.param_groups for p in g["params"])
    assert opt_numel == trained  # ZeRO-2 flat fp32 partitions: optimizer state for the adapters only
    for n, p in engine.module.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base.state_dict()[hf_name(n)]), n


@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_holds_the_adapters_only_and_resumes_exactly(tmp_path, tokenizer, stage):
    engine = lora_engine(lora_model(tmp_path), stage)
    role = os.path.join(step_dir(str(tmp_path), 1), "actor")
    DeepSpeedCheckpointManager(engine, tokenizer=tokenizer).save(role, step=1)
    cfg = json.load(open(os.path.join(role, LORA_SUBDIR, "adapter_config.json")))
    assert cfg["r"] == 4 and cfg["base_model_name_or_path"] == str(tmp_path / "base")
    import glob

    for f in glob.glob(os.path.join(role, "global_step_1", "*model_states.pt")):
        module = torch.load(f, weights_only=False)["module"] or {}
        assert [k for k in module if "lora_" not in k] == [], f  # no frozen base weight (nor its tied alias)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    fp32 = get_fp32_state_dict_from_zero_checkpoint(role)  # the master weights saved: the adapters only
    assert sorted(fp32) == sorted(n for n, p in engine.module.named_parameters() if p.requires_grad)
    train_steps(engine, 2)
    want = gathered(engine, trainable_only=True)
    other = lora_engine(lora_model(tmp_path, seed=123), stage, steps=0)  # other initial adapters
    DeepSpeedCheckpointManager(other, tokenizer=tokenizer).load(role)
    train_steps(other, 2)
    got = gathered(other, trainable_only=True)
    assert got.keys() == want.keys() and [n for n in got if not torch.equal(got[n], want[n])] == []


def test_checkpoint_refuses_a_run_with_another_lora_setting(tmp_path, tokenizer):
    from tests.test_checkpoint_hf_export import engine_for

    engine = lora_engine(lora_model(tmp_path), 2)
    role = os.path.join(step_dir(str(tmp_path), 1), "actor")
    DeepSpeedCheckpointManager(engine, tokenizer=tokenizer).save(role, step=1)
    full = engine_for(tiny(True), 2)
    with pytest.raises(ValueError, match="saved with LoRA adapters but this run trains all weights"):
        DeepSpeedCheckpointManager(full, tokenizer=tokenizer).load(role)


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


@pytest.mark.parametrize("stage", [0, 3])
def test_export_writes_the_merged_model_and_the_peft_folder(tmp_path, tokenizer, stage):
    engine = lora_engine(lora_model(tmp_path), stage, steps=2)
    live = merged(engine, stage)
    role = os.path.join(step_dir(str(tmp_path), 1), "actor")
    DeepSpeedCheckpointManager(engine, tokenizer=tokenizer).save(role, step=1)
    out = str(tmp_path / "hf")
    export_main(["merge", "--backend", "deepspeed", "--local_dir", role, "--target_dir", out, "--adapter"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in loaded.named_parameters())
    for n, p in loaded.named_parameters():
        assert torch.equal(p, live[n]), n  # the checkpoint's fp32 adapters merged = the live merge
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))
    with_adapter = peft.PeftModel.from_pretrained(base, os.path.join(out, "lora_adapter"))
    x = ids()
    torch.testing.assert_close(logits(loaded, x), logits(with_adapter, x), atol=1e-5, rtol=0)
    assert not torch.allclose(logits(loaded, x), logits(base_folder(tmp_path)[1], x))  # the adapter did something
    assert transformers.AutoTokenizer.from_pretrained(out).get_vocab() == tokenizer.get_vocab()
    # the in-process export (trainer.export_hf at the end of a run): the same merged weights, and the peft folder
    live_out = export_hf(engine, str(tmp_path / "live"), tokenizer, dtype="float32", zero_stage=stage)
    again = transformers.AutoModelForCausalLM.from_pretrained(live_out)
    assert all(torch.equal(p, live[n]) for n, p in again.named_parameters())
    assert os.path.isfile(os.path.join(live_out, LORA_SUBDIR, "adapter_model.safetensors"))


def test_export_of_a_lora_critic_and_its_errors(tmp_path, tokenizer):
    engine = lora_engine(lora_model(tmp_path, value_head=True), 2, steps=2)
    names = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert any(".score.modules_to_save." in n for n in names)  # the value head is trained in full
    role = os.path.join(step_dir(str(tmp_path), 1), "critic")
    DeepSpeedCheckpointManager(engine, tokenizer=tokenizer).save(role, step=1)
    out = export_checkpoint(role, str(tmp_path / "hf"))
    loaded = transformers.AutoModelForTokenClassification.from_pretrained(out)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, engine.module(input_ids=x).logits, atol=1e-5, rtol=0)
    os.rename(str(tmp_path / "base"), str(tmp_path / "moved"))
    with pytest.raises(FileNotFoundError, match="pass its folder with --base_model"):
        export_checkpoint(role, str(tmp_path / "x"))
    export_checkpoint(role, str(tmp_path / "y"), base_model=str(tmp_path / "moved"))
    from tests.test_checkpoint_hf_export import engine_for

    plain = os.path.join(step_dir(str(tmp_path), 2), "actor")
    DeepSpeedCheckpointManager(engine_for(tiny(True), 2), tokenizer=tokenizer).save(plain, step=2)
    with pytest.raises(ValueError, match="saved without LoRA adapters"):
        export_checkpoint(plain, str(tmp_path / "z"), adapter=True)


def test_adapter_state_dict_uses_peft_file_names(tmp_path):
    engine = lora_engine(lora_model(tmp_path), 2)
    sd = adapter_state_dict(engine.module, 2)
    assert sd and all(k.startswith("base_model.model.") and ".lora_" in k and ".default." not in k for k in sd)
    want = peft.get_peft_model_state_dict(engine.module)
    assert sd.keys() == want.keys() and all(torch.equal(sd[k], want[k]) for k in sd)


# ---- weight sync ---------------------------------------------------------------------------------------------
class RecordingEngine:
    """A rollout engine that records what ``LoraWeightSync`` sends it."""

    def __init__(self):
        self.loaded, self.adapters = [], []

    def load_lora_adapter(self, path):
        self.adapters.append((path, open(os.path.join(path, "adapter_config.json")).read()))


def test_merged_sync_sends_everything_first_then_only_the_changed_tensors(tmp_path):
    from trainer.workers.lora_sync import LoraWeightSync

    engine = lora_engine(lora_model(tmp_path), 2)
    sync = LoraWeightSync(engine.module, RecordingEngine(), zero_stage=2, mode="merged")
    first = [n for bucket in sync.named_params(4096) for n, _ in bucket]
    second = {n: t.clone() for bucket in sync.named_params(4096) for n, t in bucket}
    assert first == [n for n, _ in base_folder(tmp_path)[1].named_parameters()]
    assert set(second) < set(first) and all(torch.equal(t, merged(engine, 2)[n]) for n, t in second.items())
    level2 = LoraWeightSync(engine.module, RecordingEngine(), zero_stage=2, mode="merged", sleep_level=2)
    for _ in range(2):  # a level-2 sleep discards the engine's weights: every sync sends all of them
        assert [n for bucket in level2.named_params(4096) for n, _ in bucket] == first
    with pytest.raises(ValueError, match="no load_lora_adapter"):
        LoraWeightSync(engine.module, object(), zero_stage=2, mode="adapter")


def test_vllm_adapter_sync_sends_the_base_once_then_a_new_lora_request_each_step(tmp_path, monkeypatch):
    import rollout.memory as memory
    from rollout.base import SamplingConfig
    from rollout.context import rollout_mode
    from rollout.vllm_engine import VLLMRolloutEngine
    from tests.test_rollout_vllm_protocol import FakeLLM, FakeSamplingParams
    from trainer.workers.actor import vllm_kwargs
    from trainer.workers.lora_sync import LoraWeightSync

    class LoRARequest:
        def __init__(self, lora_name, lora_int_id, lora_path):
            self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

    class LoraLLM(FakeLLM):
        def __init__(self, log, state, **kw):
            super().__init__(log, state, **kw)
            self.llm_engine = self
            self.generated_with = []

        def add_lora(self, req):
            self.log.append(("add_lora", req.lora_int_id, sorted(os.listdir(req.lora_path))))

        def remove_lora(self, lora_id):
            self.log.append(("remove_lora", lora_id))

        def generate(self, prompts, sampling_params, use_tqdm=False, lora_request=None):
            self.generated_with.append(lora_request)
            return super().generate(prompts, sampling_params, use_tqdm)

    monkeypatch.setattr(memory, "empty_cache", lambda: None)
    engine = lora_engine(lora_model(tmp_path), 2)
    _, base = base_folder(tmp_path)
    state = {n: torch.zeros_like(p) for n, p in base.named_parameters()}
    log = []
    from trainer.config import ModelConfig, RolloutConfig
    from trainer.config.packaged import packaged_section

    kw = vllm_kwargs(packaged_section(RolloutConfig, "actor_rollout_ref.rollout", ["rollout=vllm"], lora_sync="adapter"),
                     packaged_section(ModelConfig, "actor_rollout_ref.model", lora_rank=4))
    assert (kw["enable_lora"], kw["max_loras"], kw["max_lora_rank"]) == (True, 1, 8)  # 4 rounded up to vLLM's 8
    vllm = VLLMRolloutEngine(str(tmp_path / "base"), eos_token_id=2, llm_cls=lambda **k: LoraLLM(log, state, **k),
                             sampling_params_cls=FakeSamplingParams, lora_request_cls=LoRARequest, **kw)
    assert vllm.llm.kw["enable_lora"] and vllm.llm.kw["max_lora_rank"] == 8
    sync = LoraWeightSync(engine.module, vllm, zero_stage=2, mode="adapter", base_model_path=str(tmp_path / "base"))
    sampling = SamplingConfig(n=1, temperature=1.0, max_new_tokens=4)
    folders = []
    for step in range(2):
        with rollout_mode(vllm, lambda: sync.named_params(4096), 4096):
            vllm.generate([[3, 4]], sampling)
        folders.append(sync.adapter_dir)
        if step == 0:  # the frozen base went in once, unmerged
            assert all(torch.equal(state[n], p) for n, p in base.named_parameters())
            loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), sync.adapter_dir)
            x = ids()
            with torch.no_grad():
                torch.testing.assert_close(loaded(input_ids=x).logits, engine.module(input_ids=x).logits,
                                           atol=1e-5, rtol=0)
        train_steps(engine, 1)
    first_adapter = next(i for i, e in enumerate(log) if e[0] == "add_lora")
    assert [e[0] for e in log[first_adapter:]].count("load_weights") == 0  # the base is not sent again
    assert any(e[0] == "load_weights" for e in log[:first_adapter])
    assert [e for e in log if e[0] in ("add_lora", "remove_lora")] == [
        ("add_lora", 1, ["adapter_config.json", "adapter_model.safetensors"]), ("remove_lora", 1),
        ("add_lora", 2, ["adapter_config.json", "adapter_model.safetensors"])]
    assert [r.lora_int_id for r in vllm.llm.generated_with] == [1, 2]
    assert not os.path.exists(folders[0]) and os.path.isdir(folders[1])  # the previous adapter folder is removed
    sync.close()
    assert not os.path.exists(folders[1])


def test_vllm_load_weights_renames_the_modules_vllm_wrapped_for_lora():
    """vLLM with ``enable_lora=True`` keeps each LoRA-capable module's weight under ``<module>.base_layer``: the HF
    names of wrapped modules (and of the parts of a packed one) get ``base_layer``, the others stay."""
    from rollout.vllm_engine import VLLMRolloutEngine, lora_base_layer_names
    from tests.test_rollout_vllm_protocol import FakeLLM, FakeSamplingParams

    class LoraWrappedModel:
        packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

        def __init__(self, params):
            self.params, self.loaded = params, []

        def named_parameters(self):
            return iter([(n, torch.zeros(1)) for n in self.params])

        def load_weights(self, weights):
            self.loaded.append([n for n, _ in weights])

    sent = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.input_layernorm.weight", "model.norm.weight"]
    wrapped = ["model.embed_tokens.base_layer.weight", "model.layers.0.self_attn.qkv_proj.base_layer.weight",
               "model.layers.0.input_layernorm.weight"]
    renamed = ["model.embed_tokens.base_layer.weight", "model.layers.0.self_attn.q_proj.base_layer.weight",
               "model.layers.0.self_attn.k_proj.base_layer.weight", "model.layers.0.self_attn.v_proj.base_layer.weight",
               "model.layers.0.input_layernorm.weight", "model.norm.weight"]
    for params, expected in [(wrapped, renamed),
                             ([n.replace(".base_layer", "") for n in wrapped], sent)]:  # LoRA off: unchanged
        engine = VLLMRolloutEngine("unused", eos_token_id=2, llm_cls=lambda **k: FakeLLM([], {}, **k),
                                   sampling_params_cls=FakeSamplingParams)
        model = engine.llm.worker.model_runner.model = LoraWrappedModel(params)
        engine.load_weights([(n, torch.zeros(1)) for n in sent])
        assert model.loaded == [expected]
    # the pure helper: without packed_modules_mapping only the module named before .base_layer is renamed
    named = lora_base_layer_names([(n, torch.zeros(1)) for n in sent], wrapped)
    assert [n for n, _ in named] == ["model.embed_tokens.base_layer.weight"] + sent[1:]
    assert [n for n, _ in lora_base_layer_names([(n, torch.zeros(1)) for n in renamed], wrapped,
                                                LoraWrappedModel.packed_modules_mapping)] == renamed  # idempotent
