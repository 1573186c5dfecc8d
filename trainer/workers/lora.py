"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on a trained role, with peft.

A role whose model settings have ``lora_rank > 0`` (verl's keys: ``lora_rank``, ``lora_alpha``, ``target_modules``,
``exclude_modules``) is wrapped with ``peft.get_peft_model`` before ``deepspeed.initialize``: the base weights are
frozen, only the adapters (and, for the critic, its value head) are given to the optimizer, so ZeRO-1/2/3 keep
optimizer state for the adapters only. The reference model is the same module with its adapters disabled
(``PeftModel.disable_adapter``): no second copy of the weights.

The rollout engines, the HF export and ``weights_fingerprint`` see the merged weights ``W + (alpha / r) B A``
under the base model's own parameter names: :func:`iter_merged_params` computes them bucket by bucket with peft's
``get_delta_weight`` (the formula of ``merge_and_unload``) without changing the trained weights; under ZeRO-3 each
bucket is gathered once. :func:`trainer.workers.lora_adapter.adapter_state_dict` gives the adapter alone in peft's file layout
(``adapter_model.safetensors`` names).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

NamedTensor = tuple[str, torch.Tensor]

#: the one-output token heads of transformers' ``*ForTokenClassification`` models (the critic's value head)
VALUE_HEADS = ("score", "classifier")
ADAPTER = "default"  # peft's adapter name
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSettings:
    """A role's LoRA settings (verl's ``model`` keys).

    Attributes:
        rank: ``lora_rank``, the inner dimension r of ``B (out, r) @ A (r, in)`` (> 0).
        alpha: ``lora_alpha``; the update is scaled by ``alpha / rank`` (peft's ``scaling``).
        target_modules: ``"all-linear"`` (every linear layer but the output head) or a list of module names, each
            matching a module whose dotted name equals it or ends with ``.<name>`` (peft's rule).
        exclude_modules: module names (same rule) never adapted, or ().
    """

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]
    exclude_modules: tuple[str, ...] = ()

    @classmethod
    def from_model_config(cls, model_cfg) -> "LoraSettings | None":
        """The settings of a role's :class:`trainer.config.model.ModelConfig` (``actor_rollout_ref.model``, or
        ``critic.model`` over it); None when ``lora_rank`` is 0 or null (full fine-tuning). Values are assumed
        checked (:func:`trainer.lora_checks.check_lora`); null target_modules means all-linear."""
        if not lora_enabled(model_cfg):
            return None
        targets = model_cfg.target_modules or "all-linear"
        targets = targets if isinstance(targets, str) else tuple(str(t) for t in targets)
        exclude = model_cfg.exclude_modules or ()
        exclude = (exclude,) if isinstance(exclude, str) else tuple(str(e) for e in exclude)
        return cls(rank=int(model_cfg.lora_rank), alpha=float(model_cfg.lora_alpha), target_modules=targets,
                   exclude_modules=exclude)

    def peft_config(self, value_head: bool = False):
        """The ``peft.LoraConfig``: task ``CAUSAL_LM``, or ``TOKEN_CLS`` for a value model (peft then trains the
        ``score``/``classifier`` head fully, as ``modules_to_save``; the head is kept out of the LoRA targets)."""
        from peft import LoraConfig, TaskType

        exclude = list(self.exclude_modules) + (list(VALUE_HEADS) if value_head else [])
        return LoraConfig(task_type=TaskType.TOKEN_CLS if value_head else TaskType.CAUSAL_LM, r=self.rank,
                          lora_alpha=self.alpha, lora_dropout=0.0, bias="none",
                          target_modules=self.target_modules if isinstance(self.target_modules, str)
                          else list(self.target_modules), exclude_modules=exclude or None)


def lora_enabled(model_cfg) -> bool:
    """Whether a role's :class:`trainer.config.model.ModelConfig` asks for LoRA (``lora_rank > 0``)."""
    return int(model_cfg.lora_rank or 0) > 0


