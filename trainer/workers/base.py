"""What every DeepSpeed worker does: join the process group, build a DeepSpeed config, wrap a model.

A worker is a Ray actor pinned to one placement-group bundle. Rank 0 of a worker group picks
``MASTER_ADDR``/``MASTER_PORT``; the others receive them; each calls ``deepspeed.init_distributed`` (gloo
with ``DS_ACCELERATOR=cpu``, nccl on GPU) and ``deepspeed.initialize``.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)


def seed_worker_rng(seed: int, rank: int) -> None:
    """Seed this process's global generators (python ``random``, numpy, torch CPU and CUDA:
    ``transformers.set_seed``) with ``seed + rank``, so that what draws from them in a worker (dropout in a trained
    model, the ``clip_cov`` loss's token choice) is the same in two runs of one ``trainer.seed``, and differs
    between data-parallel ranks. A resumed run then restores the states its checkpoint saved."""
    from transformers import set_seed

    set_seed(int(seed) + int(rank))


def free_port() -> int:
    """A TCP port that is free on this host right now (free for anyone to take again: see :func:`reserve_port`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


_RESERVED: dict[int, socket.socket] = {}


def reserve_port() -> int:
    """A TCP port free on this host, held by this process (a bound socket that does not listen) until
    :func:`release_port`: between the pick and the bind of the rendezvous store (model loading lies between them)
    no other process can bind it, nor take it for an outgoing connection (Ray opens many), which otherwise ends
    the start-up with ``EADDRINUSE``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", 0))
    port = s.getsockname()[1]
    _RESERVED[port] = s
    return port


def release_port(port: int | None) -> None:
    """Free a port of :func:`reserve_port` right before its owner binds it (no-op for a port not held here)."""
    s = _RESERVED.pop(int(port), None) if port is not None else None
    if s is not None:
        s.close()


def node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # not inside Ray
        return "127.0.0.1"


def reset_peak_memory(device: torch.device) -> None:
    """Start measuring a stage's peak GPU memory (``torch.cuda.reset_peak_memory_stats``); a no-op off CUDA."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def stage_peak_memory(device: torch.device, stage: str) -> dict[str, float]:
    """Peak GPU memory of this process since :func:`reset_peak_memory`, for the stage that just ran, in GiB.

    Returns ``{"perf/max_memory_allocated_gb/<stage>": GiB, "perf/max_memory_reserved_gb/<stage>": GiB}``
    (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``; all roles colocated in this process count),
    then resets the peak so the next stage is measured on its own; ``{}`` off CUDA.
    """
    if device.type != "cuda":
        return {}
    out = {f"perf/max_memory_allocated_gb/{stage}": torch.cuda.max_memory_allocated(device) / 2**30,
           f"perf/max_memory_reserved_gb/{stage}": torch.cuda.max_memory_reserved(device) / 2**30}
    reset_peak_memory(device)
    return out


class StartupClock:
    """Seconds of each part of a worker's start-up, in order (``parts``: ``{name: seconds}``), for the driver's
    start-up line (:func:`trainer.placement.startup_split`); a part runs from the previous mark (or the clock's
    creation) to its own :meth:`mark`."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        """End the part ``name`` now."""
        now = time.perf_counter()
        self.parts[name], self._last = now - self._last, now


def _decorate_on_first_call(fn, decorator_factory):
    """``fn`` with the decorator ``decorator_factory()`` applied when the returned function is first called
    instead of now; that decorated function runs from then on (also in the first call).

    Args:
        fn: the function to decorate.
        decorator_factory: a callable taking no arguments and returning the decorator (e.g. ``torch.compile``).
    """
    import functools

    decorated = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal decorated
        if decorated is None:
            decorated = decorator_factory()(fn)
        return decorated(*args, **kwargs)

    return call


def import_deepspeed_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon optimizer module with its ``@compiler.compile()`` decorators (``torch.compile``)
    applied at each function's first call rather than at import.

    DeepSpeed imports that module during engine and ZeRO optimizer set-up and in every ZeRO-1/2 gradient reduction
    (to test ``isinstance(optimizer, MuonWithAuxAdam)``). Applying ``torch.compile`` at import loads TorchInductor
    (about 0.8 s of CPU per worker process), although the workers train with AdamW and never call Muon's kernels.
    Only the moment changes: the decorator DeepSpeed asks for (``deepspeed.runtime.compiler.compile(...)``, with
    its arguments) is applied to a Muon function when it is first called, so a called kernel is compiled as
    before. ``deepspeed.runtime.compiler.compile`` is put back before this returns. A no-op when the module is
    already imported, or this DeepSpeed has no Muon module or no ``compiler.compile``.
    """
    import sys

    if "deepspeed.runtime.zero.muon.original_muon" in sys.modules:
        return
    from deepspeed.runtime import compiler

    real = getattr(compiler, "compile", None)
    if real is None:
        return

    def deferred(*args, **kwargs):
        return lambda fn: _decorate_on_first_call(fn, lambda: real(*args, **kwargs))

    compiler.compile = deferred
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    except ImportError:
        pass
    finally:
        compiler.compile = real


class DistributedWorker:
    """Sets up the environment of one rank; subclasses build models in ``init_model``.

    Args:
        config: what this worker's role receives (a :class:`trainer.config.workers.WorkerRuntime` subclass:
            its sections, ``deepspeed``, ``seed``, ``cpus_per_worker``).
        rank, world_size: this worker's place in its group.
        master_addr, master_port: rank 0's rendezvous address (None on rank 0: it picks them; None on another rank:
            :meth:`set_master_addr_port` gives them before the process group is joined).
        device: ``cpu`` or ``cuda``.
    """

    def __init__(self, config, rank: int, world_size: int, master_addr: str | None = None,
                 master_port: int | None = None, device: str = "cpu", role: str = "worker"):
        self.config, self.rank, self.world_size, self.device_type, self.role = config, rank, world_size, device, role
        if master_addr is None and rank == 0:
            master_addr, master_port = node_ip(), reserve_port()  # released when rank 0 binds it
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0"})
        self.master_addr = self.master_port = None
        if master_addr is not None:
            self.set_master_addr_port(master_addr, master_port)
        if device == "cpu":
            os.environ["DS_ACCELERATOR"] = "cpu"
            torch.set_num_threads(config.cpus_per_worker)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._dist_ready = False
        seed_worker_rng(config.seed, rank)

    def get_master_addr_port(self) -> tuple[str, int]:
        return self.master_addr, self.master_port

    def set_master_addr_port(self, master_addr: str, master_port: int) -> None:
        """Rank 0's rendezvous address (a rank > 0 created without it receives it here, before its first other
        call)."""
        self.master_addr, self.master_port = master_addr, master_port
        os.environ.update({"MASTER_ADDR": str(master_addr), "MASTER_PORT": str(master_port)})

    def ping(self) -> int:
        return self.rank

    def location(self) -> dict[str, Any]:
        """Where this worker runs (logged by the driver, so that a stuck or dead rank can be found):
        ``{"pid": process id, "node_id": Ray node id (hex), "node_ip": the node's IP as Ray reports it}``."""
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}

    # ---- distributed -------------------------------------------------------------------------------------
    def init_distributed(self) -> None:
        if self._dist_ready:
            return
        import deepspeed

        if self.device_type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
            # DeepSpeed's CPU accelerator JIT-compiles a shared-memory comm op on first use (about a minute on
            # 2 cores); gloo alone is enough for our collectives
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        import_deepspeed_muon_uncompiled()
        release_port(self.master_port)  # rank 0 binds its rendezvous store now
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        self._dist_ready = True

    # ---- checkpoints and HF export of the role this worker trains ----------------------------------------
    def attach_checkpointing(self, role, value_head: bool = False) -> dict:
        """Checkpoint manager for ``role`` (a ``ModelRole``); returns ``{"num_params": ...}`` for ``init_model``.

        Every trained role (actor, critic, PRM) saves, loads and exports through the methods below.
        """
        from trainer.checkpoint.deepspeed_manager import DeepSpeedCheckpointManager

        self._trained, self._value_head = role, value_head
        self.ckpt = DeepSpeedCheckpointManager(role.engine, tokenizer=role.tokenizer, hf_config=role.hf_config,
                                               rank=self.rank, world_size=self.world_size)
        return {"num_params": sum(getattr(p, "ds_numel", p.numel()) for p in role.engine.module.parameters())}

    def save_checkpoint(self, role_dir: str) -> None:
        self.ckpt.save(role_dir)

    def load_checkpoint(self, role_dir: str) -> None:
        """Load ``role_dir``; a file that does not load (a damaged pickle) raises
        :class:`trainer.checkpoint.finite.DamagedCheckpoint` on the rank that read it, a loaded state that is not
        finite on any rank on every rank."""
        from trainer.checkpoint.finite import check_loaded_state, reading_checkpoint

        with reading_checkpoint(self.role, self.rank, role_dir):
            self.ckpt.load(role_dir)
        check_loaded_state(self._trained.engine, self.role, role_dir)

    def check_finite_state(self, step_dir: str) -> None:
        """Before ``step_dir`` is saved: :class:`trainer.checkpoint.finite.NonFiniteWeights` on every rank when the
        trained role's state is not finite on any rank (a worker that trains nothing has nothing to check)."""
        from trainer.checkpoint.finite import check_state_before_save

        if getattr(self, "_trained", None) is not None:
            check_state_before_save(self._trained.engine, self.role, step_dir)

    def export_hf(self, out_dir: str) -> None:
        """The trained role as a Hugging Face folder (ZeRO-3 parameters gathered; all ranks must call it)."""
        from trainer.checkpoint.hf_export import export_hf

        export_hf(self._trained.engine, out_dir, tokenizer=self._trained.tokenizer, dtype=self.param_dtype(),
                  zero_stage=self.config.deepspeed.zero_stage, value_head=self._value_head)

    # ---- DeepSpeed config --------------------------------------------------------------------------------
    def ds_config(self, train: bool, grad_clip: float = 1.0) -> dict[str, Any]:
        """The DeepSpeed config of a training (``train``) or a frozen (reference) model.

        Gradient accumulation is owned by the trainer (``managed_gradient_accumulation: false``): every
        ``backward`` accumulates, every ``step`` is an optimizer step; losses arrive already normalised
        (see ``trainer.core_algos.agg_loss``).
        """
        ds = self.config.deepspeed
        stage = ds.zero_stage
        bf16 = ds.bf16_on(self.device_type)
        if not train:
            stage = 3 if stage == 3 else 0
        zero: dict[str, Any] = {"stage": stage}
        if train and stage == 2 and self.device_type == "cuda":
            # reduction and gradient-bucket copies on their own stream, overlapping the backward (the update's MFU
            # with CUDA graphs: 32.6% vs 29.6% without, same H200; docs/benchmarks.md); costs about 4.5 x
            # reduce_bucket_size of gradient buffers. Off again with deepspeed.ds_config.
            zero["overlap_comm"] = True
        if train and ds.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": self.device_type == "cuda"}
        if stage == 3:
            zero.update({"stage3_param_persistence_threshold": 1e4,
                         "stage3_gather_16bit_weights_on_model_save": True})
            if ds.offload_param:
                zero["offload_param"] = {"device": "cpu", "pin_memory": self.device_type == "cuda"}
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "zero_optimization": zero,
            "bf16": {"enabled": bf16},
            "zero_allow_untested_optimizer": True,
            "wall_clock_breakdown": False,
            "steps_per_print": 10 ** 9,
        }
        if train:
            cfg["gradient_clipping"] = float(grad_clip)
        if ds.ds_config:  # its entries that first-class keys own equal them (trainer.ds_config_checks)
            cfg = _deep_merge(cfg, ds.ds_config)
            if not train:  # a frozen model keeps its own stage (0 below ZeRO-3)
                cfg["zero_optimization"]["stage"] = stage
        return cfg

    def param_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.config.deepspeed.bf16_on(self.device_type) else torch.float32

    def build_optimizer(self, model: torch.nn.Module, optim_cfg, total_steps: int):
        """AdamW and a warmup-then-``lr_scheduler_type`` LR schedule (:func:`_lr_scheduler`).

        ``deepspeed.optimizer=torch_adamw`` is ``torch.optim.AdamW`` with ``fused=True`` (one kernel per step instead
        of about ten passes over the fp32 master weights; same update rule) on CUDA with ZeRO stage <= 2 and no
        optimizer offload, the default (multi-tensor) implementation otherwise (ZeRO-3's partitioned step was not
        run with the fused kernel).

        Args:
            optim_cfg: the role's :class:`trainer.config.actor.OptimConfig`.
            total_steps: optimizer steps of the whole run (the schedule's length).
        """
        from transformers import get_scheduler

        ds = self.config.deepspeed
        params = [p for p in model.parameters() if p.requires_grad]
        kw = dict(lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), weight_decay=optim_cfg.weight_decay)
        if ds.optimizer == "torch_adamw":
            fused = self.device_type == "cuda" and not ds.offload_optimizer and ds.effective_zero_stage <= 2
            opt = torch.optim.AdamW(params, fused=True, **kw) if fused else torch.optim.AdamW(params, **kw)
        elif ds.offload_optimizer:  # deepspeed_adamw (the section allows these two)
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(params, adamw_mode=True, **kw)
        else:
            from deepspeed.ops.adam import FusedAdam

            opt = FusedAdam(params, adam_w_mode=True, **kw)
        return opt, _lr_scheduler(get_scheduler, opt, optim_cfg, total_steps)


