"""Move the actor's weights into a sleeping rollout engine and back to sleep, with the empty_cache discipline.

Order (verl's, from its issues #987 and #575):
enter: [offload_fn] -> empty_cache -> wake_up(["weights"]) -> load_weights per bucket -> free temporaries
       -> empty_cache -> wake_up(["kv_cache"])
exit:  sleep(level) -> empty_cache -> [reload_fn]
The KV cache is woken only after the weight-transfer temporaries are freed (this fixed OOM for 72B on 8xH800).
The cache is returned to the driver only for an engine with an allocator of its own (vLLM): the transformers
engine allocates from PyTorch's caching allocator (``uses_torch_allocator``), which reuses the trainer's freed
blocks as they are and frees its cache by itself before an allocation would fail. With ``share_weights`` the
engine runs on the trainer's own tensors (``engine.share_weights``) instead of the bucketed copy.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterable, Iterator

import torch

from rollout import memory
from rollout.base import RolloutEngine

NamedTensor = tuple[str, torch.Tensor]


def _nbytes(p: torch.Tensor) -> int:
    numel = getattr(p, "ds_numel", None)  # ZeRO-3 partitioned parameters keep their full size here
    return int(numel if numel is not None else p.numel()) * p.element_size()


def _is_bucket(item) -> bool:
    return isinstance(item, list)


def bucket_named_tensors(pairs: Iterable, bucket_bytes: int) -> Iterator[list[NamedTensor]]:
    """Group ``(name, tensor)`` pairs greedily into lists of at most ``bucket_bytes`` (a bigger tensor stands
    alone); items that are already lists (buckets from :func:`iter_actor_params`) are passed through."""
    bucket: list[NamedTensor] = []
    size = 0
    for item in pairs:
        if _is_bucket(item):
            if bucket:
                yield bucket
                bucket, size = [], 0
            yield item
            continue
        name, tensor = item
        nb = _nbytes(tensor)
        if bucket and size + nb > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nb
    if bucket:
        yield bucket


def sync_weights(engine: RolloutEngine, named_params: Iterable, bucket_bytes: int) -> int:
    """Stream weights into ``engine`` with one ``load_weights`` call per bucket, then ``engine.weights_updated()``
    once (cached state from the old weights is dropped); returns the number of ``load_weights`` calls.

    Args:
        engine: the rollout engine (awake for "weights").
        named_params: ``(hf_name, full_tensor)`` pairs, or buckets (lists of pairs) as yielded by
            :func:`iter_actor_params` - a bucket is loaded while its gather context is still open.
        bucket_bytes: max bytes per ``load_weights`` call (> 0) when pairs are grouped here.

    Raises:
        ValueError: ``bucket_bytes`` <= 0.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    calls = 0
    for bucket in bucket_named_tensors(named_params, bucket_bytes):
        engine.load_weights(bucket)
        calls += 1
        del bucket
    updated = getattr(engine, "weights_updated", None)  # engines not derived from RolloutEngine may lack it
    if updated is not None:
        updated()
    return calls


@contextlib.contextmanager
def rollout_mode(engine: RolloutEngine, named_params_fn: Callable[[], Iterable], bucket_bytes: int,
                 offload_fn: Callable[[], None] | None = None, reload_fn: Callable[[], None] | None = None,
                 sleep_level: int = 1, memory_log: dict | None = None, timing_log: dict | None = None,
                 share_weights: bool = False):
    """Context in which ``engine`` holds the actor's current weights and may generate.

    Args:
        engine: a sleeping :class:`~rollout.base.RolloutEngine`.
        named_params_fn: called once on entry; returns ``(hf_name, full_tensor)`` pairs or buckets of them
            (e.g. ``lambda: iter_actor_params(ds_engine.module, zero_stage, bucket_bytes)``).
        bucket_bytes: max bytes per ``load_weights`` call.
        offload_fn: optional, called first on entry (e.g. ``lambda: offload_optimizer_states(ds_engine)``).
        reload_fn: optional, called last on exit (e.g. ``lambda: reload_optimizer_states(ds_engine)``).
        sleep_level: 1 keeps weights in CPU memory, 2 discards them (they are overwritten by the next sync).
        memory_log: optional dict that receives the GPU memory in use (GiB, every allocator of the process, from
            ``cudaMemGetInfo``) after each stage: ``before_wake``, ``weights_awake``, ``weights_synced``,
            ``kv_awake``, ``generated``, ``asleep`` (nothing is recorded without CUDA).
        timing_log: optional dict that receives the seconds of each stage, keyed as above by the state it ends in
            (``before_wake``: optimizer offload and cache release; ``weights_awake``: waking the weights;
            ``weights_synced``: the bucketed weight sync; ``kv_awake``: waking the KV cache; ``generated``: the
            body of the ``with`` block; ``asleep``: sleep and cache release).
        share_weights: hand the pairs to ``engine.share_weights`` in one call instead of copying them (an engine
            with ``can_share_weights``; the trainer's tensors must stay alive and in place).

    Yields:
        the engine. On exit (also on error, a failed wake-up included) the engine is put to sleep, the cache
        emptied and ``reload_fn`` called (also when the sleep fails).
    """
    log = _StageLog(memory_log, timing_log)
    release = not getattr(engine, "uses_torch_allocator", False)  # only an engine with an allocator of its own
    if offload_fn is not None:
        offload_fn()
    try:  # a wake-up that fails (out of memory) still ends asleep, with the cache emptied and the optimizer back
        if release:
            memory.empty_cache()
        log("before_wake")
        engine.wake_up(tags=["weights"])
        log("weights_awake")
        params = named_params_fn()
        if share_weights:
            engine.share_weights([pair for bucket in bucket_named_tensors(params, bucket_bytes) for pair in bucket])
            getattr(engine, "weights_updated", lambda: None)()
        else:
            sync_weights(engine, params, bucket_bytes)
        del params
        if release:
            memory.empty_cache()
        log("weights_synced")
        engine.wake_up(tags=["kv_cache"])
        log("kv_awake")
        yield engine
        log("generated")
    finally:
        _put_to_sleep(engine, sleep_level, release, log, reload_fn)


