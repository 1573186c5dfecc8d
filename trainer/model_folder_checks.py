"""The files of the model folders a run loads, checked before any worker starts (``trainer.config_preflight``): the
weights each role will load (single file or the shards of an index, ``.safetensors`` or ``.bin``; a safetensors
file is checked against its own header, without loading a tensor), ``config.json`` against the weights' shapes
(:mod:`trainer.weight_shapes`), the actor's ``generation_config.json`` (its ``eos_token_id`` are stop tokens of the
rollout) and the tokenizer each role reads (its files are judged by :mod:`trainer.tokenizer_files`).

Then transformers judges ``config.json`` itself (:mod:`trainer.meta_shapes`: it loads, the model builds on the meta
device, its parameters have the weights' shapes). Nothing else here imports transformers, and torch only to read a
``.bin`` file's shapes (:mod:`trainer.weight_shapes`): a folder that lacks its weights, holds a file cut short by a
failed download or copy, or has no tokenizer is one ``ConfigError`` line naming the key, the path and what is
wrong, instead of a traceback in every worker after Ray has started.
"""
from __future__ import annotations

import json
import os
import re
import zipfile

from trainer.config_checks import ConfigError, ErrorCollector
from trainer.file_problems import AGAIN, broken_link, json_problem
# the tokenizer checks are named in __all__ too: importable from here as before
from trainer.tokenizer_files import (ACTOR_KEY, chat_template_problem, no_eos_problem, prompts_are_chat,
                                     tokenizer_problem)
from trainer.weight_shapes import config_weights_problem

__all__ = ["check_model_folders", "read_model_config", "weights_problem", "loaded_weight_files",
           "generation_config_problem", "tokenizer_problem", "safetensors_problem", "bin_problem",
           "chat_template_problem", "no_eos_problem", "check_model_files"]

#: the weight files ``transformers``' ``from_pretrained`` looks for in a local folder, in its order
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
EXPECTED_WEIGHTS = "expected model.safetensors, pytorch_model.bin or a *.index.json with its shards"
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header (bytes)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def read_model_config(key: str, path: str) -> dict:
    """The ``config.json`` of the model folder ``path`` (named by config ``key``) as a dict.

    Raises:
        ConfigError: the file is not a JSON object (e.g. cut short by a copy).
    """
    file = os.path.join(path, "config.json")
    try:
        with open(file, encoding="utf-8") as f:
            out = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}={path!r}: {json_problem(file, exc)}") from None
    if not isinstance(out, dict):
        raise ConfigError(f"{key}={path!r}: config.json holds a {type(out).__name__}, not a JSON object; {AGAIN}")
    return out


def safetensors_problem(file: str) -> str | None:
    """What is wrong with the safetensors file ``file``, read from its header only (8-byte little-endian length,
    then that many bytes of JSON whose entries' ``data_offsets`` [begin, end] index the data section that follows):
    the file must hold exactly the header and ``max(end)`` bytes of tensors, as ``safetensors`` requires. None
    when it is sound."""
    name = os.path.basename(file)
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{name} is truncated: {size} bytes, less than a safetensors file's 8-byte header length; {AGAIN}"
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            return f"{name} is not a safetensors file (its first 8 bytes give a header of {n} bytes); {AGAIN}"
        if 8 + n > size:
            return (f"{name} is truncated: its header length says {n} bytes of JSON header, the file holds "
                    f"{size - 8} after the length; {AGAIN}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{name} has a header that is not valid JSON ({exc}); {AGAIN}"
    if not isinstance(header, dict):
        return f"{name} has a header that is not a JSON object; {AGAIN}"
    end = 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
                and offsets[0] <= offsets[1]):
            return f"{name}: the header's entry {tensor!r} has no valid data_offsets ({entry!r}); {AGAIN}"
        end = max(end, offsets[1])
    have = size - 8 - n
    if have < end:
        return f"{name} is truncated: header says {end} bytes of tensors, file holds {have}; {AGAIN}"
    if have > end:
        return (f"{name} holds {have} bytes of tensors but its header says {end} (safetensors refuses a file its "
                f"header does not cover exactly); {AGAIN}")
    return None


