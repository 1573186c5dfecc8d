"""Tool-using rollouts in the trainer: the ``actor_rollout_ref.rollout.multi_turn`` section read and checked before
the workers start, the tools' schemas for the prompts, and the actor worker's sequence generator.

The generator (:mod:`rollout.generator`) is the seam between the actor worker and the rollout:
:class:`rollout.generator.SingleTurnGenerator` makes one engine call per batch (one response per sample);
:class:`MultiTurnGenerator` runs :func:`rollout.multiturn.multi_turn_generate`, where model turns alternate with
tool answers. Both return a :class:`rollout.generator.Generation`, whose ``attention_mask`` covers every response
token (tool answers included) while the rollout's ``response_mask`` covers only the model's tokens; for one engine
call the two are equal.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from rollout.generator import Generation, Generator, SingleTurnGenerator
from trainer.config_checks import ConfigError, ErrorCollector
from trainer.protocol import CALL_SECONDS_META

__all__ = ["MULTI_TURN_KEYS", "multi_turn_config", "check_multi_turn", "check_multi_turn_template", "tool_schemas",
           "MultiTurnGenerator", "build_generator", "generation_metrics"]

KEY = "actor_rollout_ref.rollout.multi_turn"
MULTI_TURN_KEYS = ("enable", "max_assistant_turns", "max_user_turns", "max_parallel_calls",
                   "max_tool_response_length", "tool_response_truncate_side", "format", "tools", "tool_config_path")
_INT_KEYS = ("max_assistant_turns", "max_user_turns", "max_parallel_calls", "max_tool_response_length")


def multi_turn_config(rollout_cfg: Mapping[str, Any]):
    """The :class:`rollout.multiturn.MultiTurnConfig` of ``rollout_cfg["multi_turn"]`` (defaults where absent).

    Raises:
        ConfigError: a key this section does not have, a limit that is not an integer (or null where allowed),
            a value out of range or an unknown format / truncate side; every bad value is named, one line each
            (:class:`trainer.config_checks.ConfigErrors` for several).
    """
    from rollout.multiturn.config import MultiTurnConfig, config_problems

    mt = rollout_cfg.get("multi_turn") or {}
    errors = []
    unknown = sorted(set(mt) - set(MULTI_TURN_KEYS))
    if unknown:
        errors.append(f"{KEY} has unknown keys {unknown}; known keys: {list(MULTI_TURN_KEYS)}")
    values = {k: mt[k] for k in MULTI_TURN_KEYS if k in mt}
    errors += config_problems(values, KEY)
    ErrorCollector(errors).raise_if_any()
    return MultiTurnConfig(**values, key=KEY)


def _tools(cfg: dict, check: bool) -> dict:
    from rollout.multiturn.loop import build_tools
    from rollout.tools.registry import ToolConfigError

    mt = multi_turn_config(cfg["actor_rollout_ref"]["rollout"])
    try:
        # each message names its full key (the list of tools, the tool config file or the format) with its value
        # as written, so that the error report, which re-runs the checks with each named key put back to its
        # default, can leave out a line that only follows from another
        return build_tools(mt, check=check, key=KEY)
    except ToolConfigError as exc:
        ErrorCollector(exc.messages).raise_if_any()
        raise
    except ValueError as exc:  # the format without its tool
        raise ConfigError(str(exc)) from exc


def unused_multi_turn_warnings(rollout_cfg: Mapping[str, Any]) -> list[str]:
    """Warnings for ``rollout.multi_turn`` settings (tools, limits, format) set away from their defaults while
    ``multi_turn.enable`` is false: they have no effect then."""
    import dataclasses

    from rollout.multiturn import MultiTurnConfig
    from rollout.tools.registry import as_written

    mt = rollout_cfg.get("multi_turn") or {}
    if mt.get("enable"):
        return []
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(MultiTurnConfig)}
    return [f"{KEY}.{k}={as_written(mt[k])}: ignored: multi-turn rollouts are off (set {KEY}.enable=true to use it)"
            for k in MULTI_TURN_KEYS if k in mt and k in defaults and k != "enable" and mt[k] != defaults[k]]


def check_multi_turn(cfg: dict) -> None:
    """Pre-start check of the section (run by :func:`trainer.config_validate.validate`): its values always, and
    with ``enable=true`` the tools (each built and its :meth:`rollout.tools.base.Tool.check` run: unknown names,
    unimportable classes, a sandbox weaker than required).

    Raises:
        ConfigError: one line naming each bad value (the key, the value as written and the tool it concerns).
    """
    mt = multi_turn_config(cfg["actor_rollout_ref"]["rollout"])
    if mt.enable:
        _tools(cfg, check=True)


def check_multi_turn_template(cfg: dict, tokenizer) -> None:
    """With ``enable=true``: the tokenizer's chat template must render ``tool`` messages (checked once the
    tokenizer is loaded, before the workers start).

    Raises:
        ConfigError: no chat template, or one without a usable tool role (the message says what was rendered).
    """
    if not multi_turn_config(cfg["actor_rollout_ref"]["rollout"]).enable:
        return
    from rollout.multiturn import ToolChatTemplate

    try:
        ToolChatTemplate(tokenizer, dict(cfg["data"].get("apply_chat_template_kwargs") or {}))
    except ValueError as exc:
        raise ConfigError(f"{KEY}.enable=true: {exc} (set actor_rollout_ref.model.custom_chat_template to a "
                          "template with a tool role)") from exc


def tool_schemas(cfg: dict) -> list[dict]:
    """The OpenAI-style function definitions of the configured tools, for ``apply_chat_template(tools=...)`` of
    the prompts; ``[]`` when multi-turn rollouts are off."""
    if not multi_turn_config(cfg["actor_rollout_ref"]["rollout"]).enable:
        return []
    return [tool.schema() for tool in _tools(cfg, check=False).values()]


class MultiTurnGenerator(Generator):
    """The multi-turn loop (:func:`rollout.multiturn.multi_turn_generate`) with the configured tools, built and
    checked once, at the worker's start. Its :class:`rollout.generator.Generation` has ``response_mask`` 1 on the
    model's tokens only, ``attention_mask`` on every response token (tool answers and template glue included), the
    per-sample non-tensor columns :data:`rollout.multiturn.metrics.ROW_COLUMNS` (B*n,) (``num_turns`` int64, verl's:
    model turns + tool turns + 1; ``mt_tool_calls``, ``mt_stop_reason``, ...: what the ``multi_turn/*`` metrics of
    the step are computed from, :func:`generation_metrics`) and the ``multi_turn/*`` and ``tool/*`` metrics of the
    call.

    Args:
        engine: the rollout engine.
        mt_cfg: a :class:`rollout.multiturn.MultiTurnConfig` with ``enable=True``.
        tokenizer: the policy's tokenizer.
        chat_template_kwargs: the prompts' ``apply_chat_template`` arguments (``data.apply_chat_template_kwargs``).

    Raises:
        ValueError: see :func:`rollout.multiturn.prepare_multi_turn`; ``generate`` raises
            ValueError for image prompts.
    """

    def __init__(self, engine, mt_cfg, tokenizer, chat_template_kwargs: Mapping | None = None) -> None:
        from rollout.multiturn import prepare_multi_turn

        super().__init__(engine)
        self.tokenizer = tokenizer
        self.cfg, self.tools, self.template = prepare_multi_turn(mt_cfg, tokenizer, chat_template_kwargs, key=KEY)

    def generate(self, prompt_ids, sampling, multi_modal_inputs: list | None = None) -> Generation:
        from rollout.multiturn import multi_turn_generate

        if multi_modal_inputs:
            raise ValueError(f"{KEY}.enable=true does not take image prompts (multi_modal_inputs); use "
                             "single-turn rollouts for a vision-language model")
        res = multi_turn_generate(self.engine, self.tokenizer, prompt_ids, sampling, self.tools, self.cfg,
                                  self.template)
        return Generation(res.rollout, res.attention_mask.to(torch.long), non_tensor=dict(res.row_columns),
                          metrics=dict(res.metrics))


def build_generator(engine, mt, tokenizer,
                    chat_template_kwargs: Mapping | None = None) -> Generator:
    """:class:`MultiTurnGenerator` when ``mt`` (``rollout.multi_turn``, a :class:`rollout.multiturn.MultiTurnConfig`)
    is enabled, else :class:`rollout.generator.SingleTurnGenerator` (one engine call per batch)."""
    return MultiTurnGenerator(engine, mt, tokenizer, chat_template_kwargs) if mt.enable else SingleTurnGenerator(engine)


def generation_metrics(batch) -> dict[str, float]:
    """The ``multi_turn/*`` and ``tool/*`` metrics of a batch of multi-turn rows (none for single-turn rollouts).

    The per-sample metrics and the batch totals (turns, tool calls, errors, malformed calls, timeouts, tool seconds,
    token shares, stop reasons: :func:`rollout.multiturn.metrics.column_metrics`) are computed from the rows'
    non-tensor columns (:data:`rollout.multiturn.metrics.ROW_COLUMNS`), so they cover every row of the batch: every
    worker's, after any filter. ``meta`` gives only what no row holds: the tools' own metrics (joined over the
    workers and generation batches, :func:`trainer.protocol.join_tool_metrics`) and the wall-clock
    ``multi_turn/tool_wall_s`` / ``generate_s`` of the step's generation (the slowest worker's seconds per call,
    :data:`trainer.protocol.CALL_SECONDS_META`; with dynamic sampling, summed over the step's generation batches).
    """
    from rollout.multiturn.metrics import column_metrics

    meta = getattr(batch, "meta", None) or {}
    out = {k: float(v) for k, v in meta.items() if k.startswith("tool/") or k in CALL_SECONDS_META}
    out.update(column_metrics(getattr(batch, "non_tensor", None) or {}))
    return out