def _put_to_sleep(engine: RolloutEngine, level: int, release: bool, log, reload_fn) -> None:
    """The end of :func:`rollout_mode`: sleep, the cache emptied (``release``), then ``reload_fn``, which runs
    even when the sleep fails."""
    try:
        engine.sleep(level=level)
        if release:
            memory.empty_cache()
        log("asleep")
    finally:
        if reload_fn is not None:
            reload_fn()


class _StageLog:
    """Records, at each stage of :func:`rollout_mode`, the GPU memory in use and the seconds since the last stage."""

    def __init__(self, memory_log: dict | None, timing_log: dict | None):
        self.memory_log, self.timing_log = memory_log, timing_log
        self.t = time.perf_counter()

    def __call__(self, stage: str) -> None:
        if self.memory_log is not None:
            memory.record_device_used(self.memory_log, stage)
        if self.timing_log is not None:
            now = time.perf_counter()
            self.timing_log[stage] = now - self.t
            self.t = now


def iter_actor_params(module: torch.nn.Module, zero_stage: int = 0, bucket_bytes: int = 512 * 2**20,
                      ) -> Iterator[list[NamedTensor]]:
    """Yield the actor's full parameters as buckets: lists of ``(hf_name, full_tensor)`` of at most
    ``bucket_bytes`` each (a larger tensor forms its own bucket).

    With ZeRO-3, each bucket is gathered by ONE ``deepspeed.zero.GatheredParameters(list_of_params)`` (not one
    gather per tensor) and the tensors are valid only until the next bucket is requested, so consume (copy) each
    bucket before asking for the next - :func:`sync_weights` does. ZeRO-0/1/2 keep full parameters on every rank.
    Names come from ``module.named_parameters()`` (pass the DeepSpeed engine's ``.module``, the HF model);
    tied weights are yielded once.

    Args:
        module: the HF model (``ds_engine.module``).
        zero_stage: 0-3.
        bucket_bytes: max bytes per bucket (> 0).

    Raises:
        ValueError: zero_stage not in 0..3 or ``bucket_bytes`` <= 0.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    gather = None
    if zero_stage == 3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters
    for bucket in bucket_named_tensors(module.named_parameters(), bucket_bytes):
        if gather is None:
            yield [(n, p.detach()) for n, p in bucket]
        else:
            with gather([p for _, p in bucket]):
                yield [(n, p.data) for n, p in bucket]


# ---- DeepSpeed optimizer-state offload while generating ------------------------------------------------------
def _offload_include():
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as S

    # lp_params (the bf16 weights) stay resident: the sync reads them and generation is short.
    return [S.optim_states, S.hp_params, S.contiguous_grad_buffer, S.lp_grads]


def _check_offloadable(ds_engine) -> None:
    stage = int(ds_engine.zero_optimization_stage())
    if stage not in (1, 2, 3):
        raise ValueError(f"optimizer-state offload needs ZeRO stage 1, 2 or 3 (DeepSpeed's offload_states API); "
                         f"this engine uses stage {stage}. Set rollout offload off or use ZeRO >= 1.")


def offload_optimizer_states(ds_engine, non_blocking: bool = True) -> None:
    """Move a DeepSpeed engine's optimizer states, fp32 master weights and grad buffers to pinned CPU memory.

    Uses ``DeepSpeedEngine.offload_states(include, device=cpu, pin_memory=True, non_blocking)``, which DeepSpeed 0.19
    implements for ZeRO-3 (``stage3.py``) and ZeRO-1/2 (``stage_1_and_2.py``, DeepSpeed PR #7421). No-op when the
    engine is on CPU. Raises ValueError for ZeRO-0 (no such API there).
    """
    _check_offloadable(ds_engine)
    if torch.device(ds_engine.device).type == "cpu":
        return
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    ds_engine.offload_states(include=_offload_include(), device=OffloadDeviceEnum.cpu, pin_memory=True,
                             non_blocking=non_blocking)


def reload_optimizer_states(ds_engine, non_blocking: bool = False) -> None:
    """Inverse of :func:`offload_optimizer_states` (``DeepSpeedEngine.reload_states``); no-op on CPU."""
    _check_offloadable(ds_engine)
    if torch.device(ds_engine.device).type == "cpu":
        return
    ds_engine.reload_states(non_blocking=non_blocking)
