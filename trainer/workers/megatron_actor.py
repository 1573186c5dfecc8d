"""The actor + rollout + reference worker of ``trainer.strategy=megatron`` (megatron-core GPTModel inside).

Same public methods and return contracts as :class:`trainer.workers.actor.ActorRolloutRefWorker` (which it
subclasses), so the single controller does not change: ``init_model``, ``generate_sequences``,
``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``, ``save_checkpoint``, ``load_checkpoint``,
``export_hf``, ``weights_fingerprint``. What is shared and what is Megatron's own:

* shared (inherited, unchanged): the rollout engine (``_build_rollout``), sampling, the generation batch
  layout, ``compute_log_prob`` / ``compute_ref_log_prob`` (``model_utils.forward_batch_log_probs``) and
  ``update_actor`` (``update.ppo_update``: mini/micro-batches, the project's loss functions, global token mean).
  They drive a :class:`trainer.megatron.engine.MegatronEngine`, which looks like a DeepSpeed engine.
* Megatron's own: the model (``trainer.megatron.model.build_gpt_model`` + HF weights), tensor parallelism
  (``actor_rollout_ref.actor.megatron.tensor_model_parallel_size``), the weight sync into the rollout engine
  (``trainer.megatron.sync.iter_hf_buckets``: TP shards gathered into HF tensors), checkpoints
  (``MegatronCheckpointManager``) and the HF export.

Devices:

* CUDA: ``DistributedDataParallel(Float16Module(GPTModel))`` with megatron's DDP config and
  ``megatron.core.optimizer.get_megatron_optimizer`` (``OptimizerConfig``: Adam with decoupled weight decay,
  bf16 params with fp32 main weights, ``use_distributed_optimizer`` from config, clipping at ``grad_clip``).
  The LR schedule is the DeepSpeed path's (``build_optimizer``'s scheduler on a shadow optimizer).
* CPU (tests only): megatron's DDP and distributed optimizer allocate CUDA buffers, so the bare GPTModel is
  trained with ``torch.optim.AdamW`` (the DeepSpeed path's ``build_optimizer``), gradients averaged over the
  data-parallel group and clipped with a TP-aware norm (``trainer.megatron.engine``). fp32.

Pipeline parallelism > 1 is refused (``ValueError`` here; ``ConfigError`` in ``trainer/config_checks.py``): the
pipeline schedule (``get_forward_backward_func``) is not wired. Ulysses SP is DeepSpeed-only; long sequences on
this path would use Megatron's own context parallelism, not wired yet either (``context_parallel_size`` must be 1).

Rows: TP peers of a data-parallel rank receive the same rows (the controller builds the group with
``sp_size = tp``, as for Ulysses peers); megatron's rank order puts TP ranks next to each other.
"""
from __future__ import annotations

import glob
import logging
import os

import torch

from trainer.workers.actor import ActorRolloutRefWorker
from trainer.workers.base import StartupClock
from trainer.workers.model_utils import ModelRole

logger = logging.getLogger(__name__)


