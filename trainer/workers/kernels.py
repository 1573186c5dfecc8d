"""Optional fused kernels for every model role (actor, reference, critic, PRM): Liger's Triton kernels and
``torch.compile`` of the decoder layers. Both are off by default and change no math, only how it is run.

Config (``actor_rollout_ref.model``, shared by all roles, as in verl):

* ``use_liger``: Liger-Kernel's RoPE, RMSNorm and SwiGLU for the model's architecture
  (``liger_kernel.transformers.monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN``; its cross-entropy kernels stay off:
  log-probs come from :func:`trainer.forward.log_probs_from_logits`). Needs CUDA (Triton) and
  ``pip install liger-kernel``. Liger swaps transformers' module classes and RoPE function process-wide, so the
  transformers rollout engine built later in the same worker uses its kernels too (same math).
* ``use_torch_compile``: ``torch.compile(dynamic=True)`` of each decoder layer (the attention is traced too, one
  graph per layer; with SP its all-to-alls as torch's functional collectives, see ``patches.ulysses``) and of the
  per-chunk log-prob math
  (:func:`trainer.forward.use_compiled_log_probs`). Not with ZeRO-3, whose parameter hooks run inside the layers.
* ``torch_compile_mode`` (with ``use_torch_compile``): torch.compile's ``mode``. ``default``; ``reduce-overhead``
  records each compiled layer's forward and backward as CUDA graphs, so a replay costs one host call instead of one
  per kernel (the update at 4k-token micro-batches is bound by the host otherwise; docs/benchmarks.md). CUDA graphs
  need fixed shapes, so packed rows are padded to a bucket (multiples of :data:`STATIC_TOKEN_MULTIPLE` tokens, 8
  sizes per doubling, under 1/8 padding; a power-of-two count of sequences; :func:`patches.packing.bucket_padding`)
  and one graph is recorded per bucket; with SP the NCCL
  all-to-alls are recorded inside the layers' graphs (checked against SP=1 on 2 GPUs:
  tests/test_ulysses_graphs_gpu.py). Needs CUDA, DeepSpeed ZeRO stage 2 for training
  (its gradient hooks copy each gradient out of the graphs' memory as it is produced; other stages would
  accumulate into gradients that the next replay overwrites; for a plain training loop see
  :func:`keep_graph_grads`) and no gradient checkpointing. ``max-autotune``: the same with inductor's GEMM
  autotuning (longer compile); ``max-autotune-no-cudagraphs``: autotuning without graphs.
"""
from __future__ import annotations

import importlib.util
import logging
import weakref

logger = logging.getLogger(__name__)

# Liger's kernels used here; its (fused linear) cross-entropy is left off because the trainer needs per-token
# log-probs and entropy at a temperature, not a loss
LIGER_KWARGS = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
# packed rows of a model compiled with CUDA graphs are padded to token buckets of this unit (patches.packing.token_bucket)
STATIC_TOKEN_MULTIPLE = 256


def compile_mode(model_cfg: dict) -> str:
    """``torch_compile_mode`` of ``model_cfg`` (default ``"default"``)."""
    return model_cfg.get("torch_compile_mode") or "default"


def check_kernel_options(model_cfg: dict, device: str, zero_stage: int, key: str = "actor_rollout_ref.model",
                         ds_config: dict | None = None, offload_optimizer: bool = False) -> None:
    """Refuse option combinations that cannot run, before any worker starts.

    Args:
        ds_config: ``deepspeed.ds_config`` (the user's DeepSpeed overrides).
        offload_optimizer: ``deepspeed.offload_optimizer`` (ZeRO-Offload).

    Raises:
        ValueError: ``use_liger`` without CUDA or without liger-kernel installed; both options at once;
            ``use_torch_compile`` with ZeRO stage 3; a non-boolean value; an unknown ``torch_compile_mode``, or a
            CUDA-graph mode without ``use_torch_compile``, without CUDA, a ZeRO stage other
            than 2, ZeRO-Offload, gradient checkpointing, ``use_remove_padding: false`` (no packed rows to bucket), or
            ``contiguous_gradients: false`` in ``ds_config`` (DeepSpeed then keeps the graphs' gradient tensors; the
            next replay overwrites them: seen on an H200).
    """
    for name in ("use_liger", "use_torch_compile"):
        v = model_cfg.get(name, False)
        if not isinstance(v, bool):
            raise ValueError(f"{key}.{name}={v!r}; expected true or false")
    if model_cfg.get("use_liger"):
        if device != "cuda":
            raise ValueError(f"{key}.use_liger=true needs trainer.device=cuda (Liger's kernels are Triton), got "
                             f"{device!r}")
        if importlib.util.find_spec("liger_kernel") is None:
            raise ValueError(f"{key}.use_liger=true but liger-kernel is not installed: pip install liger-kernel")
    if model_cfg.get("use_liger") and model_cfg.get("use_torch_compile"):
        raise ValueError(f"{key}.use_liger=true and {key}.use_torch_compile=true together fail (torch 2.11 + "
                         "liger-kernel 0.8.5 on an H200: dynamo's AssertionError tracing LigerRMSNormFunction); "
                         "turn one of them off")
    mode = compile_mode(model_cfg)
    if mode not in COMPILE_MODES:
        raise ValueError(f"{key}.torch_compile_mode={mode!r}; expected one of {', '.join(COMPILE_MODES)}")
    if mode != "default" and not model_cfg.get("use_torch_compile"):
        raise ValueError(f"{key}.torch_compile_mode={mode} needs {key}.use_torch_compile=true")
    if mode in CUDAGRAPH_MODES:
        _check_cudagraph_mode(mode, model_cfg, device, zero_stage, key, ds_config, offload_optimizer)
    if model_cfg.get("use_torch_compile") and int(zero_stage) == 3:
        raise ValueError(f"{key}.use_torch_compile=true does not work with deepspeed.zero_stage=3 (ZeRO-3 gathers "
                         "parameters in hooks inside the compiled layers); use ZeRO stage <= 2 or turn it off")


