"""Building one model role (actor, reference, critic, PRM) on a worker and running batched forwards."""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch

from trainer.protocol import DataProto
from trainer.role_models import apply_config_overrides  # noqa: F401  (the start-up checks apply the same rule)
from trainer.workers.batching import micro_batches

logger = logging.getLogger(__name__)


@dataclass
class ModelRole:
    """One DeepSpeed-wrapped model with its tokenizer, HF config and sequence-parallel group.

    Attributes:
        engine: the ``deepspeed.DeepSpeedEngine`` (call it like the HF model).
        sp: the Ulysses group object (None when sequence parallel size is 1).
        dp_group: the data-parallel process group (ranks with the same SP rank); None means the world.
        dp_size, dp_rank: this rank's data-parallel coordinates.
        use_remove_padding: packed forwards (batch 1, no padding).
    """

    engine: Any
    tokenizer: Any
    hf_config: Any
    model_path: str
    sp: Any
    sp_size: int
    dp_group: Any
    dp_size: int
    dp_rank: int
    use_remove_padding: bool
    device: torch.device
    value_head: bool = False

    @classmethod
    def build(cls, worker, model_cfg, sp: int, train: bool, optim_cfg=None, grad_clip: float = 1.0,
              total_steps: int = 1, value_head: bool = False, path_override: str | None = None) -> "ModelRole":
        """Load the HF model of ``model_cfg`` (a :class:`trainer.config.model.ModelConfig`; ``path_override``: another
        folder with the same settings, e.g. a frozen reference) and wrap it with ``deepspeed.initialize``;
        ``optim_cfg`` (:class:`trainer.config.actor.OptimConfig`) and ``total_steps`` (optimizer steps of the run)
        for a trained role.

        With ZeRO-3, ``transformers.integrations.HfDeepSpeedConfig`` is alive during ``from_pretrained`` so the
        weights are partitioned as they load. Master weights are fp32; DeepSpeed keeps bf16 copies when bf16 is on.
        """
        import deepspeed
        from transformers import AutoConfig

        path = path_override or model_cfg.path
        tok, override, remote = load_tokenizer(model_cfg, path)
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
        if value_head:  # no dropout before the value head (transformers' default is 0.1), unless override_config sets
            hf_config.classifier_dropout = 0.0  # it: the update's values would be noisy and runs not repeatable
        apply_config_overrides(hf_config, override)
        use_rmpad = packs_sequences(model_cfg.use_remove_padding, sp, hf_config, remote)  # its probe before ZeRO-3
        ds_cfg = worker.ds_config(train=train, grad_clip=grad_clip)
        keep = None
        if ds_cfg["zero_optimization"]["stage"] == 3:
            from transformers.integrations import HfDeepSpeedConfig

            keep = HfDeepSpeedConfig(ds_cfg)  # noqa: F841 (must stay alive while loading)
        sp_obj, dp_group, dp_size, dp_rank = make_sp_groups(worker.world_size, sp, worker.rank, hf_config)
        with torch.random.fork_rng(devices=[]):  # a value head is new: drawn from trainer.seed, the same on every rank
            torch.manual_seed(int(worker.config.seed))
            model = load_hf_model(path, hf_config if override or value_head else None, value_head, remote,
                                  vision_language=is_vision_language(hf_config))
        if use_rmpad:
            from patches.ulysses import apply_ulysses_patch

            apply_ulysses_patch(model, sp_obj if sp_obj is not None else 1)  # 1: no SP, fixed at patch time
        if train and model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        from trainer.workers.kernels import apply_kernel_options

        apply_kernel_options(model, {"use_liger": model_cfg.use_liger, "use_torch_compile": model_cfg.use_torch_compile,
                                     "torch_compile_mode": model_cfg.torch_compile_mode})
        model = _with_lora(worker, model, model_cfg, train, value_head)
        if train:
            opt, sched = worker.build_optimizer(model, optim_cfg, total_steps)
            engine, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_cfg)
        else:
            model.requires_grad_(False)
            engine, *_ = deepspeed.initialize(model=model, config=ds_cfg)
            engine.eval()
        del keep
        use_weights_only_loads(engine)
        return cls(engine=engine, tokenizer=tok, hf_config=hf_config, model_path=path, sp=sp_obj, sp_size=sp,
                   dp_group=dp_group, dp_size=dp_size, dp_rank=dp_rank, use_remove_padding=use_rmpad,
                   device=worker.device, value_head=value_head)