def apply_lora(model: torch.nn.Module, settings: LoraSettings, value_head: bool = False, seed: int = 0,
               gradient_checkpointing: bool = False) -> torch.nn.Module:
    """Wrap ``model`` (a transformers model, before ``deepspeed.initialize``) with LoRA adapters.

    The adapters' initial values (peft's: ``A`` Kaiming-uniform, ``B`` zero, so the wrapped model starts equal to the
    base) are drawn from ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng``: every rank builds the same
    adapters and the caller's RNG stream is untouched.

    Returns:
        the ``peft.PeftModel``; its base parameters have ``requires_grad=False``.

    Raises:
        ValueError: (peft's) a target module that does not exist or cannot carry an adapter.
    """
    from peft import get_peft_model

    if gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return get_peft_model(model, settings.peft_config(value_head))


def is_lora_model(module: Any) -> bool:
    """Whether ``module`` (an HF model, or a DeepSpeed engine's ``.module``) is a peft LoRA model."""
    import sys

    peft = sys.modules.get("peft")  # a module can only be a PeftModel once peft was imported
    return peft is not None and isinstance(module, peft.PeftModel)


def reference_mode(module: Any):
    """Context in which ``module`` computes the reference model: a LoRA model with its adapters disabled
    (``PeftModel.disable_adapter``); any other module as it is."""
    return module.disable_adapter() if is_lora_model(module) else contextlib.nullcontext()


@contextlib.contextmanager
def frozen_weights_excluded(module: torch.nn.Module):
    """Context in which ``module.state_dict()`` leaves out every frozen parameter under each of its names.

    DeepSpeed's ``save_checkpoint(exclude_frozen_parameters=True)`` drops the frozen parameters it finds in
    ``named_parameters()``, which lists a tied weight once: the other name (``lm_head.weight`` tied to the input
    embedding) would still be saved, a full vocabulary-by-hidden matrix per checkpoint. Inside this context the
    state dict keeps only trainable parameters and buffers.
    """
    frozen = {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def drop(_module, state_dict, prefix, _local_metadata):
        for name in [k for k in state_dict if k[len(prefix):] in frozen]:
            del state_dict[name]

    handle = module.register_state_dict_post_hook(drop)
    try:
        yield
    finally:
        handle.remove()


# ---- names -------------------------------------------------------------------------------------------------------
_PREFIX = "base_model.model."


def hf_name(name: str) -> str | None:
    """The base model's parameter name for a peft parameter name, or None for a parameter that has no place in the
    base model (``lora_A``/``lora_B`` weights, the frozen ``original_module`` copy of a ``modules_to_save`` head).

    ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
    ``model.layers.0.self_attn.q_proj.weight``;
    ``base_model.model.score.modules_to_save.default.weight`` -> ``score.weight``.
    """
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX):]
    parts = name.split(".")
    if any(p in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "original_module") for p in parts):
        return None
    name = name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")
    return name


def merge_refusal(base: torch.nn.Module) -> str | None:
    """Why :func:`iter_merged_params` cannot merge an adapter on ``base`` (a module of the base model, before peft
    wraps it), or None when it can: peft's ``Linear`` (``torch.nn.Linear``, transformers' ``Conv1D``), ``Embedding``
    and ``Conv1d/2d/3d`` layers without groups, whose ``get_delta_weight`` is what ``merge_and_unload`` adds to the
    base layer's ``weight``. peft cannot merge a grouped convolution, and its ``MultiheadAttention`` (and any other
    layer) merges into other tensors than ``weight``."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(base, (torch.nn.Linear, torch.nn.Embedding, Conv1D)):
        return None
    if isinstance(base, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        return None if base.groups == 1 else f"a grouped convolution (groups={base.groups}), which peft cannot merge"
    return f"a {type(base).__name__}, whose adapter the merged weight sync cannot merge"


def _holds_adapter(layer: Any) -> bool:
    """Whether ``layer`` is a peft LoRA layer (``LoraLayer``; not a ``modules_to_save`` head) holding this run's
    adapter (linear/conv: ``lora_A``; embedding: ``lora_embedding_A``; any other kind: one of its
    ``adapter_layer_names``)."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(layer, LoraLayer):
        return False
    return any(ADAPTER in getattr(layer, n, {}) for n in layer.adapter_layer_names)


