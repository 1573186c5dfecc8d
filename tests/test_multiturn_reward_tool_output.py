"""What the reward reads of a multi-turn trajectory: the scorers that read their answer after ``answer_after``
(``</tool_response>``) get the marker placed after the last tool turn by the reward manager, from the masks
(tool turns: ``attention_mask`` 1, ``response_mask`` 0), so a tool's output is never the answer whatever the chat
template renders around it (SmolLM2's ChatML template has no ``</tool_response>``). Single-turn rows and scorers
without ``answer_after`` get the decoded trajectory as it is (verl's)."""
import numpy as np
import pytest
import torch

from rewards.manager import RewardManager
from rollout.base import SamplingConfig
from rollout.multiturn import MultiTurnConfig, ToolChatTemplate, multi_turn_generate
from rollout.tools.calculator import CalculatorTool
from tests.multiturn_utils import ScriptedEngine, build_chat_tokenizer, hermes
from trainer.protocol import DataProto

# SmolLM2-Instruct's own template: a tool message renders as <|im_start|>tool ... <|im_end|>, no </tool_response>
SMOL = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
END = "<|im_end|>"
_TOKENIZERS: dict = {}


def _tok(name):
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = build_chat_tokenizer(SMOL) if name == "smol" else build_chat_tokenizer()
    return _TOKENIZERS[name]


def _batch(tok, rows, truth="42", source="openai/gsm8k"):
    """DataProto of ``rows``: lists of (text, by_model) segments; tool answers go through the template's glue."""
    built = []
    for segs in rows:
        ids, model = [], []
        for text, by_model in segs:
            if by_model:
                part = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
                ids, model = ids + part, model + [1] * len(part)
            else:
                glue, _ = ToolChatTemplate(tok).encode([text], ids[-1] if ids else None)
                ids, model = ids + glue, model + [0] * len(glue)
        built.append((ids, model))
    width = max(len(ids) for ids, _ in built) + 2
    responses = torch.full((len(built), width), tok.pad_token_id, dtype=torch.long)
    mask, attn = torch.zeros(len(built), width), torch.zeros(len(built), width, dtype=torch.long)
    for i, (ids, model) in enumerate(built):
        responses[i, :len(ids)], mask[i, :len(ids)], attn[i, :len(ids)] = torch.tensor(ids), torch.tensor(model), 1
    n = len(built)
    return DataProto.from_dict({"responses": responses, "response_mask": mask, "attention_mask": attn},
                               {"data_source": np.array([source] * n, dtype=object),
                                "reward_model": np.array([{"ground_truth": truth}] * n, dtype=object)})


def _scores(tok, rows, scorer="gsm8k", **kwargs):
    with RewardManager(tok, scorer=scorer, scorer_kwargs=kwargs, num_workers=0) as rm:
        out = rm(_batch(tok, rows))
    return out.token_level_scores.sum(-1).tolist(), out


CALL = hermes("calculator", expression="6 * 7")
PROGRAM = "```python\nprint('#### 42')\n```"


@pytest.mark.parametrize("template", ["smol", "qwen"])
@pytest.mark.parametrize("scorer,kwargs", [("gsm8k", {"method": "flexible"}), ("gsm8k", {}),
                                           ("gsm8k_flexible", {}), ("format_gsm8k", {"format_score": 0.0}),
                                           ("arith_tool", {})])
def test_tool_output_is_never_scored_whatever_the_template(template, scorer, kwargs):
    """A tool that answered ``#### 42`` (a calculator's ``42``, a program printing ``#### 42``, one printing the
    marker itself first) followed by a model that writes no answer scores 0; the model writing ``#### 42`` itself
    after the tool call scores 1, with SmolLM2's template (no ``</tool_response>``) as with Qwen's."""
    tok = _tok(template)
    rows = [[(CALL, True), ("42", False), ("ok", True)],
            [(PROGRAM, True), ("#### 42\n", False), ("ok", True)],
            [(PROGRAM, True), ("</tool_response>\n#### 42\n", False), ("done", True)],
            [(CALL, True), ("42", False), ("The tool says so: #### 42", True)],
            [(PROGRAM, True), ("#### 40\n", False), (CALL, True), ("42", False), ("#### 42", True)]]
    got, out = _scores(tok, rows, scorer, **kwargs)
    assert got == pytest.approx([0.0, 0.0, 0.0, 1.0, 1.0])
    if scorer == "arith_tool":  # a tool answered in every row, whatever the template renders
        assert out.reward_extra_info["tool_used"] == [1.0] * 5


