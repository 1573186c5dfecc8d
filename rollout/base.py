"""Rollout engine interface: sampling parameters, the output container and the abstract engine.

Every engine (vLLM, transformers) takes left-unpadded prompt token ids and returns fixed-width, right-padded
responses whose rows are ordered prompt-major: the ``n`` samples of prompt ``i`` are rows ``i*n .. i*n+n-1``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch


@dataclass
class SamplingConfig:
    """Sampling parameters of one ``generate`` call (names follow verl's ``rollout`` config / vLLM).

    Attributes:
        n: samples per prompt (>= 1).
        temperature: softmax temperature (> 0 when sampling; 0 means greedy).
        top_p: nucleus mass in (0, 1]; 1.0 disables it.
        top_k: keep the k most likely tokens; -1 or 0 disables it (vLLM uses -1).
        max_new_tokens: response width R (>= 1); every output is padded to exactly this width.
        stop_token_ids: extra stop tokens besides the tokenizer's EOS; the stop token is kept in the response
            and counted in ``response_mask``.
        do_sample: False forces greedy decoding (as does ``temperature == 0``).
        ignore_eos: no stop or EOS token ends a row early: every response is ``max_new_tokens`` long (verl's
            ``rollout.ignore_eos``; for benchmarks that need fixed lengths).
        seed: when set, the same seed (and the same inputs) gives the same samples.

    Raises:
        ValueError: on a value out of range (the message names it).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    do_sample: bool = True
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if int(self.n) < 1:
            raise ValueError(f"SamplingConfig.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingConfig.top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (``do_sample`` False or temperature 0)."""
        return (not self.do_sample) or self.temperature == 0


@dataclass
class RolloutOutput:
    """Generated responses, prompt-major (the ``n`` samples of prompt ``i`` are contiguous).

    Attributes:
        responses: (B*n, R) int64, right-padded with ``pad_id``; R = ``max_new_tokens``.
        response_mask: (B*n, R) int64, 1 for every generated token up to and including the first stop/EOS
            token, 0 after it.
        rollout_log_probs: (B*n, R) float32, log-prob of each sampled token under the engine (natural log;
            0 at padding).
    """

    responses: torch.Tensor
    response_mask: torch.Tensor
    rollout_log_probs: torch.Tensor

    def __post_init__(self) -> None:
        shapes = {k: tuple(getattr(self, k).shape) for k in ("responses", "response_mask", "rollout_log_probs")}
        if len(set(shapes.values())) != 1 or len(shapes["responses"]) != 2:
            raise ValueError(f"RolloutOutput tensors must share one (B*n, R) shape, got {shapes}")


def finalize_responses(tokens: torch.Tensor, log_probs: torch.Tensor, stop_ids: Sequence[int], pad_id: int,
                       width: int) -> RolloutOutput:
    """Cut each row after its first stop token, pad to ``width`` and build the mask.

    Args:
        tokens: (rows, L) int64 generated ids, L <= width may be shorter (early stop) or any filler after a stop.
        log_probs: (rows, L) float log-probs of ``tokens``.
        stop_ids: ids that end a response (kept in the response, mask 1).
        pad_id: filler id for positions after the stop token and beyond L.
        width: R, the fixed output width.

    Returns:
        RolloutOutput with (rows, width) tensors.

    Raises:
        ValueError: when ``tokens`` is wider than ``width`` or the two inputs disagree in shape.
    """
    if tokens.shape != log_probs.shape:
        raise ValueError(f"tokens {tuple(tokens.shape)} and log_probs {tuple(log_probs.shape)} must match")
    rows, length = tokens.shape
    if length > width:
        raise ValueError(f"generated {length} tokens, more than max_new_tokens={width}")
    out_tok = torch.full((rows, width), int(pad_id), dtype=torch.long)
    out_lp = torch.zeros((rows, width), dtype=torch.float32)
    out_tok[:, :length] = tokens.long().cpu()
    out_lp[:, :length] = log_probs.float().cpu()
    is_stop = torch.zeros((rows, width), dtype=torch.bool)
    if stop_ids:
        is_stop[:, :length] = torch.isin(out_tok[:, :length], torch.tensor(list(stop_ids), dtype=torch.long))
    # positions strictly after the first stop token are padding: exclusive cumsum of stop flags
    after_stop = (torch.cumsum(is_stop.long(), dim=1) - is_stop.long()) > 0
    valid = torch.zeros((rows, width), dtype=torch.bool)
    valid[:, :length] = True
    mask = valid & ~after_stop
    out_tok[~mask] = int(pad_id)
    out_lp[~mask] = 0.0
    return RolloutOutput(responses=out_tok, response_mask=mask.long(), rollout_log_probs=out_lp)


def check_prompts(prompt_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """Validate prompts: a non-empty list of non-empty int lists. Raises ValueError naming the bad row."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty; expected at least one prompt")
    out = []
    for i, p in enumerate(prompt_ids):
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompt_ids[{i}] is empty; expected at least one token")
        out.append(p)
    return out


class RolloutEngine(abc.ABC):
    """A generation engine that can be put to sleep while the trainer uses the GPU.

    Life cycle inside :func:`rollout.context.rollout_mode`: ``wake_up(["weights"])`` -> ``load_weights`` (one call
    per bucket; or ``share_weights`` once, for an engine that can run on the trainer's tensors) ->
    ``wake_up(["kv_cache"])`` -> ``generate`` ... -> ``sleep(level)``.

    Attributes:
        uses_torch_allocator: the engine's GPU memory comes from PyTorch's caching allocator (the transformers
            engine), so the blocks the trainer freed serve it as they are and ``rollout_mode`` does not return the
            cache to the driver around it; False for an engine with its own allocator (vLLM's).
        can_share_weights: the engine has ``share_weights(named_tensors)``: it runs on the trainer's own parameter
            tensors instead of a copy (:meth:`rollout.hf_engine.HFRolloutEngine.share_weights`).
    """

    uses_torch_allocator = False
    can_share_weights = False

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> RolloutOutput:
        """Sample ``sampling.n`` responses per prompt; rows prompt-major, width ``sampling.max_new_tokens``."""

    @abc.abstractmethod
    def sleep(self, level: int = 1) -> None:
        """Free GPU memory: level 1 keeps weights in CPU memory, level 2 discards them (a sync must follow)."""

    @abc.abstractmethod
    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-acquire GPU memory for ``tags`` (subset of ``["weights", "kv_cache"]``; None means both)."""

    @abc.abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(hf_name, full tensor)`` pairs into the engine's model (names as in the HF ``state_dict``)."""

    def weights_updated(self) -> None:
        """Called once after the last ``load_weights`` call of a weight update (by
        :func:`rollout.context.sync_weights`): an engine that keeps anything computed with the old weights (a
        prefix cache's KV blocks) drops it here. Default: nothing to drop."""


WAKE_TAGS = ("weights", "kv_cache")


def check_tags(tags: list[str] | None) -> list[str]:
    """Normalise wake-up tags: None -> both; raises ValueError on an unknown tag."""
    if tags is None:
        return list(WAKE_TAGS)
    bad = [t for t in tags if t not in WAKE_TAGS]
    if bad:
        raise ValueError(f"unknown wake_up tags {bad}; expected a subset of {list(WAKE_TAGS)}")
    return list(tags)


def concat_image_inputs(rows: Sequence[dict | None]) -> dict:
    """The model inputs of several rows from their processor tensors (``pixel_values``, ``image_grid_thw``, ...),
    concatenated along dim 0 in row order (the order of their image tokens in the batch); ``{}`` when no row has
    any."""
    keys = sorted({k for r in rows if r for k in r})
    return {k: torch.cat([r[k] for r in rows if r and k in r]) for k in keys}
