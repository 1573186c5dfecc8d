"""Whether a model's packed forward is exact: ``use_remove_padding`` (and Ulysses SP) replace the decoder's attention
by the varlen function of :mod:`patches.ulysses`, which knows causal attention, GQA, sliding windows and the
sequence boundaries of a packed row. A model whose decoder does more than that (attention sinks, ALiBi, chunked
local attention, a query/key width that differs from the value width, recurrent or convolutional token mixers that
carry state from one sequence of a packed row into the next, an attention that does not go through transformers'
``AttentionInterface`` at all) would compute other log-probs when packed, silently.

:func:`packed_attention_obstacle` decides it for the model's config, once per process:

1. attention logit soft-capping in the config (Gemma 2; the varlen kernels have none);
2. a model class that does not declare ``_supports_attention_backend`` (its attention does not go through the
   registered attention function: Bloom, MPT, the Mamba hybrids, Qwen3-Next, ...);
3. a probe: a small random model of the same class and configuration (the widths, experts and windows made small,
   at most 4 layers keeping one of every kind a per-layer list names, everything else kept:
   :func:`small_twin_config`), in float64 (float32 where float64 does not run, e.g. grouped expert kernels), run
   on three rows of different lengths padded and packed (:func:`trainer.forward.forward_log_probs`, the workers'
   path; two rows answer from their first tokens, so a mixer reaching across a sequence boundary shows); the packed
   log-probs must equal the padded ones within :data:`PROBE_TOLERANCE` (ten times that in float32), and the packed
   forward must not fail.

A text model whose configuration cannot be made small (its config class refuses the small sizes) or whose small
twin does not run padded could not be checked, and is treated as one that cannot pack (it runs padded; SP is
refused): correct log-probs first. A vision-language model, or a twin of more than :data:`PROBE_MAX_PARAMS`
parameters, is not probed: the first two rules decide alone. The probe takes 0.2 to 1.2 s on an idle CPU core
(Llama, Qwen2, Gemma 3, Mixtral, GPT-J default configurations; most of it is the vocabulary's embedding).
"""
from __future__ import annotations

import copy
import logging

from trainer.meta_shapes import one_line

logger = logging.getLogger(__name__)

__all__ = ["packed_attention_obstacle", "small_twin_config", "PROBE_TOLERANCE", "PROBE_MAX_PARAMS"]

#: largest |packed - padded| log-prob (nats) of the probe (its twin in float64) accepted as the same computation
PROBE_TOLERANCE = 1e-4
#: a small twin above this many parameters is not built
PROBE_MAX_PARAMS = 60_000_000
#: (prompt, response) lengths of the probe's rows: the first is longer than the probe's windows (8 tokens); the others
#: answer from their first tokens, where a mixer that reaches across a sequence boundary shows at once
PROBE_ROWS = ((10, 6), (1, 8), (2, 5))
_WINDOW = 8
_MAX_LAYERS = 4  # layers of the small twin (more when its per-layer lists name more kinds)


def _layers(d: dict) -> dict:
    """At most 4 layers (more, up to 8, when the per-layer lists name more kinds): the first layer of each kind a
    per-layer list names (``layer_types``: a ``conv`` layer after four attention layers is kept), then the first
    layers; every list of one entry per layer is cut to the same layers."""
    out = {}
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        n = d.get(key)
        if not isinstance(n, int) or isinstance(n, bool) or n <= _MAX_LAYERS:
            continue
        lists = {k: v for k, v in d.items() if isinstance(v, list) and len(v) == n}
        keep: set[int] = {0}
        for v in lists.values():
            seen = set()
            for i, x in enumerate(v):
                if isinstance(x, (str, int, float, bool, type(None))) and x not in seen:
                    seen.add(x)
                    keep.add(i)
        rows = sorted(keep)[:2 * _MAX_LAYERS]
        rows = sorted(set(rows) | set([i for i in range(n) if i not in rows][:max(0, _MAX_LAYERS - len(rows))]))
        out[key] = len(rows)
        out.update({k: [v[i] for i in rows] for k, v in lists.items()})
    return out


