"""DeepSpeedCheckpointManager on CPU (gloo, one process): P17 exact resume, P16 failed save, ZeRO-2/3 round trips.

DeepSpeed on CPU: ``DS_ACCELERATOR=cpu`` before import, a gloo group, ``torch.optim.AdamW`` passed as
``optimizer=`` (FusedAdam needs CUDA), fp32. ZeRO stages 0, 1, 2 and 3 all save and load on CPU.
"""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

deepspeed = pytest.importorskip("deepspeed")
transformers = pytest.importorskip("transformers")

from trainer.checkpoint.base import (commit_checkpoint, find_latest_checkpoint, list_checkpoints,  # noqa: E402
                                     read_tracker, save_trainer_state, step_dir)
from trainer.checkpoint.deepspeed_manager import DeepSpeedCheckpointManager  # noqa: E402

from tests.e2e_utils import one_process_group  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def dist_group():
    """One-process gloo group for DeepSpeed (reused if another test already made one)."""
    one_process_group()
    yield


def ds_config(stage):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": stage}, "bf16": {"enabled": False}, "fp16": {"enabled": False},
            "steps_per_print": 10**9}


def make_engine(model, stage, lr=1e-2, warmup=10, total=100):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = transformers.get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_config(stage))
    return engine


def linear_engine(stage, seed=0):
    torch.manual_seed(seed)
    return make_engine(torch.nn.Linear(4, 3), stage)


def train_step(engine):
    """One step on a batch drawn from the global torch RNG; returns the LR the step used."""
    lr = engine.optimizer.param_groups[0]["lr"]
    x = torch.randn(2, 4)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
    return lr


def adam_states(engine, key="exp_avg"):
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    # ZeRO-3 empties the base optimizer's param_groups outside step(); its state dict keeps insertion order
    return [st[key].clone() for st in base.state.values()]


