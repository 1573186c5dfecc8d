"""SVAMP with the python tool: SmolLM2's chat template and tool turns, the scorer reading the final answer only
after the last tool answer (through the reward manager's real decoding), and the svamp_tool / svamp_notool recipe
of tools/bench/rl_runs.sh composed into configs that differ only in the tool."""
import json
import os
import subprocess
import sys

import pytest
import torch

from rewards.gsm8k import TOOL_RESPONSE_END
from rewards.manager import RewardManager
from rollout.multiturn import ToolChatTemplate
from tests.multiturn_utils import build_chat_tokenizer
from trainer.protocol import DataProto

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL_TEMPLATE_FILE = os.path.join(ROOT, "tools", "chat_templates", "smollm2_tool.jinja")
# HuggingFaceTB/SmolLM2-135M-Instruct's chat template, verbatim (tokenizer.chat_template of its GGUF metadata)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PROGRAM = "```python\nprint('#### 7.5')\n```"  # a program that prints a well-formed right answer


def _tool_template() -> str:
    with open(TOOL_TEMPLATE_FILE, encoding="utf-8") as f:
        return f.read()


def _trajectory(tok, final: str) -> tuple[list[int], list[int]]:
    """(ids, model mask) of a model turn running PROGRAM, the tool's answer and the final model turn."""
    eos = tok.eos_token_id
    enc = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    glue, _ = ToolChatTemplate(tok).encode(["#### 7.5\n"], eos)
    call, last = enc(PROGRAM) + [eos], enc(final) + [eos]
    return call + glue + last, [1] * len(call) + [0] * len(glue) + [1] * len(last)


def _score(tok, finals, scorer, ground_truth="7.5"):
    rows = [_trajectory(tok, f) for f in finals]
    width = max(len(ids) for ids, _ in rows)
    responses = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask, attn = torch.zeros(len(rows), width), torch.zeros(len(rows), width, dtype=torch.long)
    for i, (ids, model) in enumerate(rows):
        responses[i, :len(ids)], mask[i, :len(ids)], attn[i, :len(ids)] = torch.tensor(ids), torch.tensor(model), 1
    data = DataProto.from_dict({"responses": responses, "response_mask": mask, "attention_mask": attn},
                               {"reward_model": [{"ground_truth": ground_truth}] * len(rows),
                                "data_source": ["svamp"] * len(rows)})
    with RewardManager(tok, scorer=scorer, scorer_kwargs={"format_score": 0.1} if scorer else {},
                       num_workers=0) as rm:
        out = rm(data)
    return out.token_level_scores.sum(-1).tolist()


def test_smollm2_template_renders_tool_turns_but_decoding_loses_their_end():
    tok = build_chat_tokenizer(SMOLLM2_TEMPLATE)
    ToolChatTemplate(tok)  # the start-up check passes: a tool message renders as <|im_start|>tool ... <|im_end|>
    ids, _ = _trajectory(tok, "#### 7.5")
    text = tok.decode(ids, skip_special_tokens=True)
    assert "tool\n#### 7.5" in text and TOOL_RESPONSE_END not in text  # no plain-text end of the tool answer


def test_smollm2_tool_template_renders_other_messages_as_smollm2():
    own, tool = build_chat_tokenizer(SMOLLM2_TEMPLATE), build_chat_tokenizer(_tool_template())
    for msgs in ([{"role": "user", "content": "q?"}],
                 [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"},
                  {"role": "assistant", "content": "a"}]):
        for gen in (True, False):
            assert tool.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen) == \
                own.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    text = tool.decode(_trajectory(tool, "so #### 7.5")[0], skip_special_tokens=True)
    assert "user\n<tool_response>\n#### 7.5\n\n</tool_response>\nassistant\nso #### 7.5" in text