def packs_sequences(use_remove_padding: bool, sp: int, hf_config, trust_remote_code: bool = False) -> bool:
    """Whether a role's forwards run packed (``use_remove_padding``, or Ulysses SP above 1) through the Ulysses
    patch's varlen attention. A model that cannot (:func:`trainer.packing_probe.packed_attention_obstacle`: logit
    soft-capping, an attention outside transformers' attention interface, a decoder whose packed log-probs differ
    from its padded ones) runs padded batches through its own attention instead, said once in an info line; with
    SP above 1 it is refused (before start-up by :func:`trainer.packing_probe.check_packed_attention`).

    Raises:
        ValueError: SP above 1 for a model that cannot run packed forwards.
    """
    from trainer.packing_probe import packed_attention_obstacle

    packed = bool(use_remove_padding) or sp > 1
    reason = packed_attention_obstacle(hf_config, trust_remote_code, sequence_parallel=sp > 1) if packed else None
    if reason is not None and sp > 1:
        raise ValueError(f"ulysses_sequence_parallel_size={sp}: this model cannot run packed forwards: {reason}")
    if reason is not None:
        from trainer.checkpoint.base import log_once

        log_once(logging.INFO, "use_remove_padding: off for this model: %s; its forwards run padded batches through "
                 "its own attention", reason, log=logger)
        return False
    return packed


def _with_lora(worker, model: torch.nn.Module, model_cfg, train: bool, value_head: bool) -> torch.nn.Module:
    """``model`` wrapped with LoRA adapters when a trained role's settings ask for them
    (:func:`trainer.workers.lora.apply_lora`; the adapters are seeded with ``trainer.seed``), else ``model``."""
    from trainer.workers.lora import LoraSettings, apply_lora, trainable_numel

    settings = LoraSettings.from_model_config(model_cfg) if train else None
    if settings is None:
        return model
    model = apply_lora(model, settings, value_head=value_head, seed=worker.config.seed,
                       gradient_checkpointing=model_cfg.enable_gradient_checkpointing)
    trained, total = trainable_numel(model)
    logger.info("LoRA rank %d alpha %g on %s: %d of %d parameters trained (%.2f%%)", settings.rank, settings.alpha,
                settings.target_modules, trained, total, 100.0 * trained / max(total, 1))
    return model


