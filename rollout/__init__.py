"""Generation engines (vLLM colocated with sleep/wake; transformers' ``generate``) and the context that moves the
actor's weights into them. Public API: :mod:`rollout.base`, :mod:`rollout.generator` (what the actor worker asks for
sequences), :mod:`rollout.hf_engine`, :mod:`rollout.vllm_engine`,
:mod:`rollout.context`, :func:`rollout.memory.empty_cache`.
"""
from rollout.base import RolloutEngine, RolloutOutput, SamplingConfig

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingConfig"]
