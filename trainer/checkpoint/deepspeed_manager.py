"""Checkpoint manager for one role (actor or critic) trained by a DeepSpeed engine (ZeRO 0/1/2/3).

Folder written by :meth:`DeepSpeedCheckpointManager.save` (``path`` = ``.../global_step_<N>/<role>``)::

    <role>/
        latest                                  # DeepSpeed's tag file (holds "global_step_<N>")
        global_step_<N>/                        # DeepSpeed's own files, per its save_checkpoint:
            mp_rank_00_model_states.pt          #   module (ZeRO 0-2), LR scheduler, client state
            zero_pp_rank_<r>_mp_rank_00_model_states.pt / ..._optim_states.pt   # ZeRO partitions
        rng_rank_<r>.pt                         # per-rank python/numpy/torch(/cuda) RNG states
        huggingface/                            # rank 0: config.json, generation_config.json, tokenizer
        zero_to_fp32.py                         # DeepSpeed's offline merge script (ZeRO >= 1)

Model, optimizer and LR scheduler go through DeepSpeed's own ``engine.save_checkpoint`` /
``engine.load_checkpoint`` (deepspeed 0.19: ``save_checkpoint(save_dir, tag=None, client_state={},
save_latest=True, exclude_frozen_parameters=False)``; the scheduler given to ``deepspeed.initialize`` is
stored as ``lr_scheduler`` in the model-states file). ``load`` passes ``load_optimizer_states=True`` and
``load_lr_scheduler_states=True`` explicitly, so a resumed run never repeats warmup.

Atomicity: everything is written into ``<role>.tmp`` and renamed to ``<role>`` only after
every rank finished; a save that raises leaves an older ``<role>`` folder untouched. The folder must be on a
file system shared by all ranks (as in verl).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any

import torch

from trainer.checkpoint.atomic import atomic_torch_save, barrier, replace_dir
from trainer.checkpoint.base import (CheckpointManager, capture_rng_state, parse_step, rate_at_restored_step,
                                     restore_rng_state)

logger = logging.getLogger(__name__)

HF_SUBDIR = "huggingface"
LORA_SUBDIR = "lora_adapter"  # a LoRA role's adapter_config.json (verl's merger writes its adapter folder so)
CLIENT_STATE_KEY = "rlhf_client_state"


def engine_dtype(engine: Any) -> torch.dtype:
    """Training dtype of a DeepSpeed engine: bfloat16, float16 or float32."""
    if getattr(engine, "bfloat16_enabled", lambda: False)():
        return torch.bfloat16
    if getattr(engine, "fp16_enabled", lambda: False)():
        return torch.float16
    return torch.float32


def trained_model_config(module: Any, fallback: Any = None, dtype: torch.dtype | None = None) -> Any:
    """A copy of the HF config that describes ``module`` as it is trained, for ``huggingface/config.json``.

    The module's own ``config`` (a critic built with ``AutoModelForTokenClassification(num_labels=1)`` from a
    causal-LM folder has ``num_labels=1`` there, unlike the folder's config), with ``architectures`` set to the
    module's class (what ``save_pretrained`` records; the folder's config names the causal LM) and ``dtype`` to
    the training dtype when given. ``fallback`` is used when the module is not a ``transformers.PreTrainedModel``
    (e.g. a Megatron model); None when neither has a config.
    """
    from transformers import PreTrainedModel

    hf_module = isinstance(module, PreTrainedModel)
    config = module.config if hf_module else fallback
    if config is None:
        return None
    cfg = config.__class__.from_dict(config.to_dict())
    if hf_module:
        cfg.architectures = [type(module).__name__]
    if dtype is not None:
        cfg.dtype = dtype
    return cfg


def save_hf_metadata(out_dir: str, hf_config: Any = None, tokenizer: Any = None, dtype: torch.dtype | None = None,
                     generation_config: Any = None) -> None:
    """Write ``config.json`` (with ``dtype`` = training dtype), ``generation_config.json`` and the tokenizer
    (incl. its chat template) into ``out_dir``. Call on rank 0 only. Any argument may be None (skipped)."""
    os.makedirs(out_dir, exist_ok=True)
    if hf_config is not None:
        cfg = hf_config.__class__.from_dict(hf_config.to_dict())
        if dtype is not None:
            cfg.dtype = dtype
        cfg.save_pretrained(out_dir)
        if generation_config is None:
            from transformers import GenerationConfig
            try:
                generation_config = GenerationConfig.from_model_config(cfg)
            except Exception as e:  # configs of non-generative models
                logger.info("no generation config derived from %s: %s", type(cfg).__name__, e)
    if generation_config is not None:
        generation_config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def deepspeed_safe_globals() -> list:
    """The DeepSpeed classes that its checkpoint files pickle (ZeRO stage enum, fragment addresses, loss
    scalers); allow-listed so that ``torch.load(weights_only=True)`` can read DeepSpeed checkpoints."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, fragment_address, LossScaler, DynamicLossScaler]


