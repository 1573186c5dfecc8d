"""The checks of a resolved config that need no file and no model: batch arithmetic, lengths, devices, estimator
and loss names, engines, strategies and kernel options (``trainer.launch.preflight`` checks paths and models).

:func:`validate` runs every section and raises their errors together, one line each.
"""
from __future__ import annotations

import math

from trainer.config_checks import (ConfigError, ConfigErrors, ErrorCollector, as_int, as_written,
                                   check_rollout_correction, run_checks)
from trainer.megatron_checks import check_megatron
from trainer.run_roles import critic_on, prime_enabled


def overlong_kwargs(cfg: dict) -> dict:
    """RewardManager arguments of ``reward_model.overlong_buffer`` (verl's keys), checked.

    Raises:
        ConfigError: ``enable`` with ``len`` not in (0, data.max_response_length), with a generation cap
            (``rollout.response_length``) other than ``data.max_response_length``, or a negative penalty factor.
    """
    ob = cfg["reward_model"]["overlong_buffer"]
    buf = as_int(ob["len"], "reward_model.overlong_buffer.len")  # checked while off too (typos)
    factor = _finite("reward_model.overlong_buffer.penalty_factor", ob["penalty_factor"])
    if not ob["enable"]:
        return {}
    max_len = int(cfg["data"]["max_response_length"])
    if not 0 < buf < max_len:
        raise ConfigError(f"reward_model.overlong_buffer.len={buf}; with enable=true expected "
                          f"0 < len < data.max_response_length={max_len}")
    cap = ((cfg.get("actor_rollout_ref") or {}).get("rollout") or {}).get("response_length")
    # DAPO's penalty reaches -penalty_factor exactly at the length it counts to: that must be the generation cap
    if cap is not None and as_int(cap, "actor_rollout_ref.rollout.response_length") != max_len:
        raise ConfigError(f"actor_rollout_ref.rollout.response_length={cap} with reward_model.overlong_buffer.enable="
                          f"true: the overlong penalty counts up to data.max_response_length={max_len}, so a response "
                          "of another length than that cap would never reach the full penalty or pass beyond it; "
                          "leave rollout.response_length unset (it follows data.max_response_length)")
    if not factor >= 0:
        raise ConfigError(f"reward_model.overlong_buffer.penalty_factor={factor}; expected >= 0")
    return dict(overlong_buffer_len=buf, overlong_penalty_factor=factor, max_response_length=max_len)


def _finite(key: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r}; expected a number") from None
    if not math.isfinite(v):
        raise ConfigError(f"{key}={value!r}; expected a finite number")
    return v


def validate(cfg: dict) -> None:
    """Batch arithmetic, lengths, devices, estimator names, engines, kernels and attention implementations
    (:mod:`trainer.attention_checks`); every section runs and their
    errors are raised together.

    Raises:
        ConfigError: naming the key and the bad value (:class:`ConfigErrors` for several, one per line).
    """
    from trainer.attention_checks import check_attention
    from trainer.config.workers import check_sections
    from trainer.ds_config_checks import check_ds_config_entries
    from trainer.multi_turn import check_multi_turn
    from trainer.rollout_placement import check_rollout_placement
    from trainer.run_length_checks import check_training_happens, check_validation_sampling
    from trainer.single_process_checks import check_single_process
    from trainer.verl_checks import check_verl_semantics

    run_checks(cfg, (_resolve_device, check_sections, _check_rollout_engine, _check_batches, _check_numbers,
                     _check_discounts, _check_kl_ctrl, _check_algorithm_names, _check_filter_groups, check_rollout_correction,
                     _check_overlong, _check_strategy, _check_kernels, check_ds_config_entries, check_verl_semantics,
                     check_multi_turn, check_rollout_placement, check_training_happens, check_validation_sampling,
                     _check_token_budgets, _check_prime, check_attention, check_single_process))


def _world(cfg: dict) -> int:
    return int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])


def detect_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu`` (the value of ``trainer.device=auto``)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_device(cfg: dict) -> None:
    """``trainer.device=auto`` of a config that did not go through trainer.launch.resolve_config (the values and
    the lengths are checked by their sections, :mod:`trainer.config.trainer` and :mod:`trainer.config.data`)."""
    if cfg["trainer"]["device"] == "auto":
        cfg["trainer"]["device"] = detect_device()


def _check_rollout_engine(cfg: dict) -> None:
    if cfg["actor_rollout_ref"]["rollout"]["name"] != "vllm":
        return
    import importlib.util

    missing = importlib.util.find_spec("vllm") is None
    if cfg["trainer"]["device"] != "cuda":
        raise ConfigError("actor_rollout_ref.rollout.name=vllm needs trainer.device=cuda (a GPU)"
                          + (" and vLLM (pip install -e .[vllm])" if missing else "")
                          + "; on this machine use rollout=hf (the transformers engine)")
    if missing:
        raise ConfigError("rollout=vllm but vLLM is not installed: pip install -e .[vllm] (or use rollout=hf)")


