"""A generated task that needs a tool: exact products (and sums/differences) of large integers.

``make_rows`` writes rows in verl's column layout (as :mod:`trainer.embedded` does for the digits task):
``data_source`` ``synthetic/arith_tool``, ``prompt`` (one user message asking to use the tool and to end with
``#### <answer>``), ``reward_model.ground_truth`` (the exact integer as a string), ``extra_info`` (operands,
operator, index, split). Scored by :mod:`rewards.arith_tool` (exact match of the final ``#### N`` after the last
tool answer). With 6-9 digit operands a model without the tool rarely gets a product exactly right, so the reward
measures tool use. :func:`with_tool_instruction` adds the same instruction to other math rows (GSM8K, SVAMP).
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Callable

from rewards.arith_tool import TASK_NAME

__all__ = ["TASK_NAME", "make_rows", "write_task", "with_tool_instruction", "tool_instruction", "CODE_OPEN",
           "CODE_CLOSE", "CHAT_TEMPLATE", "build_tokenizer", "demonstration", "warm_start", "SYNTHETIC_TASKS",
           "EmbeddedTask", "embedded_task"]

_OPS = {"*": lambda a, b: a * b, "+": lambda a, b: a + b, "-": lambda a, b: a - b}
_TOOL_WORDS = {"python": "the python tool (write a program that prints the result)",
               "calculator": "the calculator tool"}


def tool_instruction(tool: str = "python") -> str:
    """The sentence asking for the tool and the answer format. Raises ValueError for a tool other than
    ``python`` / ``calculator``."""
    if tool not in _TOOL_WORDS:
        raise ValueError(f"tool={tool!r}; expected one of {sorted(_TOOL_WORDS)}")
    return f"Use {_TOOL_WORDS[tool]} to compute it exactly, then give the final answer as '#### <number>'."


def make_rows(num_rows: int, seed: int, min_digits: int = 6, max_digits: int = 9, ops: tuple[str, ...] = ("*",),
              tool: str = "python") -> list[dict]:
    """``num_rows`` questions ``a <op> b`` with operands of ``min_digits..max_digits`` digits (uniform count).

    Raises:
        ValueError: digits out of order or < 1, an operator other than ``* + -``, an unknown tool.
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    bad = [op for op in ops if op not in _OPS]
    if bad or not ops:
        raise ValueError(f"ops={list(ops)}; expected a non-empty subset of {sorted(_OPS)}")
    hint = tool_instruction(tool)
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        a, b = (rng.randint(10 ** (d - 1), 10 ** d - 1) for d in
                (rng.randint(min_digits, max_digits), rng.randint(min_digits, max_digits)))
        op = rng.choice(ops)
        rows.append({
            "data_source": TASK_NAME,
            "prompt": [{"role": "user", "content": f"What is {a} {op} {b}? {hint}"}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(_OPS[op](a, b))},
            "extra_info": {"index": i, "split": f"seed{seed}", "a": a, "b": b, "op": op},
        })
    return rows


def with_tool_instruction(rows: list[dict], tool: str = "python") -> list[dict]:
    """Copies of verl-layout math rows whose last user message ends with :func:`tool_instruction` (for GSM8K /
    SVAMP with a tool). Rows are not modified in place.

    Raises:
        ValueError: a row whose ``prompt`` is not a list of messages with a user message.
    """
    hint = tool_instruction(tool)
    out = []
    for i, row in enumerate(rows):
        prompt = [dict(m) for m in row.get("prompt") or []] if isinstance(row.get("prompt"), list) else None
        users = [m for m in prompt or [] if m.get("role") == "user"]
        if not users:
            raise ValueError(f"row {i}: prompt must be a list of chat messages with a user message")
        users[-1]["content"] = f"{users[-1]['content'].rstrip()} {hint}"
        out.append({**row, "prompt": prompt})
    return out


