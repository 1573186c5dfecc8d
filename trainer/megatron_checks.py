"""Checks of a ``trainer.strategy=megatron`` run before any worker starts: megatron-core importable, the
``actor.megatron`` section, TP x PP against the world, the pairings the Megatron path does not support, and the
model's head counts against TP."""
from __future__ import annotations

from trainer.config.actor import MegatronConfig
from trainer.config_checks import ConfigError

__all__ = ["check_megatron", "check_megatron_model"]


def check_megatron(cfg: dict, world: int) -> None:
    """``trainer.strategy=megatron``: megatron-core importable, the ``actor.megatron`` section
    (:class:`trainer.config.actor.MegatronConfig`, its own checks), TP x PP against the world, unsupported pairings.

    Raises:
        ConfigError: naming the key and the bad value (the section's refusals, a critic, PRIME, Ulysses SP > 1,
            optimizer offload during rollout, Liger / torch.compile and a missing megatron-core are refused).
    """
    import importlib.util

    arr = cfg["actor_rollout_ref"]
    key = "actor_rollout_ref.actor.megatron"
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError("trainer.strategy=megatron but megatron-core is not importable: pip install -e .[megatron]")
    m = MegatronConfig.from_dict(arr["actor"]["megatron"], key)  # its own checks: sizes, TP only, ckpt_format
    tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
    if world % (tp * pp):
        raise ConfigError(f"{key}.tensor_model_parallel_size*pipeline_model_parallel_size={tp}*{pp} must divide the "
                          f"{world} workers (trainer.nnodes*trainer.n_gpus_per_node)")
    for sp_key, sp in (("actor_rollout_ref.actor.ulysses_sequence_parallel_size", arr["actor"]["ulysses_sequence_parallel_size"]),
                       ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", arr["ref"]["ulysses_sequence_parallel_size"])):
        if int(sp) != 1:
            raise ConfigError(f"{sp_key}={sp}: Ulysses sequence parallelism is a DeepSpeed-path feature and the "
                              "Megatron path has no sequence splitting for long inputs yet (Megatron's context "
                              "parallelism is not wired); set it to 1 or use trainer.strategy=deepspeed")
    if cfg["critic"]["enable"]:
        raise ConfigError(f"trainer.strategy=megatron has no critic worker yet, but critic.enable is on "
                          f"(algorithm.adv_estimator={cfg['algorithm']['adv_estimator']}); use a critic-free "
                          "estimator (grpo, rloo, ...) or trainer.strategy=deepspeed")
    from trainer.hooks.prime import prime_enabled

    if prime_enabled(cfg):
        raise ConfigError("algorithm=prime is not supported with trainer.strategy=megatron (its PRM worker is "
                          "DeepSpeed-only)")
    if arr["rollout"]["offload_optimizer_during_rollout"]:
        raise ConfigError("actor_rollout_ref.rollout.offload_optimizer_during_rollout=true is a DeepSpeed-path "
                          "feature; set it to false with trainer.strategy=megatron")
    for k in ("use_liger", "use_torch_compile"):
        if arr["model"][k]:
            raise ConfigError(f"actor_rollout_ref.model.{k}=true applies to Hugging Face models (DeepSpeed path); "
                              "set it to false with trainer.strategy=megatron")


def check_megatron_model(cfg: dict, hf: dict) -> None:
    """The model's head counts (and, given a full HF config, its architecture) fit the TP size.

    Raises: ConfigError naming ``tensor_model_parallel_size`` and the model field that does not divide.
    """
    tp = int(cfg["actor_rollout_ref"]["actor"]["megatron"]["tensor_model_parallel_size"])
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
