"""Config checks of the keys that follow verl's names and meanings: the reward manager, the generation batch of
dynamic sampling, checkpoint keeping and validation logging (the LR schedules and the critic's batches are checked
by their sections, :mod:`trainer.config.actor`). :func:`trainer.config_validate.validate` runs them before any
worker starts.
"""
from __future__ import annotations

from trainer.config_checks import ConfigError, ErrorCollector

__all__ = ["REWARD_MANAGERS", "check_verl_semantics"]


REWARD_MANAGERS = ("naive", "batch", "dapo", "prime", "gdpo")  # verl's names of the managers that score rows by rule


def check_verl_semantics(cfg: dict) -> None:
    """Keys that follow verl's names and meanings: the reward manager, the generation batch of dynamic sampling,
    checkpoint keeping and validation logging.

    Raises:
        ConfigErrors: every bad value found, one line each (naming the key, the value and what was expected).
    """
    errors = ErrorCollector()
    for check in (_check_reward_manager, _check_gen_batch_size, _check_validation_keys):
        errors.run(check, cfg)
    errors.raise_if_any()


def _check_reward_manager(cfg: dict) -> None:
    name = cfg["reward_model"]["reward_manager"]
    if name not in REWARD_MANAGERS:
        raise ConfigError(f"reward_model.reward_manager={name!r}; expected one of {list(REWARD_MANAGERS)} (each scores "
                          "rows with the rule scorer; DAPO's overlong penalty is reward_model.overlong_buffer); for your "
                          "own scoring use custom_reward_function.path")
    if name == "batch" and not (cfg["reward_model"].get("custom_reward_function") or {}).get("path"):
        raise ConfigError("reward_model.reward_manager=batch without reward_model.custom_reward_function.path: the "
                          "batch manager calls your function once per batch (verl's batch reward function); the "
                          "built-in scorers score one response at a time (reward_manager=naive)")


def _check_gen_batch_size(cfg: dict) -> None:
    d = cfg["data"]
    gen, bs = d["gen_batch_size"], int(d["train_batch_size"])
    if isinstance(gen, bool) or not isinstance(gen, int) or gen < 1:
        return  # None: train_batch_size; another value is refused by the data section (trainer.config.data)
    if not cfg["algorithm"]["filter_groups"]["enable"]:
        if gen != bs:
            raise ConfigError(f"data.gen_batch_size={gen} differs from data.train_batch_size={bs}, but generation "
                              "batches are the training batch unless algorithm.filter_groups.enable=true (dynamic "
                              "sampling); set them equal or enable filter_groups")
        return
    world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
    if world >= 1 and gen % world:
        raise ConfigError(f"data.gen_batch_size={gen} must be divisible by the {world} workers "
                          "(trainer.nnodes*trainer.n_gpus_per_node)")


def _check_validation_keys(cfg: dict) -> None:
    t = cfg["trainer"]
    actor_keep, critic_keep = t.get("max_actor_ckpt_to_keep"), t.get("max_critic_ckpt_to_keep")
    try:  # without saves (save_freq <= 0) both keys are unused: trainer.unused_settings warns, nothing to refuse
        saves = int(t.get("save_freq") or 0) > 0
    except (TypeError, ValueError):  # a mistyped save_freq is named by its own check
        saves = True
    if saves and critic_keep is not None and critic_keep != actor_keep:
        raise ConfigError(f"trainer.max_critic_ckpt_to_keep={critic_keep} differs from trainer.max_actor_ckpt_to_keep="
                          f"{actor_keep}: a checkpoint is one global_step_N folder for every role, kept or pruned "
                          "as a whole; set trainer.max_actor_ckpt_to_keep")
    if t.get("val_only") and not cfg["data"].get("val_files") and cfg["data"].get("train_files") is not None:
        raise ConfigError("trainer.val_only=true needs held-out data: set data.val_files")
