"""How the model-folder checks name a damaged file, in one line: a JSON file cut short or not JSON, a symbolic link
whose target is gone (a cleaned Hugging Face cache), and the advice that ends such a line (:data:`AGAIN`).

Used by the checks of the weights (:mod:`trainer.model_folder_checks`) and of the tokenizer files
(:mod:`trainer.tokenizer_files`); nothing here imports torch or transformers.
"""
from __future__ import annotations

import json
import os

#: the advice at the end of a line about a damaged file
AGAIN = "download or copy it again"


def json_problem(file: str, exc: Exception) -> str:
    """The problem line for the JSON file ``file`` that failed to parse with ``exc``: a file that ends before its
    JSON is complete is named truncated (a download or copy cut short)."""
    name = os.path.basename(file)
    if isinstance(exc, json.JSONDecodeError) and (exc.pos >= len(exc.doc.rstrip())
                                                  or exc.msg.startswith("Unterminated string")):  # open at the end
        return f"{name} is truncated: its {os.path.getsize(file)} bytes end before its JSON is complete; {AGAIN}"
    return f"{name} is not valid JSON ({exc}); {AGAIN}"


def broken_link(folder: str, name: str) -> str | None:
    """What is wrong when ``name`` in ``folder`` is a symbolic link whose target is gone (e.g. into a Hugging Face
    cache that was cleaned), without advice; None otherwise."""
    file = os.path.join(folder, name)
    if os.path.islink(file) and not os.path.exists(file):
        return (f"{name} is a broken symbolic link (to {os.readlink(file)!r}, which does not exist: a cleaned "
                "Hugging Face cache?)")
    return None
