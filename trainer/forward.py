"""Log-probs, entropy and critic values of the batches the actor, ref, critic and PRM workers run.

Batch layout (see ``trainer/protocol.py``): ``input_ids = cat(prompts, responses)`` of shape ``(B, L)``, prompts
left-padded, responses right-padded, the response occupying the last ``R`` columns; ``position_ids =
clamp(cumsum(attention_mask) - 1, min=0)``. The log-prob of response token ``j`` (column ``L-R+j``) comes from the
logits at column ``L-R+j-1``, so results are the ``[:, -R-1:-1]`` columns of the per-position "next-token" values.

Packed path (``use_remove_padding=True``), per micro-batch (verl ``dp_actor._forward_micro_batch``): the packing,
the Ulysses SP slice and the gather are ``patches.packed_forward``'s (``pack_batch`` -> ``sp_forward`` ->
``PackedBatch.gather``); here: log-probs/entropy of the local chunk's logits against the packed row's next-token
labels (logits are never gathered), or the value head's outputs, then the response columns of the gathered
``(B, L)`` values.

Value head (critic / PRM value): ``AutoModelForTokenClassification`` with ``num_labels=1`` (and
``classifier_dropout=0.0``): a stock transformers class (Llama/Qwen2/Qwen3/Mistral ``...ForTokenClassification``),
so ``save_pretrained`` / ``from_pretrained`` round-trip it and the ``score`` Linear(hidden, 1) is exported as is.
"""
from __future__ import annotations

import torch

from patches.host import host_op_threads, to_device  # noqa: F401 (re-exported: the workers' host-to-device copy)
from patches.packed_forward import check_batch, pack_batch, resolve_sp_group, sp_forward
from patches.sequence_parallel import UlyssesGroup

__all__ = ["forward_log_probs", "forward_values", "log_probs_from_logits", "use_compiled_log_probs", "to_device",
           "host_op_threads"]


def _lp_forward_chunk(x: torch.Tensor, labels: torch.Tensor, inv_t: float, want_entropy: bool,
                      want_sum_sq: bool = False):
    """Float32 ``(log_prob, entropy or empty, lse, sum of p^2 or empty)`` of one ``(n, V)`` chunk (no autograd)."""
    z = x.float() * inv_t
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    empty = lse.new_zeros(0)
    if not (want_entropy or want_sum_sq):
        return lp, empty, lse, empty
    p = torch.exp(z - lse.unsqueeze(-1))
    ent = lse - (p * z).sum(-1) if want_entropy else empty
    return lp, ent, lse, ((p * p).sum(-1) if want_sum_sq else empty)


def _lp_backward_chunk(x: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor,
                       g_lp: torch.Tensor, g_ent: torch.Tensor, inv_t: float, want_entropy: bool) -> torch.Tensor:
    """Gradient w.r.t. one ``(n, V)`` chunk of logits, in the logits' dtype (no autograd).

    With ``z = x / T``, ``p = softmax(z)``, ``E = sum(p z) = lse - H``:
    ``d lp / d z = onehot(label) - p`` and ``d H / d z = p (E - z)``; ``d / d x = (d / d z) / T``.
    """
    z = x.float() * inv_t
    p = torch.exp(z - lse.unsqueeze(-1))
    grad = -p * g_lp.unsqueeze(-1)
    if want_entropy:
        e = (lse - ent).unsqueeze(-1)
        grad = grad + g_ent.unsqueeze(-1) * p * (e - z)
    grad = grad.scatter_add(-1, labels.unsqueeze(-1), g_lp.unsqueeze(-1))
    return (grad * inv_t).to(x.dtype)


_KERNELS = {"forward": _lp_forward_chunk, "backward": _lp_backward_chunk}


