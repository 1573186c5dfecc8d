"""Offline export (tools/export_hf.py) of every role that saves, as the workers save it (case P29).

A critic (value head on a tied or untied backbone) saved by the critic worker at ZeRO 0/2/3 exports offline,
reloads as ``AutoModelForTokenClassification`` and equals the worker's online export; the saved and exported
``config.json`` name the class that was trained; a bf16 export has bf16 tensors and ``dtype: bfloat16``; the PRM (a
causal LM on a tied backbone) exports with ``lm_head`` equal to ``embed_tokens``. One process, gloo, world size 1.
"""
import json
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("deepspeed")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

from tools.export_hf import export_checkpoint  # noqa: E402


def _backbone(root, tie, seed=0):
    from trainer import embedded

    tok = embedded.build_tokenizer()
    torch.manual_seed(seed)
    conf = embedded.tiny_model_config(len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=tie)
    path = os.path.join(root, f"backbone_{'tied' if tie else 'untied'}_{seed}")
    transformers.AutoModelForCausalLM.from_config(conf).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _config(path, stage, ref_path=None):
    """The critic's worker config (``ref_path`` given: the PRM's) of the packaged config with this model."""
    from trainer.config.packaged import packaged_config
    from trainer.config.prm import prm_worker_config
    from trainer.config.workers import critic_worker_config

    common = [f"actor_rollout_ref.model.path={path}", "trainer.cpus_per_worker=1", "trainer.total_training_steps=2",
              f"deepspeed.zero_stage={stage}", "deepspeed.bf16=false", "data.train_batch_size=2",
              "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    if ref_path is None:
        return critic_worker_config(packaged_config([*common, "algorithm=gae", "critic.optim.lr=1e-3"], 1))
    return prm_worker_config(packaged_config([*common, "algorithm=prime", f"reward_model.model.ref_path={ref_path}",
                                              "reward_model.model.beta_train=0.5", "reward_model.model.optim.lr=1e-3",
                                              "reward_model.mini_batch_size=2"], 1))


def _tensors(folder):
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _config_json(folder):
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _ids(vocab):
    return torch.randint(1, vocab, (2, 7), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("stage", [0, 2, 3])
@pytest.mark.parametrize("tie", [True, False])
def test_p29_critic_checkpoint_exports_offline_like_online(tmp_path, stage, tie):
    from trainer.workers.critic import CriticWorker

    path = _backbone(str(tmp_path), tie)
    w = CriticWorker(_config(path, stage), 0, 1, device="cpu", role="critic")
    w.init_model()
    role_dir = str(tmp_path / "global_step_1" / "critic")
    w.save_checkpoint(role_dir)
    saved = _config_json(os.path.join(role_dir, "huggingface"))
    assert saved["architectures"] == ["LlamaForTokenClassification"]
    assert transformers.AutoConfig.from_pretrained(os.path.join(role_dir, "huggingface")).num_labels == 1
    online = str(tmp_path / "online")
    w.export_hf(online)
    offline = export_checkpoint(role_dir, str(tmp_path / "offline"))
    a, b = _tensors(online), _tensors(offline)
    assert set(a) == set(b) and any(k.startswith("score.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    vocab = saved["vocab_size"]
    logits = []
    for folder in (online, offline):
        assert _config_json(folder)["architectures"] == ["LlamaForTokenClassification"]
        model = transformers.AutoModelForTokenClassification.from_pretrained(folder).eval()
        with torch.no_grad():
            logits.append(model(_ids(vocab)).logits)
    assert logits[0].shape == (2, 7, 1) and torch.equal(logits[0], logits[1])
    bf16 = export_checkpoint(role_dir, str(tmp_path / "bf16"), dtype="bfloat16")
    assert {t.dtype for t in _tensors(bf16).values()} == {torch.bfloat16}
    assert _config_json(bf16)["dtype"] == "bfloat16"
    assert transformers.AutoModelForTokenClassification.from_pretrained(bf16).dtype == torch.bfloat16


@pytest.mark.parametrize("stage", [2, 3])
def test_p29_prm_tied_causal_lm_exports_with_lm_head_equal_to_embeddings(tmp_path, stage):
    from trainer.workers.prm import PRMWorker

    path, ref = _backbone(str(tmp_path), True), _backbone(str(tmp_path), True, seed=1)
    w = PRMWorker(_config(path, stage, ref_path=ref), 0, 1, device="cpu", role="prm")
    w.init_model()
    role_dir = str(tmp_path / "global_step_1" / "reward")
    w.save_checkpoint(role_dir)
    assert _config_json(os.path.join(role_dir, "huggingface"))["architectures"] == ["LlamaForCausalLM"]
    online = str(tmp_path / "online")
    w.export_hf(online)
    for dtype, name in ((None, "float32"), ("bfloat16", "bfloat16")):
        out = export_checkpoint(role_dir, str(tmp_path / f"offline_{name}"), dtype=dtype)
        assert _config_json(out)["dtype"] == name
        assert {t.dtype for t in _tensors(out).values()} == {getattr(torch, name)}
        model = transformers.AutoModelForCausalLM.from_pretrained(out)
        assert model.dtype == getattr(torch, name)
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    reference = transformers.AutoModelForCausalLM.from_pretrained(online)
    offline = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "offline_float32"))
    for (n, p), (m, q) in zip(reference.named_parameters(), offline.named_parameters()):
        assert n == m and torch.equal(p, q), n


def test_p29_critic_saved_with_the_actors_architectures_still_exports(tmp_path):
    """A critic checkpoint whose ``huggingface/config.json`` names the causal LM (as written before the saved
    config followed the trained class): the exporter takes the head from the weights."""
    from trainer.workers.critic import CriticWorker

    path = _backbone(str(tmp_path), False)
    w = CriticWorker(_config(path, 2), 0, 1, device="cpu", role="critic")
    w.init_model()
    role_dir = str(tmp_path / "global_step_1" / "critic")
    w.save_checkpoint(role_dir)
    cfg_file = os.path.join(role_dir, "huggingface", "config.json")
    cfg = _config_json(os.path.join(role_dir, "huggingface"))
    cfg["architectures"] = ["LlamaForCausalLM"]
    with open(cfg_file, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    out = export_checkpoint(role_dir, str(tmp_path / "offline"))
    assert _config_json(out)["architectures"] == ["LlamaForTokenClassification"]
    model = transformers.AutoModelForTokenClassification.from_pretrained(out)
    assert model.config.num_labels == 1


def test_the_critics_new_value_head_is_drawn_from_the_runs_seed(tmp_path):
    """Two critics of one config start with the same value head whatever the process's RNG did before (two runs
    with one ``trainer.seed`` are repeatable), and another seed draws another head."""
    import dataclasses

    from trainer.workers.critic import CriticWorker

    path = _backbone(str(tmp_path), True)
    heads = []
    for noise, seed in ((1, 7), (2, 7), (3, 8)):
        torch.manual_seed(noise)
        cfg = _config(path, 0)
        w = CriticWorker(dataclasses.replace(cfg, seed=seed), 0, 1, device="cpu", role="critic")
        w.init_model()
        heads.append({k: v.detach().clone() for k, v in w.critic.engine.module.state_dict().items()
                      if k.startswith("score.")})
    assert heads[0] and all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    assert any(not torch.equal(heads[0][k], heads[2][k]) for k in heads[0])


def test_the_critics_value_head_has_no_dropout_unless_asked(tmp_path):
    """transformers' ``*ForTokenClassification`` puts dropout 0.1 before the head when the config names none: the
    critic's update then saw noisy values and two runs of one seed differed (verl's critic sets
    ``classifier_dropout=0``). ``critic.model.override_config.classifier_dropout`` still sets it."""
    import dataclasses

    from trainer.workers.critic import CriticWorker

    path = _backbone(str(tmp_path), True)
    w = CriticWorker(_config(path, 0), 0, 1, device="cpu", role="critic")
    w.init_model()
    module = w.critic.engine.module
    assert module.dropout.p == 0.0 and module.config.classifier_dropout == 0.0
    module.train()
    x = _ids(module.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(module(input_ids=x).logits, module(input_ids=x).logits, atol=0, rtol=0)
    cfg = _config(path, 0)
    asked = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, override_config={"classifier_dropout": 0.3}))
    w = CriticWorker(asked, 0, 1, device="cpu", role="critic")
    w.init_model()
    assert w.critic.engine.module.dropout.p == 0.3