def load_deepspeed_file(path: str, **kwargs):
    """``torch.load(path, weights_only=True)`` for DeepSpeed's own checkpoint files (its few classes allow-listed)."""
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)


class DeepSpeedCheckpointManager(CheckpointManager):
    """Saves/restores a DeepSpeed engine (model, optimizer, LR scheduler) plus per-rank RNG states.

    Args:
        engine: the ``deepspeed.DeepSpeedEngine`` returned by ``deepspeed.initialize`` (with the optimizer
            and the ``lr_scheduler`` passed to it).
        tokenizer: HF tokenizer saved under ``huggingface/`` on rank 0 (None: skipped).
        hf_config: HF ``PretrainedConfig`` saved under ``huggingface/`` when the engine's module is not a
            ``transformers.PreTrainedModel``; otherwise the module's own config is saved, naming its class
            (:func:`trained_model_config`), so that ``tools/export_hf.py`` rebuilds the model that was trained.
        rank, world_size: this process's rank and the engine's world size (default: torch.distributed's).
        save_hf_metadata: write ``huggingface/`` on save (needed by ``tools/export_hf.py``).

    A LoRA model (a ``peft.PeftModel`` inside the engine) is saved without its frozen base weights (DeepSpeed's
    ``exclude_frozen_parameters``): the folder holds the adapters, their optimizer state and
    ``lora_adapter/adapter_config.json`` (naming the base model), and loads into an engine built from the same base.
    """

    def __init__(self, engine: Any, tokenizer: Any = None, hf_config: Any = None, rank: int | None = None,
                 world_size: int | None = None, save_hf_metadata: bool = True):
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.engine = engine
        self.tokenizer = tokenizer
        self.hf_config = hf_config if hf_config is not None else getattr(getattr(engine, "module", None),
                                                                         "config", None)
        self.rank = int(rank if rank is not None else (torch.distributed.get_rank() if dist_on else 0))
        self.world_size = int(world_size if world_size is not None else
                              (torch.distributed.get_world_size() if dist_on else 1))
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} is outside world_size={self.world_size}")
        self.save_hf_metadata = save_hf_metadata
        from trainer.workers.lora import is_lora_model

        self.lora = is_lora_model(getattr(engine, "module", None))

    # ------------------------------------------------------------------------------------------------ save
    def save(self, path: str, step: int | None = None) -> None:
        """Save into ``path`` (``.../global_step_<N>/<role>``) atomically; every rank must call it.

        Also accepts ``save(step, path)``. ``step`` defaults to the ``global_step_<N>`` in ``path``.
        On return the folder is complete on every rank (barriers). An exception leaves ``<path>.tmp``
        behind (removed by the next save) and any older ``path`` intact.

        Raises:
            ValueError: no step given and none in ``path``.
        """
        if isinstance(path, int) and isinstance(step, str):  # save(step, path) order
            path, step = step, path
        path = os.path.abspath(path)
        step = parse_step(path) if step is None else int(step)
        tmp = path + ".tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        barrier()
        client_state = {CLIENT_STATE_KEY: {"global_step": step, "world_size": self.world_size,
                                           "zero_stage": int(self.engine.zero_optimization_stage()),
                                           "lora": self.lora, **optimizer_layout(self.engine)}}
        from trainer.workers.lora import frozen_weights_excluded

        with frozen_weights_excluded(self.engine.module) if self.lora else contextlib.nullcontext():
            self.engine.save_checkpoint(tmp, tag=f"global_step_{step}", client_state=client_state,
                                        exclude_frozen_parameters=self.lora)
        atomic_torch_save(capture_rng_state(), os.path.join(tmp, f"rng_rank_{self.rank}.pt"))
        if self.rank == 0 and self.lora:
            from trainer.workers.lora_adapter import save_adapter_config

            save_adapter_config(self.engine.module, os.path.join(tmp, LORA_SUBDIR))
        if self.rank == 0 and self.save_hf_metadata:
            module = getattr(self.engine, "module", None)
            module = module.get_base_model() if self.lora else module  # the HF model inside peft's wrapper
            gen = getattr(module, "generation_config", None)
            save_hf_metadata(os.path.join(tmp, HF_SUBDIR), trained_model_config(module, self.hf_config),
                             self.tokenizer, engine_dtype(self.engine), gen)
        barrier()  # every rank's files are in tmp
        if self.rank == 0:
            replace_dir(tmp, path)
        barrier()
        logger.info("saved DeepSpeed checkpoint (step %d) to %s", step, path)

    # ------------------------------------------------------------------------------------------------ load
    def load(self, path: str, load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
             load_rng: bool = True) -> dict:
        """Restore model, optimizer, LR scheduler and this rank's RNG from ``path``.

        Under ZeRO-3 the engine must be fresh (DeepSpeed cannot load into an engine that just saved).

        Returns:
            ``{"global_step": int, "world_size": int, "zero_stage": int}`` as saved.
        Raises:
            FileNotFoundError: ``path`` or this rank's RNG file is missing, or DeepSpeed found nothing.
            ValueError: the checkpoint was written with another world size or ZeRO stage.
        """
        path = os.path.abspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint folder {path!r} does not exist")
        meta = self._read_meta(path)
        if meta.get("world_size", self.world_size) != self.world_size:
            raise ValueError(f"checkpoint {path!r} was saved with world_size={meta['world_size']} but this run "
                             f"has world_size={self.world_size}; resume with the same number of ranks")
        stage = int(self.engine.zero_optimization_stage())
        if meta.get("zero_stage", stage) != stage:
            raise ValueError(f"checkpoint {path!r} was saved with ZeRO stage {meta['zero_stage']} but the "
                             f"engine uses stage {stage}; use tools/export_hf.py to convert weights instead")
        if bool(meta.get("lora", False)) != self.lora:
            raise ValueError(f"checkpoint {path!r} was saved {'with' if meta.get('lora') else 'without'} LoRA "
                             f"adapters but this run trains {'LoRA adapters' if self.lora else 'all weights'}; "
                             "resume with the same actor_rollout_ref.model.lora_rank setting")
        # a LoRA checkpoint holds the trained parameters only: the frozen base comes from the model folder
        load_path, client = self.engine.load_checkpoint(path, tag=None, load_module_strict=not self.lora,
                                                        load_optimizer_states=load_optimizer_states,
                                                        load_lr_scheduler_states=load_lr_scheduler_states)
        if load_path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint in {path!r} (missing 'latest' file?)")
        if load_lr_scheduler_states:  # the first resumed step at this run's schedule (a changed one included)
            rate_at_restored_step(self.engine.lr_scheduler)
        if load_rng:
            rng_file = os.path.join(path, f"rng_rank_{self.rank}.pt")
            if not os.path.isfile(rng_file):
                raise FileNotFoundError(f"RNG file {rng_file!r} is missing")
            restore_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True))
        barrier()
        return dict((client or {}).get(CLIENT_STATE_KEY, meta))

    def _read_meta(self, path: str) -> dict:
        return read_client_state(path)


