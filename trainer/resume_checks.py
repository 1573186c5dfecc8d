"""A resume continues the checkpoint's optimizer: DeepSpeed restores each param group's ``lr``, ``betas`` and
``weight_decay`` (and the LR scheduler its base learning rates) from the checkpoint, so a new value of those keys on
the command line would have no effect. :func:`check_resume_optim` refuses such a value before start-up, naming the key,
the value and the checkpoint's (the run config each checkpoint keeps in its ``data.pt``)."""
from __future__ import annotations

import math
import os

from trainer.config_checks import ConfigError

__all__ = ["RESTORED_OPTIM_KEYS", "check_resume_optim"]

#: the ``optim`` keys whose values a resume takes from the checkpoint (the optimizer's param groups)
RESTORED_OPTIM_KEYS = ("lr", "weight_decay", "betas")
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


def check_resume_optim(cfg: dict, step_dir: str) -> None:
    """The optimizer settings of every trained role (actor; critic when on; PRIME's PRM) equal those the checkpoint at
    ``step_dir`` was saved with (a checkpoint whose ``data.pt`` holds no config is not compared).

    Raises:
        ConfigError: one line per differing key is joined into one message naming each key and both values.
    """
    import torch

    state_file = os.path.join(step_dir, "data.pt")
    if not os.path.isfile(state_file):
        return  # reported by trainer.config_checks.check_resume_checkpoint
    saved_cfg = torch.load(state_file, map_location="cpu", weights_only=True).get("config")
    if not isinstance(saved_cfg, dict):
        return
    diffs = []
    for key, path in _ROLES:
        if key == "critic" and not (cfg.get("critic") or {}).get("enable"):
            continue
        if key == "reward_model.model" and not (cfg.get("algorithm") or {}).get("use_prime"):
            continue  # the PRM is trained (and saved) with algorithm=prime only
        now, saved = _optim(cfg, path), _optim(saved_cfg, path)
        if not isinstance(now, dict) or not isinstance(saved, dict):
            continue
        diffs += [f"{key}.optim.{k}={now[k]!r} (checkpoint: {saved[k]!r})" for k in RESTORED_OPTIM_KEYS
                  if k in now and k in saved and not _same(now[k], saved[k])]
    if diffs:
        raise ConfigError(f"trainer.resume_mode: {', '.join(diffs)}: a resume restores the checkpoint's optimizer "
                          "settings, so the new value would be ignored; resume with the checkpoint's values, "
                          "or start a new run from its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")
