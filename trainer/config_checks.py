"""Config errors and the checks that depend on the training strategy (DeepSpeed vs Megatron) or on a checkpoint:
megatron-core and TP/PP sizes, the model's head counts against TP, and a resume from another strategy or other
parallel sizes. Everything here runs before any worker starts; ``trainer.launch`` calls it and re-exports it.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

__all__ = ["ConfigError", "ConfigErrors", "ErrorCollector", "run_checks", "check_megatron", "check_megatron_model",
           "check_resume_checkpoint"]


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what was expected."""


class ConfigErrors(ConfigError):
    """Several config errors found in one pass; ``str()`` holds one message per line (``messages``)."""

    def __init__(self, messages: list[str]):
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


class ErrorCollector:
    """Runs check functions and keeps every :class:`ConfigError` they raise, so that a run reports all of its config
    errors at once instead of one per attempt.

    A check is any callable that raises ``ConfigError`` (or :class:`ConfigErrors`) for a bad value; a check stops at
    its own first error, the collector goes on with the next check. Identical messages are kept once.

    Example::

        errors = ErrorCollector()
        errors.run(validate, cfg)
        with errors.check():
            preflight(cfg)
        errors.raise_if_any()
    """

    def __init__(self, messages: list[str] | None = None):
        self.messages: list[str] = []
        for m in messages or []:
            self.add(m)

    def add(self, message: str) -> None:
        """Record one message (once)."""
        if message not in self.messages:
            self.messages.append(message)

    @contextmanager
    def check(self):
        """A ``with`` block whose ConfigError is recorded instead of raised (other exceptions pass through)."""
        try:
            yield
        except ConfigErrors as exc:
            for m in exc.messages:
                self.add(m)
        except ConfigError as exc:
            self.add(str(exc))

    def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``; returns its result, or None when it raised a ConfigError (recorded)."""
        with self.check():
            return fn(*args, **kwargs)
        return None

    def raise_if_any(self) -> None:
        """Raise :class:`ConfigErrors` with every recorded message (a plain ConfigError when there is one)."""
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigErrors(self.messages)


def run_checks(cfg: dict, checks) -> None:
    """Run every ``check(cfg)`` of ``checks`` and raise all their ConfigErrors together (see :class:`ErrorCollector`)."""
    errors = ErrorCollector()
    for check in checks:
        errors.run(check, cfg)
    errors.raise_if_any()


def _as_int(value, key: str, minimum: int | None = None) -> int:
    """``int(value)`` for a config key, or a ConfigError naming the key, the value and what was expected."""
    try:
        out = int(value)
        if isinstance(value, float) and value != out:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r}; expected an integer") from None
    if minimum is not None and out < minimum:
        raise ConfigError(f"{key}={out}; expected an integer >= {minimum}")
    return out


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
        raise ConfigError(f"trainer.resume_mode: {actor!r} holds neither a DeepSpeed (latest) nor a Megatron "
                          "(meta.pt) actor checkpoint")
    strategy = cfg["trainer"].get("strategy", "deepspeed")
    if written != strategy:
        raise ConfigError(f"trainer.resume_mode: {path!r} is a {written} checkpoint but trainer.strategy={strategy}; "
                          f"resume with trainer.strategy={written}, or start from its HF export "
                          "(tools/export_hf.py) as actor_rollout_ref.model.path")
    if written == "megatron":
        import torch

        meta = torch.load(os.path.join(actor, "meta.pt"), map_location="cpu", weights_only=True)
        m = cfg["actor_rollout_ref"]["actor"].get("megatron") or {}
        tp = _as_int(m.get("tensor_model_parallel_size", 1), "tensor_model_parallel_size", 1)
        pp = _as_int(m.get("pipeline_model_parallel_size", 1), "pipeline_model_parallel_size", 1)
        world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
        want = {"tp_size": tp, "pp_size": pp, "dp_size": world // (tp * pp)}
        saved = {k: int(meta[k]) for k in want}
        if saved != want:
            raise ConfigError(f"trainer.resume_mode: {path!r} was saved with {saved} but this run has {want}; "
                              "resume with the same tensor/pipeline sizes and worker count, or start from its HF "
                              "export (tools/export_hf.py) as actor_rollout_ref.model.path")


def check_megatron(cfg: dict, world: int) -> None:
    """``trainer.strategy=megatron``: megatron-core importable, TP/PP sizes against the world, unsupported pairings.

    Raises:
        ConfigError: naming the key and the bad value (PP > 1, CP > 1, a critic, PRIME, Ulysses SP > 1,
            optimizer offload during rollout and a missing megatron-core are refused).
    """
    import importlib.util

    arr = cfg["actor_rollout_ref"]
    m = arr["actor"].get("megatron") or {}
    key = "actor_rollout_ref.actor.megatron"
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError("trainer.strategy=megatron but megatron-core is not importable: pip install -e .[megatron]")
    tp, pp, cp = (_as_int(m.get(k, 1), f"{key}.{k}", minimum=1)
                  for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"))
    if world % (tp * pp):
        raise ConfigError(f"{key}.tensor_model_parallel_size*pipeline_model_parallel_size={tp}*{pp} must divide the "
                          f"{world} workers (trainer.nnodes*trainer.n_gpus_per_node)")
    if pp != 1:
        raise ConfigError(f"{key}.pipeline_model_parallel_size={pp}: pipeline parallelism is not supported yet on "
                          "the Megatron path; use pipeline_model_parallel_size=1 with tensor parallelism")
    if cp != 1:
        raise ConfigError(f"{key}.context_parallel_size={cp}: context parallelism is not wired yet (it needs "
                          "Transformer Engine's attention); use 1")
    for sp_key, sp in (("actor_rollout_ref.actor.ulysses_sequence_parallel_size", arr["actor"]["ulysses_sequence_parallel_size"]),
                       ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", arr["ref"]["ulysses_sequence_parallel_size"])):
        if int(sp) != 1:
            raise ConfigError(f"{sp_key}={sp}: Ulysses sequence parallelism is a DeepSpeed-path feature and the "
                              "Megatron path has no sequence splitting for long inputs yet (Megatron's context "
                              "parallelism is not wired); set it to 1 or use trainer.strategy=deepspeed")
    if cfg["critic"].get("enable"):
        raise ConfigError(f"trainer.strategy=megatron has no critic worker yet, but critic.enable is on "
                          f"(algorithm.adv_estimator={cfg['algorithm']['adv_estimator']}); use a critic-free "
                          "estimator (grpo, rloo, ...) or trainer.strategy=deepspeed")
    if cfg["algorithm"].get("use_prime"):
        raise ConfigError("algorithm=prime is not supported with trainer.strategy=megatron (its PRM worker is "
                          "DeepSpeed-only)")
    if arr["rollout"].get("offload_optimizer_during_rollout"):
        raise ConfigError("actor_rollout_ref.rollout.offload_optimizer_during_rollout=true is a DeepSpeed-path "
                          "feature; set it to false with trainer.strategy=megatron")
    for k in ("use_liger", "use_torch_compile"):
        if arr["model"].get(k):
            raise ConfigError(f"actor_rollout_ref.model.{k}=true applies to Hugging Face models (DeepSpeed path); "
                              "set it to false with trainer.strategy=megatron")


def check_megatron_model(cfg: dict, hf: dict) -> None:
    """The model's head counts (and, given a full HF config, its architecture) fit the TP size.

    Raises: ConfigError naming ``tensor_model_parallel_size`` and the model field that does not divide.
    """
    tp = int((cfg["actor_rollout_ref"]["actor"].get("megatron") or {}).get("tensor_model_parallel_size", 1))
    key = f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}"
    heads = hf.get("num_attention_heads")
    for name in ("num_attention_heads", "num_key_value_heads"):
        val = hf.get(name) or heads
        if val and int(val) % tp:
            raise ConfigError(f"{key} does not divide the model's {name}={val}; pick a TP size that divides "
                              "both head counts")
    if hf.get("model_type"):
        from trainer.megatron.config import model_shape

        try:
            model_shape(hf, tp, 1)
        except ValueError as exc:
            raise ConfigError(f"trainer.strategy=megatron: {exc}") from None


REWARD_MANAGERS = ("naive", "batch", "dapo", "prime")  # verl's names of the managers that score rows by rule


def check_verl_semantics(cfg: dict) -> None:
    """Keys that follow verl's names and meanings: the reward manager, the generation batch of dynamic sampling, the
    LR schedule's cosine settings, validation logging and the critic's own micro-batch settings.

    Raises:
        ConfigErrors: every bad value found, one line each (naming the key, the value and what was expected).
    """
    errors = ErrorCollector()
    for check in (_check_reward_manager, _check_gen_batch_size, _check_lr_schedules, _check_validation_keys,
                  _check_critic_batches):
        errors.run(check, cfg)
    errors.raise_if_any()


def _check_reward_manager(cfg: dict) -> None:
    name = (cfg.get("reward_model") or {}).get("reward_manager", "naive")
    if name not in REWARD_MANAGERS:
        raise ConfigError(f"reward_model.reward_manager={name!r}; expected one of {list(REWARD_MANAGERS)} (each scores "
                          "rows with the rule scorer; DAPO's overlong penalty is reward_model.overlong_buffer); for your "
                          "own scoring use custom_reward_function.path")


def _check_gen_batch_size(cfg: dict) -> None:
    d = cfg["data"]
    gen, bs = d.get("gen_batch_size"), int(d["train_batch_size"])
    if gen is None:
        return
    gen = _as_int(gen, "data.gen_batch_size", minimum=1)
    if not (cfg["algorithm"].get("filter_groups") or {}).get("enable"):
        if gen != bs:
            raise ConfigError(f"data.gen_batch_size={gen} differs from data.train_batch_size={bs}, but generation "
                              "batches are the training batch unless algorithm.filter_groups.enable=true (dynamic "
                              "sampling); set them equal or enable filter_groups")
        return
    world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
    if world >= 1 and gen % world:
        raise ConfigError(f"data.gen_batch_size={gen} must be divisible by the {world} workers")


def _check_lr_schedules(cfg: dict) -> None:
    sections = [("actor_rollout_ref.actor.optim", cfg["actor_rollout_ref"]["actor"]["optim"]),
                ("critic.optim", cfg["critic"]["optim"])]
    rm_optim = ((cfg.get("reward_model") or {}).get("model") or {}).get("optim")
    if isinstance(rm_optim, dict):
        sections.append(("reward_model.model.optim", rm_optim))
    for key, optim in sections:
        ratio, cycles = optim.get("min_lr_ratio", 0.0), optim.get("num_cycles", 0.5)
        ratio = 0.0 if ratio is None else float(ratio)
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"{key}.min_lr_ratio={ratio}; expected a fraction in [0, 1]")
        if optim.get("lr_scheduler_type", "constant") != "cosine" and (ratio != 0.0 or float(cycles) != 0.5):
            raise ConfigError(f"{key}.min_lr_ratio={ratio} / num_cycles={cycles} shape a cosine schedule, but "
                              f"{key}.lr_scheduler_type={optim.get('lr_scheduler_type')}; set lr_scheduler_type=cosine")
        warm = optim.get("lr_warmup_steps_ratio", 0.0)
        if not 0.0 <= float(warm or 0.0) <= 1.0:
            raise ConfigError(f"{key}.lr_warmup_steps_ratio={warm}; expected a fraction in [0, 1]")


def _check_validation_keys(cfg: dict) -> None:
    t = cfg["trainer"]
    actor_keep, critic_keep = t.get("max_actor_ckpt_to_keep"), t.get("max_critic_ckpt_to_keep")
    if critic_keep is not None and critic_keep != actor_keep:
        raise ConfigError(f"trainer.max_critic_ckpt_to_keep={critic_keep} differs from trainer.max_actor_ckpt_to_keep="
                          f"{actor_keep}: a checkpoint is one global_step_N folder for every role, kept or pruned "
                          "as a whole; set trainer.max_actor_ckpt_to_keep")
    _as_int(t.get("log_val_generations", 0), "trainer.log_val_generations", minimum=0)
    if t.get("val_only") and not cfg["data"].get("val_files") and cfg["data"].get("train_files") is not None:
        raise ConfigError("trainer.val_only=true needs held-out data: set data.val_files")


def _check_critic_batches(cfg: dict) -> None:
    c = cfg["critic"]
    if not c.get("enable"):
        return
    _as_int(c.get("forward_micro_batch_size_per_gpu", 1), "critic.forward_micro_batch_size_per_gpu", minimum=1)
    if c.get("use_dynamic_bsz"):
        for key in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"):
            _as_int(c.get(key, 1), f"critic.{key}", minimum=1)
