"""Settings that a run's other choices leave without effect: each gets one warning line before start-up (verl
accepts and ignores them without a word). A setting counts as set when it differs from the value the root config
(``configs/ppo_trainer.yaml``) and each group option give it, its interpolations resolved against the run's own
values.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

from trainer import unused_conditions as c
from trainer.config.runtime import needs_reference
from trainer.run_roles import critic_on  # noqa: F401 (re-exported: the rule the config checks share)
from trainer.verl_compat import R, _fmt, _get, leaves, same_value

__all__ = ["ENGINE_KEYS", "GAMMA_READERS", "LAM_READERS", "SELECTED_BY", "SWITCHED_OFF", "ZERO_WEIGHTED",
           "decode_regions_warnings", "set_by_user", "switched_off_warnings", "unused_setting_warnings",
           "zero_weight_warnings"]

ROOT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "ppo_trainer.yaml")
KL_LOSS = "actor_rollout_ref.actor.use_kl_loss"
_INTERP = re.compile(r"^\$\{(\.*[\w.]+)\}$")
_MISSING = object()


# rollout keys of one engine, with their group defaults: another engine leaves them unused
ENGINE_KEYS = {"vllm": {"tensor_model_parallel_size": 1, "gpu_memory_utilization": 0.5},
               "hf": {"static_cache": "auto", "max_batch_size": 256, "prompt_length_bucket": 64,
                      "decode_loop": "auto", "decode_compile_regions": False}}


def unused_setting_warnings(cfg: dict) -> list[str]:
    """Warnings for settings that this run's other choices leave without effect: rollout keys of the other engine
    (set away from their defaults), ``free_cache_engine=false`` (the engine always frees its KV cache: it sleeps
    while DeepSpeed trains), ``deepspeed.offload_param`` below ZeRO-3, a custom reward function's name without
    its path, ``use_kl_in_reward`` with PRIME (whose advantages never read the penalised rewards),
    ``rollout.multi_turn`` settings while multi-turn rollouts are off, ``critic.*`` settings of a run without a
    critic and ``actor.kl_loss_*`` without ``actor.use_kl_loss`` (:func:`switched_off_warnings`); the opposite
    case, a term switched on whose coefficient is 0 (:func:`zero_weight_warnings`); a critic whose values the
    estimator never reads (:func:`unread_critic_warnings`) and a trained role with ``optim.lr=0``
    (:func:`zero_lr_warnings`)."""
    from trainer.config.deepspeed import effective_zero_stage

    rc = _get(cfg, R) or {}
    out = []
    ds = cfg.get("deepspeed") or {}
    if ds.get("offload_param") and effective_zero_stage(ds) < 3:
        out.append(f"deepspeed.offload_param=true: no effect: DeepSpeed offloads parameters with ZeRO-3 only, this run "
                   f"has ZeRO-{effective_zero_stage(ds)} (add deepspeed=zero3)")
    custom = _get(cfg, "reward_model.custom_reward_function") or {}
    if not custom.get("path") and custom.get("name") not in (None, "compute_score"):
        out.append(f"reward_model.custom_reward_function.name={custom['name']}: ignored without "
                   "custom_reward_function.path (the file that defines it)")
    from trainer.hooks.prime import prime_enabled

    if (cfg.get("algorithm") or {}).get("use_kl_in_reward") and prime_enabled(cfg):
        out.append("algorithm.use_kl_in_reward=true: no effect with algorithm=prime: PRIME's advantages are built from "
                   "the verified and the implicit process rewards, not from token_level_rewards where that penalty "
                   "goes (use actor_rollout_ref.actor.use_kl_loss=true for a KL term)")
    if "free_cache_engine" in rc and rc["free_cache_engine"] is not True:  # the rollout groups set true
        out.append(f"{R}.free_cache_engine={_fmt(rc['free_cache_engine'])}: ignored: the engine always frees its KV "
                   "cache after generation (it sleeps while DeepSpeed trains)")
    name = rc.get("name")
    if rc.get("response_length") is not None and rc["response_length"] != _get(cfg, "data.max_response_length"):
        out.append(f"{R}.response_length={_fmt(rc['response_length'])} differs from data.max_response_length="
                   f"{_fmt(_get(cfg, 'data.max_response_length'))}: responses are generated up to "
                   f"{R}.response_length, not data.max_response_length (the overlong penalty, which counts up to "
                   f"the latter, refuses the two apart); leave {R}.response_length unset (it follows "
                   "data.max_response_length) or set the two equal")
    if name != "vllm" and rc.get("prompt_length") != _get(cfg, "data.max_prompt_length"):
        out.append(f"{R}.prompt_length={_fmt(rc.get('prompt_length'))}: ignored: {R}.name={name} takes each "
                   "batch's prompts as they are (data.max_prompt_length limits them); only vLLM sizes its context by it")
    for engine, keys in ENGINE_KEYS.items():
        if engine == name:
            continue
        for key, default in keys.items():
            if key in rc and not same_value(rc[key], default):
                out.append(f"{R}.{key}={_fmt(rc[key])}: ignored: a setting of {R}.name={engine}, and this run "
                           f"generates with {R}.name={name}")
    from trainer.multi_turn import unused_multi_turn_warnings

    return (out + unused_multi_turn_warnings(rc) + decode_regions_warnings(cfg) + switched_off_warnings(cfg)
            + zero_weight_warnings(cfg) + unread_critic_warnings(cfg) + zero_lr_warnings(cfg))


def decode_regions_warnings(cfg: dict) -> list[str]:
    """``rollout.decode_compile_regions=true`` where no decode step is compiled: the run decodes with transformers'
    ``generate`` (``decode_loop=generate``; ``auto`` without CUDA or without the static cache) or runs the graph
    loop eagerly (no static cache). ``cfg``: the resolved config (``trainer.device`` cuda or cpu)."""
    rc = _get(cfg, R) or {}
    if rc.get("name") != "hf" or rc.get("decode_compile_regions") is not True:
        return []
    from rollout.generation_config import static_cache_on
    from rollout.graph_decode import resolve_decode_loop
    from trainer.config.section import ConfigError, auto_bool

    cuda, setting = _get(cfg, "trainer.device") == "cuda", rc.get("static_cache", "auto")
    loop = rc.get("decode_loop") or "auto"
    try:
        static = static_cache_on(auto_bool(setting, f"{R}.static_cache"), cuda)  # the hf group sets static_cache
    except ConfigError:
        return []  # a refused value: its section's error line names it
    if resolve_decode_loop(loop, None, cuda, static) == "generate":
        why = (f"the run decodes with transformers' generate ({R}.decode_loop={loop}, "
               f"{'static cache' if static else 'no static cache'}, trainer.device={_get(cfg, 'trainer.device')})")
    elif not static:
        why = (f"the graph loop runs uncompiled without the static cache ({R}.static_cache={_fmt(setting)}"
               + (": off without CUDA)" if setting == "auto" else ")"))
    else:
        return []
    return [f"{R}.decode_compile_regions=true: no effect: {why}; the regions apply to the compiled graph loop"]


@lru_cache(maxsize=1)
def _shipped_files() -> tuple[dict, ...]:
    """``{dotted key: value}`` of each file of configs/: the root config and every option of every group (a group
    file's keys placed at its package: ``# @package`` or the group's name), interpolations kept."""
    from omegaconf import OmegaConf

    root = os.path.dirname(ROOT_CONFIG)
    out = []
    files = [(ROOT_CONFIG, "")] + [(os.path.join(root, g, f), g) for g in sorted(os.listdir(root))
                                   if os.path.isdir(os.path.join(root, g))
                                   for f in sorted(os.listdir(os.path.join(root, g))) if f.endswith(".yaml")]
    for path, group in files:
        with open(path, encoding="utf-8") as f:
            head = re.search(r"^# @package (\S+)", f.read(), re.M)
        package = head.group(1) if head else group
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        node.pop("defaults", None)
        out.append(dict(leaves(node, "" if package == "_global_" else package)))
    return tuple(out)


@lru_cache(maxsize=1)
def _shipped_values() -> dict[str, list]:
    """``{dotted key: [every value configs/ gives it]}`` (:func:`_shipped_files` joined)."""
    out: dict[str, list] = {}
    for values in _shipped_files():
        for key, value in values.items():
            out.setdefault(key, []).append(value)
    return out


#: keys whose shipped value depends on the group option (algorithm/dr_grpo.yaml ships norm_adv_by_std_in_grpo=false,
#: every other option true): only the files that give the selector key the run's value count as their defaults
SELECTED_BY = {"algorithm.norm_adv_by_std_in_grpo": "algorithm.adv_estimator"}


def _defaults_of(run: dict, key: str) -> list:
    """The values configs/ ships for ``key`` (of the files that agree with the run on ``SELECTED_BY[key]``)."""
    selector = SELECTED_BY.get(key)
    if selector is None:
        return _shipped_values().get(key, [])
    now = _get(run, selector, _MISSING)
    return [f[key] for f in _shipped_files() if key in f and same_value(f.get(selector, _MISSING), now)]


def _resolve(plain_cfg: dict, key: str, default):
    """``default`` of the leaf ``key``; an interpolation of one key (``${a.b}``, ``${.b}`` beside the leaf, ``${..b}``
    one level up) is read from ``plain_cfg`` (the run's values), also inside a string
    (``${trainer.output_dir}/x.json``); anything else is returned as it is."""
    m = _INTERP.match(default) if isinstance(default, str) else None
    if m is None:
        return _resolve_inside(plain_cfg, key, default) if isinstance(default, str) and "${" in default else default
    ref = m.group(1)
    if not ref.startswith("."):
        return _get(plain_cfg, ref, _MISSING)
    rest = ref.lstrip(".")
    base = key.split(".")[:-(len(ref) - len(rest))]  # "." the leaf's own node, each further "." one up
    return _get(plain_cfg, ".".join([*base, rest]), _MISSING)


def _resolve_inside(plain_cfg: dict, key: str, text: str):
    """``text`` with each ``${ref}`` in it replaced by the run's value (:data:`_MISSING` when one is not there)."""
    parts = []
    for piece in re.split(r"(\$\{\.?[\w.]+\})", text):
        value = _resolve(plain_cfg, key, piece) if _INTERP.match(piece) else piece
        if value is _MISSING:
            return _MISSING
        parts.append(str(value))
    return "".join(parts)


def _set_keys(run: dict, keys: tuple[str, ...]) -> list[str]:
    """``key=value`` of the leaves at or under ``keys`` (a key ending in ``.`` is a prefix) whose run value differs
    from every value configs/ ships for it (:func:`_shipped_values`; an interpolation is resolved in the run at the
    leaf's place, so a value that follows its source is not counted). ``run`` is a plain (not recording) config."""
    out = []
    for prefix in keys:
        node = _get(run, prefix.rstrip("."), _MISSING)
        found = leaves(node, prefix.rstrip(".")) if prefix.endswith(".") and isinstance(node, dict) else [(prefix, node)]
        for key, now in found:
            if now is not _MISSING and set_by_user(run, key, now):
                out.append(f"{key}={_fmt(now)}")
    return out


def set_by_user(run: dict, key: str, now) -> bool:
    """Whether the value ``now`` of the leaf ``key`` differs from every value configs/ ships for it (an
    interpolation resolved in ``run``, a plain config); False for a key configs/ does not have."""
    if key not in _shipped_values():
        return False
    defaults = [d for d in (_resolve(run, key, v) for v in _defaults_of(run, key)) if d is not _MISSING]
    return bool(defaults) and all(not same_value(now, d) for d in defaults)


def _estimator(run: dict) -> str:
    return str(_get(run, "algorithm.adv_estimator"))


def _dynamic_bsz(run: dict) -> bool:
    return any(v is True for k, v in leaves(run) if k.endswith("use_dynamic_bsz"))


_A = "actor_rollout_ref.actor"


def _loss_mode_rows() -> tuple:
    """One :data:`SWITCHED_OFF` row per :data:`trainer.unused_conditions.LOSS_MODE_READERS` entry."""
    def row(keys, readers):
        return (lambda r: c.loss_mode(r) in c.BUILTIN_LOSS_MODES and c.loss_mode(r) not in readers, keys,
                lambda r: f"{_A}.policy_loss.loss_mode={c.loss_mode(r)} does not read them (only "
                          f"{', '.join(readers)} do)")
    return tuple(row(keys, readers) for keys, readers in c.LOSS_MODE_READERS.items())


#: the estimators whose advantages read algorithm.gamma / algorithm.lam (tests/test_verl_keys.py checks every
#: registered estimator against these lists)
GAMMA_READERS, LAM_READERS = ("gae", "reinforce_plus_plus"), ("gae",)
_M, _RC = "actor_rollout_ref.model", "algorithm.rollout_correction"
_VALIDATION_KEYS = ("trainer.log_val_generations", "trainer.val_also_greedy", f"{R}.val_kwargs.", "data.val_files",
                    "data.val_max_rows", "data.val_batch_size")
_LORA = ("lora_alpha", "target_modules", "exclude_modules")
#: (the run leaves them unused, the keys (a trailing "." takes every key below), why): one warning per row
SWITCHED_OFF = (
    (lambda r: not critic_on(r), ("critic.",),
     lambda r: f"this run trains no critic (algorithm.adv_estimator={_estimator(r)}, critic.enable unset or false); "
               "algorithm=gae or critic.enable=true trains one"),
    (lambda r: not needs_reference(r), ("actor_rollout_ref.ref.",),
     lambda r: f"this run has no reference model ({KL_LOSS}=false, algorithm.use_kl_in_reward=false; either one "
               "true computes reference log-probs)"),
    (lambda r: not _get(r, KL_LOSS), (f"{_A}.kl_loss_coef", f"{_A}.kl_loss_type"),
     lambda r: f"{KL_LOSS}=false (set it true for the KL loss term)"),
    (lambda r: not _get(r, "algorithm.use_kl_in_reward"), ("algorithm.kl_ctrl.", "algorithm.kl_penalty"),
     lambda r: "algorithm.use_kl_in_reward=false (set it true for the KL penalty in the reward)"),
    (lambda r: not _get(r, "algorithm.filter_groups.enable"), ("algorithm.filter_groups.",),
     lambda r: "algorithm.filter_groups.enable=false (set it true for dynamic sampling)"),
    (lambda r: not _get(r, "reward_model.overlong_buffer.enable"), ("reward_model.overlong_buffer.",),
     lambda r: "reward_model.overlong_buffer.enable=false (set it true for the overlong penalty)"),
    (lambda r: not _dynamic_bsz(r), (f"{_A}.ppo_max_token_len_per_gpu",),
     lambda r: f"no role uses token-budget micro-batches ({_A}.use_dynamic_bsz=true does)"),
    (lambda r: int(_get(r, "trainer.save_freq") or 0) <= 0,
     ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
     lambda r: f"trainer.save_freq={_get(r, 'trainer.save_freq')} saves no checkpoints"),
    (lambda r: _estimator(r) not in GAMMA_READERS, ("algorithm.gamma",),
     lambda r: f"algorithm.adv_estimator={_estimator(r)} does not discount (gae and reinforce_plus_plus do)"),
    (lambda r: _estimator(r) not in LAM_READERS, ("algorithm.lam",),
     lambda r: f"algorithm.adv_estimator={_estimator(r)} has no GAE lambda (gae has)"),
    (lambda r: _get(r, f"{_A}.loss_agg_mode") != "seq-mean-token-sum-norm", (f"{_A}.loss_scale_factor",),
     lambda r: f"{_A}.loss_agg_mode={_get(r, f'{_A}.loss_agg_mode')} (only seq-mean-token-sum-norm divides by it)"),
    (lambda r: critic_on(r) and _get(r, "critic.loss_agg_mode") != "seq-mean-token-sum-norm",
     ("critic.loss_scale_factor",),
     lambda r: f"critic.loss_agg_mode={_get(r, 'critic.loss_agg_mode')} (only seq-mean-token-sum-norm divides by it)"),
    (lambda r: _get(r, "actor_rollout_ref.model.path") is not None,
     ("actor_rollout_ref.model.tiny.", "data.warm_start_steps"),
     lambda r: f"actor_rollout_ref.model.path={_get(r, 'actor_rollout_ref.model.path')} is loaded (the tiny model "
               "and its warm start are built only without a model path)"),
    (lambda r: _get(r, "actor_rollout_ref.model.path") is None and not _embedded_warm_starts(r),
     ("data.warm_start_steps",),
     lambda r: f"data.synthetic_task={_get(r, 'data.synthetic_task') or 'digits'} has no warm start "
               "(data=synthetic_tool's arith_tool task has)"),
    (lambda r: not c.reads_norm_std(r), ("algorithm.norm_adv_by_std_in_grpo",),
     lambda r: f"algorithm.adv_estimator={_estimator(r)} does not read it (only {c.norm_std_readers()} do)"),
    (lambda r: not c.validates(r), _VALIDATION_KEYS, c.no_validation_why),
    (lambda r: not c.has_val_data(r), ("trainer.test_freq", "trainer.val_before_train"), c.no_validation_why),
    (c.rollout_is_off, (f"{_RC}.rollout_is_threshold", f"{_RC}.rollout_is_batch_normalize"),
     lambda r: f"rollout importance sampling is off ({_RC}.rollout_is={_get(r, f'{_RC}.rollout_is')}, "
               f"trainer.async.staleness={_get(r, 'trainer.async.staleness')}; rollout_is=token turns it on)"),
    (lambda r: c.lora_off(r, _M), tuple(f"{_M}.{k}" for k in _LORA),
     lambda r: f"{_M}.lora_rank={_get(r, f'{_M}.lora_rank')} trains every weight (LoRA needs lora_rank > 0)"),
    (lambda r: critic_on(r) and c.lora_off(r, "critic.model"), tuple(f"critic.model.{k}" for k in _LORA),
     lambda r: f"critic.model.lora_rank={_get(r, 'critic.model.lora_rank')} trains every weight of the critic"),
    (lambda r: _get(r, "trainer.rollout_placement") != "separate", (f"{R}.n_gpus", "trainer.async.trace_file"),
     lambda r: f"trainer.rollout_placement={_get(r, 'trainer.rollout_placement')} runs the engine in the actor's "
               "workers (trainer.rollout_placement=separate gives it workers of its own)"),
    (lambda r: c.strategy(r) != "megatron", (f"{_A}.megatron.",),
     lambda r: f"trainer.strategy={c.strategy(r)} (only trainer.strategy=megatron reads actor.megatron)"),
) + _loss_mode_rows() + c.MORE_ROWS


def _embedded_warm_starts(run: dict) -> bool:
    """Whether the run's embedded task (``data.synthetic_task``) warm-starts the tiny model; True for a name that
    is no task (refused elsewhere)."""
    from trainer.embedded_tool import embedded_task

    try:
        return bool(embedded_task(_get(run, "data.synthetic_task") or "digits").warm_starts)
    except ValueError:
        return True


def switched_off_warnings(cfg: dict) -> list[str]:
    """Settings set away from every value configs/ ships while another choice of the run leaves them unused
    (:data:`SWITCHED_OFF`: ``critic.*`` without a critic, ``ref.*`` without a reference model,
    ``actor.kl_loss_*`` without ``use_kl_loss``, ``kl_ctrl`` without ``use_kl_in_reward``, ``filter_groups.*`` /
    ``overlong_buffer.*`` without their ``enable``, token budgets without dynamic batches, checkpoint retention
    without saves, an estimator's keys another estimator does not read, the embedded tiny model's settings with a
    model path, the validation-only keys without validation, LoRA keys with ``lora_rank=0``, and the families of
    :mod:`trainer.unused_conditions`): one warning line per row naming the keys.
    Reads no key of a recording config."""
    from trainer.config_reads import plain

    run, out = plain(cfg), []
    for unused, keys, why in SWITCHED_OFF:
        try:
            off = unused(run)
        except (TypeError, ValueError, KeyError, AttributeError):  # a mistyped value is named by its own check
            off = False
        if off:
            found = [k for k in _set_keys(run, keys) if not k.endswith(".enable=false")]
            if found:
                out.append(f"{', '.join(found)}: ignored: {why(run)}")
    return out


def _kl_ctrl_why(r: dict) -> str:
    kind = _get(r, "algorithm.kl_ctrl.type")
    grows = " (kl_ctrl.type=adaptive only multiplies the coefficient: 0 stays 0)" if kind == "adaptive" else ""
    return f"the in-reward KL penalty weighs nothing{grows}"


#: (the switch is on, its switch, the coefficient, what the 0 means, the other way out): a term switched on whose
#: coefficient is 0 does nothing (it is computed and added times 0); 0 is a value configs/ ships (prime.yaml's
#: kl_coef), so :data:`SWITCHED_OFF`'s "set away from every shipped value" cannot catch it
ZERO_WEIGHTED = (
    (lambda r: bool(_get(r, "algorithm.use_kl_in_reward")) and not (r.get("algorithm") or {}).get("use_prime"),
     "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef", _kl_ctrl_why,
     "algorithm.use_kl_in_reward=false"),
    (lambda r: bool(_get(r, KL_LOSS)), KL_LOSS, f"{_A}.kl_loss_coef",
     lambda r: "the KL loss term weighs nothing", f"{KL_LOSS}=false"),
    (lambda r: bool(_get(r, "reward_model.overlong_buffer.enable")), "reward_model.overlong_buffer.enable",
     "reward_model.overlong_buffer.penalty_factor", lambda r: "the overlong penalty is 0 at every length",
     "reward_model.overlong_buffer.enable=false"),
)


def _is_zero(value) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


def zero_weight_warnings(cfg: dict) -> list[str]:
    """A term switched on whose coefficient is 0 (:data:`ZERO_WEIGHTED`): ``use_kl_in_reward`` with
    ``kl_ctrl.kl_coef=0`` (fixed or adaptive: the adaptive controller only multiplies it; PRIME is warned about
    apart, its advantages never read that penalty), ``use_kl_loss`` with ``kl_loss_coef=0``, ``overlong_buffer``
    with ``penalty_factor=0``: one warning line each, naming both keys. Reads no key of a recording config."""
    from trainer.config_reads import plain

    run, out = plain(cfg), []
    for on, switch, coef, why, off in ZERO_WEIGHTED:
        value = _get(run, coef, _MISSING)
        if value is not _MISSING and _is_zero(value) and on(run):
            out.append(f"{coef}={_fmt(value)} with {switch}=true: no effect: {why(run)}; set {coef} > 0, or "
                       f"{off}")
    return out


def unread_critic_warnings(cfg: dict) -> list[str]:
    """``critic.enable=true`` with an estimator whose registry entry reads no critic values (neither
    ``needs_critic`` nor a ``values`` input: grpo, rloo, ...): the critic is built and trained every step for
    nothing. One warning line naming both keys; none for an estimator the registry does not know (yet)."""
    from trainer.core_algos import ADV_ESTIMATOR_SPECS

    est = _estimator(cfg)
    spec = ADV_ESTIMATOR_SPECS.get(est)
    if _get(cfg, "critic.enable") is not True or spec is None or spec.needs_critic or "values" in spec.inputs:
        return []
    return [f"critic.enable=true: no effect: algorithm.adv_estimator={est} does not read values, so the critic is "
            "trained every step and never used; set critic.enable=false (or null), or algorithm=gae"]


def zero_lr_warnings(cfg: dict) -> list[str]:
    """A trained role (:func:`trainer.run_roles.trained_roles`: the actor, the critic when the run has one,
    PRIME's reward model) whose ``optim.lr`` is 0: its weights are never updated. One warning line each."""
    from trainer.config_reads import plain
    from trainer.run_roles import trained_roles

    run, out = plain(cfg), []
    for key, _ in trained_roles(run):
        value = _get(run, f"{key}.optim.lr", _MISSING)
        if value is not _MISSING and _is_zero(value):
            out.append(f"{key}.optim.lr={_fmt(value)}: no effect: every update of {key} has a learning rate of 0, "
                       f"so its weights are never changed; set {key}.optim.lr > 0")
    return out