def write_task(out_dir: str, train_rows: int = 2048, val_rows: int = 64, seed: int = 0, **kwargs) -> tuple[str, str]:
    """Write ``train.jsonl`` and ``val.jsonl`` (``kwargs`` go to :func:`make_rows`); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, n, s in (("train", train_rows, seed), ("val", val_rows, seed + 1)):
        path = os.path.join(out_dir, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for row in make_rows(n, s, **kwargs):
                f.write(json.dumps(row) + "\n")
        paths.append(path)
    return paths[0], paths[1]


# ---- the embedded variant's tokenizer (data=synthetic_tool) -----------------------------------------------------
CODE_OPEN, CODE_CLOSE = "```python\nprint(", ")\n```"  # one token each: a program is CODE_OPEN <expression> CODE_CLOSE
_SPECIAL = ["<pad>", "<eos>", "<unk>"]
_CONT = "@@"  # WordPiece's continuation prefix (not "##", which would swallow "####")
_ADDED = [CODE_OPEN, CODE_CLOSE, "####", "=>", "<tool_response>", "</tool_response>"]
_WORDS = ["What", "is", "Use", "the", "python", "tool", "write", "a", "program", "that", "prints", "result", "to",
          "compute", "it", "exactly", "then", "give", "final", "answer", "as", "number", "calculator",
          "?", "*", "+", "-", "(", ")", ",", ".", "'", "<", ">"]
# The user's content; a model turn ends with <eos>; tool answers sit in <tool_response> blocks; "=>" opens a turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ message['content'] }} <eos> "
    "{% elif message['role'] == 'tool' %}<tool_response> {{ message['content'] }} </tool_response> "
    "{% else %}{{ message['content'] }} {% endif %}{% endfor %}{% if add_generation_prompt %}=>{% endif %}"
)


def build_tokenizer(save_dir: str | None = None):
    """A WordPiece tokenizer (vocabulary of 63) for the tool-arithmetic task with a chat template that has a tool
    role (:data:`CHAT_TEMPLATE`), built with ``tokenizers``.

    Token ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, then digits ``0``-``9``, their continuations ``@@0``-``@@9``
    (so ``123`` is ``1 @@2 @@3`` and decodes back to ``123``), the words of the questions, and the added tokens
    :data:`CODE_OPEN`, :data:`CODE_CLOSE` (a ``format=python_block`` program ``print(<expression>)`` is these two
    around the expression's tokens), ``####``, ``=>``, ``<tool_response>``, ``</tool_response>``. Decoding joins
    words with a space. If ``save_dir`` is given, the tokenizer (with its chat template) is saved there.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    digits = [str(i) for i in range(10)]
    vocab = {t: i for i, t in enumerate(_SPECIAL + digits + [_CONT + d for d in digits] + _WORDS)}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>", max_input_chars_per_word=64,
                                     continuing_subword_prefix=_CONT))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=_CONT, cleanup=False)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    hf.add_tokens([AddedToken(t, normalized=False) for t in _ADDED])
    hf.chat_template = CHAT_TEMPLATE
    if save_dir:
        hf.save_pretrained(save_dir)
    return hf


def demonstration(tokenizer, template, row: dict) -> tuple[list[int], list[int]]:
    """A tool-using trajectory for ``row`` (a :func:`make_rows` row): the prompt, a model turn with the program
    ``print(a op b)``, the tool's answer (the exact result) through ``template`` (a
    :class:`rollout.multiturn.ToolChatTemplate`), and a model turn ``#### <result>``.

    Returns:
        (ids, model): token ids, and 1 where a token is the model's (the two turns), 0 for the prompt and glue.
    """
    x, eos = row["extra_info"], int(tokenizer.eos_token_id)
    result = row["reward_model"]["ground_truth"]

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt = enc(tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True))
    call = enc(f"{CODE_OPEN}{x['a']} {x['op']} {x['b']}{CODE_CLOSE}") + [eos]
    glue, _ = template.encode([result], eos)
    final = enc(f"#### {result}") + [eos]
    ids = prompt + call + glue + final
    return ids, [0] * len(prompt) + [1] * len(call) + [0] * len(glue) + [1] * len(final)


