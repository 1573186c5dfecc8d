"""Helpers of the multi-turn tests: a byte-level BPE tokenizer with a ChatML template that has a tool role (Qwen2.5's
layout: tool answers in ``<tool_response>`` blocks of a user turn), and a scripted engine."""
from __future__ import annotations

import torch

from rollout.base import RolloutEngine, RolloutOutput, SamplingConfig, check_prompts, finalize_responses

# Qwen2.5's layout, shortened: consecutive tool messages share one user turn.
TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}{%- for t in tools %}{{- t | tojson }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Gemma-2's behaviour: roles other than user/assistant raise.
RAISING_TEMPLATE = (
    "{%- for message in messages %}{%- if message.role not in ['user', 'assistant'] %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Silently drops tool messages.
DROPPING_TEMPLATE = RAISING_TEMPLATE.replace(
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}")

_CORPUS = [
    "<|im_start|>user\nWhat is 123456 * 654321? Use the calculator.<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123456 * 654321"}}\n</tool_call>',
    "<|im_start|>user\n<tool_response>\n80779853376\n</tool_response><|im_end|>\n",
    "The answer is #### 80779853376. Let me check with python: ```python\nprint(2 ** 10)\n```\n",
    "0123456789 + - * / ( ) = ? ! , . : ; the a is of to and answer result compute error tool",
]


def build_chat_tokenizer(template: str = TOOL_TEMPLATE):
    """A byte-level BPE tokenizer (about 500 tokens, trained on a few chat lines) with ``template``.

    Special tokens: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS, the end-of-turn token).
    ``decode(encode(text)) == text`` for any text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                 additional_special_tokens=["<|im_start|>"])
    hf.chat_template = template
    return hf


def hermes(name: str, **arguments) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedEngine(RolloutEngine):
    """An engine that answers from a script: ``script(context_text, sample_index) -> text`` (the turn's text,
    normally ending with ``<|im_end|>``). Log-prob of the token at response position t is ``-(t + 1) / 100``.
    Every ``generate`` call is recorded as ``(contexts, n, max_new_tokens)`` in :attr:`calls`."""

    def __init__(self, tokenizer, script) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.eos_ids = [tokenizer.eos_token_id]
        self.pad_id = tokenizer.pad_token_id
        self.calls: list[tuple[list[str], int, int]] = []

    def generate(self, prompt_ids, sampling: SamplingConfig) -> RolloutOutput:
        prompts = check_prompts(prompt_ids)
        texts = [self.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        self.calls.append((texts, sampling.n, sampling.max_new_tokens))
        width = sampling.max_new_tokens
        toks = torch.full((len(prompts) * sampling.n, width), self.pad_id, dtype=torch.long)
        for i, text in enumerate(texts):
            for k in range(sampling.n):
                ids = self.tokenizer.encode(self.script(text, k), add_special_tokens=False)[:width]
                toks[i * sampling.n + k, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        lps = -(torch.arange(width, dtype=torch.float32) + 1).expand(toks.shape) / 100
        return finalize_responses(toks, lps, self.eos_ids, self.pad_id, width)

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags=None) -> None:
        pass

    def load_weights(self, named_tensors) -> None:
        pass
