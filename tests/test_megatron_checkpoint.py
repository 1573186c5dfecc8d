"""MegatronCheckpointManager on CPU: a real megatron-core GPTModel (tp=pp=1, gloo world 1) with a torch AdamW
and LR scheduler standing in for Megatron's distributed optimizer (GPU-only). Skipped without megatron-core."""
import os

import pytest
import torch

from trainer.megatron.model import megatron_available

_OK, _WHY = megatron_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)


def _setup(seed=0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from trainer.megatron.model import build_gpt_model, load_hf_weights

    cfg = Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    model, _, shape = build_gpt_model(cfg)
    load_hf_weights(model, hf.state_dict(), shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return cfg, hf, model, shape, opt, sched


def _step(model, opt, sched, seed):
    from trainer.megatron.model import response_log_probs

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 61, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    lp, _ = response_log_probs(model, ids, mask, 3, 61)
    (-lp.mean()).backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    return lp.detach()


_FILES = {"torch_dist": ["dist_ckpt/metadata.json", "dist_ckpt/common.pt"],
          "torch": ["model/mp_rank_00_000/model.pt", "optim/optim_tp0_pp0_dp0.pt"]}


@pytest.mark.parametrize("fmt", ["torch_dist", "torch"])
def test_save_load_resumes_bit_exact(tmp_path, fmt):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import single_process_group

    with single_process_group():
        cfg, hf, model, shape, opt, sched = _setup()
        mgr = MegatronCheckpointManager(model, opt, sched, hf_config=cfg, ckpt_format=fmt)
        _step(model, opt, sched, 1)
        path = str(tmp_path / "global_step_1" / "actor")
        mgr.save(path)
        tracker_saved = {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()}
        noise_a = torch.rand(3)
        lp_a = _step(model, opt, sched, 2)
        w_a = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        lr_a = opt.param_groups[0]["lr"]
        # perturb everything, then resume
        get_cuda_rng_tracker().set_states({k: torch.Generator().manual_seed(7).get_state() for k in tracker_saved})
        _step(model, opt, sched, 99)
        meta = mgr.load(path)
        assert meta == {"global_step": 1, "tp_size": 1, "pp_size": 1, "dp_size": 1, "ckpt_format": fmt}
        assert all(torch.equal(get_cuda_rng_tracker().get_states()[k], v) for k, v in tracker_saved.items())
        assert torch.equal(torch.rand(3), noise_a)
        lp_b = _step(model, opt, sched, 2)
        assert torch.equal(lp_a, lp_b)
        assert opt.param_groups[0]["lr"] == lr_a == pytest.approx(1e-2 / 3)
        for k, v in model.state_dict().items():
            if not k.endswith("_extra_state"):
                assert torch.equal(v, w_a[k]), k
    names = sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)
    assert all(f in names for f in _FILES[fmt]) and not any(f in names for fs in _FILES.values() if fs != _FILES[fmt]
                                                               for f in fs)
    assert "extra/extra_tp0_pp0_dp0.pt" in names and "meta.pt" in names and "huggingface/config.json" in names
    assert not os.path.exists(path + ".tmp")


def test_wrong_parallel_sizes_and_missing_files(tmp_path):
    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import single_process_group

    with single_process_group():
        _, _, model, _, opt, sched = _setup()
        path = str(tmp_path / "global_step_3" / "actor")
        MegatronCheckpointManager(model, opt, sched, ckpt_format="torch").save(path)
        other = MegatronCheckpointManager(model, opt, sched,
                                          ranks=dict(tp=0, pp=0, dp=0, tp_size=2, pp_size=1, dp_size=1, rank=0))
        with pytest.raises(ValueError, match="tp_size': 1"):
            other.load(path)
        os.remove(os.path.join(path, "extra", "extra_tp0_pp0_dp0.pt"))
        with pytest.raises(FileNotFoundError, match="extra_tp0_pp0_dp0.pt"):
            MegatronCheckpointManager(model, opt, sched).load(path)
        with pytest.raises(FileNotFoundError, match="meta.pt"):
            MegatronCheckpointManager(model).load(str(tmp_path / "nothing"))


def test_export_hf_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import single_process_group
    from trainer.megatron.sync import iter_hf_buckets

    with single_process_group():
        cfg, hf, model, shape, opt, sched = _setup()
        _step(model, opt, sched, 5)    # weights differ from hf now
        MegatronCheckpointManager(model, hf_config=cfg).export_hf(str(tmp_path / "hf"), shape)
        buckets = list(iter_hf_buckets(model, shape, bucket_bytes=8 * 1024))
        live = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    sd = loaded.state_dict()
    # k of query group g sits at rows [16, 24) of the group's 32 rows (2 q heads x 8, then k 8, v 8)
    qkv_b = live["decoder.layers.1.self_attention.linear_qkv.bias"].view(2, 32)
    assert torch.equal(sd["model.layers.1.self_attn.k_proj.bias"], qkv_b[:, 16:24].reshape(-1))
    flat = dict(p for b in buckets for p in b)
    assert len(buckets) > 1 and set(flat) == set(hf.state_dict())
    assert all(torch.equal(sd[k], flat[k]) for k in flat)
    assert not torch.equal(sd["model.norm.weight"], hf.state_dict()["model.norm.weight"])


def test_step_state_is_hidden_only_while_megatron_loads_parameter_state():
    """megatron-core 0.19.2 + torch Adam: load_parameter_state raised KeyError 'step' on 2 x H200."""
    from types import SimpleNamespace

    from trainer.megatron.checkpoint import _step_state_set_aside

    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    step = torch.tensor(7.0)
    inner = SimpleNamespace(state={p: {"step": step, "exp_avg": torch.ones(2)}, q: {"exp_avg": torch.ones(3)}})
    chained = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=inner)])
    with _step_state_set_aside(chained):
        assert "step" not in inner.state[p] and "exp_avg" in inner.state[p]
    assert inner.state[p]["step"] is step and "step" not in inner.state[q]
    with pytest.raises(RuntimeError), _step_state_set_aside(SimpleNamespace(optimizer=inner)):
        assert "step" not in inner.state[p]
        raise RuntimeError("load failed")
    assert inner.state[p]["step"] is step          # restored even when the load raises