def full_params(engine):
    """Full parameters on CPU (ZeRO-3: gathered)."""
    params = list(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        return {n: p.detach().clone() for n, p in params}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_p17_scheduler_optimizer_rng_resume(tmp_path, stage):
    # uninterrupted run: 5 steps, probe the RNG, 3 more steps
    ref = linear_engine(stage)
    torch.manual_seed(100)
    ref_lrs = [train_step(ref) for _ in range(5)]
    ref_probe = torch.rand(3)
    ref_lrs += [train_step(ref) for _ in range(3)]
    # hand-computed: warmup lr_lambda(k) = k/10 for k < 10 -> lr = 1e-2 * k / 10
    assert ref_lrs == pytest.approx([0.0, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3], abs=1e-12)

    # interrupted run: 5 steps, save
    run = linear_engine(stage)
    torch.manual_seed(100)
    [train_step(run) for _ in range(5)]
    path = os.path.join(step_dir(str(tmp_path), 5), "actor")
    DeepSpeedCheckpointManager(run, rank=0, world_size=1).save(path)
    saved_exp_avg, saved_exp_avg_sq = adam_states(run), adam_states(run, "exp_avg_sq")
    saved_probe = torch.rand(3)

    # fresh process state + fresh engine with default settings, then load
    torch.manual_seed(12345)
    new = linear_engine(stage, seed=7)
    meta = DeepSpeedCheckpointManager(new).load(path)
    assert meta == {"global_step": 5, "world_size": 1, "zero_stage": stage, "lora": False, "optimizer": "AdamW",
                    "precision": "fp32"}
    assert new.lr_scheduler.last_epoch == 5
    assert new.lr_scheduler.get_last_lr() == pytest.approx([5e-3], abs=1e-12)
    for a, b in zip(adam_states(new), saved_exp_avg, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(adam_states(new, "exp_avg_sq"), saved_exp_avg_sq, strict=True):
        assert torch.equal(a, b)
    assert len(saved_exp_avg) > 0
    probe = torch.rand(3)
    assert torch.equal(probe, saved_probe) and torch.equal(probe, ref_probe)
    lrs = [train_step(new) for _ in range(3)]
    assert lrs == ref_lrs[5:]
    final, ref_final = full_params(new), full_params(ref)
    for n in ref_final:
        assert torch.equal(final[n], ref_final[n]), n


def test_p16_failed_deepspeed_save_keeps_previous(tmp_path, monkeypatch):
    root = str(tmp_path)
    eng = linear_engine(2)
    train_step(eng)
    mgr = DeepSpeedCheckpointManager(eng, rank=0, world_size=1)
    mgr.save(1, os.path.join(step_dir(root, 1), "actor"))  # save(step, path) order is accepted too
    save_trainer_state(step_dir(root, 1), {"pos": 1}, 1, {})
    commit_checkpoint(root, 1, max_keep=1)
    w1 = full_params(eng)

    train_step(eng)
    real_save = torch.save

    def flaky_save(obj, f, *a, **k):
        if "optim_states" in str(f):  # DeepSpeed writes model states first, then optimizer partitions
            raise OSError("disk full")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", flaky_save)
    with pytest.raises(OSError, match="disk full"):
        mgr.save(os.path.join(step_dir(root, 2), "actor"))
    monkeypatch.undo()
    assert read_tracker(root) == 1
    assert find_latest_checkpoint(root) == step_dir(root, 1)
    assert not os.path.exists(os.path.join(step_dir(root, 2), "actor"))
    # step 1 still loads, with the step-1 weights
    fresh = linear_engine(2, seed=3)
    DeepSpeedCheckpointManager(fresh).load(os.path.join(step_dir(root, 1), "actor"))
    for n, p in full_params(fresh).items():
        assert torch.equal(p, w1[n]), n
    # a successful save of step 2 leaves only step 2 (no leftover .tmp)
    mgr.save(os.path.join(step_dir(root, 2), "actor"))
    save_trainer_state(step_dir(root, 2), {"pos": 2}, 2, {})
    commit_checkpoint(root, 2, max_keep=1)
    assert [s for s, _ in list_checkpoints(root)] == [2]
    assert sorted(os.listdir(step_dir(root, 2))) == ["actor", "data.pt"]


def test_overwrite_same_step_and_world_size_mismatch(tmp_path):
    eng = linear_engine(1)
    train_step(eng)
    path = os.path.join(step_dir(str(tmp_path), 1), "actor")
    mgr = DeepSpeedCheckpointManager(eng)
    mgr.save(path)
    train_step(eng)
    mgr.save(path)  # same step again: replaced, not merged
    w = full_params(eng)
    assert {"global_step_1", "latest", "rng_rank_0.pt"} <= set(os.listdir(path))
    assert not os.path.exists(path + ".tmp") and not os.path.exists(path + ".old")
    fresh = linear_engine(1, seed=5)
    DeepSpeedCheckpointManager(fresh).load(path)
    for n, p in full_params(fresh).items():
        assert torch.equal(p, w[n]), n
    with pytest.raises(ValueError, match="world_size=1 but this run has world_size=2"):
        DeepSpeedCheckpointManager(linear_engine(1), rank=0, world_size=2).load(path)
    with pytest.raises(ValueError, match="ZeRO stage 1 but the engine uses stage 2"):
        DeepSpeedCheckpointManager(linear_engine(2)).load(path)
    with pytest.raises(FileNotFoundError, match="global_step_9"):
        DeepSpeedCheckpointManager(fresh).load(os.path.join(step_dir(str(tmp_path), 9), "actor"))


def tiny_llama(seed, tie=False):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(cfg)


def llama_step(engine, ids):
    out = engine(input_ids=ids, labels=ids)
    engine.backward(out.loss)
    engine.step()
    return out.loss.detach()


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_roundtrip_tiny_llama_bit_exact(tmp_path, stage):
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 96, (2, 12), generator=g) for _ in range(3)]
    eng = make_engine(tiny_llama(0), stage, lr=1e-3, warmup=1)
    for b in batches[:2]:
        llama_step(eng, b)
    path = os.path.join(step_dir(str(tmp_path), 2), "actor")
    DeepSpeedCheckpointManager(eng).save(path)
    saved = full_params(eng)
    saved_opt = adam_states(eng, "exp_avg_sq")

    new = make_engine(tiny_llama(1), stage, lr=1e-3, warmup=1)
    DeepSpeedCheckpointManager(new).load(path)
    loaded = full_params(new)
    assert loaded.keys() == saved.keys()
    for n in saved:
        assert torch.equal(loaded[n], saved[n]), n
    for a, b in zip(adam_states(new, "exp_avg_sq"), saved_opt, strict=True):
        assert torch.equal(a, b)
    assert os.path.isfile(os.path.join(path, "huggingface", "config.json"))
    # the next step is identical too (bit-exact resume on CPU)
    assert torch.equal(llama_step(new, batches[2]), llama_step(eng, batches[2]))
    after_new, after_ref = full_params(new), full_params(eng)
    for n in after_ref:
        assert torch.equal(after_new[n], after_ref[n]), n


@pytest.mark.parametrize("new_total, constant, want", [(8, False, 5e-3), (4, True, 1e-2), (4, False, 0.0)])
def test_lr1_lr2_a_changed_schedule_rules_the_first_resumed_step(tmp_path, new_total, constant, want):
    """A 4-step cosine run saved at step 4 (its next rate: 0), resumed with 8 steps (the new cosine's rate at step 4
    of 8: half of 1e-2) or a constant schedule: the first resumed step trains at the new schedule's rate."""
    run = make_engine(torch.nn.Linear(4, 3), 2, warmup=0, total=4)
    [train_step(run) for _ in range(4)]
    path = os.path.join(step_dir(str(tmp_path), 4), "actor")
    DeepSpeedCheckpointManager(run, rank=0, world_size=1).save(path)
    model = torch.nn.Linear(4, 3)
    if constant:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        new, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(2),
                                            lr_scheduler=transformers.get_constant_schedule(opt))
    else:
        new = make_engine(model, 2, warmup=0, total=new_total)
    DeepSpeedCheckpointManager(new).load(path)
    assert new.lr_scheduler.last_epoch == 4
    assert train_step(new) == pytest.approx(want, abs=1e-12)
