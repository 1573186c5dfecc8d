"""Single rows of a prompt data file: why a row cannot be used, and how an error names it.

:func:`row_problem` says why a row is skipped as unusable (no prompt or ground truth, a chat message without its role
or content, a ``prompt``, ``reward_model`` or ``extra_info`` of the wrong type), :func:`row_tools` and
:func:`row_images` read a row's ``tools`` and ``images`` columns, :func:`row_place` and :func:`row_origins` name a row by
its file and index (counted from 0), :func:`jsonl_problem` finds the row of a JSON-lines file that does not parse, and
:func:`check_reward_key` makes sure every row names its reward scorer in ``data.reward_fn_key``. A row that cannot be
used is a :class:`DataError` naming its file and index (:class:`trainer.dataset.PromptDataset` reads the files and puts
the place in front).
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence


class DataError(ValueError):
    """A data file is missing, empty, lacks a column or holds no usable rows."""


def row_place(path: str, index: int) -> str:
    """How an error names a row: ``row <index> of <file> (counted from 0)``."""
    return f"row {index} of {path} (counted from 0)"


def type_of(value: Any) -> str:
    """A value's type with its article and the value, shortened: ``a str ('hello')``, ``an int (5)``."""
    name = type(value).__name__
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({shown})"


def row_tools(row: dict) -> list:
    """A row's ``tools`` column as a list of function definitions (``[]`` when absent or empty).

    Raises:
        DataError: the column is neither a list of mappings nor the JSON text of one (the message does not name
            the row: :class:`trainer.dataset.PromptDataset` puts its file and index in front).
    """
    tools = row.get("tools")
    if tools is None or (hasattr(tools, "__len__") and len(tools) == 0):
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise DataError(f"its 'tools' is not JSON ({exc.msg}): {tools[:80]!r}; expected a list of function "
                            "definitions or its JSON text") from exc
    tools = list(tools) if not isinstance(tools, (str, dict)) and hasattr(tools, "__iter__") else tools
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise DataError(f"its 'tools' is {type_of(tools)}; expected a list of function definitions "
                        "({'type': 'function', 'function': {...}}) or its JSON text")
    return tools


#: ``data.truncation`` values (verl's): raise, keep the last tokens, keep the first, keep both ends
TRUNCATIONS = ("error", "left", "right", "middle")


def truncate_prompt(ids: list[int], max_len: int, truncation: str) -> list[int]:
    """``ids`` cut to ``max_len`` tokens by ``data.truncation``: ``left`` keeps the last ``max_len``, ``right`` the
    first, ``middle`` the first ``max_len // 2`` and the last ``max_len - max_len // 2`` (verl's
    ``RLHFDataset``); ``ids`` as it is when it fits.

    Raises:
        ValueError: ``truncation`` is not ``left``, ``right`` or ``middle``.
    """
    if len(ids) <= max_len:
        return ids
    if truncation == "left":
        return ids[-max_len:]
    if truncation == "right":
        return ids[:max_len]
    if truncation == "middle":
        head = max_len // 2
        return ids[:head] + ids[len(ids) - (max_len - head):]
    raise ValueError(f"data.truncation={truncation!r}; expected left, right or middle to cut a prompt")


def image_paths_from(row: dict, image_key: str, data_file: str) -> dict:
    """``row`` with each relative image path (a string, ``file://`` too, or a ``{'path'}`` / ``{'image'}`` dict
    without bytes) of its ``image_key`` column that is not a file from the working folder but is one from
    ``data_file``'s folder replaced by that path: verl reads a relative path from the working folder; data written
    with paths relative to its own file is read from any folder. ``row`` itself is not changed."""
    images = row.get(image_key)
    if not isinstance(images, (list, tuple)) or not images:
        return row
    base, changed, out = os.path.dirname(os.path.abspath(data_file)), False, []
    for x in images:
        key = next((k for k in ("path", "image") if isinstance(x, dict) and x.get(k)), None)
        path = x[key] if key and not x.get("bytes") else x
        path = path[len("file://"):] if isinstance(path, str) and path.startswith("file://") else path
        if isinstance(path, str) and path and not os.path.isabs(path) and not os.path.isfile(path) \
                and os.path.isfile(os.path.join(base, path)):
            path, changed = os.path.join(base, path), True
            x = {**x, key: path} if isinstance(x, dict) else path
        out.append(x)
    return {**row, image_key: out} if changed else row


