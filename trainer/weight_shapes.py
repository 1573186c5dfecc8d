"""A model folder's ``config.json`` against the shapes of its weights, read from the safetensors headers (and the
index's ``weight_map``) without loading a tensor: the input embedding must be ``[vocab_size, hidden_size]``, and the
weights must hold every decoder layer that ``num_hidden_layers`` counts.

A config from another model than its weights fails in every worker with transformers' size-mismatch report, or
(fewer layers in the weights) trains layers that start from random values; :func:`config_weights_problem` names it
in one line before any worker starts. What this cannot judge is left alone: ``.bin`` weights, remote code
(``auto_map``), architectures whose embedding is not ``[vocab_size, hidden_size]`` (:data:`ROWS_DIFFER`,
:data:`WIDTH_KEYS`) or whose ``num_hidden_layers`` counts other blocks (:data:`LAYERS_DIFFER`), a quantized
embedding, an embedding that no common name or unique shape identifies, the output head (its rows may be another
vocabulary size), and weights with more layers than the config (extra layers, such as DeepSeek-V3's
multi-token-prediction layer, are not loaded).
Nothing here imports torch or transformers.
"""
from __future__ import annotations

import json
import os
import re

__all__ = ["config_weights_problem", "read_safetensors_header", "header_shapes"]

#: the names of the input embedding, strongest first; a tier with several 2-D matches is ambiguous (not judged)
EMBEDDING_NAMES = (("embed_tokens.weight",),
                   ("wte.weight", "word_embeddings.weight", "embed_in.weight", "tok_embeddings.weight"),
                   ("embeddings.weight",))
#: model types whose embedding has more rows than ``vocab_size`` (transformers' Mllama +8, Moshi +1, Molmo2 and CSM
#: extra vocabularies)
ROWS_DIFFER = frozenset({"mllama", "mllama_text_model", "moshi", "molmo2", "molmo2_text", "csm"})
#: config keys that make the embedding's rows differ from ``vocab_size``
ROWS_KEYS = ("additional_vocab_size", "num_codebooks")
#: config keys of an embedding width other than ``hidden_size`` (OPT's projection, ALBERT's factorised embedding, ...)
WIDTH_KEYS = ("word_embed_proj_dim", "embedding_size", "input_embedding_size", "embed_dim", "embedding_dim",
              "embedding_rank", "backbone_hidden_size")
#: model types whose ``num_hidden_layers`` in ``config.json`` is not the number of ``layers.<i>`` (Dory counts
#: attention and MLP blocks apart, two per layer)
LAYERS_DIFFER = frozenset({"dory"})
HIDDEN_KEYS = ("hidden_size", "n_embd")
LAYER_KEYS = ("num_hidden_layers", "n_layer")
LAYER_LISTS = ("layers", "h", "blocks", "layer")
FIX = "use the config.json that came with these weights"


def read_safetensors_header(file: str) -> dict | None:
    """The JSON header of the safetensors file ``file`` (tensor name -> ``{"dtype", "shape", "data_offsets"}``,
    plus ``__metadata__``), or None when it cannot be read."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            out = json.loads(f.read(n).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return out if isinstance(out, dict) else None


class _Weights:
    """The tensors of a model folder's safetensors weights: their names, the file of each, their shapes (a file's
    header is read when one of its shapes is first asked for)."""

    def __init__(self, folder: str, files: list[str]):
        self.folder, self.where, self._headers = folder, {}, {}
        if len(files) == 1 and files[0].endswith(".index.json"):
            try:
                with open(os.path.join(folder, files[0]), encoding="utf-8") as f:
                    weight_map = json.load(f).get("weight_map")
            except (OSError, ValueError, UnicodeDecodeError, AttributeError):
                weight_map = None
            self.where = {k: v for k, v in (weight_map or {}).items() if isinstance(v, str)}
            self.label = files[0]
        else:
            for name in files:
                for tensor in self._header(name):
                    self.where.setdefault(tensor, name)
            self.label = files[0] if len(files) == 1 else "the folder's *.safetensors files"
        self.where.pop("__metadata__", None)

    def _header(self, file: str) -> dict:
        if file not in self._headers:
            self._headers[file] = read_safetensors_header(os.path.join(self.folder, file)) or {}
        return self._headers[file]

    def shape(self, tensor: str) -> list[int] | None:
        entry = self._header(self.where[tensor]).get(tensor) if tensor in self.where else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        return shape if isinstance(shape, list) and all(isinstance(d, int) for d in shape) else None

    def matrices(self, names) -> list[str]:
        """The 2-D tensors among ``names``."""
        return [n for n in names if len(self.shape(n) or ()) == 2]


def header_shapes(folder: str, files: list[str]) -> dict[str, list[int]]:
    """The shape of every tensor of the safetensors weights ``files`` of ``folder`` (the one weights file, an
    ``*.index.json`` standing for the shards of its ``weight_map``, or several ``*.safetensors``), read from the
    headers only; a tensor whose header entry cannot be read is left out. Never raises for an unreadable file."""
    if not files or not all(f.endswith((".safetensors", ".safetensors.index.json")) for f in files):
        return {}
    weights = _Weights(folder, files)
    return {n: s for n in weights.where if (s := weights.shape(n)) is not None}


def _int(config: dict, keys) -> tuple[str, int] | None:
    """The first of ``keys`` that ``config`` sets to an integer, with its value."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