def bin_problem(file: str) -> str | None:
    """What is wrong with the PyTorch weights file ``file`` (``torch.save``'s zip archive: its end record and
    central directory must be there, every entry inside the file), without loading it. A file in the legacy
    (pickle) format is not checked. None when it is sound."""
    name = os.path.basename(file)
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        magic = f.read(4)
    if size == 0:
        return f"{name} is empty; {AGAIN}"
    if magic.startswith(b"PK"):
        if not zipfile.is_zipfile(file):
            return (f"{name} is truncated: a PyTorch zip archive without its end record (central directory), "
                    f"{size} bytes; {AGAIN}")
        try:
            with zipfile.ZipFile(file) as z:
                infos = z.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            return f"{name} is not a readable PyTorch zip archive ({exc}); {AGAIN}"
        if any(i.header_offset + i.compress_size > size for i in infos):
            return f"{name} is truncated: its entries reach beyond its {size} bytes; {AGAIN}"
        return None
    if magic[:1] == b"\x80":
        return None  # the legacy pickle format: not checkable without loading it
    return f"{name} is not a PyTorch weights file (neither a zip archive nor a pickle); {AGAIN}"


def _file_problem(file: str) -> str | None:
    return safetensors_problem(file) if file.endswith(".safetensors") else bin_problem(file)


def _index_problem(folder: str, index: str) -> str | None:
    """What is wrong with the sharded checkpoint of ``folder`` whose index file is ``index``: the index must parse
    and list shards, and each listed shard must be there and sound."""
    try:
        with open(os.path.join(folder, index), encoding="utf-8") as f:
            weight_map = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        return json_problem(os.path.join(folder, index), exc)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
    if not shards or not all(isinstance(s, str) for s in shards):
        return f"{index} lists no shard files (no \"weight_map\" of tensor name to file); {AGAIN}"
    missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return (f"{index} lists {len(shards)} shard files, {len(missing)} of them missing: "
                f"{', '.join(missing[:3])}{more}; {AGAIN}")
    for shard in shards:
        problem = _file_problem(os.path.join(folder, shard))
        if problem:  # the note goes with what is wrong, before the advice
            return f"{problem.removesuffix(f'; {AGAIN}')} (a shard listed in {index}); {AGAIN}"
    return None


def weights_problem(folder: str, hf: dict | None = None, all_safetensors: bool = False) -> str | None:
    """What is wrong with the weights of the model folder ``folder`` (``hf``: its ``config.json``), or None.

    The file checked is the one ``from_pretrained`` loads (``config.json``'s ``transformers_weights``, else the
    first of :data:`WEIGHT_FILES` present; an index with all its shards). ``all_safetensors``: the loader reads
    every ``*.safetensors`` of the folder when there is one (the Megatron path), so each is checked. A LoRA adapter
    folder (``adapter_config.json``) is left to its loader.
    """
    names = sorted(os.listdir(folder))
    if all_safetensors and any(n.endswith(".safetensors") for n in names):
        for n in names:
            if n.endswith(".safetensors"):
                broken = broken_link(folder, n)
                problem = f"{broken}; {AGAIN}" if broken else safetensors_problem(os.path.join(folder, n))
                if problem:
                    return problem
        return None
    explicit = (hf or {}).get("transformers_weights")
    chosen = [explicit] if isinstance(explicit, str) else [n for n in WEIGHT_FILES if n in names]
    if not chosen or not os.path.isfile(os.path.join(folder, chosen[0])):
        if "adapter_config.json" in names:
            return None
        if chosen and broken_link(folder, chosen[0]):
            return f"{broken_link(folder, chosen[0])}; {AGAIN}"
        if isinstance(explicit, str):
            return f"{explicit}, the weights file that config.json's transformers_weights names, is missing; {AGAIN}"
        return f"no weights ({EXPECTED_WEIGHTS})"
    name = chosen[0]
    if name.endswith(".index.json"):
        return _index_problem(folder, name)
    return _file_problem(os.path.join(folder, name))


def loaded_weight_files(folder: str, hf: dict | None = None, all_safetensors: bool = False) -> list[str]:
    """The names in ``folder`` of the weights files the loader reads, chosen as :func:`weights_problem` chooses them:
    every ``*.safetensors`` (``all_safetensors``, when there is one), else ``config.json``'s
    ``transformers_weights``, else the first of :data:`WEIGHT_FILES` present (an index stands for its shards)."""
    names = sorted(os.listdir(folder))
    if all_safetensors and any(n.endswith(".safetensors") for n in names):
        return [n for n in names if n.endswith(".safetensors")]
    explicit = (hf or {}).get("transformers_weights")
    if isinstance(explicit, str):
        return [explicit]
    return [n for n in WEIGHT_FILES if n in names][:1]


