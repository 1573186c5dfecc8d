"""Prompt datasets (verl's parquet column layout) and a resumable prompt loader.

A row has ``prompt`` (a list of chat messages, or a plain string), ``data_source``, ``reward_model``
(a dict with ``ground_truth``) and optionally ``extra_info`` and ``ability``; verl's GSM8K parquet files load
as they are. Files may be parquet or JSON-lines; they are read with the ``datasets`` library.

Multimodal rows (verl's layout, for a vision-language model and its processor): an ``images`` column (``image_key``)
holds the row's images (PIL images, ``{"bytes": ..., "path": ...}`` dicts as ``datasets`` stores them, file paths
or raw bytes), and the prompt's text marks where each goes with an ``<image>`` placeholder. The processor renders
the chat template and expands every image into its vision tokens, so the prompt length that the overlong filter
compares with ``max_prompt_length`` counts the image tokens (:mod:`trainer.multimodal`).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import jinja2
import numpy as np
import torch

from trainer.data_rows import (TRUNCATIONS, DataError, image_paths_from, json_messages_text, jsonl_problem,
                               plain_prompt_note, row_images, row_place, row_problem, row_tools, text_messages,
                               truncate_prompt)
from trainer.multimodal import image_prompt_inputs
from trainer.protocol import DataProto

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("reward_model",)



class DataExhausted(Exception):
    """The loader has yielded every batch of its ``num_epochs`` epochs (verl's end of ``trainer.total_epochs``)."""


def _parquet_rows(path: str) -> int | None:
    """The row count in a parquet file's footer; None when the footer cannot be read (reported by the loader)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - not a parquet file: datasets names the problem
        return None


def _load_rows(files: Sequence[str], origins: list | None = None) -> list[dict]:
    """Every row of ``files``, in order; ``origins`` (when given) receives ``(file, index of the row in its file)``
    for each row."""
    import datasets

    rows: list[dict] = []
    for path in files:
        if not os.path.exists(path):
            raise DataError(f"data file {path!r} does not exist (expected a .parquet or .jsonl file)")
        if os.path.getsize(path) == 0:
            raise DataError(f"data file {path!r} is empty")
        ext = os.path.splitext(path)[1].lower()
        if ext == ".parquet":
            kind = "parquet"
            if _parquet_rows(path) == 0:
                raise DataError(f"data file {path!r} has no rows (a parquet file with its columns but 0 rows)")
        elif ext in (".jsonl", ".json"):
            kind = "json"
        else:
            raise DataError(f"data file {path!r} has extension {ext!r}; expected .parquet, .jsonl or .json")
        # the JSON reader logs its error with the row counted within a block of the file: the DataError names it
        reader_log = logging.getLogger("datasets.packaged_modules.json.json")
        level, counts = reader_log.level, datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
        reader_log.setLevel(logging.CRITICAL)
        # load_dataset("json"/"parquet") of a local file sends a download count to the Hub: a name lookup that waits
        # up to 5 s without a network
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
        try:
            ds = datasets.load_dataset(kind, data_files=path, split="train")
            got = ds.to_list()  # strings are decoded here: a non-UTF-8 byte raises now
            rows.extend(got)
            if origins is not None:
                origins.extend((path, j) for j in range(len(got)))
        except Exception as exc:  # datasets raises many kinds; name the file
            if isinstance(exc, UnicodeDecodeError) or "utf-8" in str(exc).lower():
                raise DataError(f"data file {path!r} is not valid UTF-8 text ({exc}); re-encode it as UTF-8") from exc
            problem = jsonl_problem(path) if kind == "json" else None
            if problem is not None:
                raise DataError(f"{problem}; fix or remove that line") from exc
            cause = exc
            while cause.__cause__ is not None:  # datasets wraps the reader's error (e.g. the row of a JSON error)
                cause = cause.__cause__
            raise DataError(f"could not read data file {path!r}: {type(cause).__name__}: {cause}") from exc
        finally:
            reader_log.setLevel(level)
            datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = counts
    return rows


@dataclass
class PromptDataset:
    """Tokenised prompts with their reward metadata.

    Args:
        files: parquet / jsonl paths.
        tokenizer: a Hugging Face tokenizer; chat prompts go through ``apply_chat_template``.
        max_prompt_length: the longest prompt in tokens.
        prompt_key: the column holding the prompt.
        filter_overlong_prompts: drop rows longer than ``max_prompt_length`` (counted and logged); otherwise
            ``truncation`` decides: ``error`` raises, ``left``/``right``/``middle`` cut the prompt
            (:func:`trainer.data_rows.truncate_prompt`).
        chat_template_kwargs: extra arguments of ``apply_chat_template`` (``data.apply_chat_template_kwargs``).
        processor: a Hugging Face processor (``apply_chat_template`` + ``__call__(text=, images=)``) for rows with
            images; None for a text-only model.
        image_key: the column holding a row's images.
        tools: OpenAI-style function definitions (``{"type": "function", "function": {...}}``) that chat prompts
            show (``apply_chat_template(tools=...)``): the multi-turn tools' schemas, or empty. A row's own
            ``tools`` column (a list of definitions or its JSON text) replaces them for that row.

    After loading, ``cut_by_max_rows`` says whether ``max_rows`` left usable rows out.

    Rows with images get ``multi_modal_inputs`` (the processor's tensors but ``input_ids`` / ``attention_mask``,
    e.g. ``pixel_values`` and ``image_grid_thw``) when read (``ds[i]``), computed again from the images so that
    the dataset holds no pixel tensors; other rows get ``{}`` when the dataset has a processor.

    Raises:
        DataError: missing/empty files, missing columns, or no usable rows; a row that cannot be used (images that
            do not match their placeholders or an ``images`` column that is not a list, a chat template that cannot
            render it, a bad ``tools`` column, a prompt too long under ``truncation=error``) or a JSON-lines row that
            does not parse is named by its file and index (counted from 0).
    """

    files: Sequence[str]
    tokenizer: Any
    max_prompt_length: int
    prompt_key: str = "prompt"
    filter_overlong_prompts: bool = True
    truncation: str = "error"
    max_rows: int | None = None
    chat_template_kwargs: dict = field(default_factory=dict)
    processor: Any = None
    image_key: str = "images"
    tools: list = field(default_factory=list)
    rows: list[dict] = field(default_factory=list, init=False)
    origins: list[tuple[str, int]] = field(default_factory=list, init=False)
    num_filtered: int = field(default=0, init=False)
    num_invalid: int = field(default=0, init=False)
    cut_by_max_rows: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.files, str):
            self.files = [self.files]
        if self.max_prompt_length <= 0:
            raise DataError(f"data.max_prompt_length={self.max_prompt_length}; expected a positive number of tokens")
        if self.truncation not in TRUNCATIONS:
            raise DataError(f"data.truncation={self.truncation!r}; expected one of {', '.join(TRUNCATIONS)}")
        origins: list[tuple[str, int]] = []
        raw = _load_rows(self.files, origins)
        if not raw:
            raise DataError(f"data files {list(self.files)} contain no rows")
        firsts: dict = {}  # each file's first row: a column missing there is missing from the whole file
        for row, (path, _) in zip(raw, origins):
            firsts.setdefault(path, row)
        for path, first in firsts.items():
            missing = [c for c in (self.prompt_key, *REQUIRED_COLUMNS) if c not in first]
            if missing:
                raise DataError(f"data file {path!r}: its rows lack column(s) {missing}; have {sorted(first)}. "
                                "Expected verl's layout: prompt, data_source, reward_model.ground_truth")
        first_invalid = None  # the first row skipped as unusable: its file, index and why
        for row, origin in zip(raw, origins):
            if self.max_rows is not None and len(self.rows) >= self.max_rows:
                self.cut_by_max_rows = True
                break
            row = image_paths_from(row, self.image_key, origin[0])
            try:
                ids = self.prompt_ids(row)
            except DataError as exc:
                raise DataError(f"{row_place(*origin)}: {exc}") from exc
            if ids is None:
                self.num_invalid += 1
                first_invalid = first_invalid or f"{row_place(*origin)}: {self.row_problem(row)}"
                continue
            if len(ids) > self.max_prompt_length:
                if self.filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                if row.get(self.image_key):
                    raise DataError(f"{row_place(*origin)}: its prompt with images has {len(ids)} tokens (image "
                                    f"tokens included) > data.max_prompt_length={self.max_prompt_length}; image "
                                    "prompts cannot be cut, set data.filter_overlong_prompts=True or raise "
                                    "max_prompt_length")
                if self.truncation == "error":
                    raise DataError(f"{row_place(*origin)}: its prompt has {len(ids)} tokens > "
                                    f"data.max_prompt_length={self.max_prompt_length}; set "
                                    "data.filter_overlong_prompts=True or data.truncation=left|right|middle")
                ids = truncate_prompt(ids, self.max_prompt_length, self.truncation)
            self.rows.append({**row, "input_ids": ids})
            self.origins.append(origin)
        self._log_left_out(first_invalid)
        if not self.rows:
            raise DataError(f"no usable rows in {list(self.files)}: {len(raw)} read, {self.num_filtered} longer "
                            f"than data.max_prompt_length={self.max_prompt_length}, {self.num_invalid} without a "
                            "prompt or ground truth (or with a chat message lacking its role or content, an unknown "
                            "role, only empty messages, or a prompt, reward_model or extra_info of the wrong type)"
                            + (f"; the first of these: {first_invalid}" if first_invalid else ""))

    def _log_left_out(self, first_invalid: str | None) -> None:
        """A warning for the prompts filtered as too long, one for the rows skipped as unusable (naming the first)."""
        if self.num_filtered:
            logger.warning("filtered %d prompts longer than %d tokens from %s", self.num_filtered,
                           self.max_prompt_length, list(self.files))
        note = None if self.processor is not None else plain_prompt_note(self.rows, self.prompt_key, self.tokenizer)
        if note:
            logger.warning("%s; in %s", note, list(self.files))
        if self.num_invalid:
            logger.warning("skipped %d unusable rows (no prompt or ground truth, a chat message without a known role "
                           "or any content, a field of the wrong type) in %s; the first: %s",
                           self.num_invalid, list(self.files), first_invalid)

    def row_problem(self, row: dict) -> str | None:
        """Why ``row`` is skipped as unusable (:func:`trainer.data_rows.row_problem` under ``prompt_key``); None
        for a usable row."""
        return row_problem(row, self.prompt_key)

    def prompt_ids(self, row: dict) -> list[int] | None:
        """The prompt's token ids as the model will see them (image tokens expanded), i.e. the length the overlong
        filter compares; None for a row that :meth:`row_problem` finds unusable. Does not change ``row``.

        Raises:
            DataError: a row with images but no processor, an ``images`` column that is not a list, or
                placeholders that do not match the images; a chat template that cannot render the prompt; a bad
                ``tools`` column; a prompt string holding the JSON text of chat messages (the message does not name
                the row: the dataset puts its file and index in front).
        """
        if self.row_problem(row) is not None:
            return None
        prompt, images = row[self.prompt_key], row_images(row, self.image_key)
        tools = row_tools(row) or list(self.tools)  # read for every row: a bad column is refused whatever the prompt
        if images:
            try:
                ids, _ = image_prompt_inputs(self.processor, prompt, images, self.chat_template_kwargs)
            except ValueError as exc:
                raise DataError(f"its {self.image_key!r}: {exc}") from exc
            return ids
        if isinstance(prompt, str):
            if json_messages_text(prompt):
                raise DataError(f"its {self.prompt_key!r} is a string holding the JSON text of chat messages "
                                f"({prompt[:60]!r}...); it would be trained on as literal text without the chat "
                                "template: store the messages as a list of {role, content} mappings, not as a string")
            return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        try:
            out = self.tokenizer.apply_chat_template(text_messages(prompt, self.prompt_key), add_generation_prompt=True,
                                                     tokenize=True, **({"tools": tools} if tools else {}),
                                                     **self.chat_template_kwargs)
        except jinja2.TemplateError as exc:  # the template (the tokenizer's or custom_chat_template) cannot render it
            raise DataError(f"the chat template cannot render its prompt ({type(exc).__name__}: {exc}); check "
                            "actor_rollout_ref.model.custom_chat_template and data.apply_chat_template_kwargs") \
                from exc
        if hasattr(out, "keys") and "input_ids" in out:
            out = out["input_ids"]
        return list(out)

    def __len__(self) -> int:
        return len(self.rows)

    def fingerprint(self) -> dict:
        """``{"rows": N, "rows_digest": <hex>}``: the number of rows and a SHA-256 of the prompts (``prompt_key``)
        of up to 1024 rows spread evenly over them, in order (computed once). A checkpoint keeps it with the loader
        position, so that a resume onto other rows is refused (:func:`trainer.resume_checks.check_resume_rows`);
        the tokenised form is not hashed (a new chat template that keeps the rows passes)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            import hashlib

            digest, n = hashlib.sha256(), len(self.rows)
            for i in range(0, n, max(1, n // 1024)):
                digest.update(json.dumps(self.rows[i].get(self.prompt_key), sort_keys=True, default=str).encode())
                digest.update(b"\0")
            cached = self.__dict__["_fingerprint"] = {"rows": n, "rows_digest": digest.hexdigest()[:16]}
        return dict(cached)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        if self.processor is None:
            return row
        mm = {}
        if row.get(self.image_key):
            _, mm = image_prompt_inputs(self.processor, row[self.prompt_key], row[self.image_key],
                                        self.chat_template_kwargs)
        return {**row, "multi_modal_inputs": mm}


def collate_prompts(rows: Sequence[dict], pad_token_id: int, prompt_key: str = "prompt") -> DataProto:
    """Left-pad prompts into a DataProto with ``input_ids``, ``attention_mask``, ``position_ids`` (B, P) int64.

    Non-tensor columns: ``data_source``, ``reward_model``, ``extra_info``, ``raw_prompt`` (the row's
    ``prompt_key`` column, ``data.prompt_key``) and every other column all rows have (``ability``, ...), one entry
    per row.
    """
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, width - n:] = torch.tensor(r["input_ids"], dtype=torch.long)
        mask[i, width - n:] = 1
    pos = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)
    non_tensor: dict[str, list] = {
        "data_source": [r.get("data_source", "unknown") for r in rows],
        "reward_model": [r["reward_model"] for r in rows],
        "extra_info": [r.get("extra_info") or {} for r in rows],
        "raw_prompt": [r.get(prompt_key) for r in rows],
    }
    for key in rows[0]:
        if key not in non_tensor and key not in ("input_ids", prompt_key) and all(key in r for r in rows):
            non_tensor[key] = [r[key] for r in rows]
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, non_tensor)


