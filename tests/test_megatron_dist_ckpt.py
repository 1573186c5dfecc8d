"""Megatron dist checkpoints (``ckpt_format=torch_dist``) on CPU: resharding on load, offline HF export, bad input.

Two gloo processes run a real megatron-core GPTModel (tiny Qwen2, fp32, torch AdamW + LR scheduler):
A) at TP=2: one update, save ``ck_tp2``, the logits of the live model, a second update (the continuous run);
B) the same processes re-initialised at TP=1 x PP=2: a randomly initialised model loads ``ck_tp2`` (TP=2 -> PP=2)
   and saves ``ck_pp2``.
The test process (TP=1, PP=1) loads each checkpoint and runs the second update: its log-probs and weights equal
the continuous TP=2 run's, which needs the weights AND Adam's moments and step count resharded correctly.
``tools/export_hf.py`` turns both checkpoints into HF folders whose logits equal the live model's.
"""
import json
import os

import pytest
import torch

from trainer.megatron.model import megatron_available

_OK, _WHY = megatron_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)

_IDS = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(11))


def _init(rank, world, port, tp, pp):
    from megatron.core import parallel_state as ps

    from trainer.megatron.engine import install_cpu_tp_compat
    from trainer.megatron.model import init_megatron_parallel

    if not torch.distributed.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_megatron_parallel(tp, pp)
    install_cpu_tp_compat()


def _worker(rank, port, root):
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.test_megatron_checkpoint import _setup, _step
    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import forward_logits
    from trainer.megatron.sync import iter_hf_weights

    _init(rank, 2, port, tp=2, pp=1)
    cfg, _, model, shape, opt, sched = _setup()
    _step(model, opt, sched, 1)
    MegatronCheckpointManager(model, opt, sched, hf_config=cfg).save(os.path.join(root, "ck_tp2", "global_step_1", "actor"))
    with torch.no_grad():
        live = forward_logits(model, _IDS, torch.ones_like(_IDS), 61)
    lp2 = _step(model, opt, sched, 2)
    after = {k: v.clone() for k, v in iter_hf_weights(model, shape)}
    if rank == 0:
        torch.save({"live_logits": live, "lp2": lp2, "after": after, "lr": opt.param_groups[0]["lr"]},
                   os.path.join(root, "continuous.pt"))
    _init(rank, 2, port, tp=1, pp=2)
    cfg, _, model, shape, opt, sched = _setup(seed=5)
    mgr = MegatronCheckpointManager(model, opt, sched, hf_config=cfg)
    mgr.load(os.path.join(root, "ck_tp2", "global_step_1", "actor"))
    mgr.save(os.path.join(root, "ck_pp2", "global_step_1", "actor"))
    torch.distributed.barrier()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import torch.multiprocessing as mp

    from trainer.workers.base import free_port

    root = str(tmp_path_factory.mktemp("dist_ckpt"))
    mp.start_processes(_worker, args=(free_port(), root), nprocs=2, join=True, start_method="spawn")
    return root, torch.load(os.path.join(root, "continuous.pt"), weights_only=False)


@pytest.mark.parametrize("ck", ["ck_tp2", "ck_pp2"])
def test_resharded_resume_at_tp1_equals_the_continuous_run(saved, ck):
    from tests.test_megatron_checkpoint import _setup, _step
    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import single_process_group
    from trainer.megatron.sync import iter_hf_weights

    root, cont = saved
    path = os.path.join(root, ck, "global_step_1", "actor")
    with single_process_group():
        cfg, _, model, shape, opt, sched = _setup(seed=5)
        meta = MegatronCheckpointManager(model, opt, sched, hf_config=cfg).load(path)
        lp2 = _step(model, opt, sched, 2)
        after = dict(iter_hf_weights(model, shape))
    want = {"ck_tp2": (2, 1), "ck_pp2": (1, 2)}[ck]
    assert (meta["tp_size"], meta["pp_size"], meta["ckpt_format"]) == (*want, "torch_dist")
    torch.testing.assert_close(lp2, cont["lp2"], atol=1e-5, rtol=0)
    assert opt.param_groups[0]["lr"] == cont["lr"]
    assert set(after) == set(cont["after"])
    for k, v in after.items():
        torch.testing.assert_close(v, cont["after"][k], atol=1e-5, rtol=0, msg=k)