def _embedding(weights: _Weights, vocab: int | None) -> str | None:
    """The input embedding's tensor name: by its name (:data:`EMBEDDING_NAMES`), else the one 2-D tensor with
    ``vocab`` rows that is not an output head; None when no name or shape identifies one tensor."""
    for tier in EMBEDDING_NAMES:
        found = weights.matrices(n for n in weights.where if any(n == s or n.endswith("." + s) for s in tier))
        if found:
            return found[0] if len(found) == 1 else None
    if vocab is None:
        return None
    rows = [n for n in weights.matrices(weights.where) if weights.shape(n)[0] == vocab
            and "lm_head" not in n and not n.endswith("output.weight")]
    return rows[0] if len(rows) == 1 else None


def config_weights_problem(folder: str, hf: dict, files: list[str]) -> str | None:
    """What in ``hf`` (the ``config.json`` of ``folder``; a vision-language model's ``text_config``) contradicts the
    shapes of the safetensors weights ``files`` the loader reads (names in ``folder``: the one weights file, an
    ``*.index.json``, or every ``*.safetensors``): the input embedding against ``vocab_size`` and ``hidden_size``,
    the highest decoder layer in the tensor names against ``num_hidden_layers``. None when they agree or when this
    cannot judge (see the module's docstring). The weights files must be sound
    (``trainer.model_folder_checks.weights_problem``)."""
    if not files or not all(f.endswith((".safetensors", ".safetensors.index.json")) for f in files):
        return None
    if "auto_map" in hf:
        return None
    text = hf.get("text_config")
    source = "config.json's text_config" if isinstance(text, dict) else "config.json"
    text = text if isinstance(text, dict) else hf
    weights = _Weights(folder, files)
    vocab, hidden = _int(text, ("vocab_size",)), _int(text, HIDDEN_KEYS)
    types = {hf.get("model_type"), text.get("model_type")}
    if types & ROWS_DIFFER or any(k in text for k in ROWS_KEYS):
        vocab = None
    if any(k in text for k in WIDTH_KEYS):
        hidden = None
    quantized = "quantization_config" in hf or "quantization_config" in text
    name = _embedding(weights, vocab[1] if vocab else None)
    if name is None:
        return None
    if not quantized:
        rows, width = weights.shape(name)
        compared = [(*pair, have) for pair, have in ((hidden, width), (vocab, rows)) if pair]
        if any(value != have for _, value, have in compared):
            says = " and ".join(f"{key}={value}" for key, value, _ in compared)
            return (f"{source} says {says}, but {weights.where[name]} holds {name} of shape [{rows}, {width}] "
                    f"(the config and the weights come from different models); {FIX}")
    if types & LAYERS_DIFFER:
        return None
    return _layers_problem(weights, text, source, name)


def _layers_problem(weights: _Weights, text: dict, source: str, embedding: str) -> str | None:
    """The weights hold fewer decoder layers (``<prefix>layers.<i>.``, under the embedding's prefix) than the
    config's ``num_hidden_layers``: the missing ones would start from random values."""
    layers = _int(text, LAYER_KEYS)
    parts = embedding.split(".")
    prefix = ".".join(parts[:-2]) + "." if len(parts) > 2 else ""
    pattern = re.compile(rf"^{re.escape(prefix)}({'|'.join(LAYER_LISTS)})\.(\d+)\.")
    found = [m for m in map(pattern.match, weights.where) if m]
    if layers is None or not found:
        return None
    top = max(found, key=lambda m: int(m.group(2)))
    have = int(top.group(2)) + 1
    key, want = layers
    if have >= want:
        return None
    held = "layer 0" if have == 1 else f"layers 0-{have - 1}"
    missing = f"layer {have}" if want == have + 1 else f"layers {have}-{want - 1}"
    return (f"{source} says {key}={want}, but {weights.label} holds {held} only "
            f"({prefix}{top.group(1)}.<i>), so {missing} would start from random values (the config and the "
            f"weights come from different models); {FIX}")