@pytest.mark.parametrize("scorer", ["format_gsm8k", None])  # reward=format, and reward=rule (by data_source)
def test_tool_printed_answer_earns_nothing_svamp_decimals_compare(scorer):
    tok = build_chat_tokenizer(_tool_template())
    got = _score(tok, ["The tool printed it.", "#### 7.5", "#### 7.50", "#### 8"], scorer)
    wrong = 0.1 if scorer else 0.0
    assert got == pytest.approx([0.0, 1.0, 1.0, wrong])


FAKE_PYTHON = """#!/usr/bin/env bash
# records the trainer's arguments; anything else runs in the real python
if [ "$1" = trainer/main.py ]; then
  for a in "$@"; do case $a in trainer.output_dir=*) d=${a#trainer.output_dir=} ;; esac; done
  "%s" -c 'import json, sys; json.dump(sys.argv[3:], open(sys.argv[1], "w"))' "$(basename "$d").json" "$@"
  exit 0
fi
exec "%s" "$@"
"""


def _recipe(tmp_path, runs):
    for name in ("trainer", "tools", "rewards", "rollout", "patches", "configs"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    src = tmp_path / ".gdata" / "svamp"
    src.mkdir(parents=True)
    (src / "test.jsonl").write_text("".join(json.dumps({"Body": f"b{i}", "Question": f"q{i}?", "Answer": i / 2,
                                                         "Equation": "x"}) + "\n" for i in range(800)))
    fake, model = tmp_path / "fake_python", tmp_path / "smol"
    fake.write_text(FAKE_PYTHON % (sys.executable, sys.executable))
    fake.chmod(0o755)
    model.mkdir()
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHON": str(fake), "OUT": str(tmp_path / "out"), "RUNS": runs,
           "MODEL": str(model)}
    return subprocess.run(["bash", os.path.join(ROOT, "tools", "bench", "rl_runs.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_rl_runs_svamp_tool_writes_its_data_and_differs_from_notool_only_in_the_tool(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from trainer.launch import resolve_config, validate

    done = _recipe(tmp_path, "svamp_tool:0 svamp_notool:0")
    assert done.returncode == 0, done.stderr + done.stdout
    monkeypatch.chdir(tmp_path)
    args = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in ("svamp_tool", "svamp_notool")}
    only_tool = [a.split("=")[0] for a in args["svamp_tool"] if a not in args["svamp_notool"]]
    assert sorted(only_tool) == sorted(
        ["actor_rollout_ref.model.custom_chat_template", "data.train_files", "data.val_files", "trainer.output_dir",
         *(f"actor_rollout_ref.rollout.multi_turn.{k}" for k in ("enable", "format", "tools",
                                                                 "max_assistant_turns"))])
    assert [a for a in args["svamp_notool"] if a not in args["svamp_tool"]][0].startswith("trainer.output_dir=")
    cfgs = {}
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        for name, a in args.items():
            cfgs[name] = resolve_config(compose(config_name="ppo_trainer", overrides=a))
            validate(cfgs[name])
    tool = cfgs["svamp_tool"]
    assert tool["actor_rollout_ref"]["model"]["custom_chat_template"] == _tool_template()
    from trainer.multi_turn import check_multi_turn_template

    tok = build_chat_tokenizer(SMOLLM2_TEMPLATE)
    tok.chat_template = tool["actor_rollout_ref"]["model"]["custom_chat_template"]  # as load_tokenizer sets it
    check_multi_turn_template(tool, tok)  # the start-up check of the tool run
    assert tool["trainer"]["total_training_steps"] >= 30 and tool["trainer"]["test_freq"] == 10
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "data" / "svamp_tool" / "test.parquet")
    assert len(rows) == 100 and rows["extra_info"][0]["tool"] == "python"
    assert rows["prompt"][0][0]["content"].startswith("b700 q700? Use the python tool")
    assert rows["reward_model"][1]["ground_truth"] == "350.5"
    plain = pd.read_parquet(tmp_path / "data" / "svamp" / "test.parquet")
    assert plain["prompt"][0][0]["content"].startswith("b700 q700? Let's think step by step")