def test_shared_adam_step_tensor_is_unshared_after_load():
    """Megatron's DistributedOptimizer.load_state_dict (no TE/apex) gives every parameter state ONE step tensor;
    torch Adam then advances it once per parameter per step (measured: 4 params, one step -> step 1 + 4 = 5), so
    the bias corrections after a resume were wrong. After unshare_step_tensors each state advances by one."""
    from types import SimpleNamespace

    from trainer.megatron.checkpoint import unshare_step_tensors

    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(4)]
    opt = torch.optim.Adam(ps, lr=0.1)
    for p in ps:
        p.grad = torch.ones(3)
    opt.step()
    sd = opt.state_dict()
    shared = torch.tensor(1.0)
    for s in sd["state"].values():
        s["step"] = shared                         # what megatron-core 0.19.2's load_state_dict builds
    opt.load_state_dict(sd)
    assert len({id(opt.state[p]["step"]) for p in ps}) == 1
    chained = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=opt)])
    assert unshare_step_tensors(chained) == 3
    assert len({id(opt.state[p]["step"]) for p in ps}) == 4 and unshare_step_tensors(opt) == 0
    opt.step()
    assert [float(opt.state[p]["step"]) for p in ps] == [2.0] * 4


def test_torch_format_checkpoint_still_exports_offline(tmp_path):
    """Checkpoints written with ckpt_format=torch (and older ones, whose meta.pt has no ckpt_format) still export."""
    from transformers import AutoModelForCausalLM

    from tools.export_hf import export_checkpoint
    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import single_process_group
    from trainer.megatron.sync import iter_hf_weights

    path = str(tmp_path / "global_step_1" / "actor")
    with single_process_group():
        cfg, _, model, shape, opt, sched = _setup()
        _step(model, opt, sched, 1)
        MegatronCheckpointManager(model, opt, sched, hf_config=cfg, ckpt_format="torch").save(path)
        live = dict(iter_hf_weights(model, shape))
    meta = torch.load(os.path.join(path, "meta.pt"), weights_only=True)
    del meta["ckpt_format"]                       # as written before dist checkpointing existed
    torch.save(meta, os.path.join(path, "meta.pt"))
    sd = AutoModelForCausalLM.from_pretrained(export_checkpoint(path, str(tmp_path / "hf"), dtype="float32")).state_dict()
    assert set(sd) == set(live) and all(torch.equal(sd[k], live[k]) for k in live)