def use_compiled_log_probs(enable: bool = True) -> None:
    """Run the per-chunk log-prob math of :func:`log_probs_from_logits` through ``torch.compile`` (one fused kernel
    per pass instead of several elementwise passes over the ``(chunk, V)`` logits), or back to eager.

    Process-wide; the compiled functions have no autograd (the backward is written by hand), so compiling them is
    safe under DeepSpeed and Ulysses. Shapes are dynamic (``dynamic=True``) so every chunk length reuses one graph.
    """
    if enable:
        _KERNELS["forward"] = torch.compile(_lp_forward_chunk, dynamic=True)
        _KERNELS["backward"] = torch.compile(_lp_backward_chunk, dynamic=True)
    else:
        _KERNELS["forward"], _KERNELS["backward"] = _lp_forward_chunk, _lp_backward_chunk


class _ChunkedLogProbs(torch.autograd.Function):
    """Log-probs and entropy of ``(N, V)`` logits in float32 chunks, with a hand-written backward.

    Forward saves only the per-token ``logsumexp`` and entropy ``(N,)`` besides the logits the graph already holds;
    backward recomputes ``softmax`` chunk by chunk. No float32 copy of the whole ``(N, V)`` logits is ever alive,
    and each pass reads the logits once (verl's fused log-prob kernels follow the same idea). The optional
    ``sum_v p_v^2`` per token comes from the same pass and carries no gradient.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature: float, want_entropy: bool, chunk_size: int, want_sum_sq: bool):
        inv_t = 1.0 / temperature
        lps, ents, lses, sqs = [], [], [], []
        for s in range(0, logits.shape[0], chunk_size):
            lp, ent, lse, sq = _KERNELS["forward"](logits[s:s + chunk_size], labels[s:s + chunk_size], inv_t,
                                                   want_entropy, want_sum_sq)
            lps.append(lp)
            ents.append(ent)
            lses.append(lse)
            sqs.append(sq)
        lp, lse = torch.cat(lps), torch.cat(lses)
        ent = torch.cat(ents) if want_entropy else lp.new_zeros(0)
        sq = torch.cat(sqs) if want_sum_sq else lp.new_zeros(0)
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.inv_t, ctx.want_entropy, ctx.chunk_size = inv_t, want_entropy, chunk_size
        ctx.mark_non_differentiable(lse, sq)
        return lp, ent, lse, sq

    @staticmethod
    def backward(ctx, g_lp, g_ent, _g_lse, _g_sq):
        logits, labels, lse, ent = ctx.saved_tensors
        n = logits.shape[0]
        g_lp = torch.zeros(n, device=logits.device) if g_lp is None else g_lp.float()
        want_ent = ctx.want_entropy and g_ent is not None
        g_ent = g_ent.float() if want_ent else g_lp
        grad = torch.empty_like(logits)
        c = ctx.chunk_size
        for s in range(0, n, c):
            grad[s:s + c] = _KERNELS["backward"](logits[s:s + c], labels[s:s + c], lse[s:s + c],
                                                 ent[s:s + c] if want_ent else lse[s:s + c], g_lp[s:s + c],
                                                 g_ent[s:s + c], ctx.inv_t, want_ent)
        return grad, None, None, None, None, None


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                          calculate_entropy: bool = False, chunk_size: int = 1024,
                          calculate_sum_pi_squared: bool = False):
    """Per-token log-probs (and entropy) of ``labels`` under ``softmax(logits / temperature)``, memory-aware.

    ``log_prob = z[label] - logsumexp(z)`` and ``entropy = logsumexp(z) - sum(softmax(z) * z)`` with
    ``z = logits / temperature``, computed in float32 one chunk of ``chunk_size`` tokens at a time, forward and
    backward (a hand-written backward: ``d lp/dz = onehot - p``, ``d H/dz = p (E[z] - z)``), so no float32 copy
    of the ``(N, V)`` logits is kept. ``use_compiled_log_probs`` fuses each chunk's math with ``torch.compile``.
    With ``calculate_sum_pi_squared`` the same pass gives ``sum_v softmax(z)_v^2`` per token (the optimal token
    baseline's input; verl's ``calculate_sum_pi_squared_from_logits``), without gradient.

    Args:
        logits: ``(N, V)`` any float dtype. labels: ``(N,)`` int64 in ``[0, V)``.

    Returns:
        ``(log_probs (N,) float32, entropy (N,) float32 or None)``; differentiable w.r.t. ``logits``. With
        ``calculate_sum_pi_squared``: ``(log_probs, entropy or None, sum_pi_squared (N,) float32 in (0, 1])``.

    Raises:
        ValueError: on shape mismatch or a non-positive temperature / chunk size.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"expected logits (N, V) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if temperature <= 0 or chunk_size <= 0:
        raise ValueError(f"temperature ({temperature}) and chunk_size ({chunk_size}) must be > 0")
    if logits.shape[0] == 0:
        empty = logits.new_zeros(0, dtype=torch.float32)
        out = empty, (empty if calculate_entropy else None)
        return (*out, empty) if calculate_sum_pi_squared else out
    lp, ent, _, sq = _ChunkedLogProbs.apply(logits, labels, float(temperature), bool(calculate_entropy),
                                            int(chunk_size), bool(calculate_sum_pi_squared))
    out = lp, (ent if calculate_entropy else None)
    return (*out, sq) if calculate_sum_pi_squared else out


