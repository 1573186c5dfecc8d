"""The log-probs of the sampled tokens, recorded inside transformers' ``generate`` by a logits processor."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["SampledTokenLogProbs"]


class SampledTokenLogProbs:
    """A transformers logits processor that records ``log_softmax(logits_t / T)[token_t]`` for every step ``t``
    of one ``generate`` call, holding only the latest step's (rows, vocab) fp32 log-probs.

    transformers calls it once per generated token with the ids so far and that step's raw logits (custom
    processors run before the sampling warpers); the token sampled at step ``t`` is the last id of the call for
    step ``t + 1``, and :meth:`finish` gathers the final step's from the returned sequences.

    Args:
        temperature: T (> 0; 1.0 for greedy).
        rows: batch rows of the call.
        max_new_tokens: R, the most steps the call can take.
        device: where the (rows, R) fp32 result lives.
    """

    def __init__(self, temperature: float, rows: int, max_new_tokens: int, device) -> None:
        self.temperature = float(temperature)
        self.log_probs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
        self.steps = 0
        self._last: torch.Tensor | None = None  # (rows, V) fp32 log-probs of the latest step

    def _record(self, tokens: torch.Tensor) -> None:
        self.log_probs[:, self.steps - 1] = self._last.gather(-1, tokens.view(-1, 1).to(self._last.device)).squeeze(-1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._last is not None:
            self._record(input_ids[:, -1])
        self._last = F.log_softmax(scores.float() / self.temperature, dim=-1)
        self.steps += 1
        return scores

    def finish(self, tokens: torch.Tensor) -> torch.Tensor:
        """(rows, L) fp32 log-probs of ``tokens`` (rows, L), the call's generated ids. L equals the steps seen, or
        the steps seen minus one when ``generate`` read its stop flag one step late
        (:func:`rollout.stop_check.deferred_stop_check`) and undid that extra step: its token was never kept, so
        its distribution is dropped, and the last kept token was recorded by that extra call.

        Raises:
            RuntimeError: when L is neither.
        """
        length = tokens.shape[1]
        if length == self.steps - 1 and length > 0:  # the extra step: token L-1 recorded when it was processed
            self._last = None
            return self.log_probs[:, :length]
        if length != self.steps:
            raise RuntimeError(f"generate returned {length} new tokens but the log-prob recorder saw "
                               f"{self.steps} steps")
        if self._last is not None:
            self._record(tokens[:, -1])
            self._last = None
        return self.log_probs[:, :self.steps]
