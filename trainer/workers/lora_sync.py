"""Moving a LoRA actor's weights into its rollout engine (``actor_rollout_ref.rollout.lora_sync``).

* ``merged`` (both engines): the engine holds the merged weights ``W + (alpha / r) B A``
  (:func:`trainer.workers.lora.iter_merged_params`, bucketed, ZeRO-3 gathered per bucket). The first sync (and every
  sync after a ``sleep_level=2`` sleep, which discards the engine's weights) sends every tensor; later ones send only
  the tensors that training changes (the adapted layers' merged weights, trainable heads).
* ``adapter`` (vLLM, created with ``enable_lora``): the engine holds the frozen base weights, sent as above, and
  serves every request with the current adapter: after each step the adapter is written as a peft folder and
  handed to the engine as a new ``vllm.lora.request.LoRARequest`` (``VLLMRolloutEngine.load_lora_adapter``).

Either way the sync runs inside ``rollout.context.rollout_mode``, whose ``timing_log`` gives its seconds
(``perf/rollout_s/weights_synced``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

from trainer.workers.lora import NamedTensor, iter_merged_params
from trainer.workers.lora_adapter import save_adapter

LORA_SYNC_MODES = ("merged", "adapter")

#: the ranks vLLM's LoRA kernels are built for (``vllm.config.lora.MaxLoRARanks``); max_lora_rank is rounded up to one
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_kwargs(lora_rank: int) -> dict:
    """``vllm.LLM`` arguments of the ``adapter`` sync: ``enable_lora``, one adapter at a time (``max_loras=1``) and
    ``max_lora_rank`` rounded up to a rank vLLM supports.

    Raises:
        ValueError: ``lora_rank`` above vLLM's largest (512) or not positive.
    """
    if lora_rank <= 0 or lora_rank > VLLM_MAX_LORA_RANKS[-1]:
        raise ValueError(f"lora_rank={lora_rank}: vLLM's LoRA serves ranks 1..{VLLM_MAX_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_loras": 1,
            "max_lora_rank": next(r for r in VLLM_MAX_LORA_RANKS if r >= lora_rank)}


class LoraWeightSync:
    """The weight source of ``rollout_mode`` for a LoRA actor; one per worker, it remembers what the engine holds.

    Args:
        module: the actor's ``peft.PeftModel`` (``ds_engine.module``).
        engine: the rollout engine (``adapter`` mode: one with ``load_lora_adapter``).
        zero_stage: the actor's ZeRO stage (3: each bucket is gathered).
        mode: ``merged`` or ``adapter`` (see the module docstring).
        sleep_level: the engine's sleep level; 2 discards its weights, so every sync sends all of them.
        base_model_path: recorded in the adapter folder's ``adapter_config.json``.

    Raises:
        ValueError: an unknown ``mode``, or ``adapter`` with an engine that cannot load adapters.
    """

    def __init__(self, module, engine, zero_stage: int, mode: str = "merged", sleep_level: int = 1,
                 base_model_path: str | None = None):
        if mode not in LORA_SYNC_MODES:
            raise ValueError(f"lora_sync={mode!r}; expected one of {LORA_SYNC_MODES}")
        if mode == "adapter" and not hasattr(engine, "load_lora_adapter"):
            raise ValueError(f"lora_sync=adapter needs an engine that serves LoRA adapters (vLLM); "
                             f"{type(engine).__name__} has no load_lora_adapter")
        self.module, self.engine, self.zero_stage, self.mode = module, engine, int(zero_stage), mode
        self.sleep_level, self.base_model_path = int(sleep_level), base_model_path
        self.engine_has_base = False  # the engine holds every tensor that training does not change
        self._adapter_root: str | None = None
        self.adapter_dir: str | None = None  # the folder of the adapter the engine serves
        self._version = 0

    def named_params(self, bucket_bytes: int) -> Iterator[list[NamedTensor]]:
        """Buckets of ``(hf_name, tensor)`` for ``rollout.context.sync_weights``; in ``adapter`` mode, once they are
        consumed, the adapter is written and given to the engine. Consume each bucket before asking for the next."""
        full = not self.engine_has_base or self.sleep_level >= 2
        merged = self.mode == "merged"
        if full or merged:
            yield from iter_merged_params(self.module, self.zero_stage, bucket_bytes, changed_only=not full,
                                          merge=merged)
        if not merged:
            self.engine.load_lora_adapter(self._write_adapter())
        self.engine_has_base = True

    def _write_adapter(self) -> str:
        """The current adapter as a new peft folder under this worker's temporary folder (every rank writes its own:
        each serves its own engine); the previous folder is removed."""
        if self._adapter_root is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self._adapter_root = tempfile.mkdtemp(prefix="dsrl_lora_", dir=shm)
        self._version += 1
        path = os.path.join(self._adapter_root, f"v{self._version}")
        save_adapter(self.module, path, self.zero_stage, rank=0, base_model_path=self.base_model_path)
        old, self.adapter_dir = self.adapter_dir, path
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def close(self) -> None:
        """Remove the adapter folders."""
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
            self._adapter_root = self.adapter_dir = None