def optimizer_layout(engine: Any) -> dict:
    """What decides the layout of the optimizer state ``engine`` saves, for its client state: ``optimizer`` (the
    class of the optimizer given to DeepSpeed: ``AdamW``, ``FusedAdam``, ``DeepSpeedCPUAdam``; its param groups are
    saved with that class's keys) and ``precision`` (``bf16`` | ``fp16`` | ``fp32``: DeepSpeed names the ZeRO files
    ``bf16_zero_pp_rank_*`` under bf16 and keeps fp16's loss scaler with the optimizer state)."""
    opt = getattr(engine, "client_optimizer", None)
    out = {"precision": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(engine_dtype(engine), "fp32")}
    if isinstance(opt, torch.optim.Optimizer):
        out["optimizer"] = type(opt).__name__
    return out


def read_client_state(path: str) -> dict:
    """The client state a role folder ``path`` was saved with (``global_step``, ``world_size``, ``zero_stage``,
    ``lora``, and since they are recorded ``optimizer`` and ``precision``: :func:`optimizer_layout`), read from its
    first model-states file (memory-mapped: no optimizer states, no weights copied).

    Raises:
        FileNotFoundError: no ``latest`` tag file, or no ``*model_states.pt`` in the folder it names.
    """
    return dict(read_model_states(path)[1].get(CLIENT_STATE_KEY, {}))


def read_model_states(path: str) -> tuple[str, dict]:
    """The tag folder that the ``latest`` file of the role folder ``path`` names and its first model-states file's
    contents (memory-mapped), which hold the client state and DeepSpeed's ``ds_config``.

    Raises:
        FileNotFoundError: no ``latest`` tag file, or no ``*model_states.pt`` in the folder it names.
    """
    latest = os.path.join(path, "latest")
    if not os.path.isfile(latest):
        raise FileNotFoundError(f"{latest!r} is missing: {path!r} is not a complete DeepSpeed checkpoint")
    with open(latest) as f:
        tag = f.read().strip()
    folder = os.path.join(path, tag)
    names = sorted(n for n in os.listdir(folder) if n.endswith("model_states.pt")) if os.path.isdir(folder) else []
    if not names:
        raise FileNotFoundError(f"no *model_states.pt in {folder!r}")
    return folder, load_deepspeed_file(os.path.join(folder, names[0]), mmap=True)