def _check_batches(cfg: dict) -> None:
    """The batch arithmetic of each role that updates: the actor, the critic (with a critic) and PRIME's reward
    model (:func:`_check_update_batches`). Where ``data.train_batch_size`` does not divide over the workers, a
    mini-batch size the user set (:func:`trainer.unused_settings.set_by_user`) that does not divide it either is
    named beside that line, not after the worker count is mended.

    Raises:
        ConfigError: one line per role whose batches do not divide (all roles checked)."""
    given = cfg["data"]["train_batch_size"]
    try:
        world, bs = _world(cfg), as_int(given, "data.train_batch_size")
    except (ConfigError, TypeError, ValueError):
        return  # reported by the trainer / data sections
    if world < 1 or bs < 1:
        return  # reported by the trainer / data sections (trainer.config.trainer.TrainerConfig, data's checks)
    from trainer.config.actor import check_ulysses_world
    from trainer.unused_settings import set_by_user

    check_ulysses_world(cfg, world)
    errors = ErrorCollector()  # every role's line at once
    if bs % world:
        errors.add(f"data.train_batch_size={as_written(given)} must be divisible by the {world} workers "
                   "(trainer.nnodes*trainer.n_gpus_per_node)")
        for mini_key, _, role, _ in _update_roles(cfg):
            mini = role[mini_key.rsplit(".", 1)[1]]
            if set_by_user(cfg, mini_key, mini):
                errors.run(_check_mini_divides, mini_key, mini, bs)
    else:
        for roles in _update_roles(cfg):
            errors.run(_check_update_batches, cfg, *roles)
    errors.raise_if_any()


def _update_roles(cfg: dict) -> list[tuple[str, str, dict, int]]:
    """``(mini-batch key, micro-batch key, section, Ulysses size)`` of each role that updates."""
    A, arr = "actor_rollout_ref.actor", cfg["actor_rollout_ref"]
    out = [(f"{A}.ppo_mini_batch_size", f"{A}.ppo_micro_batch_size_per_gpu", arr["actor"],
            int(arr["actor"]["ulysses_sequence_parallel_size"]))]
    if critic_on(cfg):
        c = cfg["critic"]
        out.append(("critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size_per_gpu", c,
                    int(c["ulysses_sequence_parallel_size"])))
    rm = cfg.get("reward_model") or {}
    if prime_enabled(cfg) and "mini_batch_size" in rm:
        out.append(("reward_model.mini_batch_size", "reward_model.micro_batch_size_per_gpu", rm,
                    int(rm.get("ulysses_sequence_parallel_size") or 1)))
    return out


def _check_mini_divides(mini_key: str, value, bs: int) -> int:
    """``mini_key``'s ``value`` (prompts per optimizer step) as an integer >= 1 that divides ``bs``
    (``data.train_batch_size``)."""
    mini = as_int(value, mini_key, minimum=1)
    if bs % mini:
        raise ConfigError(f"{mini_key}={as_written(value)} must divide data.train_batch_size={bs}")
    return mini


def _check_update_batches(cfg: dict, mini_key: str, micro_key: str, role: dict, sp: int) -> None:
    """One role's mini-batch (``mini_key``: prompts per optimizer step) divides ``data.train_batch_size`` and, x
    ``rollout.n`` rows, the data-parallel ranks; its micro-batch (``micro_key``, rows per worker) divides a rank's
    mini-batch or is larger (then clamped to it: one micro-batch)."""
    bs, n = int(cfg["data"]["train_batch_size"]), int(cfg["actor_rollout_ref"]["rollout"]["n"])
    mini_name, micro_name = mini_key.rsplit(".", 1)[1], micro_key.rsplit(".", 1)[1]
    mini, dp = _check_mini_divides(mini_key, role[mini_name], bs), _world(cfg) // max(1, sp)
    if (mini * n) % dp:
        raise ConfigError(f"{mini_key}*actor_rollout_ref.rollout.n={mini * n} rows must be divisible by the "
                          f"data-parallel size {dp}")
    micro = as_int(role[micro_name], micro_key)
    if micro <= 0:
        return  # reported by the role's section (trainer.config.actor.ActorConfig / CriticConfig)
    # a micro-batch larger than the rank's mini-batch is clamped to it (one micro-batch); smaller must divide it
    if not role["use_dynamic_bsz"] and micro < mini * n // dp and (mini * n // dp) % micro:
        raise ConfigError(f"a mini-batch holds {mini * n // dp} rows per data-parallel rank, not divisible by "
                          f"{micro_key}={as_written(role[micro_name])}")