@pytest.mark.parametrize("ck", ["ck_tp2", "ck_pp2"])
def test_offline_export_of_a_dist_checkpoint_gives_the_live_logits(saved, ck, tmp_path):
    from transformers import AutoModelForCausalLM

    from tools.export_hf import export_checkpoint

    root, cont = saved
    out = export_checkpoint(os.path.join(root, ck, "global_step_1", "actor"), str(tmp_path / "hf"), dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(input_ids=_IDS).logits
    torch.testing.assert_close(logits, cont["live_logits"], atol=1e-5, rtol=0)


def test_dist_checkpoint_of_another_model_is_refused_naming_the_value(saved):
    from transformers import Qwen2Config

    from tests.test_megatron_checkpoint import _setup
    from trainer.config_checks import ConfigError
    from trainer.resume_checks import check_resume_model
    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.model import single_process_group

    root, _ = saved
    step = os.path.join(root, "ck_tp2", "global_step_1")
    other = json.load(open(os.path.join(step, "actor", "huggingface", "config.json")))
    check_resume_model(step, other)                                    # the same model passes
    with pytest.raises(ConfigError, match=r"holds another model .*num_hidden_layers=2 in the checkpoint, 3 in"):
        check_resume_model(step, {**other, "num_hidden_layers": 3})
    with single_process_group():
        _, _, model, _, opt, sched = _setup()
        wrong = Qwen2Config(**{**other, "rms_norm_eps": 1e-5})
        with pytest.raises(ValueError, match=r"rms_norm_eps=1e-06 in the checkpoint, 1e-05 in the model"):
            MegatronCheckpointManager(model, opt, sched, hf_config=wrong).load(os.path.join(step, "actor"))


def test_preflight_refuses_resuming_a_dist_checkpoint_of_another_model(saved):
    """Before any worker starts: the embedded tiny model (hidden_size 64) cannot resume the 32-wide checkpoint."""
    from tests.test_megatron_launch import _cfg
    from trainer.launch import ConfigError, preflight

    step = os.path.join(saved[0], "ck_tp2", "global_step_1")
    if not os.path.isfile(os.path.join(step, "data.pt")):  # the trainer state a save writes last (workers only here)
        torch.save({"global_step": 1}, os.path.join(step, "data.pt"))
    with pytest.raises(ConfigError, match=r"^trainer.resume_mode: .* holds another model than actor_rollout_ref.model: "
                                          r"hidden_size=32 in the checkpoint, 64 in the model$"):
        preflight(_cfg(f"trainer.resume_mode={step}", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1"))


def test_dist_key_map_is_megatron_cores():
    """The offline export restates the local layer spec's key map; it must stay megatron-core's."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from trainer.megatron.weights import DIST_KEYS_MAP

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=False)
    assert spec.submodules.sharded_state_dict_keys_map == DIST_KEYS_MAP


def test_unknown_ckpt_format_is_refused():
    from trainer.megatron.checkpoint import MegatronCheckpointManager

    ranks = dict(tp=0, pp=0, dp=0, tp_size=1, pp_size=1, dp_size=1, rank=0)
    with pytest.raises(ValueError, match=r"ckpt_format='zarr'; expected one of \('torch_dist', 'torch'\)"):
        MegatronCheckpointManager(torch.nn.Linear(1, 1), ranks=ranks, ckpt_format="zarr")


def test_a_fresh_distributed_optimizer_builds_its_load_template():
    """megatron-core's DistributedOptimizer.state_dict() (without Apex/Transformer Engine) asserts one Adam step
    count in the inner torch optimizer's state, which a freshly built optimizer does not have: resuming a dist
    checkpoint on the GPU path failed there. The load path creates that state first, leaving the weights as they
    are; a chained optimizer's parts get it too."""
    from megatron.core.optimizer import ChainedOptimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from trainer.megatron.dist_ckpt import _optimizer_sharded, inner_torch_optimizers

    def fresh(seed):
        opt = DistributedOptimizer.__new__(DistributedOptimizer)  # the state_dict() logic only, no CUDA buffers
        p = torch.nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)))
        opt.optimizer, opt.grad_scaler = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1), None
        opt.sharded_state_dict = lambda model_sd, is_loading=False, metadata=None: DistributedOptimizer.state_dict(opt)
        return opt, p

    opt, p = fresh(0)
    with pytest.raises(AssertionError):  # the fault: a fresh optimizer has no step to read
        DistributedOptimizer.state_dict(opt)
    before = p.detach().clone()
    sd = _optimizer_sharded(opt, {}, True, {})
    assert torch.equal(p.detach(), before) and sd["optimizer"]["param_groups"][0]["step"] == 1.0
    assert opt.optimizer.param_groups[0]["lr"] == 1e-3 and opt.optimizer.param_groups[0]["weight_decay"] == 0.1

    parts = [fresh(1), fresh(2)]
    chained = ChainedOptimizer.__new__(ChainedOptimizer)
    chained.chained_optimizers = [o for o, _ in parts]
    assert inner_torch_optimizers(chained) == [o.optimizer for o, _ in parts]
    chained.sharded_state_dict = lambda model_sd, is_loading=False, metadata=None: [
        o.sharded_state_dict(model_sd) for o in chained.chained_optimizers]
    assert len(_optimizer_sharded(chained, {}, True, {})) == 2