def _check_cudagraph_mode(mode: str, model_cfg: dict, device: str, zero_stage: int, key: str, ds_config: dict | None,
                          offload_optimizer: bool) -> None:
    """The settings a CUDA-graph ``torch_compile_mode`` needs (see :func:`check_kernel_options`)."""
    if device != "cuda":
        raise ValueError(f"{key}.torch_compile_mode={mode} records CUDA graphs and needs trainer.device=cuda, got "
                         f"{device!r}")
    if int(zero_stage) != 2:
        raise ValueError(f"{key}.torch_compile_mode={mode} needs ZeRO stage 2 (deepspeed.zero_stage, or "
                         "deepspeed.ds_config.zero_optimization.stage when set; its gradient hooks copy each gradient "
                         f"out of the CUDA graphs' memory; verified on a GPU), got stage {zero_stage}")
    if offload_optimizer:
        raise ValueError(f"{key}.torch_compile_mode={mode} with deepspeed.offload_optimizer=true is not supported "
                         "(ZeRO-Offload copies gradients to the CPU in its hooks; not run with CUDA graphs)")
    contiguous = ((ds_config or {}).get("zero_optimization") or {}).get("contiguous_gradients", True)
    if not contiguous:
        raise ValueError(f"{key}.torch_compile_mode={mode} with deepspeed.ds_config zero_optimization."
                         "contiguous_gradients=false fails (DeepSpeed keeps the gradients that the CUDA graphs' next "
                         "replay overwrites); leave contiguous_gradients on")
    if model_cfg.get("enable_gradient_checkpointing"):
        raise ValueError(f"{key}.torch_compile_mode={mode} with {key}.enable_gradient_checkpointing=true is not "
                         "supported (the recompute would replay graphs inside the backward; not run)")
    rmpad = model_cfg.get("use_remove_padding", True)
    if not bool(rmpad):  # read as ModelRole.build reads it
        # mark_static_shapes needs the packed forward: refused here rather than in every worker after loading
        raise ValueError(f"{key}.torch_compile_mode={mode} needs {key}.use_remove_padding=true (CUDA graphs pad the "
                         f"packed rows to shape buckets; the padded-batch forward has no buckets), got "
                         f"{str(rmpad).lower()}")