def load_hf_state(path: str) -> dict[str, torch.Tensor]:
    """The full HF state dict of the model folder ``path`` (all ``*.safetensors`` files; else ``from_pretrained``).

    Returns tensors on CPU in their stored dtype. Raises FileNotFoundError when ``path`` is not a folder.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model folder {path!r} does not exist")
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f))
        return state
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


class MegatronActorRefWorker(ActorRolloutRefWorker):
    """Trainable megatron-core actor, the rollout engine and a frozen megatron-core reference model; ``config`` is a
    :class:`trainer.config.workers.ActorWorkerConfig` with its ``megatron`` section."""

    # ---- setup ----------------------------------------------------------------------------------------------
    def param_dtype(self) -> torch.dtype:
        """``actor_rollout_ref.actor.megatron.bf16``: ``auto`` = bf16 on CUDA, fp32 on CPU."""
        bf16 = self.config.megatron.bf16
        bf16 = (self.device_type == "cuda") if bf16 == "auto" else bool(bf16)
        return torch.bfloat16 if bf16 else torch.float32

    def init_model(self) -> dict:
        """Build the process groups, the actor (+ optimizer), the reference model and the rollout engine.

        Returns: ``{"num_params": <HF parameter count>, "pad_token_id": int, "stop_token_ids": list[int],
        "startup_s": {part: seconds}}`` (as the DeepSpeed worker; parts: imports, distributed, weights read, actor,
        reference, rollout engine).
        Raises:
            ValueError: sizes that do not divide the model or the world (a pipeline or context parallel size > 1
                is refused when the worker's section is built: :class:`trainer.config.actor.MegatronConfig`).
        """
        clock = StartupClock()
        from transformers import AutoConfig, AutoTokenizer

        from trainer.megatron.model import init_megatron_parallel
        clock.mark("imports")

        cfg = self.config
        self.actor_cfg, self.rollout_cfg = cfg.actor, cfg.rollout
        m = cfg.megatron  # checked when built (MegatronConfig.check: tensor parallelism only)
        tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
        self.init_distributed()  # torch.distributed (gloo on CPU, nccl on GPU), as the DeepSpeed worker
        init_megatron_parallel(tp, pp, seed=cfg.seed, cp_size=m.context_parallel_size)
        if self.device.type == "cpu":
            from trainer.megatron.engine import install_cpu_tp_compat

            install_cpu_tp_compat()
        clock.mark("distributed")
        mc = cfg.model
        path = mc.path
        trust = mc.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(mc.tokenizer_path or path, trust_remote_code=trust)
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
        if mc.enable_gradient_checkpointing:
            logger.warning("model.enable_gradient_checkpointing is ignored on the Megatron path")
        hf_state = load_hf_state(path)
        clock.mark("weights read")
        self.need_ref = cfg.need_ref
        self.actor = self._build_role(hf_config, hf_state, path, train=True)
        clock.mark("actor")
        self.ref = self._build_role(hf_config, hf_state, path, train=False) if self.need_ref else None
        if self.ref is not None:
            clock.mark("reference")
        n_params = sum(t.numel() for n, t in hf_state.items()
                       if not (n == "lm_head.weight" and self.shape.tie_word_embeddings))
        del hf_state
        self._build_rollout()
        if self.engine is not None:
            clock.mark("rollout engine")
        self.attach_checkpointing(self.actor)
        return {"num_params": n_params, "pad_token_id": self.pad_token_id, "stop_token_ids": list(self.stop_token_ids),
                "startup_s": clock.parts}

    def _build_role(self, hf_config, hf_state: dict, path: str, train: bool) -> ModelRole:
        from megatron.core import parallel_state as ps

        from trainer.megatron.engine import MegatronEngine, ShadowLRScheduler
        from trainer.megatron.model import build_gpt_model, load_hf_weights, match_hf_padding_idx

        dtype = self.param_dtype()
        model, tcfg, shape = build_gpt_model(hf_config, params_dtype=dtype)
        load_hf_weights(model, hf_state, shape)
        match_hf_padding_idx(model, getattr(hf_config, "pad_token_id", None))
        self.shape = shape
        cuda = self.device.type == "cuda"
        if cuda and dtype != torch.float32:
            from megatron.core.transformer.module import Float16Module

            model = Float16Module(tcfg, model)  # casts inputs/outputs; RMSNorm weights follow the params dtype
        optimizer = sched = None
        megatron_opt = False
        grad_clip = self.actor_cfg.grad_clip
        if not train:
            model.requires_grad_(False)
            model.eval()
        elif cuda:
            model, optimizer, sched = self._megatron_ddp_optimizer(model, tcfg, dtype, grad_clip)
            megatron_opt = True
        else:  # CPU (tests): bare model + the DeepSpeed path's AdamW and LR schedule
            optimizer, sched = self.build_optimizer(model, self.actor_cfg.optim, self.config.total_steps)
        if megatron_opt:
            sched = ShadowLRScheduler(optimizer, sched)
        engine = MegatronEngine(model, shape.vocab_size, optimizer=optimizer, lr_scheduler=sched,
                                grad_clip=grad_clip, megatron_optimizer=megatron_opt,
                                dp_group=ps.get_data_parallel_group(), dp_size=ps.get_data_parallel_world_size(),
                                tp_group=ps.get_tensor_model_parallel_group(),
                                tp_rank=ps.get_tensor_model_parallel_rank())
        return ModelRole(engine=engine, tokenizer=self.tokenizer, hf_config=hf_config, model_path=path, sp=None,
                         sp_size=1, dp_group=ps.get_data_parallel_group(), dp_size=ps.get_data_parallel_world_size(),
                         dp_rank=ps.get_data_parallel_rank(), use_remove_padding=False, device=self.device)

    def _megatron_ddp_optimizer(self, model, tcfg, dtype: torch.dtype, grad_clip: float):
        """CUDA: megatron DDP + ``get_megatron_optimizer``; returns ``(ddp_model, optimizer, shadow_scheduler)``."""
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optim = self.actor_cfg.optim
        use_dist = self.config.megatron.use_distributed_optimizer
        ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                use_distributed_optimizer=use_dist)
        model = DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=model)
        betas = optim.betas
        ocfg = OptimizerConfig(optimizer="adam", lr=optim.lr, weight_decay=optim.weight_decay,
                               adam_beta1=float(betas[0]), adam_beta2=float(betas[1]),
                               bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
                               use_distributed_optimizer=use_dist, clip_grad=grad_clip)
        optimizer = get_megatron_optimizer(ocfg, [model])
        # the LR schedule of the DeepSpeed path, run on a one-parameter shadow optimizer
        _, shadow = self.build_optimizer(torch.nn.Linear(1, 1, bias=False), optim, self.config.total_steps)
        return model, optimizer, shadow

    # ---- rollout weights ------------------------------------------------------------------------------------
    def _rollout_context(self, validate: bool, memory_log: dict | None = None, timing_log: dict | None = None):
        """``rollout.context.rollout_mode`` fed with the actor's TP-gathered HF tensors in buckets."""
        from rollout.context import rollout_mode
        from trainer.megatron.engine import unwrap
        from trainer.megatron.sync import iter_hf_buckets

        rc = self.rollout_cfg
        bucket = rc.update_weights_bucket_megabytes * 2 ** 20
        model = unwrap(self.actor.engine.module)
        return rollout_mode(self.engine, lambda: iter_hf_buckets(model, self.shape, bucket), bucket,
                            sleep_level=rc.sleep_level, memory_log=memory_log,
                            timing_log=timing_log)

    @torch.no_grad()
    def weights_fingerprint(self) -> dict:
        """Sums of the actor's HF-named tensors (TP gathered) and of the rollout engine's parameters."""
        from trainer.megatron.engine import unwrap
        from trainer.megatron.sync import iter_hf_weights

        actor = {n: float(t.double().sum()) for n, t in iter_hf_weights(unwrap(self.actor.engine.module), self.shape)}
        engine_model = getattr(self.engine, "model", None)
        eng = {n: float(p.double().sum()) for n, p in engine_model.named_parameters()} if engine_model is not None else {}
        return {"actor": actor, "engine": eng}

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The actor as a full HF state dict on CPU (TP gathered; every rank of the model group must call it)."""
        from trainer.megatron.engine import unwrap
        from trainer.megatron.sync import iter_hf_weights

        return {n: t.detach().cpu().clone() for n, t in iter_hf_weights(unwrap(self.actor.engine.module), self.shape)}

    # ---- checkpoints and HF export ----------------------------------------------------------------------------
    def attach_checkpointing(self, role, value_head: bool = False) -> dict:
        """A :class:`trainer.megatron.checkpoint.MegatronCheckpointManager` for ``role`` (``save_checkpoint`` /
        ``load_checkpoint`` are inherited: ``self.ckpt.save(dir)`` / ``self.ckpt.load(dir)``), writing
        ``actor_rollout_ref.actor.megatron.ckpt_format``."""
        from trainer.megatron.checkpoint import MegatronCheckpointManager

        if value_head:
            raise ValueError("the Megatron path has no value-head (critic) models")
        self._trained, self._value_head = role, False
        eng = role.engine
        fmt = self.config.megatron.ckpt_format
        self.ckpt = MegatronCheckpointManager(eng.module, optimizer=eng.optimizer, lr_scheduler=eng.lr_scheduler,
                                              hf_config=role.hf_config, tokenizer=role.tokenizer, ckpt_format=fmt)
        return {"num_params": sum(p.numel() for p in eng.module.parameters())}

    def export_hf(self, out_dir: str) -> None:
        """The actor as a Hugging Face folder (``model.safetensors`` + config + tokenizer; all ranks must call)."""
        self.ckpt.export_hf(out_dir, self.shape, dtype=self.param_dtype())