def _token_budgets(cfg: dict) -> list[tuple[str, object, bool, str, int]]:
    """``(key, budget, use_dynamic_bsz, sp key, sp)`` of every token budget of a role that runs: the actor's update
    and old-log-prob pass, the reference's pass (with a KL term), the critic's update and value forwards (with a
    critic) and PRIME's reward model (``reward_model.max_token_len_per_gpu``, with PRIME). The budget is per
    Ulysses rank: a micro-batch holds budget x sp tokens. On Megatron the budget is the micro-batch's own (tensor
    parallel ranks hold whole sequences): sp 1."""
    from trainer.config.runtime import needs_reference

    A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    arr = cfg["actor_rollout_ref"]
    actor, rollout = arr["actor"], arr["rollout"]
    megatron = str(cfg["trainer"].get("strategy")) == "megatron"
    a_sp = ("trainer.strategy", 1) if megatron else (f"{A}.ulysses_sequence_parallel_size",
                                                     actor["ulysses_sequence_parallel_size"])
    out = [(f"{A}.ppo_max_token_len_per_gpu", actor["ppo_max_token_len_per_gpu"], actor["use_dynamic_bsz"], *a_sp),
           (f"{R}.log_prob_max_token_len_per_gpu", rollout.get("log_prob_max_token_len_per_gpu"),
            rollout.get("log_prob_use_dynamic_bsz"), *a_sp)]
    if needs_reference(cfg):
        ref = arr["ref"]
        ref_sp = ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", ref["ulysses_sequence_parallel_size"])
        out.append(("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", ref["log_prob_max_token_len_per_gpu"],
                    ref["log_prob_use_dynamic_bsz"], *(a_sp if megatron else ref_sp)))
    if critic_on(cfg):
        c = cfg["critic"]
        for name in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"):
            out.append((f"critic.{name}", c.get(name), c["use_dynamic_bsz"],  # null forward: the update's budget
                        "critic.ulysses_sequence_parallel_size", c["ulysses_sequence_parallel_size"]))
    if prime_enabled(cfg):
        rm = cfg.get("reward_model") or {}
        out.append(("reward_model.max_token_len_per_gpu", rm.get("max_token_len_per_gpu"), rm.get("use_dynamic_bsz"),
                    "reward_model.ulysses_sequence_parallel_size", rm.get("ulysses_sequence_parallel_size", 1)))
    return out


def _check_token_budgets(cfg: dict) -> None:
    """With dynamic micro-batches (``use_dynamic_bsz``), each token budget of a role that runs
    (:func:`_token_budgets`), x its sequence-parallel size, holds the longest sequence the run can produce:
    ``data.max_prompt_length`` + the response length (``rollout.response_length``; a multi-turn trajectory, tool
    answers included, stays within it). verl asserts the same; a smaller budget puts every longer sequence in a
    micro-batch of its own, over the budget.

    Raises:
        ConfigError: naming the budget, its sequence-parallel size and the longest sequence (one line per budget).
    """
    d, rollout = cfg["data"], cfg["actor_rollout_ref"]["rollout"]
    response = rollout.get("response_length") or d["max_response_length"]
    try:
        longest = int(d["max_prompt_length"]) + int(response)
    except (TypeError, ValueError):
        return  # a mistyped length is named by the data section
    errors = []
    for key, budget, dynamic, sp_key, sp in _token_budgets(cfg):
        if dynamic is not True or isinstance(budget, bool) or not isinstance(budget, int) or budget < 1 \
                or isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
            continue  # off, or a mistyped value the role's section names
        if budget * sp < longest:
            per = f" x {sp_key}={sp} = {budget * sp}" if sp > 1 else ""
            on = "log_prob_use_dynamic_bsz" if ".log_prob_" in key else "use_dynamic_bsz"
            switch = f"{key.rsplit('.', 1)[0]}.{on}"
            errors.append(f"{key}={budget}{per} tokens with {switch}=true is less than the longest sequence, "
                          f"data.max_prompt_length + response length = {longest}: each longer sequence would be a "
                          f"micro-batch of its own, over the budget; expected >= {-(-longest // sp)}")
    if errors:
        raise ConfigError(errors[0]) if len(errors) == 1 else ConfigErrors(errors)


def _check_numbers(cfg: dict) -> None:
    """The ``trainer`` keys that the driver's section (:class:`trainer.config.trainer.TrainerConfig`) leaves out."""
    t = cfg["trainer"]
    if t.get("max_critic_ckpt_to_keep") is not None:
        as_int(t["max_critic_ckpt_to_keep"], "trainer.max_critic_ckpt_to_keep", minimum=0)
    if t.get("export_hf_freq_s") is not None:
        _finite("trainer.export_hf_freq_s", t["export_hf_freq_s"])  # <= 0: off