def _layer_refusal(layer: Any) -> str | None:
    """Why the adapter of the peft LoRA ``layer`` cannot be merged by :class:`_Unit`, or None."""
    from peft.tuners.lora import layer as lora_layer

    kinds = (lora_layer.Linear, lora_layer.Embedding, lora_layer.Conv1d, lora_layer.Conv2d, lora_layer.Conv3d)
    if type(layer) not in kinds:
        return f"a peft {type(layer).__name__} layer, whose adapter the merged weight sync cannot merge"
    if ADAPTER in getattr(layer, "lora_variant", {}):
        return f"a {type(layer.lora_variant[ADAPTER]).__name__} adapter (not plain LoRA)"
    if getattr(layer, "lora_bias", {}).get(ADAPTER, False):
        return "an adapter with lora_bias"
    return merge_refusal(layer.get_base_layer())


def _lora_layer_of(module: torch.nn.Module, param_name: str):
    """The peft LoRA layer owning ``param_name`` when it is that layer's ``base_layer.weight`` (a linear, Conv1D,
    convolution or embedding layer holding the adapter), else None."""
    if not param_name.endswith(".base_layer.weight"):
        return None
    layer = module.get_submodule(param_name[:-len(".base_layer.weight")])
    return layer if _holds_adapter(layer) else None


def _adapter_params(layer: Any) -> list[torch.Tensor]:
    """The adapter's factors of a peft LoRA layer: an ``Embedding`` keeps them as parameters
    (``lora_embedding_A[adapter]`` (r, vocab), ``lora_embedding_B[adapter]`` (dim, r)), a ``Linear`` / ``Conv``
    as the weights of its ``lora_A`` / ``lora_B`` modules."""
    if ADAPTER in getattr(layer, "lora_embedding_A", {}):
        return [layer.lora_embedding_A[ADAPTER], layer.lora_embedding_B[ADAPTER]]
    return [*layer.lora_A[ADAPTER].parameters(), *layer.lora_B[ADAPTER].parameters()]


@dataclass
class _Unit:
    """One output tensor: ``name`` (HF) from ``source`` (a parameter), merged with ``layer``'s adapter if set."""

    name: str
    source: torch.Tensor
    layer: Any = None

    def inputs(self) -> list[torch.Tensor]:
        if self.layer is None:
            return [self.source]
        return [self.source, *_adapter_params(self.layer)]

    def nbytes(self) -> int:
        numel = getattr(self.source, "ds_numel", None)
        return int(numel if numel is not None else self.source.numel()) * self.source.element_size()

    def value(self) -> torch.Tensor:
        """The tensor (valid while its inputs are gathered): ``W + delta`` as peft's merge computes it (a new tensor;
        ``get_delta_weight``: ``scaling * B @ A`` for a linear layer, transposed for ``Conv1D`` and for an embedding,
        whose weight is (vocab, dim)), or the parameter's data."""
        w = self.source.data
        if self.layer is None:
            return w
        merged = w.clone()
        merged += self.layer.get_delta_weight(ADAPTER).to(w.dtype)
        return merged


def _check_mergeable(module: torch.nn.Module, layers: dict[str, Any]) -> None:
    """Every peft LoRA layer of ``module`` holding the adapter is one of ``layers`` (found through its
    ``base_layer.weight``) and can be merged: an adapter is never left out of the merged weights in silence.

    Raises:
        ValueError: naming the module and why its adapter cannot be merged.
    """
    found = {id(layer) for layer in layers.values()}
    for name, sub in module.named_modules():
        if not _holds_adapter(sub):
            continue
        why = _layer_refusal(sub) if id(sub) in found else \
            f"a peft {type(sub).__name__} layer whose adapter is not on its base_layer.weight"
        if why is not None:
            raise ValueError(f"LoRA adapter on {hf_name(name)!r}: {why}; the rollout engine, the export and the "
                             "fingerprint would not get the trained weights. Leave this module out of target_modules")


def _units(module: torch.nn.Module, changed_only: bool, merge: bool = True) -> list[_Unit]:
    """The base model's tensors as :class:`_Unit` s, in ``named_parameters`` order (tied weights once).
    ``changed_only``: only those that training changes (adapted weights, trainable heads); ``merge=False``: the
    adapted weights without their adapters (the frozen base)."""
    out, layers = [], {}
    for name, p in module.named_parameters():
        target = hf_name(name)
        if target is None:
            continue
        layer = _lora_layer_of(module, name)
        if layer is not None:
            layers[name] = layer
        if changed_only and layer is None and not p.requires_grad:
            continue
        out.append(_Unit(target, p, layer if merge else None))
    _check_mergeable(module, layers)
    return out