def row_images(row: dict, image_key: str = "images") -> list:
    """A row's images (the column ``image_key``) as a list (``[]`` when absent or empty); its items are read later
    (:func:`trainer.multimodal.load_image`: PIL images, paths, bytes or ``{'bytes', 'path'}`` dicts).

    Raises:
        DataError: the column is not a list (a single path or dict, a number); the message does not name the row.
    """
    images = row.get(image_key)
    if images is None or (isinstance(images, (list, tuple)) and not images):
        return []
    if not isinstance(images, (list, tuple)):
        raise DataError(f"its {image_key!r} is {type_of(images)}; expected a list of images (PIL images, paths, "
                        "bytes or {'bytes', 'path'} dicts), one per <image> placeholder of the prompt")
    return list(images)


# roles that chat templates render (OpenAI's and transformers' names, Llama 3.1's ``ipython`` tool output, Gemma's
# ``model`` for the assistant's turns)
CHAT_ROLES = ("system", "developer", "user", "assistant", "model", "tool", "function", "ipython")


def _prompt_problem(prompt: Any, key: str) -> str | None:
    """What makes ``prompt`` (the value of the column ``key``) unusable: none, empty (or only whitespace), not a
    string or a list of chat messages, a message that is not a mapping with a string ``role`` and a ``content`` (text
    or a list of parts), a role outside :data:`CHAT_ROLES` (ChatML templates render any role as written, so a
    misspelt one became a turn the model never saw in training), or messages whose contents are all empty."""
    if prompt is None:
        return f"no {key!r} value"
    if not isinstance(prompt, (str, list, tuple)):
        return f"its {key!r} is {type_of(prompt)}, expected a list of chat messages or a string"
    if not (prompt.strip() if isinstance(prompt, str) else prompt):
        return f"an empty {key!r}"
    for i, m in enumerate(() if isinstance(prompt, str) else prompt):
        if not isinstance(m, dict):
            return f"chat message {i} of its {key!r} is {type_of(m)}, expected a mapping with a role and content"
        if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list))):
            shown = repr(m) if len(repr(m)) <= 80 else repr(m)[:77] + "..."
            return f"chat message {i} of its {key!r} lacks its role or content: {shown}"
        if m["role"] not in CHAT_ROLES:
            return f"chat message {i} of its {key!r} has the role {m['role']!r}, expected one of {list(CHAT_ROLES)}"
    if not isinstance(prompt, str) and all(_empty(m["content"]) for m in prompt):
        return f"every chat message of its {key!r} has empty content"
    return None


def text_messages(messages: Any, key: str) -> list[dict]:
    """``messages`` as a text-only chat template takes them: a ``content`` given as a list of parts (OpenAI's
    ``[{"type": "text", "text": ...}]``) becomes the concatenation of its text parts, as templates that take parts
    render them (a template that takes strings only rendered the list as its Python text, ``[{'type': ...}]``);
    string contents are kept. Does not change ``messages``.

    Raises:
        DataError: a part that is not a text part (an image part in a row without images, a mapping without a
            string ``text``), naming the message and the part (not the row: the dataset puts it in front).
    """
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str):
            out.append(m)
            continue
        for part in m["content"]:
            if not (isinstance(part, dict) and part.get("type", "text") == "text"
                    and isinstance(part.get("text"), str)):
                raise DataError(f"chat message {i} of its {key!r} has the content part {part!r:.80}, not a text part "
                                "({'type': 'text', 'text': ...}); a prompt without images is rendered as text: keep "
                                "only text parts, or give the row its images (data.image_key) for a model with a "
                                "processor")
        out.append({**m, "content": "".join(part["text"] for part in m["content"])})
    return out