def _check_batch(input_ids, attention_mask, position_ids, response_length):
    check_batch(input_ids, attention_mask, position_ids)
    if not 0 < response_length < input_ids.shape[1]:
        raise ValueError(f"response_length must be in [1, seqlen={input_ids.shape[1]}), got {response_length}")


def _resolve_sp(model, sp: UlyssesGroup | None, use_remove_padding: bool) -> UlyssesGroup:
    sp = resolve_sp_group(model, sp)
    if sp.size > 1 and not use_remove_padding:
        raise ValueError("ulysses sequence parallelism (sp > 1) needs use_remove_padding=True")
    return sp


def _padded_forward(model, input_ids, attention_mask, position_ids, device):
    """The plain padded forward (``use_remove_padding=False``, no SP): ``(model output (B, L, ...), input_ids on
    the model's device)``."""
    input_ids, attention_mask, position_ids = (to_device(t, device) for t in (input_ids, attention_mask,
                                                                               position_ids))
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out, input_ids


def forward_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                      response_length: int, temperature: float = 1.0, calculate_entropy: bool = False,
                      use_remove_padding: bool = True, sp: UlyssesGroup | None = None, chunk_size: int = 1024,
                      device=None, multi_modal_inputs: dict | None = None, calculate_sum_pi_squared: bool = False):
    """Per-token log-probs (and entropy) of the response tokens under a causal LM (or a vision-language model).

    Args:
        model: a transformers causal LM (patched by ``patches.ulysses.apply_ulysses_patch`` for sp > 1).
        input_ids: ``(B, L)`` int64 ``cat(prompts, responses)``. attention_mask: ``(B, L)`` 0/1.
        position_ids: ``(B, L)`` int64, 0 at the first valid token of every row; or ``(B, C, L)`` rotary position
            rows of a multimodal model (Qwen2-VL's M-RoPE: temporal, height, width; verl's layout), whose text
            positions are then ``clamp(cumsum(attention_mask) - 1, min=0)``.
        response_length: ``R``, the response occupies the last R columns.
        temperature: logits are divided by it (as in the rollout sampler).
        calculate_entropy: also return the entropy of ``softmax(logits / temperature)``.
        use_remove_padding: packed forward (True) or plain padded forward (False, only without SP).
        sp: the SP group; default the group bound to the model or the active one (size 1 if none). All SP peers
            must pass the same batch.
        chunk_size: tokens per float32 log-softmax chunk.
        device: the model's device when the inputs stay on the CPU (the trainer's workers pass it): packing happens
            on the CPU and no host sync is made (:func:`patches.packed_forward.pack_batch`). None: the inputs'
            device.
        multi_modal_inputs: the processor's image inputs of these rows (``pixel_values`` ``(patches, D)``,
            ``image_grid_thw`` ``(images, 3)``, ...), concatenated in row order; passed to the model with the whole
            packed row (see :func:`patches.packed_forward.pack_batch`). Needs ``use_remove_padding``.
        calculate_sum_pi_squared: also return ``sum_v softmax(logits / temperature)_v^2`` per response token, from
            the same chunked pass (:func:`log_probs_from_logits`); with SP it is gathered like the log-probs.

    Returns:
        ``(log_probs (B, R) float32, entropy (B, R) float32 or None)`` on the model's device, and a third
        ``sum_pi_squared (B, R) float32`` (no gradient) with ``calculate_sum_pi_squared``. Entries of padded
        response tokens are meaningless (mask them with ``response_mask``). Differentiable (use under grad in the
        actor update).

    Raises:
        ValueError: bad shapes, response_length out of range, position_ids not restarting at 0, or SP misuse.
    """
    _check_batch(input_ids, attention_mask, position_ids, response_length)
    sp = _resolve_sp(model, sp, use_remove_padding)
    B, R = input_ids.shape[0], response_length
    if not use_remove_padding:
        if multi_modal_inputs:
            raise ValueError("multi_modal_inputs need use_remove_padding=True (the packed forward)")
        out, input_ids = _padded_forward(model, input_ids, attention_mask, position_ids, device)
        logits = out.logits[:, -R - 1:-1]
        stats = log_probs_from_logits(logits.reshape(B * R, -1), input_ids[:, -R:].reshape(-1), temperature,
                                      calculate_entropy, chunk_size, calculate_sum_pi_squared)
        return tuple(t.view(B, R) if t is not None else None for t in stats)
    batch = pack_batch(model, input_ids, attention_mask, position_ids, sp, device, multi_modal_inputs)
    out = sp_forward(model, batch)
    stats = log_probs_from_logits(out.logits[0], batch.labels, temperature, calculate_entropy, chunk_size,
                                  calculate_sum_pi_squared)
    del out
    # per-token values of the local SP slice, gathered into (B, L) rows; the response columns
    return tuple(batch.gather(t)[:, -R - 1:-1] if t is not None else None for t in stats)


