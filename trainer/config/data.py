"""``data``: the prompt files, their columns, lengths and batches (the data group, ``configs/data/*.yaml``, holds
the defaults; ``configs/ppo_trainer.yaml`` adds ``gen_batch_size`` and ``apply_chat_template_kwargs``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.config.section import ABSENT_OK, Section
from trainer.config.trainer import at_least
from trainer.config_checks import ConfigError

__all__ = ["DataConfig"]


@dataclass(frozen=True)
class DataConfig(Section):
    """``data`` (verl's keys). PRIME's own ``data.*`` keys (``oversample_factor``, the accuracy band) are read by
    :class:`trainer.hooks.prime.PrimeConfig`.

    Attributes:
        train_files, val_files: a parquet/JSON file or a list of them; None (the embedded task): generated into
            ``<trainer.output_dir>/data`` at start-up (:func:`trainer.embedded_assets.prepare_embedded`), no
            held-out set for ``val_files`` when ``train_files`` is given.
        prompt_key, image_key, reward_fn_key: the rows' columns of the prompt, its images, the scorer's name.
        max_prompt_length, max_response_length: tokens (> 0).
        train_batch_size: prompts per step (> 0). val_batch_size: prompts per validation batch (None: all).
        gen_batch_size: prompts per generation batch of dynamic sampling (>= 1; None: ``train_batch_size``).
        shuffle, seed: the loader's shuffling and its seed (also the embedded task's).
        filter_overlong_prompts, truncation: what :class:`trainer.dataset.PromptDataset` does with a long prompt.
        max_rows, val_max_rows: keep only the first N rows (None: all).
        apply_chat_template_kwargs: extra arguments of the tokenizer's ``apply_chat_template``.
        synthetic_task: the embedded task (digits | arith_tool; only ``data=synthetic_tool`` sets it; None:
            digits). warm_start_steps: the tiny model's supervised steps before training (None: 0).
    """

    train_files: str | list | None
    val_files: str | list | None
    prompt_key: str
    image_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    val_batch_size: int | None
    gen_batch_size: int | None
    shuffle: bool
    seed: int
    filter_overlong_prompts: bool
    truncation: str
    max_rows: int | None
    val_max_rows: int | None
    apply_chat_template_kwargs: dict | None
    synthetic_task: str | None = field(metadata=ABSENT_OK)
    warm_start_steps: int | None = field(metadata=ABSENT_OK)

    def check(self, key: str) -> None:
        """Positive lengths, batch sizes and row limits (batches against workers: :mod:`trainer.config_validate`)."""
        for name in ("max_prompt_length", "max_response_length", "train_batch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{key}.{name}={self.given(name)}; expected a positive integer")
        for name in ("gen_batch_size", "val_batch_size"):  # null: the train batch / every validation row at once
            if getattr(self, name) is not None:
                at_least(f"{key}.{name}", getattr(self, name), 1)
        for name in ("max_rows", "val_max_rows"):  # null keeps every row
            if getattr(self, name) is not None:
                at_least(f"{key}.{name}", getattr(self, name), 1)
        from trainer.data_rows import TRUNCATIONS

        if self.truncation not in TRUNCATIONS:
            raise ConfigError(f"{key}.truncation={self.given('truncation')!r}; expected one of "
                              f"{', '.join(TRUNCATIONS)}")