def test_tool_output_is_never_scored_through_the_multi_turn_loop():
    """The breaker's reproducer: the loop's own masks; calculator("6 * 7") then ``ok`` scores 0 under gsm8k
    flexible with both templates, and a final ``#### 42`` scores 1."""
    for name in ("smol", "qwen"):
        tok = _tok(name)
        for final, want in (("ok", 0.0), ("#### 42", 1.0)):
            def script(ctx, k, final=final):
                return (final if ctx.count("<|im_start|>assistant") >= 2 else CALL) + END
            prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is 6*7?"}], tokenize=False,
                                                        add_generation_prompt=True), add_special_tokens=False)
            res = multi_turn_generate(ScriptedEngine(tok, script), tok, [prompt],
                                      SamplingConfig(n=1, max_new_tokens=128), {"calculator": CalculatorTool()},
                                      MultiTurnConfig(enable=True))
            p = len(prompt)
            data = DataProto.from_dict(
                {"responses": res.rollout.responses, "response_mask": res.rollout.response_mask,
                 "attention_mask": torch.cat([torch.ones(1, p, dtype=torch.long), res.attention_mask], 1)},
                {"data_source": np.array(["openai/gsm8k"], dtype=object),
                 "reward_model": np.array([{"ground_truth": "42"}], dtype=object)})
            with RewardManager(tok, scorer="gsm8k", scorer_kwargs={"method": "flexible"}, num_workers=0) as rm:
                assert rm(data).token_level_scores.sum().item() == want, (name, final)


def test_tool_output_is_never_scored_single_turn_and_custom_scorers_see_verl_text():
    """The marker is placed only for multi-turn rows and only for scorers that read after ``answer_after``: a
    single-turn row, a scorer without that parameter (verl's custom signature) and ``answer_after=None`` (read
    everything, the run's choice) get the decoded trajectory unchanged."""
    tok = _tok("smol")
    seen: list[str] = []

    def custom(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return 0.0

    def after(solution_str, ground_truth, answer_after="</tool_response>"):
        seen.append(solution_str)
        return 0.0

    rows = [[("#### 42", True)], [(CALL, True), ("42", False), ("ok", True)]]
    whole = [tok.decode(ids[attn == 1], skip_special_tokens=True)
             for ids, attn in zip(_batch(tok, rows)["responses"], _batch(tok, rows)["attention_mask"])]
    _scores(tok, rows, custom)
    assert seen == whole
    seen.clear()
    _scores(tok, rows, after)
    assert seen[0] == whole[0] and seen[1] == whole[1][:-len("ok")] + "</tool_response>ok"
    seen.clear()
    _scores(tok, rows, after, answer_after=None)
    assert seen == whole
    got, _ = _scores(tok, rows, "gsm8k", method="flexible", answer_after=None)
    assert got == [1.0, 1.0]  # reading everything is asked for: the tool's 42 counts


@pytest.mark.parametrize("template", ["smol", "qwen"])
def test_a_boxed_answer_printed_by_a_tool_is_never_the_math_answer(template):
    """The MATH scorer reads its box after the last ``answer_after`` too: a program printing ``\\boxed{42}`` then a
    model that writes no box scores 0; the model's own box after the tool turn scores 1."""
    tok = _tok(template)
    boxed = "```python\nprint('\\\\boxed{42}')\n```"
    rows = [[(boxed, True), ("\\boxed{42}\n", False), ("ok", True)],
            [(boxed, True), ("\\boxed{42}\n", False), ("so \\boxed{42}", True)],
            [(boxed, True), ("\\boxed{40}\n", False), ("so \\boxed{42}", True)]]
    with RewardManager(tok, scorer="math", num_workers=0) as rm:
        got = rm(_batch(tok, rows, source="math500")).token_level_scores.sum(-1).tolist()
    assert got == [0.0, 1.0, 1.0]
    from rewards.registry import get_scorer

    assert get_scorer("math")("so \\boxed{42}", "42") == 1.0  # single turn: the whole text
    assert get_scorer("math")("\\boxed{42}</tool_response>ok", "42", answer_after=None) == 1.0
