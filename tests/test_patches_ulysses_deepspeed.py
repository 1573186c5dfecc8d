"""The gradient-scaling rule of Ulysses SP with a real DeepSpeed 0.19 engine (CPU, gloo, 4 ranks: dp=2 x sp=2).

One SGD step (lr 1, clipping off) must move every parameter by exactly the DP-mean of the unsharded gradients:
* no SP-aware mpu (DeepSpeed's DP group = the whole world, ZeRO averages over 4 ranks) + gather grad_scale = sp;
* an SP-aware mpu (ZeRO divides by world/sp = dp) + grad_scale = 1.
Note: DeepSpeed's default ``gradient_clipping`` is 1.0 (``GRADIENT_CLIPPING_DEFAULT``); it is set to 0 here.
"""
import copy
import json
import os
import tempfile
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from tests import test_patches_ulysses_dist as common
from tests.e2e_utils import free_port

pytest.importorskip("deepspeed")


class _SpMpu:
    """Minimal Megatron-style mpu with sequence-parallel groups, as DeepSpeed's engine queries it."""

    def __init__(self, mesh, world, rank):
        import torch.distributed as dist
        self.m, self.world, self.rank, self.WORLD = mesh, world, rank, dist.group.WORLD

    def get_sequence_parallel_world_size(self): return self.m.sp.size
    def get_sequence_parallel_rank(self): return self.m.sp.rank
    def get_sequence_parallel_group(self): return self.m.sp.group
    def get_sequence_data_parallel_group(self): return self.WORLD
    def get_sequence_data_parallel_world_size(self): return self.world
    def get_sequence_data_parallel_rank(self): return self.rank
    def get_data_parallel_group(self): return self.m.dp_group
    def get_data_parallel_world_size(self): return self.m.dp_size
    def get_data_parallel_rank(self): return self.m.dp_rank
    def get_model_parallel_world_size(self): return 1
    def get_model_parallel_rank(self): return 0
    def get_model_parallel_group(self): return None


def worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    errors = []
    try:
        import deepspeed
        from transformers import AutoModelForCausalLM

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # as the workers: gloo only, no JIT build

        from patches.ulysses import UlyssesGroup, apply_ulysses_patch, build_dp_sp_groups
        from trainer.forward import forward_log_probs
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        mesh = build_dp_sp_groups(world, 2, rank)
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(common.MODELS["qwen2"](), attn_implementation="sdpa",
                                                dtype=torch.float32)
        refs = [common.reference(base, d)[2] for d in range(mesh.dp_size)]
        ref = {n: sum(r[n] for r in refs) / mesh.dp_size for n in refs[0]}
        # groups.mpu is process-global in DeepSpeed: the mpu case must come last
        for stage, use_mpu in ((1, False), (2, False), (2, True)):
            sp = UlyssesGroup(mesh.sp.group, mesh.sp.size, mesh.sp.rank, 1.0 if use_mpu else None)
            model = apply_ulysses_patch(copy.deepcopy(base), sp)
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                   "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                                              config=cfg, mpu=_SpMpu(mesh, world, rank) if use_mpu else None)
            ids, mask, pos, rm, w = common.make_batch(mesh.dp_rank)
            lp, ent = forward_log_probs(engine.module, ids, mask, pos, common.R, temperature=0.7,
                                        calculate_entropy=True)
            engine.backward(common.loss_fn(lp, ent, rm, w))
            engine.step()
            for n, p in engine.module.named_parameters():
                try:
                    torch.testing.assert_close(before[n] - p.detach(), ref[n], atol=1e-5, rtol=0)
                except AssertionError as e:
                    errors.append(f"zero{stage} mpu={use_mpu} {n}: {e}")
                    break
    except Exception:
        errors.append(traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(errors, f)


def test_deepspeed_zero_step_equals_dp_mean_of_unsharded_gradients():
    mp.get_context("forkserver").set_forkserver_preload([__name__, common.__name__])
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(4, free_port(), d), nprocs=4, join=True, start_method="forkserver")
        errors = [e for r in range(4) for e in json.load(open(os.path.join(d, f"rank{r}.json")))]
    assert not errors, "\n".join(errors)