def plain_prompt_note(rows: Sequence[dict], key: str, tokenizer: Any) -> str | None:
    """A warning when some of ``rows`` hold a plain-string prompt in ``key`` while ``tokenizer`` has a chat template:
    such prompts are tokenised as they are, without the template (chat messages are rendered with it); None
    otherwise."""
    plain = sum(isinstance(r.get(key), str) for r in rows)
    if not plain or not getattr(tokenizer, "chat_template", None):
        return None
    return (f"data: {plain} of {len(rows)} prompts ({key!r}) are plain strings, tokenised without the tokenizer's "
            "chat template (it has one); store them as chat messages ([{\"role\": \"user\", \"content\": ...}]) "
            "to have them rendered with it")


def json_messages_text(prompt: Any) -> bool:
    """True when ``prompt`` is a string holding the JSON text of chat messages (a list of mappings with ``role`` and
    ``content``): a list saved as a string, which would be trained on as literal text without the chat template."""
    if not isinstance(prompt, str) or not prompt.lstrip().startswith("["):
        return False
    try:
        value = json.loads(prompt)
    except ValueError:
        return False
    return isinstance(value, list) and bool(value) and \
        all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def _empty(content: str | list) -> bool:
    """An empty (or whitespace-only) text, or a list of parts none of which holds text or anything else."""
    if isinstance(content, str):
        return not content.strip()
    return all(isinstance(p, dict) and p.get("type", "text") == "text" and not str(p.get("text") or "").strip()
               for p in content)


def _reward_model_problem(rm: Any) -> str | None:
    """What makes ``reward_model`` unusable: not a mapping, or its ``ground_truth`` none or empty (``""``, ``[]``,
    ``{}``). A ground truth of any other type (a number, a list of answers) goes to a custom scorer as it is; one
    routed to a built-in scorer, which compares a string or a number, is refused by
    :func:`trainer.config_checks.check_ground_truths`."""
    if rm is None:
        return "no 'reward_model' value, expected a mapping with a 'ground_truth'"
    if not isinstance(rm, dict):
        return f"its 'reward_model' is {type_of(rm)}, expected a mapping with a 'ground_truth'"
    truth = rm.get("ground_truth")
    if truth is None:
        return "no 'reward_model.ground_truth' value"
    if isinstance(truth, (str, list, dict)) and len(truth) == 0:
        return f"an empty 'reward_model.ground_truth' ({truth!r})"
    return None


def row_problem(row: dict, prompt_key: str = "prompt") -> str | None:
    """Why ``row`` is skipped as unusable, every reason joined by ``; ``: no prompt (in the column ``prompt_key``), an
    empty one, one that is neither a string nor a list of chat messages, or a chat message without its ``role`` or
    ``content`` (it would render as nothing); a ``reward_model`` that is not a mapping, or no (or an empty)
    ``reward_model.ground_truth``; an ``extra_info`` that is not a mapping (the scorers and the protocol take a dict).
    None for a usable row. A prompt stored as a plain string is usable (tokenised without the chat template)."""
    extra = row.get("extra_info")
    problems = [_prompt_problem(row.get(prompt_key), prompt_key), _reward_model_problem(row.get("reward_model")),
                None if extra is None or isinstance(extra, dict) else
                f"its 'extra_info' is {type_of(extra)}, expected a mapping (or no value)"]
    return "; ".join(p for p in problems if p) or None


def jsonl_problem(path: str) -> str | None:
    """The first row of the JSON-lines file ``path`` that does not parse, named by :func:`row_place` and its line
    number, with what is wrong (cut short, not JSON, or a JSON value that is not an object); None when every row
    parses or the file is not JSON lines (its first line is not one JSON object). Rows are counted the way the
    ``datasets`` reader (pyarrow) counts them: blank lines are skipped, objects side by side on a line are rows each.
    Read only after a load error: the reader's own message counts its row within a block of the file (a truncated
    last line of a 2240-row file was ``row 718``)."""
    decoder, row = json.JSONDecoder(), 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            text = raw.decode("utf-8", errors="replace").rstrip()
            pos = len(text) - len(text.lstrip())  # columns count from the line's start, indentation included
            while pos < len(text):
                try:
                    value, end = decoder.raw_decode(text, pos)
                except json.JSONDecodeError as exc:
                    if row == 0:  # not JSON lines (e.g. one JSON document over several lines): leave it to the reader
                        return None
                    cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(text)
                    shown = repr(text.strip()) if len(text.strip()) <= 80 else repr(text.strip()[:77]) + "..."
                    where = f"{exc.msg}{'' if exc.msg.endswith(' at') else ' at'} column {exc.pos + 1}"
                    what = f"is cut short (truncated JSON: {where})" if cut else f"is not JSON ({where})"
                    return f"{row_place(path, row)}, line {number} of the file, {what}: {shown}"
                if not isinstance(value, dict):
                    return (f"{row_place(path, row)}, line {number} of the file, is {type_of(value)}, expected a JSON "
                            "object (one row)") if row else None
                row, pos = row + 1, end
                while pos < len(text) and text[pos].isspace():
                    pos += 1
    return None


