"""The one set of token ids that end a response.

Chat models often end a turn with a token other than the tokenizer's EOS: Llama-3-Instruct writes
``<|eot_id|>`` (its ``generation_config.eos_token_id`` is a list of three ids), Gemma-2-it ``<end_of_turn>``,
ChatML models ``<|im_end|>``. A rollout that stops only at ``tokenizer.eos_token_id`` runs such models to the
length limit and trains on (and scores) whatever follows the end of the turn. :func:`resolve_stop_token_ids`
joins every source of "this ends the response", and every engine, the response mask, the reward placement,
the truncation flag and the length metrics use its result.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Sequence

logger = logging.getLogger(__name__)

__all__ = ["resolve_stop_token_ids", "chat_end_of_turn_id", "as_id_list", "model_vocab_size"]

_MARK = "\u2063dsrl-end-of-turn-probe\u2063"


def as_id_list(value: Any) -> list[int]:
    """``None`` -> ``[]``, an int -> ``[int]``, an iterable of ints -> a list (order kept, duplicates dropped).

    Raises:
        ValueError: an entry that is not an integer (or is negative).
    """
    if value is None:
        return []
    items = [value] if isinstance(value, int) or not isinstance(value, Iterable) or isinstance(value, str) \
        else list(value)
    out = []
    for v in items:
        try:
            i = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"stop token id {v!r} is not an integer") from None
        if i < 0 or (isinstance(v, float) and v != i):
            raise ValueError(f"stop token id {v!r} must be a non-negative integer")
        out.append(i)
    return list(dict.fromkeys(out))


def chat_end_of_turn_id(tokenizer) -> int | None:
    """The special token that the chat template writes right after an assistant message, or None.

    Renders ``[user, assistant]`` with ``tokenizer.apply_chat_template`` and a probe text as the assistant's
    content, tokenizes what follows the probe, and returns the first id there that is a special (or added)
    token: ``<|eot_id|>`` for Llama-3, ``<end_of_turn>`` for Gemma-2, ``<|im_end|>`` for ChatML. None when the
    tokenizer has no chat template, the template cannot render that conversation, or no special token follows.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    msgs = [{"role": "user", "content": "1"}, {"role": "assistant", "content": _MARK}]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False)
    except Exception as exc:  # a template may refuse this shape (e.g. it wants a system turn); then no id
        logger.debug("chat template did not render a probe conversation: %s", exc)
        return None
    if not isinstance(text, str) or _MARK not in text:
        return None
    tail = text.split(_MARK, 1)[1]
    if not tail:
        return None
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    for tid in tokenizer(tail, add_special_tokens=False)["input_ids"]:
        if int(tid) in special:
            return int(tid)
    return None


def _generation_config_eos(model_path: str | None) -> Any:
    """``eos_token_id`` as ``generation_config.json`` in ``model_path`` gives it (None without the file or when it
    does not load)."""
    if not model_path or not os.path.isfile(os.path.join(model_path, "generation_config.json")):
        return None
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError) as exc:
        logger.warning("could not read %s/generation_config.json: %s", model_path, exc)
        return None


def _in_file(model_path: str | None, name: str) -> str:
    where = os.path.join(model_path, name) if model_path else "the model's " + name
    return f"eos_token_id in {where}"


def _stop_sources(tokenizer, hf_config, model_path: str | None, extra, config_label: str | None
                  ) -> list[tuple[str, list[int]]]:
    """``(where, ids)`` of every source of stop ids, in :func:`resolve_stop_token_ids`'s order; ``where`` names
    the file and field (or the config key) that holds them.

    Raises:
        ValueError: a source gives an entry that is not a non-negative integer, naming that source.
    """
    eot = chat_end_of_turn_id(tokenizer)
    raw = [("the tokenizer's eos_token_id", getattr(tokenizer, "eos_token_id", None)),
           (config_label or _in_file(model_path, "config.json"),
            getattr(hf_config, "eos_token_id", None) if hf_config is not None else None),
           (_in_file(model_path, "generation_config.json"), _generation_config_eos(model_path)),
           ("the chat template's end-of-turn token", eot),
           ("actor_rollout_ref.rollout.stop_token_ids", list(extra or []))]
    out = []
    for where, value in raw:
        try:
            out.append((where, as_id_list(value)))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def model_vocab_size(hf_config) -> int | None:
    """The model's ``vocab_size`` (its embedding rows; a vision-language model's ``text_config``), or None when
    ``hf_config`` is None or names none."""
    for cfg in (hf_config, getattr(hf_config, "text_config", None)):
        size = getattr(cfg, "vocab_size", None) if cfg is not None else None
        if isinstance(size, int) and size > 0:
            return size
    return None


def resolve_stop_token_ids(tokenizer, hf_config=None, model_path: str | None = None,
                           extra: Sequence[int] | None = None, config_label: str | None = None) -> list[int]:
    """Every token id that ends a response, in a fixed order (first: the tokenizer's EOS).

    Sources, joined: ``tokenizer.eos_token_id``; ``hf_config.eos_token_id`` (int or list);
    ``generation_config.json``'s ``eos_token_id`` in ``model_path`` (int or list); the chat template's
    end-of-turn token (:func:`chat_end_of_turn_id`); ``extra`` (the config key
    ``actor_rollout_ref.rollout.stop_token_ids``).

    Args:
        tokenizer: a HF tokenizer.
        hf_config: the model's ``PretrainedConfig`` (or None).
        model_path: the model folder (for ``generation_config.json``), or None.
        extra: more stop ids from the config.
        config_label: what ``hf_config.eos_token_id`` came from, for the errors (default: ``eos_token_id in
            <model_path>/config.json``; e.g. a config override that sets it).

    Returns:
        list[int], non-empty, without duplicates.

    Raises:
        ValueError: no source gives any id; an entry of a source is not a non-negative integer; an id is outside
            the vocabulary (the model's ``vocab_size`` when ``hf_config`` gives it, else the tokenizer's size).
            The message names the file and field (or config key) that holds the bad entry.
    """
    sources = _stop_sources(tokenizer, hf_config, model_path, extra, config_label)
    ids = list(dict.fromkeys(i for _, found in sources for i in found))
    if not ids:
        raise ValueError("no stop token: the tokenizer has no eos_token_id, the model config none, and "
                         "actor_rollout_ref.rollout.stop_token_ids is empty; set one of them")
    # the model's embedding rows bound the ids it can generate: a token the tokenizer added past them (len(tokenizer)
    # > vocab_size) is never produced; the tokenizer's size only when the model's is not known
    vocab = model_vocab_size(hf_config) or (len(tokenizer) if hasattr(tokenizer, "__len__") else None)
    bad = [i for i in ids if vocab is not None and i >= vocab]
    if bad:
        blamed = [f"{where} gives {[i for i in found if i >= vocab]}" for where, found in sources
                  if any(i >= vocab for i in found)]
        raise ValueError(f"stop token ids {bad} are outside the vocabulary (size {vocab}): {'; '.join(blamed)}; "
                         f"the model can never generate them; expected ids below {vocab} there")
    return ids
