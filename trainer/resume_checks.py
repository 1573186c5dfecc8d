"""A resume continues the checkpoint's optimizer: DeepSpeed restores each param group's ``lr``, ``betas`` and
``weight_decay`` (and the LR scheduler its base learning rates) from the checkpoint, so a new value of those keys on
the command line would have no effect. :func:`check_resume_optim` refuses such a value before start-up, naming the key,
the value and the checkpoint's (the run config each checkpoint keeps in its ``data.pt``). Likewise the data loader's
saved position (epoch, batch index) indexes the checkpoint's row order: :func:`check_resume_data` refuses a changed
order or batch size."""
from __future__ import annotations

import math
import os

from trainer.config.trainer import run_strategy
from trainer.config_checks import ConfigError, as_int

__all__ = ["DATA_ORDER_KEYS", "RESTORED_OPTIM_KEYS", "SCHEDULE_KEYS", "check_resume_checkpoint", "check_resume_data",
           "check_resume_model", "check_resume_optim", "resume_schedule_warnings"]

#: the ``optim`` keys whose values a resume takes from the checkpoint (the optimizer's param groups)
RESTORED_OPTIM_KEYS = ("lr", "weight_decay", "betas")
#: the ``optim`` keys of the learning-rate schedule: a resume follows the new values from its step on (a warning)
SCHEDULE_KEYS = ("lr_scheduler_type", "lr_warmup_steps", "lr_warmup_steps_ratio", "min_lr_ratio", "num_cycles")
#: the ``data`` keys that fix which rows the saved loader position points at (the order and the batch size)
DATA_ORDER_KEYS = ("seed", "shuffle", "train_batch_size", "gen_batch_size")
_ROLES = (("actor_rollout_ref.actor", ("actor_rollout_ref", "actor")), ("critic", ("critic",)),
          ("reward_model.model", ("reward_model", "model")))


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _optim(cfg: dict, path: tuple) -> dict | None:
    node = cfg
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node.get("optim") if isinstance(node, dict) else None


def _saved_config(step_dir: str) -> dict | None:
    """The run config the checkpoint at ``step_dir`` keeps in its ``data.pt``; None when it holds none (or the file
    is missing: reported by :func:`check_resume_checkpoint`)."""
    import torch

    state_file = os.path.join(step_dir, "data.pt")
    if not os.path.isfile(state_file):
        return None
    saved_cfg = torch.load(state_file, map_location="cpu", weights_only=True).get("config")
    return saved_cfg if isinstance(saved_cfg, dict) else None


def check_resume_data(cfg: dict, step_dir: str) -> None:
    """``data.seed``, ``data.shuffle``, ``data.train_batch_size`` and ``data.gen_batch_size`` equal the checkpoint's:
    the saved loader position (epoch, batch index) would otherwise point into another row order, so rows would be
    seen twice or skipped in the resumed epoch (a checkpoint without a saved config is not compared).

    Raises:
        ConfigError: one message naming each differing key and both values.
    """
    saved = (_saved_config(step_dir) or {}).get("data")
    if not isinstance(saved, dict):
        return
    now = cfg.get("data") or {}
    diffs = [f"data.{k}={now[k]!r} (checkpoint: {saved[k]!r})" for k in DATA_ORDER_KEYS
             if k in now and k in saved and not _same(now[k], saved[k])]
    if diffs:
        raise ConfigError(f"trainer.resume_mode: {', '.join(diffs)}: the checkpoint's data-loader position counts "
                          "batches of its own row order, so rows would repeat or be skipped; resume with the "
                          "checkpoint's values, or start a new run from its HF export (tools/export_hf.py)")


def _optim_diffs(cfg: dict, step_dir: str, keys: tuple[str, ...]) -> list[str]:
    """``<role>.optim.<key>=<now> (checkpoint: <saved>)`` for each of ``keys`` whose value differs from the one the
    checkpoint at ``step_dir`` was saved with, over the trained roles (actor; critic when on; PRIME's PRM). A
    warmup of -1 (from its ratio) is not compared: the checkpoint holds the number it was planned to."""
    saved_cfg = _saved_config(step_dir)
    if saved_cfg is None:
        return []
    diffs = []
    for key, path in _ROLES:
        if key == "critic" and not (cfg.get("critic") or {}).get("enable"):
            continue
        if key == "reward_model.model" and not (cfg.get("algorithm") or {}).get("use_prime"):
            continue  # the PRM is trained (and saved) with algorithm=prime only
        now, saved = _optim(cfg, path), _optim(saved_cfg, path)
        if not isinstance(now, dict) or not isinstance(saved, dict):
            continue
        diffs += [f"{key}.optim.{k}={now[k]!r} (checkpoint: {saved[k]!r})" for k in keys
                  if k in now and k in saved and not _same(now[k], saved[k])
                  and not (k == "lr_warmup_steps" and isinstance(now[k], int) and now[k] < 0)]
    return diffs


def resume_schedule_warnings(cfg: dict, step_dir: str) -> list[str]:
    """One warning line when a resume changes the learning-rate schedule (:data:`SCHEDULE_KEYS`): the scheduler's
    step count is restored, so the new schedule takes over from the resumed step (the rate can jump there); the
    run is allowed (a schedule changed on purpose is a use), but not silently."""
    diffs = _optim_diffs(cfg, step_dir, SCHEDULE_KEYS)
    if not diffs:
        return []
    return [f"trainer.resume_mode: {', '.join(diffs)}: the learning-rate schedule changes at the resumed step (the "
            "scheduler's position is restored, the new schedule is followed from there; the rate may jump)"]