def load_hf_model(path: str, hf_config, value_head: bool, trust_remote_code: bool,
                  vision_language: bool = False) -> torch.nn.Module:
    """The fp32 HF model at ``path``: a causal LM, an image-text-to-text model (``vision_language``: its config has a
    ``vision_config``), or (``value_head``) the backbone with a one-output token head (the critic; it exports as an
    HF model). With ``hf_config`` (an overridden config) the model is built from it."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForTokenClassification

    given = {} if hf_config is None else {"config": copy.deepcopy(hf_config)}
    if not value_head:
        auto = AutoModelForImageTextToText if vision_language else AutoModelForCausalLM
        return auto.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code, **given)
    if given:
        given["config"].num_labels = 1
    else:
        given["num_labels"] = 1
    return AutoModelForTokenClassification.from_pretrained(path, dtype=torch.float32,
                                                           trust_remote_code=trust_remote_code, **given)


def load_tokenizer(model_cfg, path: str | None = None):
    """``(tokenizer, override_config, trust_remote_code)`` of a role's :class:`trainer.config.model.ModelConfig`
    (its ``external_lib`` imported first; ``custom_chat_template`` applied; ``path``: instead of ``model_cfg.path``
    when the tokenizer has no folder of its own)."""
    from transformers import AutoTokenizer

    import_external_lib(model_cfg.external_lib)
    remote = model_cfg.trust_remote_code
    tok = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or path or model_cfg.path, trust_remote_code=remote)
    if model_cfg.custom_chat_template:
        tok.chat_template = model_cfg.custom_chat_template
    return tok, dict(model_cfg.override_config), remote


def import_external_lib(name: str | None) -> None:
    """Import the module ``name`` (``model.external_lib``: it registers custom models with transformers), if set.

    Raises:
        ImportError: naming the module.
    """
    if name:
        import importlib

        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"external_lib={name!r} cannot be imported: {exc}") from exc


def is_vision_language(hf_config) -> bool:
    """Whether an HF config describes a vision-language model (it carries a ``vision_config``)."""
    return getattr(hf_config, "vision_config", None) is not None


def use_weights_only_loads(engine) -> None:
    """Make ``engine.load_checkpoint`` read every file with ``torch.load(weights_only=True)``.

    DeepSpeed 0.19's ``TorchCheckpointEngine.load`` passes ``weights_only=False`` (arbitrary code can run from a
    tampered checkpoint); this replaces that one method on the engine's own checkpoint engine. A file holding
    any other Python object fails to load with torch's error naming the object, instead of executing it.
    """
    ce = getattr(engine, "checkpoint_engine", None)
    if ce is None or type(ce).__name__ != "TorchCheckpointEngine":
        return
    from trainer.checkpoint.deepspeed_manager import deepspeed_safe_globals

    allowed = deepspeed_safe_globals()

    def load(path: str, map_location=None):
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)

    ce.load = load


def make_sp_groups(world_size: int, sp: int, rank: int, hf_config) -> tuple[Any, Any, int, int]:
    """Data-parallel x sequence-parallel groups; returns (sp_object|None, dp_group|None, dp_size, dp_rank).

    SP groups are contiguous ranks (rank r is in SP group r // sp); with sp == 1 the DP group is the world.

    Raises:
        ValueError: ``sp`` does not divide the world size or the model's head counts (the patch's rules:
            :func:`patches.validate_ulysses_config`, :func:`patches.build_dp_sp_groups`).
    """
    if sp == 1:
        return None, None, world_size, rank
    from patches.ulysses import build_dp_sp_groups, validate_ulysses_config

    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    validate_ulysses_config(text.num_attention_heads,
                            getattr(text, "num_key_value_heads", None) or text.num_attention_heads, sp)
    mesh = build_dp_sp_groups(world_size, sp, rank)
    return mesh.sp, mesh.dp_group, mesh.dp_size, mesh.dp_rank


def forward_micro(role: ModelRole, mb: DataProto, temperature: float, calculate_entropy: bool,
                  calculate_sum_pi_squared: bool = False):
    """Per-token response log-probs (and entropy) of one micro-batch: (b, R) f32 each (entropy may be None); a third
    ``sum_pi_squared`` (b, R) f32 with ``calculate_sum_pi_squared`` (see :func:`trainer.forward.forward_log_probs`)."""
    from trainer.forward import forward_log_probs

    from trainer.multimodal import concat_multi_modal_inputs

    mm = concat_multi_modal_inputs(mb["multi_modal_inputs"]) if "multi_modal_inputs" in mb else None
    # inputs stay on the CPU: the packed forward packs there and copies without a host sync (trainer.forward)
    return forward_log_probs(role.engine, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                             response_length=mb["responses"].shape[1], temperature=temperature,
                             calculate_entropy=calculate_entropy, use_remove_padding=role.use_remove_padding,
                             sp=role.sp, device=role.device, multi_modal_inputs=mm or None,
                             calculate_sum_pi_squared=calculate_sum_pi_squared)


def forward_batch_log_probs(role: ModelRole, data: DataProto, micro_batch_size: int, temperature: float,
                            calculate_entropy: bool, use_dynamic_bsz: bool = False, max_token_len: int = 16384,
                            calculate_sum_pi_squared: bool = False):
    """Log-probs (and entropy) of every row of ``data`` in micro-batches, in the original row order, with the model
    in eval mode (no dropout: the update's ``train()`` otherwise stays on, and these passes are the old policy's,
    the reference's and the PRM's scores; the update sets ``train()`` again).

    Returns:
        (log_probs (B, R) f32 on CPU, entropy (B, R) f32 on CPU or None), and a third ``sum_pi_squared`` (B, R) f32
        on CPU with ``calculate_sum_pi_squared``.
    """
    role.engine.eval()
    order = torch.arange(len(data))
    data = data.select(["input_ids", "attention_mask", "position_ids", "responses"],
                       [k for k in ("multi_modal_inputs",) if k in data.non_tensor])
    data["_row"] = order
    parts, rows = [], []
    for mb in micro_batches(data, micro_batch_size, use_dynamic_bsz, max_token_len * role.sp_size, role.dp_group):
        stats = forward_micro(role, mb, temperature, calculate_entropy, calculate_sum_pi_squared)
        parts.append([t.float().cpu() if t is not None else None for t in stats])
        rows.append(mb["_row"])
    inv = torch.argsort(torch.cat(rows))
    return tuple(torch.cat(col)[inv] if col[0] is not None else None for col in zip(*parts))
