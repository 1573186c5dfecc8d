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
from contextlib import ExitStack, contextmanager

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


@contextmanager
def _megatron_optimizer_on_cpu():
    """megatron-core's DDP + DistributedOptimizer on the CPU (test only): the few places that name CUDA.

    ``DistributedOptimizer`` accepts only ``torch.cuda.*Tensor`` parameter types (``Tensor.type()``), builds flag
    tensors with ``device='cuda'`` and moves its gather buffers with ``.cuda()``; the buffers themselves are on
    ``torch.cuda.current_device()``. All of these are mapped to the CPU inside the block.
    """
    from unittest import mock

    type_, factories = torch.Tensor.type, ("tensor", "zeros", "empty", "ones", "full")

    def cuda_type(self, *args, **kwargs):
        t = type_(self, *args, **kwargs)
        if args or kwargs or not isinstance(t, str) or t.startswith("torch.cuda."):
            return t
        return t.replace("torch.", "torch.cuda.", 1)

    def on_cpu(fn):
        def make(*args, **kwargs):
            if str(kwargs.get("device", "cpu")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)
        return make

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.Tensor, "type", cuda_type))
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self))
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: "cpu"))
        stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
        for name in factories:
            stack.enter_context(mock.patch.object(torch, name, on_cpu(getattr(torch, name))))
        yield


def _worker_model_and_optimizer(seed):
    """The GPU worker's actor: bf16 ``Float16Module(GPTModel)`` in megatron's DDP with the distributed optimizer,
    built by ``MegatronActorRefWorker._megatron_ddp_optimizer`` itself (torch's Adam inside: no Apex / TE here)."""
    from types import SimpleNamespace

    from megatron.core.transformer.module import Float16Module

    from tests.test_megatron_checkpoint import _setup
    from trainer.megatron.model import build_gpt_model, load_hf_weights
    from trainer.workers.megatron_actor import MegatronActorRefWorker

    cfg, hf, *_ = _setup(seed)  # the tiny Qwen2 and its seeded HF weights
    model, tcfg, shape = build_gpt_model(cfg, params_dtype=torch.bfloat16)
    load_hf_weights(model, hf.state_dict(), shape)
    worker = SimpleNamespace(
        actor_cfg=SimpleNamespace(optim=SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)),
        config=SimpleNamespace(megatron=SimpleNamespace(use_distributed_optimizer=True), total_steps=10),
        build_optimizer=lambda m, optim, total: (None, None))
    ddp, opt, _ = MegatronActorRefWorker._megatron_ddp_optimizer(worker, Float16Module(tcfg, model), tcfg,
                                                                torch.bfloat16, 1.0)
    return cfg, ddp, shape, opt


def _worker_update(model, opt, seed):
    """One actor update as ``MegatronEngine.step`` takes it on the GPU (``megatron_guarded_step``)."""
    from trainer.megatron.engine import megatron_guarded_step
    from trainer.megatron.model import response_log_probs

    ids = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(seed))
    lp, _ = response_log_probs(model, ids, torch.ones(2, 8, dtype=torch.long), 3, 61)
    (-lp.float().mean()).backward()
    _, applied = megatron_guarded_step(model, opt)
    assert applied
    model.zero_grad_buffer()
    opt.zero_grad()
    return lp.detach().float()


def test_a_fresh_distributed_optimizer_resumes_a_torch_dist_checkpoint(tmp_path):
    """The GPU resume (megatron-core without Apex / Transformer Engine): a freshly built actor (megatron DDP + the
    distributed optimizer around torch's Adam) loads a torch_dist checkpoint. ``DistributedOptimizer.load_state_dict``
    put a ``step`` tensor in each parameter's state and then copied every state tensor from the loaded per-parameter
    tensors, which have no ``step``: KeyError 'step' (H200, megatron-core 0.19.2). After the load, one update equals
    the continuous run's, so the fp32 main weights, Adam's moments and its step count are all restored, and each
    parameter has its own step tensor."""
    from trainer.megatron.checkpoint import MegatronCheckpointManager
    from trainer.megatron.engine import unwrap
    from trainer.megatron.model import single_process_group
    from trainer.megatron.sync import iter_hf_weights

    path = str(tmp_path / "global_step_1" / "actor")
    with _megatron_optimizer_on_cpu(), single_process_group():
        cfg, model, shape, opt = _worker_model_and_optimizer(0)
        _worker_update(model, opt, 1)
        MegatronCheckpointManager(model, opt, None, hf_config=cfg, ckpt_format="torch_dist").save(path)
        lp2 = _worker_update(model, opt, 2)
        want = {k: v.clone() for k, v in iter_hf_weights(unwrap(model), shape)}

        cfg, model, shape, opt = _worker_model_and_optimizer(5)  # the resumed run's fresh worker
        MegatronCheckpointManager(model, opt, None, hf_config=cfg).load(path)
        inner = opt.chained_optimizers[0].optimizer
        steps = [s["step"] for s in inner.state.values()]
        assert len(steps) > 1 and {float(s) for s in steps} == {1.0} and len({id(s) for s in steps}) == len(steps)
        torch.testing.assert_close(_worker_update(model, opt, 2), lp2, atol=0, rtol=0)
        got = dict(iter_hf_weights(unwrap(model), shape))
    assert set(got) == set(want)
    for k, v in got.items():
        torch.testing.assert_close(v, want[k], atol=0, rtol=0, msg=k)


def test_each_chained_distributed_optimizer_loads_its_param_state_with_the_steps_set_aside():
    """Several chained parts: the parts' entries in key order (as ``ChainedOptimizer.load_state_dict``), param groups
    and steps first, then each part's ``param_state`` through its own loader while no ``step`` is in the state."""
    from types import SimpleNamespace

    from trainer.megatron.dist_ckpt import load_megatron_optimizer_state

    calls = []

    def part(name):
        inner = SimpleNamespace(state={})

        def load_param_state(param_state):
            calls.append((name, param_state, [dict(s) for s in inner.state.values()]))
        return SimpleNamespace(optimizer=inner, load_parameter_state_from_fully_reshardable=load_param_state)

    parts = [part("a"), part("b")]

    def load_state_dict(state):  # what megatron's load_state_dict leaves: a step in each parameter's state
        assert all("param_state" not in s and "param_state_sharding_type" not in s for s in state.values())
        for i, p in enumerate(parts):
            p.optimizer.state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(1)}}
            calls.append(("groups", state[i]["optimizer"]))
    chained = SimpleNamespace(chained_optimizers=parts, load_state_dict=load_state_dict)
    state = {1: {"optimizer": "g1", "param_state": "ps1", "param_state_sharding_type": "fully_reshardable"},
             0: {"optimizer": "g0", "param_state": "ps0", "param_state_sharding_type": "fully_reshardable"}}
    load_megatron_optimizer_state(chained, state)
    assert calls[:2] == [("groups", "g0"), ("groups", "g1")]
    assert [(n, ps) for n, ps, _ in calls[2:]] == [("a", "ps0"), ("b", "ps1")]
    assert all(set(s) == {"exp_avg"} for *_, states in calls[2:] for s in states)
    assert all(float(p.optimizer.state[0]["step"]) == 3.0 for p in parts)  # put back afterwards
