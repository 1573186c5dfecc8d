"""The tokens a chat template puts between two assistant turns: the end of the assistant message, the tool messages
(``role: tool``) and the next assistant header.

They are found by rendering a probe conversation with and without the tool messages (as verl's agent loop does):
``render([user, assistant], add_generation_prompt=False)`` must be a prefix of ``render([user, assistant, tool
x n], add_generation_prompt=True)``; the difference, plus what the template writes after the assistant's content,
is the glue. The tool contents are placeholders, so the glue splits into ``n + 1`` template pieces around the
``n`` contents; the pieces are tokenized once per ``n`` and cached, the contents per call (with the tokenizer's
``split_special_tokens=True``, so that a tool printing ``<|im_end|>`` cannot forge a control token).
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["ToolChatTemplate"]

_ASSISTANT_MARK = "DSRLASSISTANTPROBE"
_USER_PROBE = "DSRLUSERPROBE"


def _placeholder(i: int) -> str:
    return f"DSRLTOOLCONTENT{i}X"


class ToolChatTemplate:
    """Glue tokens of tool turns for one tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template that renders ``tool`` messages.
        chat_template_kwargs: extra ``apply_chat_template`` arguments (e.g. ``{"enable_thinking": False}``),
            the same as the prompt's (``data.apply_chat_template_kwargs``).

    Raises:
        ValueError: no chat template; the template raises on a ``tool`` message (e.g. "roles must alternate
            user/assistant"), drops its content, or renders the earlier messages differently once a tool message
            follows. Checked when the object is built, i.e. at start-up.
    """

    def __init__(self, tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn rollouts need a chat template with a 'tool' role; the tokenizer has no "
                             "chat_template (set one on the tokenizer or use a chat model)")
        self._pieces: dict[int, list[list[int]]] = {}
        self.pieces(1)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **self.kwargs)
        if not isinstance(text, str):
            raise ValueError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    def _texts(self, n: int) -> list[str]:
        head = [{"role": "user", "content": _USER_PROBE}, {"role": "assistant", "content": _ASSISTANT_MARK}]
        tools = [{"role": "tool", "content": _placeholder(i)} for i in range(n)]
        try:
            base = self._render(head, add_generation_prompt=False)
            full = self._render(head + tools, add_generation_prompt=True)
        except Exception as exc:
            raise ValueError(f"the chat template cannot render 'tool' messages ({type(exc).__name__}: {exc}); "
                             "multi-turn rollouts need a template with a tool role") from exc
        if _ASSISTANT_MARK not in base:
            raise ValueError("the chat template drops the assistant message's content; cannot place tool turns")
        if not full.startswith(base):
            raise ValueError("the chat template renders the earlier messages differently once a 'tool' message "
                             f"follows (without: {base[-80:]!r}; with: {full[:len(base)][-80:]!r}); the glue "
                             "between turns cannot be computed")
        glue = base.split(_ASSISTANT_MARK, 1)[1] + full[len(base):]
        pieces, rest = [], glue
        for i in range(n):
            before, sep, rest = rest.partition(_placeholder(i))
            if not sep:
                raise ValueError("the chat template does not render a 'tool' message's content verbatim "
                                 f"(rendered glue: {glue!r}); it has no usable tool role")
            pieces.append(before)
        return pieces + [rest]

    def pieces(self, n: int) -> list[list[int]]:
        """Token ids of the ``n + 1`` template pieces around ``n`` tool contents (cached).

        Raises:
            ValueError: see the class docstring.
        """
        if n not in self._pieces:
            self._pieces[n] = [list(self.tokenizer.encode(p, add_special_tokens=False)) if p else []
                               for p in self._texts(n)]
        return self._pieces[n]

    def encode(self, contents: list[str], last_token: int | None) -> tuple[list[int], list[int]]:
        """Glue token ids after a model turn that ended with ``last_token``, for the tool answers ``contents``.

        The first piece starts with the template's end-of-turn token; when the model's turn already ended with
        that token (the usual case: it is a stop token) it is not repeated.

        Returns:
            (ids, is_content): the tokens to append, and 1 where a token belongs to a tool's answer (0 for the
            template's own tokens). Both lists have the same length.
        """
        if not contents:
            raise ValueError("encode needs at least one tool answer")
        pieces = self.pieces(len(contents))
        ids, is_content = [], []
        for i, piece in enumerate(pieces):
            if i == 0 and piece and last_token is not None and piece[0] == int(last_token):
                piece = piece[1:]
            ids += piece
            is_content += [0] * len(piece)
            if i < len(contents):
                tok = list(self.tokenizer(contents[i], add_special_tokens=False,
                                          split_special_tokens=True)["input_ids"])
                ids += tok
                is_content += [1] * len(tok)
        return ids, is_content
