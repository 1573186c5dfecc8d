"""The embedded default's files for a run: the tiny model and its tokenizer (``<trainer.output_dir>/init_model``) and
the generated task's rows (``<trainer.output_dir>/data``), written at start-up when the config names no model or no
data (:func:`prepare_embedded`, called by :func:`trainer.launch.run` before the model files are checked).

The tasks themselves are :mod:`trainer.embedded` and :mod:`trainer.embedded_tool`; where the files go, and when an
earlier run's are reused, :mod:`trainer.run_folder`.
"""
from __future__ import annotations

import os

from trainer.config.data import DataConfig
from trainer.config.section import replaced
from trainer.checkpoint.atomic import give_umask_modes
from trainer.config_checks import ConfigError

__all__ = ["prepare_embedded"]


def prepare_embedded(cfg: dict, resuming: bool = False) -> DataConfig:
    """Write the tiny model + tokenizer and the synthetic task when the config asks for them (in place: the model
    paths and ``data.train_files`` / ``data.val_files`` are filled in). Returns the ``data`` section with the
    files filled in (:class:`trainer.config.data.DataConfig`).

    The tiny model (``<trainer.output_dir>/init_model``) is built from the settings of
    :func:`trainer.embedded.init_model_settings`; a model already there is used only when it was built from the same
    (:func:`trainer.run_folder.place_init_model`: otherwise a fresh run builds its own, which replaces the earlier one
    once every check has passed, and a resume, ``resuming``, is refused).

    Raises:
        ConfigError: an unknown ``data.synthetic_task``, a bad ``data`` value (its section's check), or a resume
            whose tiny-model settings differ from those ``init_model`` was built from, or whose generated data files
            were edited (:func:`trainer.run_folder.write_embedded_data`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import embedded
    from trainer.embedded_tool import embedded_task
    from trainer.run_folder import place_init_model, write_embedded_data

    out = os.path.abspath(cfg["trainer"]["output_dir"])
    model, seed = cfg["actor_rollout_ref"]["model"], int(cfg["trainer"]["seed"])
    data = DataConfig.from_dict(cfg["data"], "data")
    try:  # data.synthetic_task: the generated task, its tokenizer and the tiny model's warm start
        task = embedded_task(data.synthetic_task or "digits")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if model["path"] is None:
        tiny = dict(model.get("tiny") or {})

        def build(folder: str) -> int:
            tok = task.build_tokenizer(folder)
            with torch.random.fork_rng(devices=[]):  # drawn from trainer.seed; the caller's stream is left as it was
                torch.manual_seed(seed)
                built = AutoModelForCausalLM.from_config(embedded.tiny_model_config(len(tok), **tiny))
                task.warm_start(built, tok, data.warm_start_steps or 0, seed)
            built.save_pretrained(folder)
            give_umask_modes(folder)  # safetensors writes its weights 0600
            return len(tok)

        steps = (data.warm_start_steps or 0) if task.warm_starts else 0  # the digits task has no warm start
        settings = embedded.init_model_settings(seed, data.synthetic_task or "digits", steps, tiny)
        init_dir = place_init_model(out, settings, build, resuming)
        model["path"] = init_dir
        if cfg["critic"]["model"]["path"] is None:
            cfg["critic"]["model"]["path"] = init_dir
    if data.train_files is None:  # kept when the same; another run's rows stay until it is set aside (run_folder)
        train, val = write_embedded_data(task.write_task, out, data.seed, resuming)
        val = data.val_files if data.val_files is not None else val
        cfg["data"]["train_files"], cfg["data"]["val_files"] = train, val
        data = replaced(data, "data", train_files=train, val_files=val)
    return data
