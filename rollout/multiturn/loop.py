"""Multi-turn generation with tools on any :class:`rollout.base.RolloutEngine`.

Each round calls ``engine.generate`` once per group size on the rows whose trajectory goes on (rows waiting for
tools are not in the batch; they rejoin in the next round with the tool answers appended). A row's turn ends at
one of the engine's stop tokens or at the response budget; its text is parsed for tool calls and, when it has a
complete one, cut right after it (:func:`rollout.tools.parsers.turn_calls`: what the model wrote after its call,
before it could see the answer, is dropped, log-probs included); all calls of the round (every row) run
concurrently, and the answers are appended through the chat template (:class:`ToolChatTemplate`). A row ends when
its turn has no tool call, at ``max_assistant_turns`` / ``max_user_turns``, when the response reaches
``sampling.max_new_tokens`` tokens, or when the next tool turn would not leave room for a model token; it never
ends on a tool turn, so its last response token is the model's.

Rows with the same context (the ``n`` samples of a prompt in the first round; samples that wrote the same turn
and got the same answer later) are passed as one prompt with ``n`` = their count, so that engines that seed each
request (vLLM with ``sampling.seed``) still draw different samples for them.
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

import torch

from rollout.base import RolloutEngine, RolloutOutput, SamplingConfig, check_prompts
from rollout.multiturn.chat import ToolChatTemplate
from rollout.multiturn.config import MultiTurnConfig
from rollout.multiturn.metrics import multi_turn_metrics, row_columns
from rollout.tools.base import Tool, ToolCall
from rollout.tools.executor import run_tool_calls, truncate_text
from rollout.tools.parsers import turn_calls
from rollout.tools.registry import MULTI_TURN_KEY, resolve_tools

__all__ = ["MultiTurnResult", "build_tools", "multi_turn_generate", "prepare_multi_turn"]

_SEED_STRIDE = 1_000_003  # per round: seed + stride * round + group-size bucket


@dataclass
class MultiTurnResult:
    """Responses of a multi-turn rollout, prompt-major (the ``n`` samples of prompt ``i`` are rows ``i*n..``).

    Attributes:
        rollout: :class:`RolloutOutput`: ``responses`` (N, R) int64 right-padded with the engine's pad id;
            ``response_mask`` (N, R) int64, 1 only on tokens the model wrote (tool answers, template glue and
            padding are 0), for the loss, KL, entropy and length metrics; ``rollout_log_probs`` (N, R) float32,
            the engine's log-prob of each model token, 0 elsewhere. R = ``sampling.max_new_tokens``.
        attention_mask: (N, R) int64, 1 on every response token (model, tool answer, template), 0 on padding;
            the trainer's ``attention_mask`` / ``position_ids`` and the reward (which sees the whole
            trajectory) use it.
        num_turns: (N,) int64, verl's ``num_turns``: model turns + tool turns + 1 (the prompt).
        tool_calls: (N,) int64, calls each sample made (malformed ones included).
        metrics: ``multi_turn/*`` and tool metrics (see :func:`rollout.multiturn.metrics.multi_turn_metrics`).
        row_columns: the per-sample figures the metrics are computed from, numpy arrays of N entries
            (:func:`rollout.multiturn.metrics.row_columns`; ``num_turns`` among them); the trainer's rows carry them
            as non-tensor columns.
    """

    rollout: RolloutOutput
    attention_mask: torch.Tensor
    num_turns: torch.Tensor
    tool_calls: torch.Tensor
    metrics: dict[str, float]
    row_columns: dict = field(default_factory=dict)


@dataclass
class _Row:
    """One trajectory. ``kind`` per response token: 1 model, 2 tool answer, 3 template glue."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    turn_start: int = 0  # index in ``ids`` where the current model turn began
    stop_reason: str | None = None
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    malformed: int = 0
    tool_seconds: float = 0.0
    dropped: int = 0  # model tokens written after a call in the same turn, cut away


def _engine_ids(engine: RolloutEngine, sampling: SamplingConfig) -> tuple[list[int], int]:
    try:
        stops, pad = list(engine.eos_ids), int(engine.pad_id)
    except AttributeError:
        raise ValueError(f"{type(engine).__name__} has no eos_ids/pad_id; multi-turn rollouts need the engine's "
                         "stop and pad ids") from None
    return list(dict.fromkeys(stops + list(sampling.stop_token_ids))), pad


def _generate_round(engine: RolloutEngine, rows: list[_Row], active: list[int], sampling: SamplingConfig,
                    width: int, round_idx: int) -> None:
    """Extend every active row by one engine call's tokens (cut to the row's remaining budget)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in active:
        groups[tuple(rows[i].prompt + rows[i].ids)].append(i)
    by_size: dict[int, list[tuple]] = defaultdict(list)
    for ctx, members in groups.items():
        by_size[len(members)].append(ctx)
    for bucket, (size, contexts) in enumerate(sorted(by_size.items())):
        remaining = max(width - len(rows[groups[c][0]].ids) for c in contexts)
        seed = None if sampling.seed is None else int(sampling.seed) + _SEED_STRIDE * round_idx + bucket
        call = dataclasses.replace(sampling, n=size, max_new_tokens=remaining, seed=seed)
        out = engine.generate([list(c) for c in contexts], call)
        for j, ctx in enumerate(contexts):
            for k, i in enumerate(groups[ctx]):
                r = j * size + k
                length = int(out.response_mask[r].sum())
                room = width - len(rows[i].ids)
                rows[i].ids += out.responses[r, :length].tolist()[:room]
                rows[i].log_probs += out.rollout_log_probs[r, :length].tolist()[:room]
                rows[i].kind += [1] * min(length, room)


def _cut_turn(row: _Row, tokenizer, text: str, end: int, stops: set[int]) -> None:
    """Drop the turn's tokens after the shortest prefix whose text reaches character ``end`` of ``text`` (the turn
    decoded), unless all that follows is whitespace and stop tokens (the model ended the turn there itself)."""
    turn = row.ids[row.turn_start:]
    lo, hi = 1, len(turn)
    while lo < hi:  # decoded length grows with the prefix
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if len(tokenizer.decode(turn[:mid], skip_special_tokens=False)) < end else (lo, mid)
    tail = [t for t in turn[lo:] if t not in stops]
    if not tail or not tokenizer.decode(tail, skip_special_tokens=False).strip():
        return
    keep = row.turn_start + lo
    row.dropped += len(row.ids) - keep
    del row.ids[keep:], row.kind[keep:], row.log_probs[keep:]


def _end_of_turn(row: _Row, stops: set[int], cfg: MultiTurnConfig, tokenizer) -> list[ToolCall]:
    """Close the row's model turn: set ``stop_reason`` when the trajectory ends, else cut the turn after its tool
    calls (:func:`_cut_turn`) and return them. A turn without a call that ends on a stop token ended the trajectory
    (``no_tool_call``), also when that token is on the last response column, as a single-turn row whose last
    token is a stop id is not truncated; one that does not was cut by the budget (``length``)."""
    row.assistant_turns += 1
    turn = row.ids[row.turn_start:]
    text = tokenizer.decode(turn, skip_special_tokens=False) if turn else ""
    calls, end = turn_calls(cfg.format, text)
    if end is not None:
        _cut_turn(row, tokenizer, text, end, stops)
    elif not turn or turn[-1] not in stops:  # cut by the budget before the model ended its turn
        row.stop_reason = "length"
        return []
    if not calls:  # the model ended the trajectory itself, whatever turn this is
        row.stop_reason = "no_tool_call"
        return []
    if cfg.max_assistant_turns is not None and row.assistant_turns >= cfg.max_assistant_turns:
        row.stop_reason = "max_assistant_turns"  # it asked for a tool that the turn limit does not allow
        return []
    if cfg.max_user_turns is not None and row.user_turns >= cfg.max_user_turns:
        row.stop_reason = "max_user_turns"
        return []
    limit = int(cfg.max_parallel_calls)
    extra = ToolCall(None, None, f"more than max_parallel_calls={limit} tool calls in one turn; this one was not run")
    return calls[:limit] + [extra] * (len(calls) - limit)


def _append_answers(row: _Row, outcomes, template: ToolChatTemplate, cfg: MultiTurnConfig, width: int) -> None:
    texts = [truncate_text(o.text, cfg.max_tool_response_length, cfg.tool_response_truncate_side) for o in outcomes]
    for o in outcomes:
        row.calls += 1
        row.errors += o.status == "error"
        row.timeouts += o.status == "timeout"
        row.malformed += o.malformed
        row.tool_seconds += o.seconds
    ids, is_content = template.encode(texts, row.ids[-1])
    if len(row.ids) + len(ids) >= width:  # no room for a model token after the answers: end before them
        row.stop_reason = "length"
        return
    row.ids += ids
    row.kind += [2 if c else 3 for c in is_content]
    row.log_probs += [0.0] * len(ids)
    row.user_turns += 1
    row.turn_start = len(row.ids)


def _tensors(rows: list[_Row], width: int, pad_id: int) -> tuple[RolloutOutput, torch.Tensor]:
    n = len(rows)
    responses = torch.full((n, width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    lps = torch.zeros((n, width), dtype=torch.float32)
    for i, row in enumerate(rows):
        length = len(row.ids)
        responses[i, :length] = torch.tensor(row.ids, dtype=torch.long)
        kind = torch.tensor(row.kind, dtype=torch.long)
        mask[i, :length] = (kind == 1).long()
        attn[i, :length] = 1
        lps[i, :length] = torch.tensor(row.log_probs, dtype=torch.float32) * (kind == 1)
    return RolloutOutput(responses=responses, response_mask=mask, rollout_log_probs=lps), attn


def multi_turn_generate(engine: RolloutEngine, tokenizer, prompt_ids: list[list[int]], sampling: SamplingConfig,
                        tools: Mapping[str, Tool], cfg: MultiTurnConfig,
                        template: ToolChatTemplate | None = None) -> MultiTurnResult:
    """Generate ``sampling.n`` tool-using trajectories per prompt (see the module docstring).

    Args:
        engine: a rollout engine with ``eos_ids`` and ``pad_id`` (both built-in engines have them).
        tokenizer: the policy's tokenizer (decodes turns for the parser; renders tool turns).
        prompt_ids: B prompts (token ids, no padding), rendered with the generation prompt (and the tools'
            schemas, ``apply_chat_template(tools=[t.schema() ...])``, where the template shows them).
        sampling: sampling settings; ``max_new_tokens`` is R, the cap on the whole response (model + tool tokens).
        tools: ``{name: tool}`` (:func:`rollout.tools.registry.resolve_tools`).
        cfg: :class:`MultiTurnConfig`.
        template: a prepared :class:`ToolChatTemplate` (built from ``tokenizer`` when None).

    Returns:
        :class:`MultiTurnResult` with (B*n, R) tensors.

    Raises:
        ValueError: empty prompts, an engine without stop/pad ids, or a chat template without a tool role.
    """
    prompts = check_prompts(prompt_ids)
    stops, pad_id = _engine_ids(engine, sampling)
    template = template or ToolChatTemplate(tokenizer)
    width = int(sampling.max_new_tokens)
    rows = [_Row(prompt=p) for p in prompts for _ in range(sampling.n)]
    active = list(range(len(rows)))
    gen_s = tool_s = 0.0
    round_idx = 0
    while active:
        t0 = time.perf_counter()
        _generate_round(engine, rows, active, sampling, width, round_idx)
        gen_s += time.perf_counter() - t0
        pending = {i: _end_of_turn(rows[i], set(stops), cfg, tokenizer) for i in active}
        pending = {i: c for i, c in pending.items() if c}
        t0 = time.perf_counter()
        outcomes = run_tool_calls([c for calls in pending.values() for c in calls], tools)
        tool_s += time.perf_counter() - t0
        pos = 0
        for i, calls in pending.items():
            _append_answers(rows[i], outcomes[pos:pos + len(calls)], template, cfg, width)
            pos += len(calls)
        active = [i for i in pending if rows[i].stop_reason is None]
        round_idx += 1
    rollout, attn = _tensors(rows, width, pad_id)
    metrics = multi_turn_metrics(rows, tools, generate_s=gen_s, tool_wall_s=tool_s)
    return MultiTurnResult(rollout=rollout, attention_mask=attn,
                           num_turns=torch.tensor([r.assistant_turns + r.user_turns + 1 for r in rows]),
                           tool_calls=torch.tensor([r.calls for r in rows]), metrics=metrics,
                           row_columns=row_columns(rows))


def prepare_multi_turn(cfg: MultiTurnConfig | Mapping, tokenizer, chat_template_kwargs: Mapping | None = None,
                       key: str = MULTI_TURN_KEY) -> tuple[MultiTurnConfig, dict[str, Tool], ToolChatTemplate]:
    """Start-up of multi-turn rollouts: parse the config, build and check the tools, check the chat template.

    Args:
        cfg: a :class:`MultiTurnConfig` or the ``rollout.multi_turn`` mapping.
        tokenizer: the policy's tokenizer.
        chat_template_kwargs: the prompt's extra ``apply_chat_template`` arguments.
        key: the section's config key, named in the messages (the trainer's ``actor_rollout_ref.rollout.multi_turn``).

    Returns:
        (config, {name: tool}, template) for :func:`multi_turn_generate`.

    Raises:
        ValueError: a bad key or value, an unknown tool, a tool whose import, constructor or :meth:`Tool.check`
            failed (e.g. the sandbox's isolation is below its minimum), ``format=python_block`` without a
            ``python`` tool, or a chat template without a tool role.
    """
    cfg = cfg if isinstance(cfg, MultiTurnConfig) else MultiTurnConfig.from_config(cfg, key)
    return cfg, build_tools(cfg, key=key), ToolChatTemplate(tokenizer, chat_template_kwargs)


def build_tools(cfg: MultiTurnConfig, check: bool = True, key: str = MULTI_TURN_KEY) -> dict[str, Tool]:
    """The configured tools, ``{name: tool}``, each started-up with :meth:`Tool.check` when ``check``. ``key``: the
    section's config key, named in the messages (``<key>.tools``, ``<key>.format``, ...).

    Raises:
        rollout.tools.registry.ToolConfigError: an unknown tool, a bad entry or a tool whose import, constructor or
            :meth:`Tool.check` raised (:func:`rollout.tools.registry.resolve_tools`; one line per tool).
        ValueError: ``format=python_block`` without a ``python`` tool.
    """
    tools = resolve_tools(cfg.tools, cfg.tool_config_path, key, check=check)
    if cfg.format == "python_block" and "python" not in tools:
        raise ValueError(f"{key}.format=python_block sends code blocks to the 'python' tool, which is not "
                         f"configured (tools: {sorted(tools)}); add python to {key}.tools")
    return tools