def warm_start(model, tokenizer, rows: list[dict], steps: int, lr: float = 1.5e-3, batch_size: int = 32,
               seed: int = 0) -> float:
    """A short supervised pass over :func:`demonstration` trajectories (loss on the model's tokens only), in place.

    A model with random weights never writes a working program by chance, so GRPO would see no reward; a short
    pass gives a policy that calls the tool and copies its answer some of the time, which RL then trains on.

    Args:
        model: a causal LM (e.g. the embedded tiny Llama) on CPU.
        rows: :func:`make_rows` rows to imitate (cycled).
        steps: optimizer steps (0: no change).
        lr, batch_size, seed: AdamW's learning rate (at 3e-3 the result varied with the seed from 0.33 to 0.89
            of held-out demonstrations reproduced after 170 steps; at 1.5e-3 from 0.84 to 1.00), trajectories per
            step, the order's seed.

    Returns:
        The last step's mean token cross-entropy (nats), NaN for ``steps=0``.
    """
    import torch

    from rollout.multiturn import ToolChatTemplate

    template = ToolChatTemplate(tokenizer)
    demos = [demonstration(tokenizer, template, r) for r in rows]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("nan"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs fastest on one thread
    try:
        for _ in range(int(steps)):
            loss = _demo_step(model, opt, rng.sample(demos, min(batch_size, len(demos))), tokenizer.pad_token_id)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return float(loss)


def _demo_step(model, opt, batch: list[tuple[list[int], list[int]]], pad_id: int):
    """One AdamW step of next-token cross-entropy on the model's tokens of ``batch`` (right-padded)."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), int(pad_id), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        ids[i, :len(seq)], attn[i, :len(seq)] = torch.tensor(seq), 1
        labels[i, :len(seq)] = torch.where(torch.tensor(mask) == 1, torch.tensor(seq), -100)
    loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


# ---- the embedded default's generated tasks (data.synthetic_task) -----------------------------------------------
SYNTHETIC_TASKS = ("digits", "arith_tool")
_EMBEDDED_DIGITS = (1, 2)  # operand digits of data=synthetic_tool: products of 1..99, which a tiny model cannot know


@dataclass(frozen=True)
class EmbeddedTask:
    """The pieces of one generated task of the embedded default (``trainer/embedded_assets.py:prepare_embedded``).

    Attributes:
        build_tokenizer: ``(save_dir) -> tokenizer``, the tokenizer (with its chat template) for the tiny model.
        write_task: ``(out_dir, seed) -> (train_path, val_path)``.
        warm_start: ``(model, tokenizer, steps, seed) -> None``, run on the fresh tiny model before it is saved.
        warm_starts: whether ``warm_start`` changes the model (False: ``data.warm_start_steps`` has no effect, and
            the record of what built ``init_model`` holds 0 for it).
    """

    build_tokenizer: Callable
    write_task: Callable
    warm_start: Callable
    warm_starts: bool = True


def embedded_task(name: str) -> EmbeddedTask:
    """The task of ``data.synthetic_task``: ``digits`` (:mod:`trainer.embedded`, no warm start) or ``arith_tool``
    (this module: 2240 training questions ``a * b`` with operands of 1-2 digits, the python tool, and
    ``data.warm_start_steps`` steps of :func:`warm_start` on 2048 other questions).

    Raises:
        ValueError: another name (the message lists the known ones).
    """
    from trainer import embedded

    if name == "digits":
        return EmbeddedTask(embedded.build_tokenizer, lambda out, seed: embedded.write_task(out, seed=seed),
                            lambda model, tok, steps, seed: None, warm_starts=False)
    if name == "arith_tool":
        lo, hi = _EMBEDDED_DIGITS
        return EmbeddedTask(
            build_tokenizer,
            lambda out, seed: write_task(out, train_rows=2240, seed=seed, min_digits=lo, max_digits=hi),
            lambda model, tok, steps, seed: warm_start(model, tok, make_rows(2048, seed + 1000, lo, hi), steps,
                                                      seed=seed))
    raise ValueError(f"data.synthetic_task={name!r}; expected one of {list(SYNTHETIC_TASKS)}")