def _heads(d: dict) -> dict:
    """4 query heads of width 16; the key/value heads keep their kind (as many, one, or fewer: 2)."""
    out = {}
    for q_key, kv_keys in (("num_attention_heads", ("num_key_value_heads", "num_kv_heads")), ("n_head", ())):
        nq = d.get(q_key)
        if not isinstance(nq, int) or nq < 1:
            continue
        out[q_key] = 4
        for kv_key in kv_keys:
            nk = d.get(kv_key)
            if isinstance(nk, int) and nk >= 1:
                out[kv_key] = 4 if nk >= nq else 1 if nk == 1 else 2
    if d.get("head_dim") is not None:
        out["head_dim"] = 16
    return out


def _mla(d: dict) -> dict:
    """Multi-head latent attention's ranks and widths made small; a value width unlike the query/key width stays
    unlike it."""
    if d.get("kv_lora_rank") is None:
        return {}
    qk = (d.get("qk_nope_head_dim") or 0) + (d.get("qk_rope_head_dim") or 0)
    out = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
           "v_head_dim": 16 if d.get("v_head_dim") == qk else 8}
    if d.get("q_lora_rank") is not None:
        out["q_lora_rank"] = 16
    if d.get("qk_head_dim") is not None:
        out["qk_head_dim"] = 16
    if d.get("head_dim") is not None and d.get("head_dim") == d.get("qk_rope_head_dim"):
        out["head_dim"] = 8  # the rotary width (DeepSeek-V3's config)
    return out


def _small_ints(d: dict, keys: tuple, cap: int) -> dict:
    return {k: min(d[k], cap) for k in keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)}


def _has_vision(config) -> bool:
    d = config.to_dict()
    return d.get("vision_config") is not None or d.get("text_config") is not None


def small_twin_config(config):
    """A copy of the transformers ``config`` with small sizes and everything else as it was, or None when its
    class refuses them or it has a vision part (``vision_config``).

    Made small: the hidden width (64), feed-forward widths (64), the layer count (at most 4, with every per-layer
    list cut alike), the heads (:func:`_heads`), latent attention (:func:`_mla`), experts (at most 4, at most 2 per
    token, one group), sliding windows and attention chunks (at most 8 tokens); ``initializer_range`` 0.5, so that a
    wrong attention shows in the log-probs of random weights."""
    if _has_vision(config):
        return None
    d = config.to_dict()
    over = {k: 64 for k in ("hidden_size", "n_embd", "d_model") if isinstance(d.get(k), int)}
    over.update({k: 64 for k in ("intermediate_size", "ffn_hidden_size", "intermediate_size_mlp", "n_inner",
                                 "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim")
                 if isinstance(d.get(k), int)})
    over.update(_layers(d))
    over.update(_heads(d))
    over.update(_mla(d))
    over.update(_small_ints(d, ("num_local_experts", "num_experts", "n_routed_experts"), 4))
    over.update(_small_ints(d, ("num_experts_per_tok",), 2), **_small_ints(d, ("n_group", "topk_group"), 1))
    over.update(_small_ints(d, ("first_k_dense_replace",), 1), **_small_ints(d, ("sliding_window",
                                                                               "attention_chunk_size"), _WINDOW))
    over.update(_small_ints(d, ("rotary_dim",), 8))  # GPT-J, CodeGen: the rotary part of a 16-wide head
    over.update(_mamba(d))
    over.update(_rope_lists(d))
    if "initializer_range" in d:
        over["initializer_range"] = 0.5
    try:
        return type(config).from_dict({**d, **over})
    except Exception as exc:  # noqa: BLE001 - a config class's own validation of the small sizes
        logger.debug("packed attention probe: %s refuses small sizes (%s)", type(config).__name__, exc)
        return None


