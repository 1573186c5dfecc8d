"""What the actor worker asks for sequences: a :class:`Generator` turns prompts into responses on a rollout engine.

The engine (:class:`rollout.base.RolloutEngine`: vLLM, transformers) samples tokens; the generator decides how a
trajectory is built from its calls. :class:`SingleTurnGenerator` makes one ``engine.generate`` call per batch (one
model turn per prompt). A multi-turn generator (tool calls between model turns, :mod:`rollout.multiturn`) has the
same ``generate`` and returns the same :class:`Generation`, with response tokens the model did not write (tool
answers, template glue) masked out of ``rollout.response_mask`` but kept in ``attention_mask``; the actor worker
builds its rows from a :class:`Generation` alone, so swapping the generator changes nothing else.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import torch

from rollout.base import RolloutEngine, RolloutOutput, SamplingConfig

__all__ = ["Generation", "Generator", "SingleTurnGenerator"]


@dataclass
class Generation:
    """The responses of one ``generate`` call, prompt-major (the ``n`` samples of prompt ``i`` are contiguous).

    Attributes:
        rollout: ``responses`` (B*n, R) int64, ``response_mask`` (B*n, R) int64 (1 on the tokens the model wrote:
            the loss, KL and entropy read it), ``rollout_log_probs`` (B*n, R) float32.
        attention_mask: (B*n, R) int64, 1 on every response token the model attends to (model turns and, in a
            multi-turn trajectory, tool answers), 0 on padding.
        columns: extra per-row tensors of the rows, (B*n, ...).
        non_tensor: extra per-row non-tensor columns (numpy arrays of length B*n; e.g. a multi-turn
            ``num_turns`` int64).
        metrics: the call's metrics (``{name: float}``).
    """

    rollout: RolloutOutput
    attention_mask: torch.Tensor
    columns: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor: dict = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class Generator(abc.ABC):
    """Builds trajectories for prompts on a rollout engine (see the module docstring)."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine

    @abc.abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig,
                 multi_modal_inputs: list | None = None) -> Generation:
        """``sampling.n`` trajectories per prompt.

        Args:
            prompt_ids: B prompts as unpadded token id lists.
            sampling: the call's sampling settings (``max_new_tokens`` is the response width R).
            multi_modal_inputs: B per-prompt image inputs of a vision-language model, or None.
        """


class SingleTurnGenerator(Generator):
    """One model turn per prompt: a single ``engine.generate`` call; every response token is the model's."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig,
                 multi_modal_inputs: list | None = None) -> Generation:
        kwargs = {"multi_modal_inputs": multi_modal_inputs} if multi_modal_inputs else {}
        out = self.engine.generate(prompt_ids, sampling, **kwargs)
        return Generation(out, out.response_mask)