def _lr_scheduler(get_scheduler, opt, optim_cfg, total_steps: int):
    """Linear warmup, then ``lr_scheduler_type`` (transformers.get_scheduler), over ``total_steps`` OPTIMIZER steps.

    verl's keys count TRAINING steps: ``lr_warmup_steps`` (< 0: ``lr_warmup_steps_ratio x total_training_steps``)
    is multiplied by the optimizer steps per training step (``total_steps / optim.total_training_steps``), so the
    warmup spans the same share of the run as in verl, whose scheduler steps once per training step. ``cosine``
    decays to ``min_lr_ratio x lr`` over ``num_cycles`` half-waves (transformers' ``cosine_with_min_lr``, the same
    formula as verl's ``get_cosine_schedule_with_warmup``).
    """
    o = optim_cfg
    train_steps = o.total_training_steps or -1
    per = max(1, round(total_steps / train_steps)) if train_steps > 0 else 1
    warmup = o.lr_warmup_steps or 0
    if warmup < 0:
        warmup = int((o.lr_warmup_steps_ratio or 0.0) * max(train_steps, 0))
    name = o.lr_scheduler_type
    kwargs = {}
    if name == "constant":
        name = "constant_with_warmup"
    elif name == "cosine":
        name = "cosine_with_min_lr"
        kwargs = {"min_lr_rate": o.min_lr_ratio or 0.0, "num_cycles": o.num_cycles}
    return get_scheduler(name, optimizer=opt, num_warmup_steps=warmup * per, num_training_steps=max(total_steps, 1),
                         scheduler_specific_kwargs=kwargs or None)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