def forward_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                   response_length: int, use_remove_padding: bool = True, sp: UlyssesGroup | None = None,
                   device=None):
    """Critic values ``V(s_t)`` for the response tokens from a model with a scalar head per token.

    Args:
        model: ``AutoModelForTokenClassification`` with ``num_labels == 1`` (output ``logits (.., 1)``).
        input_ids, attention_mask, position_ids, response_length, use_remove_padding, sp, device: as
            :func:`forward_log_probs`.

    Returns:
        ``values (B, R)`` float32: the head output at the position *before* each response token
        (``[:, -R-1:-1]``, the state from which that token is generated; verl's convention). Differentiable.

    Raises:
        ValueError: bad shapes, a head with more than one output, or SP misuse.
    """
    _check_batch(input_ids, attention_mask, position_ids, response_length)
    sp = _resolve_sp(model, sp, use_remove_padding)
    R = response_length
    if not use_remove_padding:
        head = _padded_forward(model, input_ids, attention_mask, position_ids, device)[0].logits
    else:
        batch = pack_batch(model, input_ids, attention_mask, position_ids, sp, device)
        head = sp_forward(model, batch).logits
    if head.shape[-1] != 1:
        raise ValueError(f"value model must have one output per token (num_labels=1), got {head.shape[-1]}")
    if not use_remove_padding:
        return head[:, -R - 1:-1, 0].float()
    return batch.gather(head[0, :, 0].float())[:, -R - 1:-1]