def generation_config_problem(folder: str) -> str | None:
    """What is wrong with the ``generation_config.json`` of ``folder``, when there is one: it must be a JSON object
    (the rollout reads its ``eos_token_id`` as stop tokens, ``rollout.stop_tokens``). None when it is sound or
    absent."""
    name = "generation_config.json"
    broken = broken_link(folder, name)
    if broken:
        return f"{broken}; {AGAIN}"
    file = os.path.join(folder, name)
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            out = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        return json_problem(file, exc)
    return None if isinstance(out, dict) else f"{name} holds a {type(out).__name__}, not a JSON object; {AGAIN}"


def is_hub_id(value: str) -> bool:
    """``value`` reads as a Hugging Face Hub id (``name`` or ``org/name``), not as a local path."""
    return bool(_HUB_ID.match(value)) and not value.startswith((".", "~"))


def _missing_folder(key: str, path: str, needs: str) -> str | None:
    """A problem line for a value ``path`` of ``key`` that is not a local folder: it does not exist (a Hub id
    is left to the download path), or it is not a folder. None for a folder or a Hub id."""
    if os.path.isdir(path):
        return None
    if not os.path.exists(path):
        return None if is_hub_id(path) else f"{key}={path!r} does not exist (expected a folder with {needs})"
    return f"{key}={path!r} is not a folder (expected a folder with {needs})"


def _loads(cfg: dict) -> list[tuple[str, str, str, str, bool, bool]]:
    """The model folders the run loads: ``(key, folder, tokenizer key, tokenizer folder, megatron, checked)``
    per role (the actor with its reference, the critic when ``critic.enable``, PRIME's reward model and its
    frozen reference). ``checked``: ``trainer.config_preflight`` already refuses a missing folder or one without
    ``config.json`` under this key. The embedded tiny model (``actor_rollout_ref.model.path=null``) is built by the
    run and not listed."""
    arr = cfg["actor_rollout_ref"]["model"]
    akey, apath = "actor_rollout_ref.model.path", arr.get("path")
    atok = ("actor_rollout_ref.model.tokenizer_path", arr.get("tokenizer_path"))
    megatron = (cfg.get("trainer") or {}).get("strategy") == "megatron"
    out = []

    def role(key, path, tok, mega, checked):
        tkey, tpath = tok if tok[1] else (key, path)
        if path is not None:
            out.append((key, path, tkey, tpath, mega, checked))

    role(akey, apath, atok, megatron, True)
    critic = cfg.get("critic") or {}
    if critic.get("enable"):
        cm = critic.get("model") or {}
        ctok = ("critic.model.tokenizer_path", cm["tokenizer_path"]) if cm.get("tokenizer_path") else atok
        role(*(("critic.model.path", cm["path"]) if cm.get("path") else (akey, apath)), ctok, False, True)
    if (cfg.get("algorithm") or {}).get("use_prime"):
        rm = (cfg.get("reward_model") or {}).get("model") or {}
        ptok = ("reward_model.model.tokenizer_path", rm["tokenizer_path"]) if rm.get("tokenizer_path") else atok
        prm = ("reward_model.model.path", rm["path"]) if rm.get("path") else (akey, apath)
        role(*prm, ptok, False, prm[0] == akey)
        ref = ("reward_model.model.ref_path", rm["ref_path"]) if rm.get("ref_path") else prm
        role(*ref, ptok, False, ref[0] == akey)
    return out