class PromptLoader:
    """Yields batches of ``batch_size`` prompts; its position is saved and restored for exact resumption.

    The order of epoch ``e`` is a permutation drawn from ``torch.Generator().manual_seed(seed + e)`` (or the
    natural order when ``shuffle`` is false); the last incomplete batch is dropped. With ``num_epochs`` the loader
    ends after that many epochs (:class:`DataExhausted`), as verl's epoch loop over ``trainer.total_epochs`` does.

    Raises:
        DataError: when the dataset holds fewer rows than one batch.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, pad_token_id: int, shuffle: bool = True,
                 seed: int = 0, num_epochs: int | None = None):
        if batch_size <= 0:
            raise DataError(f"batch size {batch_size} must be positive")
        if len(dataset) < batch_size:
            cut = getattr(dataset, "cut_by_max_rows", False)
            raise DataError(f"dataset has {len(dataset)} usable rows"
                            + (f" (data.max_rows={dataset.max_rows} kept only the first rows)" if cut else "")
                            + f", fewer than one batch (data.train_batch_size={batch_size})"
                            + ("; raise data.max_rows or lower data.train_batch_size" if cut else ""))
        self.dataset, self.batch_size, self.pad_token_id = dataset, batch_size, pad_token_id
        self.shuffle, self.seed, self.num_epochs = shuffle, seed, num_epochs
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.dataset) // self.batch_size

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=g).tolist()

    def next_batch(self) -> tuple[DataProto, int]:
        """The next batch and the epoch it belongs to (epochs roll over automatically).

        Raises:
            DataExhausted: every batch of ``num_epochs`` epochs was given out.
        """
        if self.position >= len(self):
            if self.num_epochs is not None and self.epoch + 1 >= self.num_epochs:
                raise DataExhausted(f"all {self.num_epochs} epochs of {len(self)} batches are used up")
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order(self.epoch)
        idx = order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        batch = collate_prompts([self.dataset[i] for i in idx], self.pad_token_id,
                                getattr(self.dataset, "prompt_key", "prompt"))
        batch.meta["epoch"] = self.epoch
        return batch, self.epoch

    def state_dict(self) -> dict:
        """The position (epoch, batches given out), the seed, and the dataset's fingerprint (rows, digest) that a
        resume compares before it restores the position."""
        rows = self.dataset.fingerprint() if hasattr(self.dataset, "fingerprint") else {}
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, **rows}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def pad_rows_to_multiple(data: DataProto, multiple: int) -> tuple[DataProto, int]:
    """Repeat the last rows so that ``len(data)`` divides by ``multiple``; returns the batch and pad count."""
    pad = (-len(data)) % multiple
    if pad == 0:
        return data, 0
    idx = np.concatenate([np.arange(len(data)), np.arange(pad) % len(data)])
    return data.index(idx), pad