def check_resume_optim(cfg: dict, step_dir: str) -> None:
    """The optimizer settings of every trained role (actor; critic when on; PRIME's PRM) equal those the checkpoint at
    ``step_dir`` was saved with (a checkpoint whose ``data.pt`` holds no config is not compared).

    Raises:
        ConfigError: one line per differing key is joined into one message naming each key and both values.
    """
    diffs = _optim_diffs(cfg, step_dir, RESTORED_OPTIM_KEYS)
    if diffs:
        raise ConfigError(f"trainer.resume_mode: {', '.join(diffs)}: a resume restores the checkpoint's optimizer "
                          "settings, so the new value would be ignored; resume with the checkpoint's values, "
                          "or start a new run from its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")


def check_resume_checkpoint(cfg: dict, path: str) -> None:
    """The checkpoint at ``path`` (``.../global_step_<N>``) was written by this run's strategy and, for Megatron,
    with this run's tensor/pipeline/data-parallel sizes (read from ``actor/meta.pt``).

    A DeepSpeed role folder holds DeepSpeed's ``latest`` tag file; a Megatron one holds ``meta.pt``.

    Raises:
        ConfigError: naming the checkpoint, what wrote it and what this run would need.
    """
    actor = os.path.join(path, "actor")
    if os.path.isfile(os.path.join(actor, "meta.pt")):
        written = "megatron"
    elif os.path.isfile(os.path.join(actor, "latest")):
        written = "deepspeed"
    else:
        role = any(os.path.isfile(os.path.join(path, f)) for f in ("latest", "meta.pt"))  # a role folder was named
        raise ConfigError(f"trainer.resume_mode: {actor!r} holds neither a DeepSpeed (latest) nor a Megatron "
                          "(meta.pt) actor checkpoint" + (f"; {path!r} is a role folder: name its step folder "
                                                          f"{os.path.dirname(path)!r}" if role else ""))
    _check_checkpoint_files(cfg, path)
    strategy = run_strategy(cfg)
    if written != strategy:
        raise ConfigError(f"trainer.resume_mode: {path!r} is a {written} checkpoint but trainer.strategy={strategy}; "
                          f"resume with trainer.strategy={written}, or start from its HF export "
                          "(tools/export_hf.py) as actor_rollout_ref.model.path")
    if written == "megatron":
        import torch

        meta = torch.load(os.path.join(actor, "meta.pt"), map_location="cpu", weights_only=True)
        if meta.get("ckpt_format", "torch") == "torch_dist":
            return  # a dist checkpoint reshards to this run's tensor/pipeline/data-parallel sizes on load
        m = cfg["actor_rollout_ref"]["actor"]["megatron"]
        tp = as_int(m["tensor_model_parallel_size"], "tensor_model_parallel_size", 1)
        pp = as_int(m["pipeline_model_parallel_size"], "pipeline_model_parallel_size", 1)
        world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
        want = {"tp_size": tp, "pp_size": pp, "dp_size": world // (tp * pp)}
        saved = {k: int(meta[k]) for k in want}
        if saved != want:
            raise ConfigError(f"trainer.resume_mode: {path!r} (ckpt_format=torch) was saved with {saved} but this "
                              f"run has {want}; resume with the same tensor/pipeline sizes and worker count, or "
                              "start from its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")


def _check_checkpoint_files(cfg: dict, path: str) -> None:
    """The step folder holds the trainer state and a folder for each role this run loads (actor; critic when it is
    on; PRIME's reward model), every DeepSpeed role folder holds each saving rank's files (model states, optimizer
    shard, RNG state), and no file of it is cut short (:func:`trainer.checkpoint.verify.verify_step_folder`): a
    missing or short file is named here, before start-up. ``resume_mode=auto`` has already stepped back to the
    newest complete step when there is one (:func:`trainer.checkpoint.base.resolve_resume_path`); a path named
    explicitly is refused as it is."""
    from trainer.checkpoint.verify import verify_step_folder
    from trainer.hooks.prime import prime_enabled

    roles = ["actor", *(["critic"] if cfg["critic"].get("enable") else []), *(["reward"] if prime_enabled(cfg) else [])]
    world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
    try:
        verify_step_folder(path, roles, world)
    except ValueError as exc:
        raise ConfigError(f"trainer.resume_mode: {exc}") from exc


def check_resume_model(path: str, hf: dict) -> None:
    """The actor checkpoint at ``path`` (``.../global_step_<N>``) holds the model this run builds: its saved
    ``actor/huggingface/config.json`` agrees with ``hf`` (the run's model config as a dict) on every field of
    ``trainer.megatron.config.MODEL_CONFIG_KEYS`` that both set. Checkpoints saved without a config pass.

    Raises:
        ConfigError: naming the checkpoint and the first differing field with both values.
    """
    import json

    from trainer.megatron.config import model_config_difference

    saved = os.path.join(path, "actor", "huggingface", "config.json")
    if not os.path.isfile(saved):
        return
    with open(saved, encoding="utf-8") as f:
        diff = model_config_difference(json.load(f), hf)
    if diff:
        raise ConfigError(f"trainer.resume_mode: {path!r} holds another model than actor_rollout_ref.model: {diff}")
