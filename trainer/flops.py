"""Model FLOPs of a dense decoder and the FLOPs utilisation (MFU) of a timed update (verl's ``flops_counter``
counts the same terms)."""
from __future__ import annotations

from typing import Sequence

__all__ = ["flops_per_token", "compute_mfu"]

_UNGATED_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi"}


def _arch(cfg) -> tuple[float, int, int, int]:
    """(dense matmul params N, layers, attention heads, head_dim) of a decoder-only HF config."""
    g = lambda *names, default=None: next((getattr(cfg, n) for n in names if getattr(cfg, n, None) is not None),
                                          default)
    h, layers = g("hidden_size", "n_embd"), g("num_hidden_layers", "n_layer")
    heads, vocab = g("num_attention_heads", "n_head"), g("vocab_size")
    if None in (h, layers, heads, vocab):
        raise ValueError("config lacks hidden_size/num_hidden_layers/num_attention_heads/vocab_size")
    kv = g("num_key_value_heads", default=heads)
    d = g("head_dim", default=h // heads)
    inter = g("intermediate_size", "n_inner", default=4 * h)
    n_mlp = (2 if getattr(cfg, "model_type", "") in _UNGATED_MLP else 3) * h * inter
    n_attn = h * d * (heads + 2 * kv) + heads * d * h  # q, k, v, o projections
    return float(layers * (n_mlp + n_attn) + vocab * h), int(layers), int(heads), int(d)  # + lm head


def flops_per_token(hf_config, seqlen: int) -> float:
    """Training FLOPs (forward + backward) per token of a sequence of ``seqlen`` tokens, dense decoder:
    ``6 * N + 12 * n_layers * n_heads * head_dim * seqlen`` (PaLM, Chowdhery et al. 2022, arXiv:2204.02311,
    appendix B; the attention term ignores causal masking, as verl's ``flops_counter`` does). ``N`` counts the
    matmul parameters: q/k/v/o projections (GQA-aware), the MLP (3 matrices if gated, 2 for GPT-2-style), and the
    LM head; the embedding lookup is not a matmul. MoE models are not modelled."""
    n, layers, heads, d = _arch(hf_config)
    return 6.0 * n + 12.0 * layers * heads * d * seqlen


def compute_mfu(hf_config, num_tokens: int, seqlens: Sequence[int], seconds: float, n_gpus: int,
                peak_flops: float) -> float:
    """Model FLOPs utilisation: ``(6*N*num_tokens + 12*L*H*d*sum(s^2)) / (seconds * n_gpus * peak_flops)``.

    Args:
        num_tokens: tokens processed (e.g. ``sum(seqlens) * ppo_epochs``); seqlens: per-sequence lengths;
        peak_flops: peak FLOP/s of one GPU (e.g. 989e12 for H100/H200 dense bf16).
    Raises:
        ValueError: non-positive ``seconds``, ``n_gpus`` or ``peak_flops``.
    """
    if seconds <= 0 or n_gpus < 1 or peak_flops <= 0:
        raise ValueError(f"need seconds > 0, n_gpus >= 1, peak_flops > 0; got {seconds}, {n_gpus}, {peak_flops}")
    n, layers, heads, d = _arch(hf_config)
    flops = 6.0 * n * num_tokens + 12.0 * layers * heads * d * float(sum(int(s) ** 2 for s in seqlens))
    return flops / (seconds * n_gpus * peak_flops)