def _check_discounts(cfg: dict) -> None:
    """``algorithm.gamma`` (discount) and ``algorithm.lam`` (GAE's lambda) in [0, 1] (Schulman et al. 2016: both
    weight future terms; above 1 the returns grow without bound, below 0 they flip sign)."""
    for name in ("gamma", "lam"):
        if name in cfg["algorithm"]:
            value = _finite(f"algorithm.{name}", cfg["algorithm"][name])
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"algorithm.{name}={cfg['algorithm'][name]!r}; expected a number in [0, 1]")


def _check_kl_ctrl(cfg: dict) -> None:
    """``algorithm.kl_ctrl`` builds its controller (:func:`trainer.algos.kl.get_kl_controller`), as the driver
    does at start-up whether or not the KL is in the reward; ``algorithm.kl_penalty`` names a KL estimator."""
    from trainer.algos.kl import get_kl_controller
    from trainer.config.actor import check_kl_type

    if "kl_penalty" in cfg["algorithm"]:
        check_kl_type("algorithm.kl_penalty", cfg["algorithm"]["kl_penalty"])
    kl_ctrl = cfg["algorithm"].get("kl_ctrl") or {}
    try:
        get_kl_controller(kl_ctrl)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"algorithm.kl_ctrl={dict(kl_ctrl)!r}: {exc}") from exc


def _check_algorithm_names(cfg: dict) -> None:
    """The estimator (its registered name and traits; the policy loss and the loss aggregation are the actor's
    section's, :class:`trainer.config.actor.ActorConfig`)."""
    from trainer.algo_checks import check_estimator_and_loss

    check_estimator_and_loss(cfg)


def _check_filter_groups(cfg: dict) -> None:
    from trainer.hooks.dynamic_sampling import FilterGroupsConfig

    n = int(cfg["actor_rollout_ref"]["rollout"]["n"])
    try:  # the values are checked even while the filter is off, so that a typo does not wait for enable=true
        fg = FilterGroupsConfig.from_config(cfg["algorithm"].get("filter_groups"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if fg.enable:
        from trainer.hooks.prime import prime_enabled

        if n < 2:
            raise ConfigError("algorithm.filter_groups.enable=true compares the responses of one prompt, but "
                              f"actor_rollout_ref.rollout.n={n}; set rollout.n >= 2")
        if prime_enabled(cfg):
            raise ConfigError("algorithm.filter_groups.enable=true with algorithm=prime: PRIME filters its "
                              "oversampled groups itself (data.oversample_factor, data.filter_accuracy, "
                              "data.accuracy_lower_bound)")


def _check_prime(cfg: dict) -> None:
    """With algorithm=prime, its settings (:class:`trainer.hooks.prime.PrimeConfig`: the accuracy band, the
    oversampling, ``reward_model.model.update``, ``prime_granularity``, ``prime_norm``), as the driver builds them."""
    from trainer.hooks.prime import PrimeConfig, prime_enabled

    if prime_enabled(cfg) and int(cfg["actor_rollout_ref"]["rollout"]["n"]) >= 2:  # n < 2: the estimator's check
        PrimeConfig.from_config(cfg, _world(cfg))


def _check_overlong(cfg: dict) -> None:
    overlong_kwargs(cfg)


def _check_strategy(cfg: dict) -> None:
    """``trainer.strategy`` (:func:`trainer.config.trainer.run_strategy`) and, for megatron, its sizes and pairings
    (:func:`trainer.megatron_checks.check_megatron`)."""
    from trainer.config.trainer import run_strategy

    if run_strategy(cfg) == "megatron":
        check_megatron(cfg, _world(cfg))


def _check_kernels(cfg: dict) -> None:
    from trainer.config.deepspeed import effective_zero_stage
    from trainer.workers.kernels import check_kernel_options

    arr, ds = cfg["actor_rollout_ref"], cfg["deepspeed"]

    def check(model_cfg: dict) -> None:
        check_kernel_options(model_cfg, cfg["trainer"]["device"], effective_zero_stage(ds),
                             ds_config=ds.get("ds_config"), offload_optimizer=bool(ds.get("offload_optimizer")))

    try:
        check(arr["model"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    from trainer.hooks.prime import prime_enabled

    if prime_enabled(cfg):  # the PRM worker builds actor_rollout_ref.model with reward_model.model's overrides
        from trainer.config.model import ROLE_MODEL_KEYS

        rm = cfg.get("reward_model") or {}
        over = {k: v for k, v in (rm.get("model") or {}).items() if k in ROLE_MODEL_KEYS and v is not None}
        try:
            check({**arr["model"], **over})
        except ValueError as exc:
            keys = ", ".join(f"reward_model.model.{k}={str(v).lower()}" for k, v in over.items())
            raise ConfigError(f"the PRIME reward model (actor_rollout_ref.model{' with ' + keys if keys else ''}): "
                              f"{exc}") from exc