def check_model_folders(cfg: dict) -> None:
    """Every model folder the run loads (:func:`_loads`) holds sound weights (:func:`weights_problem`) whose shapes
    agree with its ``config.json`` (:func:`trainer.weight_shapes.config_weights_problem`), the actor's a sound
    ``generation_config.json`` when it has one (:func:`generation_config_problem`), and the tokenizer its role
    reads (:func:`tokenizer_problem`: the role's ``tokenizer_path``, else the model folder's own). Each
    folder is judged once, under the first key that names it; a Hub id is left to the download.

    Raises:
        ConfigError: one line per problem, ``<key>='<path>': <what is wrong> (expected ...)``
            (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    errors = ErrorCollector()
    judged: dict = {}  # (real folder, megatron) -> the folder is a model folder (config.json there)
    reported: set = set()  # real folders with a problem already reported (under the first key that names them)
    seen_tokenizers: set = set()
    remote = bool(cfg["actor_rollout_ref"]["model"].get("trust_remote_code"))
    by_transformers = _external_lib_imports(cfg["actor_rollout_ref"]["model"].get("external_lib"))
    custom_template = cfg["actor_rollout_ref"]["model"].get("custom_chat_template")
    for key, path, tkey, tpath, megatron, checked in _loads(cfg):
        here = (os.path.realpath(path), megatron)
        if here not in judged:
            before = len(errors.messages)
            judged[here] = _judge_weights(errors if here[0] not in reported else ErrorCollector(), key, path,
                                          megatron, checked, remote if by_transformers else None)
            if len(errors.messages) > before:
                reported.add(here[0])
        if tkey == key and not judged[here]:
            continue  # the model folder's own tokenizer, in a folder already refused
        if not os.path.isdir(tpath):
            line = _missing_folder(tkey, tpath, "the tokenizer")
            if line:
                errors.add(line)
            continue
        if os.path.realpath(tpath) in seen_tokenizers:
            continue
        seen_tokenizers.add(os.path.realpath(tpath))
        problem = tokenizer_problem(tpath, remote)
        if problem:
            if tkey == key and problem.startswith("no tokenizer"):  # a damaged file says what to do itself
                problem += (f"; save the tokenizer there, or set {key.rsplit('.', 1)[0]}.tokenizer_path to a folder "
                            "that has one")
            errors.add(f"{tkey}={tpath!r}: {problem}")
        elif key == ACTOR_KEY and not custom_template:
            problem = chat_template_problem(tpath)
            if problem and prompts_are_chat(cfg):  # the dataset renders chat prompts with the actor's tokenizer
                errors.add(f"{tkey}={tpath!r}: {problem}, but the prompts (data.prompt_key) are chat messages, "
                           "rendered with it; set actor_rollout_ref.model.custom_chat_template to a Jinja chat "
                           "template, set actor_rollout_ref.model.tokenizer_path to a tokenizer folder that has one, "
                           "or store the prompts as plain strings (tokenised without a template)")
    actor = cfg["actor_rollout_ref"]["model"].get("path")
    if actor is not None and os.path.isfile(os.path.join(actor, "config.json")):
        problem = generation_config_problem(actor)
        if problem:
            errors.add(f"{ACTOR_KEY}={actor!r}: {problem}")
    errors.raise_if_any()


def _external_lib_imports(name: str | None) -> bool:
    """``model.external_lib`` (a module that registers models with transformers) is unset or imports; one that does
    not is reported by ``trainer.launch.import_external_lib``, and transformers does not judge the folders then."""
    if not name:
        return True
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _judge_weights(errors: ErrorCollector, key: str, path: str, megatron: bool, checked: bool,
                   remote: bool | None) -> bool:
    """Add to ``errors`` what is wrong with the model folder ``path`` of ``key`` (its existence and
    ``config.json`` when no other check names them, ``not checked``; its weights, their shapes against
    ``config.json``, then, unless ``remote`` (``trust_remote_code``) is None, ``config.json`` as transformers loads
    it, :func:`trainer.meta_shapes.transformers_config_problem`). Returns whether ``path`` is a model folder (a
    folder with ``config.json``)."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        if not checked:  # a folder no other check names
            line = _missing_folder(key, path, "config.json and the weights")
            if line is None and os.path.isdir(path):
                line = f"{key}={path!r} is not a Hugging Face model folder (no config.json)"
            if line:
                errors.add(line)
        return False
    hf = errors.run(read_model_config, key, path)
    if hf is not None:
        files = loaded_weight_files(path, hf, megatron)
        problem = weights_problem(path, hf, all_safetensors=megatron) or config_weights_problem(path, hf, files)
        if problem is None and remote is not None:
            from trainer.meta_shapes import transformers_config_problem

            problem = transformers_config_problem(path, hf, files, remote)
        if problem:
            errors.add(f"{key}={path!r}: {problem}")
    return True


def check_model_files(cfg: dict, hf: dict) -> None:
    """The actor's model folder against what the run needs: a vision-language model ships its processor
    (``trainer.multimodal.check_processor``) and generates with the hf rollout engine (a resumed checkpoint's model:
    :func:`trainer.resume_checks.check_resume_model`).

    Raises:
        ConfigError: naming the key and the missing file or differing value.
    """
    from trainer.multimodal import check_processor

    model = cfg["actor_rollout_ref"]["model"]
    if model.get("path") is not None:
        try:
            check_processor("actor_rollout_ref.model.path", model["path"], hf, model.get("tokenizer_path"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    rollout = cfg["actor_rollout_ref"]["rollout"]["name"]
    if hf.get("vision_config") and rollout != "hf":
        raise ConfigError(f"actor_rollout_ref.rollout.name={rollout}: image prompts of a vision-language model are "
                          "passed to generation by the hf engine only; use rollout=hf")
