"""A model folder's ``config.json`` against the shapes of its weights, read without loading a tensor's data: from the
safetensors headers, or from a ``.bin`` file in torch's zip format (``torch.save``'s default since 1.6) loaded onto
the meta device (its pickle only, memory-mapped), and from the index's ``weight_map`` (``*.safetensors.index.json``
or ``pytorch_model.bin.index.json``): the input embedding must be ``[vocab_size, hidden_size]``, and the weights must
hold every decoder layer that ``num_hidden_layers`` counts.

A config from another model than its weights fails in every worker with transformers' size-mismatch report, or
(fewer layers in the weights) trains layers that start from random values; :func:`config_weights_problem` names it
in one line before any worker starts. What this cannot judge is left alone: a ``.bin`` in the legacy (pickle, not
zip) format (its shapes cannot be read without reading the whole file) or one that torch does not read, remote code
(``auto_map``), architectures whose embedding is not ``[vocab_size, hidden_size]`` (:data:`ROWS_DIFFER`,
:data:`WIDTH_KEYS`) or whose ``num_hidden_layers`` counts other blocks (:data:`LAYERS_DIFFER`), a quantized
embedding, an embedding that no common name or unique shape identifies, the output head (its rows may be another
vocabulary size), and weights with more layers than the config (extra layers, such as DeepSeek-V3's
multi-token-prediction layer, are not loaded).
Nothing here imports transformers; torch is imported only to read ``.bin`` weights.
"""
from __future__ import annotations

import json
import os
import re
import zipfile

__all__ = ["config_weights_problem", "read_safetensors_header", "bin_shapes", "file_shapes", "header_shapes"]

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
#: the weights files whose shapes are read: single files and the index of either format (its shards by their names)
SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json")


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


def bin_shapes(file: str) -> dict[str, list[int]]:
    """``{tensor name: shape}`` of the PyTorch weights file ``file`` (a state dict saved by ``torch.save``), read
    without its tensors' data: a zip-format file is loaded onto the meta device through a memory map (its pickle
    only, about a millisecond whatever the file's size). Empty for a legacy (pickle, not zip) file, which cannot be
    read without reading all of it, for a file torch does not read (``weights_only``: no code runs) and for anything
    but a dict of tensors; whether the file is sound is ``trainer.model_folder_checks.bin_problem``'s question.
    Never raises."""
    if not zipfile.is_zipfile(file):
        return {}
    try:
        import torch

        state = torch.load(file, map_location="meta", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - a file torch does not read is not judged here
        return {}
    if not isinstance(state, dict):
        return {}
    return {k: [int(d) for d in v.shape] for k, v in state.items()
            if isinstance(k, str) and isinstance(v, torch.Tensor)}


def file_shapes(file: str) -> dict[str, list[int]]:
    """``{tensor name: shape}`` of the weights file ``file``: a ``*.safetensors`` from its header
    (:func:`read_safetensors_header`; an entry without a list of integers as its shape is left out), a ``*.bin``
    from :func:`bin_shapes`. Empty for another file name or a file that cannot be read. Never raises."""
    if file.endswith(".bin"):
        return bin_shapes(file)
    if not file.endswith(".safetensors"):
        return {}
    out = {}
    for name, entry in (read_safetensors_header(file) or {}).items():
        shape = entry.get("shape") if isinstance(entry, dict) and name != "__metadata__" else None
        if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            out[name] = shape
    return out


def _judged(files: list[str]) -> bool:
    """Whether ``files`` (the weights files the loader reads) are of the formats whose shapes are read."""
    return bool(files) and all(isinstance(f, str) and f.endswith(SUFFIXES) for f in files)


class _Weights:
    """The tensors of a model folder's weights (safetensors or ``.bin``, single files or an index's shards): their
    names, the file of each, their shapes (a file's shapes are read, :func:`file_shapes`, when one of them is first
    asked for; an index names the tensors without reading a shard)."""

    def __init__(self, folder: str, files: list[str]):
        self.folder, self.where, self._shapes = folder, {}, {}
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
                for tensor in self._file(name):
                    self.where.setdefault(tensor, name)
            self.label = files[0] if len(files) == 1 else "the folder's *.safetensors files"
        self.where.pop("__metadata__", None)

    def _file(self, file: str) -> dict[str, list[int]]:
        if file not in self._shapes:
            self._shapes[file] = file_shapes(os.path.join(self.folder, file))
        return self._shapes[file]

    def shape(self, tensor: str) -> list[int] | None:
        """The shape of ``tensor`` in the file that holds it, or None when it is not held or cannot be read."""
        return self._file(self.where[tensor]).get(tensor) if tensor in self.where else None

    def matrices(self, names) -> list[str]:
        """The 2-D tensors among ``names``."""
        return [n for n in names if len(self.shape(n) or ()) == 2]


def header_shapes(folder: str, files: list[str]) -> dict[str, list[int]]:
    """The shape of every tensor of the weights ``files`` of ``folder`` (the one weights file, an ``*.index.json``
    of either format standing for the shards of its ``weight_map``, or several ``*.safetensors``), read from the
    safetensors headers or from zip-format ``.bin`` files on the meta device (:func:`file_shapes`), no tensor's data
    loaded; a tensor whose shape cannot be read (a legacy ``.bin``, a bad header entry) is left out, and other file
    names give an empty dict. Never raises for an unreadable file."""
    if not _judged(files):
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
    shapes of the weights ``files`` the loader reads (names in ``folder``: the one weights file, safetensors or
    ``.bin``, an ``*.index.json`` of either format, or every ``*.safetensors``): the input embedding against
    ``vocab_size`` and ``hidden_size``, the highest decoder layer in the tensor names against ``num_hidden_layers``.
    None when they agree or when this cannot judge (see the module's docstring). The weights files must be sound
    (``trainer.model_folder_checks.weights_problem``); one whose shapes cannot be read is not judged."""
    if not _judged(files) or "auto_map" in hf:
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