def _buckets(units: list[_Unit], bucket_bytes: int) -> Iterator[list[_Unit]]:
    bucket, size = [], 0
    for u in units:
        if bucket and size + u.nbytes() > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append(u)
        size += u.nbytes()
    if bucket:
        yield bucket


def iter_merged_params(module: torch.nn.Module, zero_stage: int = 0, bucket_bytes: int = 512 * 2**20,
                       changed_only: bool = False, merge: bool = True) -> Iterator[list[NamedTensor]]:
    """Yield the merged weights of a LoRA model as buckets of ``(hf_name, tensor)`` of at most ``bucket_bytes``
    (a bigger tensor stands alone), the names and order of the base model's ``named_parameters``.

    An adapted layer's weight (linear, Conv1D, convolution, or embedding: peft's ``lora_embedding_A``/``_B``) is
    ``W + delta`` with ``delta`` its ``get_delta_weight`` (``scaling * B @ A``, transposed where the weight is
    (in, out) or (vocab, dim); bitwise what ``merge_and_unload`` writes), in the weight's dtype; every other tensor is
    the parameter itself. The trained parameters are not modified. With ZeRO-3 each bucket's parameters (base weights
    and their ``A``, ``B``) are gathered with ONE ``deepspeed.zero.GatheredParameters`` and the tensors are valid only
    until the next bucket is requested: consume (copy) each bucket first, as ``rollout.context.sync_weights`` does.

    Args:
        module: the ``peft.PeftModel`` (``ds_engine.module``).
        zero_stage: 0-3.
        bucket_bytes: max bytes per bucket (> 0), counted on the full (unpartitioned) tensors.
        changed_only: only the tensors that training changes (the adapted weights and trainable heads), for an
            engine that already holds the rest.
        merge: False yields the frozen base weights instead (the adapted layers' ``W`` without ``B A``), for an engine
            that applies the adapter itself (vLLM's LoRA).

    Raises:
        ValueError: ``zero_stage`` not in 0..3, ``bucket_bytes`` <= 0, ``module`` is not a LoRA model, or it holds
            an adapter this merge cannot carry (:func:`merge_refusal`; ``trainer.lora_checks`` refuses its target
            before start-up), raised before the first bucket.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    if not is_lora_model(module):
        raise ValueError(f"{type(module).__name__} is not a peft LoRA model")
    for bucket in _buckets(_units(module, changed_only, merge), bucket_bytes):
        with _gathered([t for u in bucket for t in u.inputs()], zero_stage):
            yield [(u.name, u.value()) for u in bucket]


@contextlib.contextmanager
def _gathered(params: list[torch.Tensor], zero_stage: int):
    if zero_stage != 3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def merged_state_dict(module: torch.nn.Module, zero_stage: int, dtype: torch.dtype, rank: int = 0) -> dict | None:
    """The merged model's full state dict on CPU in ``dtype`` on ``rank`` 0 (None elsewhere; every rank must call it
    under ZeRO-3): :func:`iter_merged_params` plus the base model's persistent buffers."""
    sd: dict[str, torch.Tensor] = {}
    for bucket in iter_merged_params(module, zero_stage, 256 * 2**20):
        if rank == 0:
            sd.update({n: t.detach().to("cpu", dtype, copy=True) for n, t in bucket})
    if rank != 0:
        return None
    keys = set(module.state_dict().keys())
    for name, buf in module.named_buffers():
        target = hf_name(name)
        if target is not None and name in keys and target not in sd:
            sd[target] = buf.detach().to("cpu", copy=True)
    return sd


def trainable_numel(module: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (full sizes under ZeRO-3)."""
    count = lambda p: int(getattr(p, "ds_numel", p.numel()))  # noqa: E731
    params = list(module.parameters())
    return sum(count(p) for p in params if p.requires_grad), sum(count(p) for p in params)
