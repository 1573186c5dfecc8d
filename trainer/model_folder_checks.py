"""The files of the model folders a run loads, checked before any worker starts (``trainer.config_preflight``): the
weights each role will load (single file or the shards of an index, ``.safetensors`` or ``.bin``; a safetensors
file is checked against its own header, without loading a tensor) and the tokenizer each role reads.

Nothing here imports torch or transformers: a folder that lacks its weights, holds a file cut short by a failed
download or copy, or has no tokenizer is one ``ConfigError`` line naming the key, the path and what is wrong,
instead of a traceback in every worker after Ray has started.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import zipfile

from trainer.config_checks import ConfigError, ErrorCollector

__all__ = ["check_model_folders", "read_model_config", "weights_problem", "tokenizer_problem", "safetensors_problem",
           "bin_problem", "chat_template_problem", "no_eos_problem"]

#: the weight files ``transformers``' ``from_pretrained`` looks for in a local folder, in its order
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
EXPECTED_WEIGHTS = "expected model.safetensors, pytorch_model.bin or a *.index.json with its shards"
#: a tokenizer's own files: tokenizer.json, a SentencePiece model (tokenizer.model, spiece.model, ...), a vocabulary
#: (vocab.json + merges.txt, vocab.txt) or a tiktoken file
TOKENIZER_PATTERNS = ("tokenizer.json", "*.model", "vocab.*", "*.tiktoken")
EXPECTED_TOKENIZER = "expected tokenizer.json or tokenizer.model / vocab files"
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header (bytes)
_AGAIN = "download or copy it again"
ACTOR_KEY = "actor_rollout_ref.model.path"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _json_problem(file: str, exc: Exception) -> str:
    """The problem line for the JSON file ``file`` that failed to parse with ``exc``: a file that ends before its
    JSON is complete is named truncated (a download or copy cut short)."""
    name = os.path.basename(file)
    if isinstance(exc, json.JSONDecodeError) and (exc.pos >= len(exc.doc.rstrip())
                                                  or exc.msg.startswith("Unterminated string")):  # open at the end
        return f"{name} is truncated: its {os.path.getsize(file)} bytes end before its JSON is complete; {_AGAIN}"
    return f"{name} is not valid JSON ({exc}); {_AGAIN}"


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
        raise ConfigError(f"{key}={path!r}: {_json_problem(file, exc)}") from None
    if not isinstance(out, dict):
        raise ConfigError(f"{key}={path!r}: config.json holds a {type(out).__name__}, not a JSON object; {_AGAIN}")
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
            return f"{name} is truncated: {size} bytes, less than a safetensors file's 8-byte header length; {_AGAIN}"
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            return f"{name} is not a safetensors file (its first 8 bytes give a header of {n} bytes); {_AGAIN}"
        if 8 + n > size:
            return (f"{name} is truncated: its header length says {n} bytes of JSON header, the file holds "
                    f"{size - 8} after the length; {_AGAIN}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{name} has a header that is not valid JSON ({exc}); {_AGAIN}"
    if not isinstance(header, dict):
        return f"{name} has a header that is not a JSON object; {_AGAIN}"
    end = 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
                and offsets[0] <= offsets[1]):
            return f"{name}: the header's entry {tensor!r} has no valid data_offsets ({entry!r}); {_AGAIN}"
        end = max(end, offsets[1])
    have = size - 8 - n
    if have < end:
        return f"{name} is truncated: header says {end} bytes of tensors, file holds {have}; {_AGAIN}"
    if have > end:
        return (f"{name} holds {have} bytes of tensors but its header says {end} (safetensors refuses a file its "
                f"header does not cover exactly); {_AGAIN}")
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
        return f"{name} is empty; {_AGAIN}"
    if magic.startswith(b"PK"):
        if not zipfile.is_zipfile(file):
            return (f"{name} is truncated: a PyTorch zip archive without its end record (central directory), "
                    f"{size} bytes; {_AGAIN}")
        try:
            with zipfile.ZipFile(file) as z:
                infos = z.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            return f"{name} is not a readable PyTorch zip archive ({exc}); {_AGAIN}"
        if any(i.header_offset + i.compress_size > size for i in infos):
            return f"{name} is truncated: its entries reach beyond its {size} bytes; {_AGAIN}"
        return None
    if magic[:1] == b"\x80":
        return None  # the legacy pickle format: not checkable without loading it
    return f"{name} is not a PyTorch weights file (neither a zip archive nor a pickle); {_AGAIN}"


def _file_problem(file: str) -> str | None:
    return safetensors_problem(file) if file.endswith(".safetensors") else bin_problem(file)


def _index_problem(folder: str, index: str) -> str | None:
    """What is wrong with the sharded checkpoint of ``folder`` whose index file is ``index``: the index must parse
    and list shards, and each listed shard must be there and sound."""
    try:
        with open(os.path.join(folder, index), encoding="utf-8") as f:
            weight_map = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        return _json_problem(os.path.join(folder, index), exc)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
    if not shards or not all(isinstance(s, str) for s in shards):
        return f"{index} lists no shard files (no \"weight_map\" of tensor name to file); {_AGAIN}"
    missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return (f"{index} lists {len(shards)} shard files, {len(missing)} of them missing: "
                f"{', '.join(missing[:3])}{more}; {_AGAIN}")
    for shard in shards:
        problem = _file_problem(os.path.join(folder, shard))
        if problem:  # the note goes with what is wrong, before the advice
            return f"{problem.removesuffix(f'; {_AGAIN}')} (a shard listed in {index}); {_AGAIN}"
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
                broken = _broken_link(folder, n)
                problem = f"{broken}; {_AGAIN}" if broken else safetensors_problem(os.path.join(folder, n))
                if problem:
                    return problem
        return None
    explicit = (hf or {}).get("transformers_weights")
    chosen = [explicit] if isinstance(explicit, str) else [n for n in WEIGHT_FILES if n in names]
    if not chosen or not os.path.isfile(os.path.join(folder, chosen[0])):
        if "adapter_config.json" in names:
            return None
        if chosen and _broken_link(folder, chosen[0]):
            return f"{_broken_link(folder, chosen[0])}; {_AGAIN}"
        if isinstance(explicit, str):
            return f"{explicit}, the weights file that config.json's transformers_weights names, is missing; {_AGAIN}"
        return f"no weights ({EXPECTED_WEIGHTS})"
    name = chosen[0]
    if name.endswith(".index.json"):
        return _index_problem(folder, name)
    return _file_problem(os.path.join(folder, name))


def _broken_link(folder: str, name: str) -> str | None:
    """What is wrong when ``name`` in ``folder`` is a symbolic link whose target is gone (e.g. into a Hugging Face
    cache that was cleaned), without advice; None otherwise."""
    file = os.path.join(folder, name)
    if os.path.islink(file) and not os.path.exists(file):
        return (f"{name} is a broken symbolic link (to {os.readlink(file)!r}, which does not exist: a cleaned "
                "Hugging Face cache?)")
    return None


def tokenizer_problem(folder: str, trust_remote_code: bool = False) -> str | None:
    """What is wrong with the tokenizer of ``folder``: it must hold a tokenizer's files (:data:`TOKENIZER_PATTERNS`)
    and its ``tokenizer.json`` and ``tokenizer_config.json``, when there, must parse. A tokenizer of remote code
    (``tokenizer_config.json``'s ``auto_map`` with ``trust_remote_code``) is left to its code. None when it is
    sound."""
    names = os.listdir(folder)
    for name in ("tokenizer_config.json", "tokenizer.json"):
        if name in names:
            broken = _broken_link(folder, name)
            if broken:
                return f"{broken}; {_AGAIN}"
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    json.load(f)
            except (ValueError, UnicodeDecodeError) as exc:
                return _json_problem(os.path.join(folder, name), exc)
    if "tokenizer.json" in names:
        return None
    if any(fnmatch.fnmatch(n, p) for n in names for p in TOKENIZER_PATTERNS):
        return None
    if trust_remote_code and "tokenizer_config.json" in names:
        try:
            with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
                if "AutoTokenizer" in (json.load(f).get("auto_map") or {}):
                    return None
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
            pass
    return f"no tokenizer ({EXPECTED_TOKENIZER})"


def chat_template_problem(folder: str) -> str | None:
    """What keeps the tokenizer of ``folder`` from having a chat template, read from its files as ``transformers``
    does (``chat_template.jinja``, ``chat_template.json``'s ``chat_template``, ``tokenizer_config.json``'s
    ``chat_template``); None when one of them holds a template. A tokenizer of remote code is not judged here."""
    def read_json(name):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out = json.load(f)
            return out if isinstance(out, dict) else {}
        except (OSError, ValueError, UnicodeDecodeError):
            return {}

    config = read_json("tokenizer_config.json")
    if "AutoTokenizer" in (config.get("auto_map") or {}) or config.get("chat_template"):
        return None
    if read_json("chat_template.json").get("chat_template"):
        return None
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja) and os.path.getsize(jinja) > 0:
        return None
    broken = _broken_link(folder, "chat_template.jinja")
    if broken:
        return f"the tokenizer has no chat template: {broken}"
    return ("the tokenizer has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja "
            "or chat_template.json)")


def no_eos_problem(cfg: dict) -> str:
    """The error line for an actor tokenizer that was loaded without an EOS token: the key and folder it was read
    from (``actor_rollout_ref.model.tokenizer_path``, else ``.path``), what its ``tokenizer_config.json`` says and
    what to set there."""
    model = cfg["actor_rollout_ref"]["model"]
    key, path = (("actor_rollout_ref.model.tokenizer_path", model["tokenizer_path"]) if model.get("tokenizer_path")
                 else (ACTOR_KEY, model["path"]))
    file = os.path.join(str(path), "tokenizer_config.json")
    config = None
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):  # the AddedToken form: {"content": "</s>", ...}
        eos = eos.get("content")
    if os.path.isdir(str(path)) and not os.path.isfile(file):
        why = "the folder has no tokenizer_config.json"
    elif eos:
        why = f"tokenizer_config.json's eos_token {eos!r} is not a token of its vocabulary"
    else:
        why = "tokenizer_config.json names no eos_token"
    return (f"{key}={path!r}: the tokenizer has no EOS token ({why}); set \"eos_token\" in {file} to the token "
            "that ends a response")


def _prompts_are_chat(cfg: dict) -> bool:
    """The training or validation prompts (``data.prompt_key``) are chat messages, which
    :meth:`trainer.dataset.PromptDataset.prompt_ids` renders with the tokenizer's chat template (a plain string
    prompt is tokenised as it is). The embedded task (``data.train_files`` null) is chat messages; a file whose first
    row (JSON lines) or column type (parquet) cannot be read is left to the data loader."""
    data = cfg.get("data") or {}
    key = data.get("prompt_key") or "prompt"
    if data.get("train_files") is None:
        return True
    for files in (data.get("train_files"), data.get("val_files")):
        for f in ([files] if isinstance(files, str) else list(files or ())):
            f = os.path.expanduser(str(f))
            if not os.path.isfile(f):
                continue
            try:
                if f.endswith(".parquet"):
                    import pyarrow.parquet as pq

                    schema = pq.read_schema(f)
                    if key in schema.names and str(schema.field(key).type).startswith(("list", "large_list")):
                        return True
                    continue
                with open(f, encoding="utf-8") as fh:
                    line = next((ln for ln in fh if ln.strip()), "")
                row = json.loads(line) if line else {}
                if isinstance(row, dict) and isinstance(row.get(key), list):
                    return True
            except Exception:  # noqa: BLE001 - an unreadable file is named by the data loader
                continue
    return False


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
    """Every model folder the run loads (:func:`_loads`) holds sound weights (:func:`weights_problem`) and the
    tokenizer its role reads (:func:`tokenizer_problem`: the role's ``tokenizer_path``, else the model folder's
    own). Each folder is judged once, under the first key that names it; a Hub id is left to the download.

    Raises:
        ConfigError: one line per problem, ``<key>='<path>': <what is wrong> (expected ...)``
            (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    errors = ErrorCollector()
    judged: dict = {}  # (real folder, megatron) -> the folder is a model folder (config.json there)
    reported: set = set()  # real folders with a problem already reported (under the first key that names them)
    seen_tokenizers: set = set()
    remote = bool(cfg["actor_rollout_ref"]["model"].get("trust_remote_code"))
    custom_template = cfg["actor_rollout_ref"]["model"].get("custom_chat_template")
    for key, path, tkey, tpath, megatron, checked in _loads(cfg):
        here = (os.path.realpath(path), megatron)
        if here not in judged:
            before = len(errors.messages)
            judged[here] = _judge_weights(errors if here[0] not in reported else ErrorCollector(), key, path,
                                          megatron, checked)
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
            if problem and _prompts_are_chat(cfg):  # the dataset renders chat prompts with the actor's tokenizer
                errors.add(f"{tkey}={tpath!r}: {problem}, but the prompts (data.prompt_key) are chat messages, "
                           "rendered with it; set actor_rollout_ref.model.custom_chat_template to a Jinja chat "
                           "template, set actor_rollout_ref.model.tokenizer_path to a tokenizer folder that has one, "
                           "or store the prompts as plain strings (tokenised without a template)")
    errors.raise_if_any()


def _judge_weights(errors: ErrorCollector, key: str, path: str, megatron: bool, checked: bool) -> bool:
    """Add to ``errors`` what is wrong with the model folder ``path`` of ``key`` (its existence and
    ``config.json`` when no other check names them, ``not checked``; its weights). Returns whether ``path`` is a
    model folder (a folder with ``config.json``)."""
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
        problem = weights_problem(path, hf, all_safetensors=megatron)
        if problem:
            errors.add(f"{key}={path!r}: {problem}")
    return True
