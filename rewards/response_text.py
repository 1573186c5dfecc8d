"""The text a scorer reads from a batch's responses: the trajectories decoded, and for a multi-turn row the split
after its last tool turn, so that a scorer that reads its answer after a marker never reads a tool's output
(:func:`decode_responses`, :func:`solution_text`; used by :class:`rewards.manager.RewardManager` and the batch
manager)."""
from __future__ import annotations

from typing import Any

import torch

from rewards.gsm8k import TOOL_RESPONSE_END

__all__ = ["decode_responses", "solution_text"]


def decode_responses(tokenizer: Any, data) -> tuple[list[str], torch.Tensor, torch.Tensor,
                                                   list[tuple[str, str] | None]]:
    """(texts, valid, seen, splits) of ``data`` (a :class:`trainer.protocol.DataProto` with ``responses`` and
    ``response_mask`` (B, R), optionally ``attention_mask`` (B, P+R)): ``valid`` (B, R) bool marks the model's
    tokens (``response_mask``), ``seen`` (B, R) bool every token of the trajectory (the response part of
    ``attention_mask``: tool answers included); the texts are decoded under ``seen`` by ``tokenizer.batch_decode``
    (special tokens skipped), so that a scorer reads the tool results. One engine call per sample gives
    ``seen == valid`` (split None). A row with tokens the model did not write (a multi-turn rollout's tool turns:
    template glue and tool answers) also gets its split ``(before, final)``: the text up to the end of its last such
    span, and the model's own text after it (see :func:`solution_text`).

    Raises:
        ValueError: ``responses`` and ``response_mask`` are not both (batch, response_len).
    """
    responses, mask = data["responses"], data["response_mask"]
    if responses.dim() != 2 or tuple(mask.shape) != tuple(responses.shape):
        raise ValueError(f"responses {tuple(responses.shape)} and response_mask {tuple(mask.shape)} must both "
                         "be (batch, response_len)")
    valid = (mask > 0).cpu()
    seen = valid
    attn = data["attention_mask"] if "attention_mask" in data else None
    if attn is not None and attn.dim() == 2 and attn.shape[0] == responses.shape[0] and \
            attn.shape[1] >= responses.shape[1]:
        seen = (attn[:, attn.shape[1] - responses.shape[1]:] > 0).cpu() | valid
    ids = responses.cpu()
    rows = [ids[i][seen[i]].tolist() for i in range(ids.shape[0])]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []
    splits: list[tuple[str, str] | None] = [None] * len(rows)
    tool = seen & ~valid
    multi = [i for i in range(ids.shape[0]) if bool(tool[i].any())]
    if multi:
        parts = []
        for i in multi:
            cut = int(torch.nonzero(tool[i]).max()) + 1  # just after the last token the model did not write
            parts += [ids[i, :cut][seen[i, :cut]].tolist(), ids[i, cut:][seen[i, cut:]].tolist()]
        decoded = tokenizer.batch_decode(parts, skip_special_tokens=True)
        for j, i in enumerate(multi):
            splits[i] = (decoded[2 * j], decoded[2 * j + 1])
    return list(texts), valid, seen, splits


def solution_text(text: str, split: tuple[str, str] | None, marker: str | None) -> str:
    """The ``solution_str`` a scorer gets. A scorer that reads the whole text (``marker`` None): the decoded
    trajectory as it is (verl's). A multi-turn row for a scorer that reads its answer after
    the last ``marker`` (``answer_after``, ``</tool_response>`` for the built-in scorers): the trajectory with
    ``marker`` placed after its last tool turn, whatever the chat template renders there, so that the answer
    is read from the model's own final text only: a template without the marker (SmolLM2's ChatML renders
    ``<|im_start|>tool``) or a tool that prints the marker itself cannot make a tool's output the answer. The
    model cannot place the end of a tool answer either: where it wrote :data:`rewards.gsm8k.TOOL_RESPONSE_END`
    itself (in a single-turn row, or after its last tool turn), those characters become spaces (the same count, so
    a length rule reads what the model wrote), and it cannot hide what it wrote before (several answers, say) from
    the scorer. Any other ``marker`` (a user's ``answer_after``, e.g. ``</think>``) is the model's to write and is
    left as it is."""
    if marker is None:
        return text
    own = split[1] if split is not None else text  # what the model wrote after its last tool turn, or all of it
    if marker == TOOL_RESPONSE_END:
        own = own.replace(marker, " " * len(marker))
    return own if split is None else split[0] + marker + own
