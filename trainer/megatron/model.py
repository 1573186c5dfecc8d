"""Build a megatron-core GPTModel (local layer spec) from an HF config, load HF weights, and run log-probs.

Needs megatron-core (``pip install -e .[megatron]``) and an initialised ``megatron.core.parallel_state``
(:func:`init_megatron_parallel`). No Transformer Engine and no apex: the local spec
(``get_gpt_layer_local_spec``) uses megatron's own ColumnParallel/RowParallel linears and RMSNorm.

CPU (tests only): megatron-core assumes CUDA in three places of the forward (RoPE moves ``inv_freq`` to
``torch.cuda.current_device()``; attention takes its score buffer from ``GlobalMemoryBuffer`` on the current
CUDA device and forks the CUDA RNG tracker). :func:`install_cpu_compat` patches exactly those when CUDA is absent; it is a no-op on GPU machines. Megatron's DDP and distributed
optimizer allocate CUDA buffers and are GPU-only (measured with megatron-core 0.16.1, see patches/README.md).

Positions: megatron-core's GPTModel applies RoPE to positions ``0..L-1`` of each row and ignores
``position_ids``. Our batches are left-padded prompts + right-padded responses, so :func:`left_align` shifts
each row's valid tokens to column 0 before the forward (then positions equal HF's ``cumsum(mask) - 1``) and
the results are shifted back.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any

import torch

from trainer.megatron.config import build_transformer_config, model_shape
from trainer.megatron.weights import hf_to_mcore

logger = logging.getLogger(__name__)
_CPU_COMPAT = False


def megatron_available() -> tuple[bool, str]:
    """``(True, version)`` when megatron-core imports, else ``(False, reason)``."""
    try:
        import megatron.core as mc

        return True, str(getattr(mc, "__version__", "unknown"))
    except Exception as e:  # ImportError or a broken install
        return False, f"megatron-core is not importable: {type(e).__name__}: {e}"


def run_with_cpu_as_current_device(fn):
    """Wrap ``fn`` so that ``torch.cuda.current_device()`` returns ``"cpu"`` while it runs (CPU tests only)."""
    from unittest import mock

    def wrapped(*args, **kwargs):
        with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"):
            return fn(*args, **kwargs)
    return wrapped


def install_cpu_compat() -> None:
    """Let megatron-core's local-spec GPT forward run without CUDA (idempotent; no-op when CUDA exists).

    Patches ``RotaryEmbedding.get_emb`` and ``GlobalMemoryBuffer.get_tensor`` (CPU tensors) and the RNG tracker's CUDA state get/set
    (CPU generator instead), and adds the ``model-parallel-rng`` tracker state if missing.
    """
    global _CPU_COMPAT
    if _CPU_COMPAT or torch.cuda.is_available():
        return
    import megatron.core.tensor_parallel.random as mrand
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from megatron.core.utils import GlobalMemoryBuffer

    on_cpu = run_with_cpu_as_current_device
    RotaryEmbedding.get_emb = on_cpu(RotaryEmbedding.get_emb)
    GlobalMemoryBuffer.get_tensor = on_cpu(GlobalMemoryBuffer.get_tensor)
    mrand._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrand._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    tracker = mrand.get_cuda_rng_tracker()
    name = getattr(mrand, "_MODEL_PARALLEL_RNG_TRACKER_NAME", "model-parallel-rng")
    if name not in tracker.get_states():
        tracker.set_states({**tracker.get_states(), name: torch.get_rng_state()})
    _CPU_COMPAT = True


def init_megatron_parallel(tp_size: int = 1, pp_size: int = 1, seed: int = 1234, cp_size: int = 1) -> None:
    """Initialise ``torch.distributed`` (from env, gloo on CPU / nccl on GPU) and megatron's parallel state with
    ``tp_size`` x ``pp_size`` x ``cp_size`` (context parallel) model-parallel ranks.

    Also seeds megatron's tensor-parallel RNG tracker on GPU (``model_parallel_cuda_manual_seed``).

    Raises:
        ValueError: ``world_size`` is not divisible by ``tp_size * pp_size * cp_size``.
    """
    from megatron.core import parallel_state as ps

    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend)
    world = torch.distributed.get_world_size()
    if world % (tp_size * pp_size * cp_size):
        raise ValueError(f"world_size={world} is not divisible by tp*pp*cp={tp_size}*{pp_size}*{cp_size}")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=pp_size,
                                     context_parallel_size=cp_size)
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
    else:
        torch.manual_seed(seed)
        install_cpu_compat()


def build_gpt_model(hf_config: Any, params_dtype: torch.dtype = torch.float32, pre_process: bool | None = None,
                    post_process: bool | None = None, parallel_output: bool = False):
    """A megatron-core ``GPTModel`` for ``hf_config`` on this rank's (tp, pp) position (random init).

    TP/PP sizes come from the initialised parallel state. ``parallel_output=False`` gathers logits over TP,
    so callers see ``(batch, seq, padded_vocab)``.

    Returns:
        ``(model, transformer_config, shape)``.
    Raises:
        ValueError: unsupported config (see ``trainer.megatron.config``).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    cfg, gm = build_transformer_config(hf_config, tp_size=tp, pp_size=pp, params_dtype=params_dtype,
                                       use_cpu_initialization=not torch.cuda.is_available())
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=False)
    pre = ps.is_pipeline_first_stage() if pre_process is None else pre_process
    post = ps.is_pipeline_last_stage() if post_process is None else post_process
    model = GPTModel(config=cfg, transformer_layer_spec=spec, pre_process=pre, post_process=post,
                     parallel_output=parallel_output, **gm)
    if torch.cuda.is_available():
        model = model.cuda()
    return model, cfg, model_shape(hf_config, tp, pp)