def _rope_lists(d: dict) -> dict:
    """Per-frequency lists of a rotary scaling (longrope's ``short_factor`` / ``long_factor``: one entry per rotary
    pair of a head) cut to the small twin's 16-wide heads."""
    out = {}
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        if not isinstance(rope, dict):
            continue
        factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor")) or 1.0
        pairs = max(1, int(16 * float(factor)) // 2)
        lists = {k: v[:pairs] for k, v in rope.items() if isinstance(v, list) and len(v) > pairs}
        if lists:
            out[key] = {**rope, **lists}
    return out


def _mamba(d: dict) -> dict:
    """A Mamba mixer's heads made small and consistent with the 64 wide hidden state (``n_heads * d_head ==
    expand * hidden``), one group, a small state."""
    if not isinstance(d.get("mamba_n_heads"), int):
        return {}
    expand = d.get("mamba_expand") if isinstance(d.get("mamba_expand"), int) else 2
    out = {"mamba_n_heads": 4, "mamba_d_head": expand * 64 // 4}
    out.update(_small_ints(d, ("mamba_n_groups",), 1), **_small_ints(d, ("mamba_d_state", "mamba_chunk_size"), 16))
    return out


def _model_class(config, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        if trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {}):
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            return get_class_from_dynamic_module(config.auto_map["AutoModelForCausalLM"], config.name_or_path)
        return None


def _probe_rows(vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    P, R = max(p for p, _ in PROBE_ROWS), max(r for _, r in PROBE_ROWS)
    ids = torch.randint(3, max(4, min(int(vocab), 1000)), (len(PROBE_ROWS), P + R), generator=g)
    mask = torch.zeros(len(PROBE_ROWS), P + R, dtype=torch.long)
    for i, (p, r) in enumerate(PROBE_ROWS):
        mask[i, P - p:P + r] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), R


def _padded_twin(cls, twin, ids, mask, pos, R):
    """``(model, padded log-probs, tolerance)`` of the small twin in float64 (tolerance :data:`PROBE_TOLERANCE`),
    else in float32 (ten times that) when float64 does not run; the last error in one line when neither builds and
    runs padded; None when the twin has more than :data:`PROBE_MAX_PARAMS` parameters (not probed)."""
    import torch

    from trainer.forward import forward_log_probs

    try:
        with torch.device("meta"):
            if sum(p.numel() for p in cls._from_config(twin).parameters()) > PROBE_MAX_PARAMS:
                return None
    except Exception as exc:  # noqa: BLE001 - the class refuses the small configuration
        return one_line(exc, 200)
    problem = ""
    for dtype, tolerance in ((torch.float64, PROBE_TOLERANCE), (torch.float32, 10 * PROBE_TOLERANCE)):
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(0)
                model = cls._from_config(twin, dtype=dtype).eval()
                return model, forward_log_probs(model, ids, mask, pos, R, use_remove_padding=False)[0], tolerance
        except Exception as exc:  # noqa: BLE001 - this dtype does not run: the next, or nothing learnt
            problem = one_line(exc, 200)
    return problem


def _probe(cls, twin, sequence_parallel: bool) -> str | None:
    """The probe of rule 3 on ``twin``: a reason (other log-probs, a failing packed forward, or a twin that does not
    run padded: not checked), or None (the same log-probs; a twin too large to build; a ZeRO-3 load in progress).
    The packed forward runs as the workers run it without SP (boundaries handed to the attention as keyword
    arguments) and, with ``sequence_parallel``, also as eager Ulysses runs it (boundaries from the ``position_ids``
    each attention call receives)."""
    import torch
    from transformers.integrations import is_deepspeed_zero3_enabled

    from patches.ulysses import apply_ulysses_patch
    from trainer.forward import forward_log_probs

    if is_deepspeed_zero3_enabled():  # the twin would be partitioned across the ranks (a ZeRO-3 load in progress)
        logger.debug("packed attention probe: not run while a ZeRO-3 load is in progress")
        return None
    ids, mask, pos, R = _probe_rows(getattr(twin, "vocab_size", 0) or 4)
    built = _padded_twin(cls, twin, ids, mask, pos, R)
    if built is None or isinstance(built, str):
        return None if built is None else f"it could not be checked: a small random {cls.__name__} does not run ({built})"
    model, padded, tolerance = built
    with torch.no_grad():
        for patch_sp in (1, None) if sequence_parallel else (1,):
            how = "" if patch_sp == 1 else " with sequence parallelism (boundaries from position_ids)"
            try:
                packed = forward_log_probs(apply_ulysses_patch(copy.deepcopy(model), patch_sp), ids, mask, pos, R,
                                           use_remove_padding=True, device=torch.device("cpu"))[0]
            except Exception as exc:  # noqa: BLE001 - any failure of the packed path is the answer
                return f"its packed forward{how} fails on a small random {cls.__name__} ({one_line(exc, 200)})"
            diff = float((packed - padded)[mask[:, -R:].bool()].abs().max())
            if not diff <= tolerance:
                return (f"packed{how}, a small random {cls.__name__} computes other log-probs than padded (largest "
                        f"difference {diff:.2g} nats): its decoder does more than the varlen kernels' causal "
                        "attention (e.g. attention sinks, ALiBi, chunked attention, a recurrent or convolutional "
                        "mixer, an attention layer not given the positions)")
    return None


_DECIDED: dict[tuple[str, bool, bool], str | None] = {}


def packed_attention_obstacle(config, trust_remote_code: bool = False, sequence_parallel: bool = False) -> str | None:
    """Why the model of the transformers ``config`` cannot run packed forwards (rules 1-3 of the module doc), as a
    phrase for a log line or an error, or None when it can (or, for a model not probed: a vision-language model, a
    class that cannot be loaded here, a twin too large, when the first two rules find nothing). Decided once per process and configuration (the probe: 0.2 to 1.2 s on a CPU).

    Args:
        config: the model's ``PretrainedConfig`` (overrides applied), text-only or with a vision part.
        trust_remote_code: whether the model's own code may be loaded for the probe (``auto_map``).
        sequence_parallel: the model runs with Ulysses SP above 1 (the probe then also checks the eager SP path).
    """
    from trainer.config.actor import attention_softcap

    key = (config.to_json_string(use_diff=False), bool(trust_remote_code), bool(sequence_parallel))
    if key in _DECIDED:
        return _DECIDED[key]
    softcap = attention_softcap(config.to_dict())
    try:
        cls = _model_class(config, trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - remote code that does not load here: not probed
        logger.debug("packed attention probe: no model class for %s (%s)", type(config).__name__, exc)
        cls = None
    if softcap is not None:
        reason = (f"its attention uses logit soft-capping (attn_logit_softcapping={softcap:g}), which the packed "
                  "(varlen) kernels do not support")
    elif cls is not None and not getattr(cls, "_supports_attention_backend", False):
        reason = (f"{cls.__name__}'s attention does not go through transformers' attention interface, which the "
                  "packed (varlen) attention replaces")
    else:
        twin = small_twin_config(config) if cls is not None else None
        reason = _probe(cls, twin, sequence_parallel) if twin is not None else None
        if cls is not None and twin is None and not _has_vision(config):
            reason = f"it could not be checked: {type(config).__name__} refuses a small configuration of it"
    _DECIDED[key] = reason
    return reason


def check_packed_attention(cfg: dict, hf_config=None) -> None:
    """Before any worker starts: a role with Ulysses SP above 1 (:func:`trainer.config.actor.ulysses_sizes`) runs
    packed forwards, so each model such a role loads (:func:`trainer.role_models.loaded_models`: the critic's and
    PRIME's reward model's own folders, else the actor's) must be able to (:func:`packed_attention_obstacle`, both
    packed paths), each model probed once. ``hf_config``: the actor's model's config (overrides applied; None:
    built here); another model's config is built as its workers build it (:func:`trainer.role_models.role_config`;
    one transformers does not load here is left to the workers). Without SP nothing is checked here: a role whose
    model cannot run packed forwards runs padded ones (:func:`trainer.workers.model_utils.packs_sequences`).

    Raises:
        ConfigError: one line per such key (:class:`trainer.config_checks.ConfigErrors` for several), naming the
            key, its size, the model (its path key and folder) and why it cannot.
    """
    from collections.abc import Mapping

    from trainer.config.actor import ulysses_sizes
    from trainer.config_checks import ConfigError, ErrorCollector
    from trainer.role_models import loaded_models, model_label, role_config, section_models

    sizes = {key.rsplit(".", 1)[0]: (key, int(sp)) for key, sp in ulysses_sizes(cfg) if sp is not None and int(sp) > 1}
    actor = section_models(cfg)["actor_rollout_ref.actor"][0]
    errors = ErrorCollector()
    for group in loaded_models(cfg, sizes) if sizes else ():
        model = group[0][1]
        try:
            conf = hf_config if hf_config is not None and model.same_model(actor) else role_config(cfg, model)
        except (ConfigError, OSError):  # a folder the folder checks refuse
            continue
        reason = None if isinstance(conf, Mapping) else packed_attention_obstacle(conf, model.remote,
                                                                                  sequence_parallel=True)
        for section, own in group if reason is not None else ():
            key, sp = sizes[section]
            whose = "this model" if own.path is None else model_label(own.key, own.path)
            errors.add(f"{key}={sp}: Ulysses sequence parallelism runs packed forwards, which {whose} cannot: "
                       f"{reason}; expected 1 for this model")
    errors.raise_if_any()