def decoder_layers(model) -> list:
    """The decoder layers of a transformers model: the modules whose class name ends in ``DecoderLayer``."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def apply_kernel_options(model, model_cfg: dict) -> list[str]:
    """Apply ``use_liger`` / ``use_torch_compile`` from ``model_cfg`` to ``model`` (in place, before DeepSpeed
    wraps it). Returns the names of what was applied (for the log).

    Raises:
        ValueError: ``use_liger`` for a model type Liger has no kernels for; ``use_torch_compile`` on a model
            without ``*DecoderLayer`` modules; CUDA graphs on a Ulysses SP > 1 model whose all-to-alls are not
            traced (SP size bound only at run time, or a forward without ``**kwargs``), the model left unchanged.
    """
    applied = []
    if model_cfg.get("use_liger"):
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

        model_type = getattr(model.config, "model_type", None)
        fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
        if fn is None:
            raise ValueError(f"use_liger=true: Liger has no kernels for model_type {model_type!r}; supported: "
                             f"{sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)}")
        import inspect

        params = inspect.signature(fn).parameters
        fn(model=model, **{k: v for k, v in LIGER_KWARGS.items() if k in params})
        applied.append(f"liger({model_type})")
    if model_cfg.get("use_torch_compile"):
        import torch

        from patches.patch_info import mark_layers_compiled, patch_info
        from trainer.forward import use_compiled_log_probs

        layers = decoder_layers(model)
        if not layers:
            raise ValueError(f"use_torch_compile=true: no *DecoderLayer modules in {type(model).__name__}")
        mode = compile_mode(model_cfg)
        graphs = mode in CUDAGRAPH_MODES
        info = patch_info(model)
        if graphs and info is not None and info.sp_size > 1 and not info.traceable:
            # the all-to-alls would run eagerly between graph pieces (never run): refused before any layer is wrapped
            raise ValueError(f"torch_compile_mode={mode} with Ulysses SP needs a model patched with a bound SP group "
                             f"whose forward takes **kwargs (the traced all-to-alls); {type(model).__name__} was "
                             f"patched with SP size {info.sp_size} and boundary keyword arguments off")
        for layer in layers:
            # CUDA graphs: shapes start static and become dynamic on the first recompile (one graph per bucket)
            layer.compile(dynamic=None if graphs else True, mode=None if mode == "default" else mode)
        if info is not None:  # SP: the traced all-to-alls
            mark_layers_compiled(model)
        if graphs:
            mark_static_shapes(model, STATIC_TOKEN_MULTIPLE)
        use_compiled_log_probs(True)
        applied.append(f"torch.compile({len(layers)} layers, mode {mode}, log-probs, torch {torch.__version__})")
    if applied:
        logger.info("fused kernels: %s", ", ".join(applied))
    return applied


def mark_static_shapes(model, token_multiple: int) -> None:
    """Ask :func:`trainer.forward.forward_log_probs` / ``forward_values`` to pad ``model``'s host-packed rows to a
    bucket (``token_multiple`` tokens, a power-of-two count of sequences) and to mark a new CUDA-graph step before
    each forward (``torch.compiler.cudagraph_mark_step_begin``).

    Raises:
        ValueError: a model not patched by :func:`patches.ulysses.apply_ulysses_patch` (no packed forward), or
            ``token_multiple < 1``.
    """
    from patches.patch_info import patch_info, set_static_shapes

    if patch_info(model) is None:
        raise ValueError("CUDA-graph compile needs the packed forward (use_remove_padding=true, a model patched by "
                         "patches.ulysses.apply_ulysses_patch)")
    set_static_shapes(model, token_multiple)  # raises for token_multiple < 1


def keep_graph_grads(model) -> int:
    """Make gradient accumulation safe for a model compiled with CUDA graphs in a training loop without DeepSpeed
    (``torch.optim`` + ``loss.backward()`` over several micro-batches).

    When a parameter has no gradient yet, autograd adopts the backward graph's output tensor as ``param.grad``; that
    memory belongs to the CUDA graph and is overwritten by its next replay (torch raises "accessing tensor output of
    CUDAGraphs that has been overwritten"). A post-accumulate-grad hook on every trainable parameter replaces such
    an adopted gradient with a copy, once per fresh gradient (after ``zero_grad``), not per micro-batch.

    Returns:
        the number of parameters hooked.
    """
    def own(p):
        owned = getattr(p, "_owned_grad", None)
        if p.grad is not None and (owned is None or owned() is not p.grad):
            p.grad = p.grad.clone()
            p._owned_grad = weakref.ref(p.grad)

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.register_post_accumulate_grad_hook(own)
    return len(params)


def warm_compile_pool(use_torch_compile: bool, rollout_cfg, device_type: str) -> bool:
    """Start inductor's pool of compile worker processes now when this worker will compile on CUDA: the update and
    reference with ``use_torch_compile`` (``actor_rollout_ref.model``), or the transformers engine's decoding
    (``rollout_cfg``: a :class:`trainer.config.rollout.RolloutConfig`) with its static cache (on by default
    on CUDA; both of its decode loops compile). torch starts the pool only at the first compilation and, until its
    processes are up, compiles the Triton kernels one after another in the calling process; started at the
    worker's start, the pool is ready by the first step. Returns whether the pool was started (False off CUDA,
    without compilation, or where torch lacks the call: ``torch._inductor.async_compile.maybe_warm_pool``, which
    honours ``TORCH_WARM_POOL=0``)."""
    from rollout.generation_config import static_cache_on

    engine_compiles = rollout_cfg.name == "hf" and static_cache_on(rollout_cfg.static_cache, True)
    if device_type != "cuda" or not (use_torch_compile or engine_compiles):
        return False
    try:
        from torch._inductor.async_compile import maybe_warm_pool
    except ImportError:
        return False
    maybe_warm_pool()
    return True