def match_hf_padding_idx(model: torch.nn.Module, pad_token_id: int | None) -> None:
    """Give the megatron-core embedding the HF embedding's ``padding_idx`` rule: a position whose input id is
    ``pad_token_id`` sends no gradient into the embedding table (``torch.nn.Embedding(padding_idx=...)``, which the
    HF Llama/Qwen2/Mistral models build with ``config.pad_token_id``). Without it a sampled pad token trained the pad
    row on this path and not on the DeepSpeed path, so the two gave different gradients for one batch. The forward
    values are unchanged; a tied output layer still trains the row, as in HF.

    Args:
        model: a ``GPTModel`` (unwrapped) built by :func:`build_gpt_model`; a stage without the embedding is left
            as it is.
        pad_token_id: the HF config's ``pad_token_id``; None leaves the model as it is.
    """
    emb = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    if emb is None or pad_token_id is None:
        return

    def hook(module, args, output):
        ids = args[0]  # (batch, seq) token ids; output (batch, seq, hidden)
        if output.requires_grad and ids.shape == output.shape[:-1]:
            return torch.where((ids == pad_token_id).unsqueeze(-1), output.detach(), output)
        return output

    emb.register_forward_hook(hook)


def load_hf_weights(model: torch.nn.Module, hf_state: dict[str, torch.Tensor], shape) -> None:
    """Copy a full HF state dict into this rank's megatron-core ``model`` (converted and sharded).

    Raises:
        RuntimeError: the converted names do not match the model's parameters (names the differences).
    """
    from megatron.core import parallel_state as ps

    local = hf_to_mcore(hf_state, shape, ps.get_tensor_model_parallel_world_size(),
                        ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size(),
                        ps.get_pipeline_model_parallel_rank())
    params = dict(model.named_parameters())
    missing, unexpected = sorted(set(params) - set(local)), sorted(set(local) - set(params))
    if missing or unexpected:
        raise RuntimeError(f"HF->megatron conversion mismatch: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != local[name].shape:
                raise RuntimeError(f"{name}: converted shape {tuple(local[name].shape)} != model {tuple(p.shape)}")
            p.copy_(local[name].to(p.dtype))


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift each row so its first valid token is column 0; returns ``(aligned_ids, shifts)``.

    Args: ``input_ids``/``attention_mask`` ``(B, L)``; valid tokens must be contiguous in each row.
    Returns: ``aligned_ids`` ``(B, L)`` and ``shifts`` ``(B,)`` int64 (leading pads of each row).
    Raises: ValueError when a row's valid tokens are not contiguous.
    """
    mask = attention_mask.bool()
    shifts = (~mask).long().cumprod(dim=1).sum(dim=1)
    n = mask.sum(dim=1)
    cols = torch.arange(mask.shape[1], device=mask.device)
    expect = (cols[None] >= shifts[:, None]) & (cols[None] < (shifts + n)[:, None])
    if not torch.equal(expect, mask):
        raise ValueError("attention_mask rows must hold one contiguous run of valid tokens")
    idx = (cols[None] + shifts[:, None]) % mask.shape[1]
    return input_ids.gather(1, idx), shifts


def mcore_causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """Megatron attention mask ``(B, 1, L, L)`` bool, True = masked, from key validity ``(B, L)``."""
    L = valid.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=valid.device).tril()
    return ~(causal[None] & valid.bool()[:, None, :])[:, None]


def forward_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   vocab_size: int) -> torch.Tensor:
    """Logits ``(B, L, vocab_size)`` (model dtype) aligned with ``input_ids`` columns (pp=1 only).

    Left padding is handled by :func:`left_align`; padded vocab columns are dropped. Logits at padded
    columns are meaningless.
    """
    aligned, shifts = left_align(input_ids, attention_mask)
    valid = torch.arange(input_ids.shape[1], device=input_ids.device)[None] < attention_mask.sum(1, keepdim=True)
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
    logits = model(input_ids=aligned, position_ids=pos, attention_mask=mcore_causal_mask(valid))
    logits = logits[..., :vocab_size]
    L = input_ids.shape[1]
    back = (torch.arange(L, device=input_ids.device)[None] - shifts[:, None]) % L
    return logits.gather(1, back[..., None].expand(-1, -1, logits.shape[-1]))


def response_log_probs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       response_length: int, vocab_size: int, temperature: float = 1.0,
                       calculate_entropy: bool = False):
    """Log-probs ``(B, R)`` float32 (and entropy ``(B, R)`` or None) of the last ``R`` columns.

    Same convention as ``trainer/forward.py``: response token at column ``L-R+j`` is scored by the logits at
    column ``L-R+j-1``; ``trainer.forward.log_probs_from_logits`` does the float32 math.
    """
    from trainer.forward import log_probs_from_logits

    logits = forward_logits(model, input_ids, attention_mask, vocab_size)
    R = int(response_length)
    if not 0 < R < input_ids.shape[1]:
        raise ValueError(f"response_length={R} must be in (0, {input_ids.shape[1]})")
    z = logits[:, -R - 1:-1].reshape(-1, logits.shape[-1])
    lp, ent = log_probs_from_logits(z, input_ids[:, -R:].reshape(-1), temperature, calculate_entropy)
    B = input_ids.shape[0]
    return lp.view(B, R), (ent.view(B, R) if ent is not None else None)


@contextmanager
def single_process_group(port: int = 29533):
    """A gloo process group of world size 1 + megatron parallel state tp=pp=1 (tests, CPU tools)."""
    from megatron.core import parallel_state as ps

    created = not torch.distributed.is_initialized()
    if created:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        init_megatron_parallel(1, 1)
        yield
    finally:
        if created:
            ps.destroy_model_parallel()
            torch.distributed.destroy_process_group()
