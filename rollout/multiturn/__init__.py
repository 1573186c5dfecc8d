"""Multi-turn, tool-using rollouts on the existing engines: the loop (:mod:`.loop`), its config (:mod:`.config`),
the chat-template glue of tool turns (:mod:`.chat`) and the batch metrics (:mod:`.metrics`)."""
from rollout.multiturn.chat import ToolChatTemplate
from rollout.multiturn.config import MultiTurnConfig
from rollout.multiturn.loop import MultiTurnResult, multi_turn_generate, prepare_multi_turn

__all__ = ["MultiTurnConfig", "MultiTurnResult", "ToolChatTemplate", "multi_turn_generate", "prepare_multi_turn"]