def row_origins(ds: Any) -> list[tuple[str, int]]:
    """``(file, index in that file)`` of each row of ``ds`` (a :class:`trainer.dataset.PromptDataset`, or anything
    with ``rows`` and ``files``: then the index among all its rows, its files named together)."""
    rows = list(getattr(ds, "rows", None) or ())
    origins = list(getattr(ds, "origins", None) or ())
    if len(origins) != len(rows):
        files = [str(f) for f in (getattr(ds, "files", None) or ())]
        origins = [(", ".join(files) or "the data", i) for i in range(len(rows))]
    return origins


def _scorer_name_problem(row: dict, key: str) -> str | None:
    """What keeps ``row``'s value in the column ``key`` from naming a reward scorer (scorers are registered under
    non-empty strings); None for a non-empty string."""
    value = row.get(key)
    if value is None:
        return f"has no {key!r} value"
    if not isinstance(value, str):
        return f"has {key}={value!r} ({type(value).__name__}), not a scorer name"
    if not value.strip():
        return f"has an empty {key!r} value ({value!r})"
    return None


def check_reward_key(ds: Any, key: str, allow_none: bool = False, batch: bool = False) -> None:
    """Every row of ``ds`` (a :class:`trainer.dataset.PromptDataset`, or anything with ``rows`` and ``files``) names
    its reward scorer in the column ``key`` (``data.reward_fn_key``): a non-empty string. A JSON-lines row without it, or a
    parquet null, reads as None; an empty string or a value of another type (a number, a list) names no scorer
    either: the run would stop with ``no reward scorer registered for ...`` naming neither the file nor the row.
    ``allow_none``: only a file without the column is refused (a custom reward function that takes
    ``data_source`` is given each row's value as it is, None included). ``batch``: the values are a batch reward
    function's ``data_sources`` (``reward_model.reward_manager=batch``), which every file must have as a column.

    Raises:
        DataError: one line naming ``data.reward_fn_key``, the file and the row (counted from 0) with its value, or
            that the column is missing from the file, and the ways out.
    """
    rows, origins = list(getattr(ds, "rows", None) or ()), row_origins(ds)
    problems = [(i, _scorer_name_problem(row, key)) for i, row in enumerate(rows) if key not in row or not allow_none]
    bad = [(i, why) for i, why in problems if why is not None]
    if not bad:
        return
    first, why = bad[0]
    path = origins[first][0]
    of_file = [i for i, (p, _) in enumerate(origins) if p == path]
    if all(key not in rows[i] for i in of_file):
        have = sorted(k for k in rows[first] if k != "input_ids")
        where = f"the column {key!r} is missing from {path} (its columns: {have})"
    else:
        others = f"; {len(bad) - 1} more row(s) name no scorer either" if len(bad) > 1 else ""
        where = f"{row_place(*origins[first])} {why}{others}"
    if batch:
        raise DataError(f"data.reward_fn_key={key!r}: {where}; reward_model.reward_manager=batch passes this "
                        f"column to the batch reward function as data_sources: give every row a {key!r} value, or "
                        "set data.reward_fn_key=<a column every row has>")
    out = ("or drop the data_source parameter of the custom reward function" if allow_none else
           "or force one scorer for every row with reward_model.scorer=<name>")
    raise DataError(f"data.reward_fn_key={key!r}: {where}; the reward scorer of a row is picked by this column (a "
                    f"scorer name): give every row a {key!r} string, set data.reward_fn_key=<a column every row has>, "
                    f"{out}")
