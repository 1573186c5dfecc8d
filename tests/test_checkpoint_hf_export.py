"""HF export: export_hf from a module / ZeRO-3 engine, and tools/export_hf.py from a saved step (CPU)."""

import json
import os
import subprocess
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

deepspeed = pytest.importorskip("deepspeed")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

from trainer.checkpoint.base import step_dir  # noqa: E402
from trainer.checkpoint.deepspeed_manager import DeepSpeedCheckpointManager  # noqa: E402
from trainer.checkpoint.hf_export import export_hf  # noqa: E402
from trainer.embedded import CHAT_TEMPLATE, build_tokenizer, tiny_model_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.e2e_utils import one_process_group  # noqa: E402
from tools.export_hf import export_checkpoint, main as export_main  # noqa: E402

VOCAB = 23


@pytest.fixture(scope="module", autouse=True)
def dist_group():
    one_process_group()
    yield


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tiny(tie, seed=0, cls=transformers.LlamaForCausalLM, **extra):
    torch.manual_seed(seed)
    model = cls(tiny_model_config(VOCAB, hidden_size=32, intermediate_size=64, tie_word_embeddings=tie, **extra))
    return model.eval()


def ids():
    return torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))


def safetensor_keys(folder):
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def engine_for(model, stage):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}, "bf16": {"enabled": False},
           "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    x = ids()
    out = engine(input_ids=x, labels=x)
    engine.backward(out.loss)
    engine.step()
    return engine


@pytest.mark.parametrize("tie", [True, False])
def test_export_module_loads_with_same_logits(tmp_path, tokenizer, tie):
    model = tiny(tie)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # make sure the exported head is the trained one (tied: embed too)
        ref = model(ids()).logits
    out = export_hf(model, str(tmp_path / "hf"), tokenizer, dtype=torch.float32, zero_stage=0)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        got = loaded(ids()).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert loaded.config.tie_word_embeddings is tie
    same = loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert same is tie
    keys = safetensor_keys(out)
    assert ("lm_head.weight" in keys) is (not tie)  # tied weight written once
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["dtype"] == "float32"
    assert os.path.isfile(os.path.join(out, "generation_config.json"))
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok("last of 3 7 ?")["input_ids"] == tokenizer("last of 3 7 ?")["input_ids"]


def test_export_bf16_records_dtype(tmp_path, tokenizer):
    model = tiny(True)
    out = export_hf(model, str(tmp_path / "hf"), tokenizer, dtype="bf16", zero_stage=0)
    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "bfloat16"
    assert {t.dtype for t in safetensor_keys(out).values()} == {torch.bfloat16}
    assert model.model.embed_tokens.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="int8"):
        export_hf(model, str(tmp_path / "bad"), tokenizer, dtype="int8")
    with pytest.raises(ValueError, match="zero_stage=4"):
        export_hf(model, str(tmp_path / "bad"), tokenizer, dtype="fp32", zero_stage=4)


@pytest.mark.parametrize("tie", [True, False])
def test_export_zero3_engine(tmp_path, tokenizer, tie):
    engine = engine_for(tiny(tie), 3)
    engine.module.eval()
    with torch.no_grad():
        ref = engine.module(ids()).logits
    out = export_hf(engine, str(tmp_path / "hf"), tokenizer, dtype=torch.float32, zero_stage=3)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        got = loaded(ids()).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert ("lm_head.weight" in safetensor_keys(out)) is (not tie)


def test_export_value_head(tmp_path, tokenizer):
    critic = tiny(False, cls=transformers.LlamaForTokenClassification, num_labels=1)
    with torch.no_grad():
        ref = critic(ids()).logits
    out = export_hf(critic, str(tmp_path / "critic"), tokenizer, dtype="float32", value_head=True)
    loaded = transformers.AutoModelForTokenClassification.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids()).logits, ref, atol=1e-5, rtol=0)
    assert ref.shape == (2, 9, 1)
    two = tiny(False, cls=transformers.LlamaForTokenClassification, num_labels=2)
    with pytest.raises(ValueError, match="one-output head"):
        export_hf(two, str(tmp_path / "bad"), tokenizer, dtype="float32", value_head=True)


@pytest.mark.parametrize("stage,tie", [(0, True), (2, False), (3, True)])
def test_tools_export_hf_from_saved_step(tmp_path, tokenizer, stage, tie):
    engine = engine_for(tiny(tie), stage)
    params = list(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        trained = {n: p.detach().clone() for n, p in params}
    role_dir = os.path.join(step_dir(str(tmp_path), 1), "actor")
    DeepSpeedCheckpointManager(engine, tokenizer=tokenizer).save(role_dir)
    assert json.load(open(os.path.join(role_dir, "huggingface", "config.json")))["dtype"] == "float32"
    out = export_checkpoint(role_dir, str(tmp_path / "hf"))
    keys = safetensor_keys(out)
    for n, p in trained.items():
        assert torch.equal(keys[n], p), n
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    for n, p in loaded.named_parameters():
        assert torch.equal(p, trained[n]), n
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template == CHAT_TEMPLATE
    if stage == 2:  # CLI entry point with a dtype override
        export_main(["--local_dir", role_dir, "--target_dir", str(tmp_path / "hf16"), "--dtype", "bfloat16"])
        assert {t.dtype for t in safetensor_keys(str(tmp_path / "hf16")).values()} == {torch.bfloat16}
        # an export into a folder that holds files is refused unless --overwrite: the files stay as they were
        before = {f: os.path.getmtime(os.path.join(out, f)) for f in os.listdir(out)}
        with pytest.raises(ValueError, match=r"--target_dir .* already holds files .* --overwrite"):
            export_checkpoint(role_dir, out)
        assert {f: os.path.getmtime(os.path.join(out, f)) for f in os.listdir(out)} == before
        export_main(["--local_dir", role_dir, "--target_dir", out, "--dtype", "bfloat16", "--overwrite"])
        assert {t.dtype for t in safetensor_keys(out).values()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="is the checkpoint root"):
        export_checkpoint(str(tmp_path), str(tmp_path / "x"))
    tag = os.listdir(role_dir)  # a --tag that is not there is named as such, not as an incomplete checkpoint
    tag = next(n for n in tag if n.startswith("global_step"))
    with pytest.raises(ValueError, match=rf"^--tag 'global_step_9': no such tag in .* \(tags there: {tag}; "):
        export_checkpoint(role_dir, str(tmp_path / "x"), tag="global_step_9")
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="without HF metadata"):
        export_checkpoint(str(tmp_path / "empty"), str(tmp_path / "x"))
    os.remove(os.path.join(role_dir, "latest"))
    with pytest.raises(FileNotFoundError, match="latest"):
        export_checkpoint(role_dir, str(tmp_path / "x"))


def test_tools_export_hf_script_help():
    r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "export_hf.py"), "--help"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0, r.stderr
    assert "--local_dir" in r.stdout
