"""The tokenizer files of a model folder, checked before any worker starts (:func:`tokenizer_problem`, run by
:func:`trainer.model_folder_checks.check_model_folders` for the tokenizer each role reads): a tokenizer's own files
must be there and its JSON files must parse; the actor's tokenizer must have a chat template when the prompts are chat
messages (:func:`chat_template_problem`, :func:`prompts_are_chat`). :func:`no_eos_problem` is the one line for a
tokenizer that loaded without an EOS token, :func:`load_problem` the one line for a tokenizer that does not load or
does not encode :func:`probe_text`.

Files are read as JSON and listed, as ``transformers`` would find them; nothing here imports torch or transformers.
"""
from __future__ import annotations

import fnmatch
import json
import os

from trainer.file_problems import AGAIN, broken_link, json_problem

__all__ = ["tokenizer_problem", "chat_template_problem", "no_eos_problem", "eos_outside_vocab_problem", "load_problem",
           "probe_text", "prompts_are_chat"]

#: a tokenizer's own files: tokenizer.json, a SentencePiece model (tokenizer.model, spiece.model, ...), a vocabulary
#: (vocab.json + merges.txt, vocab.txt) or a tiktoken file
TOKENIZER_PATTERNS = ("tokenizer.json", "*.model", "vocab.*", "*.tiktoken")
EXPECTED_TOKENIZER = "expected tokenizer.json or tokenizer.model / vocab files"
ACTOR_KEY = "actor_rollout_ref.model.path"


def tokenizer_problem(folder: str, trust_remote_code: bool = False) -> str | None:
    """What is wrong with the tokenizer of ``folder``: it must hold a tokenizer's files (:data:`TOKENIZER_PATTERNS`)
    and its ``tokenizer.json`` and ``tokenizer_config.json``, when there, must parse. A tokenizer of remote code
    (``tokenizer_config.json``'s ``auto_map`` with ``trust_remote_code``) is left to its code. None when it is
    sound."""
    names = os.listdir(folder)
    for name in ("tokenizer_config.json", "tokenizer.json"):
        if name in names:
            broken = broken_link(folder, name)
            if broken:
                return f"{broken}; {AGAIN}"
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    json.load(f)
            except (ValueError, UnicodeDecodeError) as exc:
                return json_problem(os.path.join(folder, name), exc)
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
    broken = broken_link(folder, "chat_template.jinja")
    if broken:
        return f"the tokenizer has no chat template: {broken}"
    return ("the tokenizer has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja "
            "or chat_template.json)")


def _tokenizer_source(cfg: dict) -> tuple[str, str]:
    """``(key, folder)`` the actor's tokenizer is read from: ``actor_rollout_ref.model.tokenizer_path``, else
    ``.path``."""
    model = cfg["actor_rollout_ref"]["model"]
    return (("actor_rollout_ref.model.tokenizer_path", model["tokenizer_path"]) if model.get("tokenizer_path")
            else (ACTOR_KEY, model["path"]))


def eos_outside_vocab_problem(cfg: dict, tokenizer, vocab_size: int) -> str:
    """The error line for an actor tokenizer whose EOS id is past the model's vocabulary (``vocab_size``
    embedding rows): a token the tokenizer added (e.g. an ``eos_token`` of ``tokenizer_config.json`` that its
    vocabulary lacks) that the model can never generate, so no response would end at it."""
    key, path = _tokenizer_source(cfg)
    return (f"{key}={path!r}: the tokenizer's eos_token {tokenizer.eos_token!r} has id {tokenizer.eos_token_id}, "
            f"outside the model's vocabulary (vocab_size {vocab_size}): the model can never generate it; set "
            f"\"eos_token\" in {os.path.join(str(path), 'tokenizer_config.json')} to a token of the model's vocabulary")


def no_eos_problem(cfg: dict) -> str:
    """The error line for an actor tokenizer that was loaded without an EOS token: the key and folder it was read
    from (``actor_rollout_ref.model.tokenizer_path``, else ``.path``), what its ``tokenizer_config.json`` says and
    what to set there."""
    key, path = _tokenizer_source(cfg)
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


def load_problem(cfg: dict, exc: BaseException, failed: str = "does not load") -> str:
    """The error line for the actor's tokenizer that ``failed`` (``does not load``, ``does not encode text``) with
    ``exc``, e.g. ``Exception: WordLevel error: Missing [UNK] token from the vocabulary`` for an empty vocabulary:
    the key and folder it was read from, the library's error on one line, and what to do."""
    model = cfg["actor_rollout_ref"]["model"]
    key, path = (("actor_rollout_ref.model.tokenizer_path", model["tokenizer_path"]) if model.get("tokenizer_path")
                 else (ACTOR_KEY, model["path"]))
    error = " ".join(str(exc).split())
    error = f"{type(exc).__name__}: {error[:300]}{'...' if len(error) > 300 else ''}"
    if isinstance(exc, ImportError):
        fix = "install the package it names"
    elif "trust_remote_code" in error and not model.get("trust_remote_code"):
        fix = "set actor_rollout_ref.model.trust_remote_code=true if you trust the folder's code"
    else:
        fix = AGAIN
    return f"{key}={path!r}: the tokenizer {failed} ({error}); {fix}"


def probe_text(tokenizer) -> str:
    """A text the tokenizer must encode: its first eight regular (not special) tokens by id, decoded; ``"a"`` when its
    vocabulary holds special tokens only."""
    special = set(tokenizer.all_special_ids)
    ids = sorted(i for i in tokenizer.get_vocab().values() if i not in special)[:8]
    return tokenizer.decode(ids) if ids else "a"


def prompts_are_chat(cfg: dict) -> bool:
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
