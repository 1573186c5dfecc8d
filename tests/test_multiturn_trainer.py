"""The multi-turn loop inside the trainer: the config section's pre-start checks, the actor worker's generation
seam (masks, num_turns, metrics), the dataset's tool schemas, the reward manager's view of the whole trajectory,
and the actor loss through the worker's own loss function: tool-answer tokens get no gradient."""
from __future__ import annotations

import os
import re
import time
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollout.tools.base import Tool
from tests.e2e_utils import ROOT
from tests.multiturn_utils import DROPPING_TEMPLATE, RAISING_TEMPLATE, ScriptedEngine, build_chat_tokenizer
from trainer.config_checks import ConfigError
from trainer.multi_turn import build_generator, check_multi_turn_template, generation_metrics, tool_schemas
from trainer.protocol import DataProto

MT = "actor_rollout_ref.rollout.multi_turn."


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


class HangingTool(Tool):
    """A tool that sleeps far past its timeout."""

    name = "hang"
    description = "never answers in time"
    parameters = {"type": "object", "properties": {}}
    timeout_s = 0.2

    def call(self, args):
        time.sleep(5)
        return "late"


# ---- pre-start checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,message", [
    ([MT + "enable=true", MT + "tools=[shell]"], r"multi_turn.tools=\['shell'\]: unknown tool 'shell'"),
    ([MT + "enable=true", MT + "tools=[nosuch.module:MyTool]"], r"cannot import module 'nosuch.module'"),
    ([MT + "enable=true", MT + "tools=[rollout.tools.base:ToolCall]"], r"expected a rollout.tools.base.Tool|Tool"),
    ([MT + "enable=true"], r"no tool is configured"),
    ([MT + "enable=true", MT + "tools=[calculator]", MT + "format=python_block"], r"'python' tool"),
    ([MT + "max_user_turns=0"], r"multi_turn.max_user_turns=0; expected an integer >= 1 or null"),
    ([MT + "max_assistant_turns=-2"], r"multi_turn.max_assistant_turns=-2; expected an integer >= 1 or null"),
    ([MT + "max_parallel_calls=abc"], r"multi_turn.max_parallel_calls='abc'; expected an integer"),
    ([MT + "max_tool_response_length=0"], r"max_tool_response_length=0; expected an integer >= 1"),
    ([MT + "format=xml"], r"multi_turn.format='xml'; expected one of \['hermes', 'python_block'\]"),
    ([MT + "tool_response_truncate_side=top"], r"tool_response_truncate_side='top'"),
    (["+" + MT + "interaction_config_pth=x.yaml"], r"unknown keys \['interaction_config_pth'\]"),
])
def test_bad_multi_turn_settings_are_one_line_errors_before_start(overrides, message):
    from trainer.launch import validate

    with pytest.raises(ConfigError, match=message) as exc:
        validate(_cfg(*overrides))
    assert "\n" not in str(exc.value)


def test_tool_errors_name_full_keys_and_quote_what_the_user_wrote():
    """The rollout names the section's keys under the key the trainer passes, so a message is the rollout's own
    text with the full key, and a user's module path that happens to contain ``rollout.multi_turn.`` is quoted as
    written."""
    from rollout.multiturn import MultiTurnConfig
    from rollout.multiturn.loop import build_tools
    from trainer.multi_turn import check_multi_turn

    with pytest.raises(ConfigError) as info:
        check_multi_turn(_cfg(MT + "enable=true", MT + "tools=[rollout.multi_turn.mytools:MyTool]"))
    assert str(info.value) == (f"{MT}tools=['rollout.multi_turn.mytools:MyTool']: tool "
                               "'rollout.multi_turn.mytools:MyTool': cannot import module 'rollout.multi_turn.mytools' "
                               "(ModuleNotFoundError: No module named 'rollout.multi_turn')"), str(info.value)
    with pytest.raises(ValueError) as rollout_side:
        build_tools(MultiTurnConfig(enable=True), key=MT.rstrip("."))
    with pytest.raises(ConfigError) as trainer_side:
        check_multi_turn(_cfg(MT + "enable=true"))
    assert str(trainer_side.value) == str(rollout_side.value) and str(rollout_side.value).startswith(MT + "enable=")


def test_good_settings_pass_and_disabled_tools_are_not_built():
    from trainer.launch import validate

    validate(_cfg(MT + "enable=true", MT + "tools=[calculator,python]", MT + "max_assistant_turns=3"))
    validate(_cfg(MT + "tools=[shell]"))  # enable=false: the tool list is not used
    assert tool_schemas(_cfg(MT + "tools=[shell]")) == []
    names = [s["function"]["name"] for s in tool_schemas(_cfg(MT + "enable=true", MT + "tools=[calculator]"))]
    assert names == ["calculator"]


@pytest.mark.parametrize("template", [RAISING_TEMPLATE, DROPPING_TEMPLATE, None])
def test_a_chat_template_without_a_tool_role_is_refused_at_start(template):
    tok = build_chat_tokenizer(template or RAISING_TEMPLATE)
    if template is None:
        tok.chat_template = None
    cfg = _cfg(MT + "enable=true", MT + "tools=[calculator]")
    with pytest.raises(ConfigError, match=r"multi_turn.enable=true: .*(tool|chat_template)"):
        check_multi_turn_template(cfg, tok)
    check_multi_turn_template(_cfg(), tok)  # single-turn: any template
    check_multi_turn_template(cfg, build_chat_tokenizer())


def test_an_unknown_synthetic_task_is_refused(tmp_path):
    from trainer.embedded_assets import prepare_embedded

    cfg = _cfg("data=synthetic_tool", "data.synthetic_task=sums", f"trainer.output_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"data.synthetic_task='sums'; expected one of \['digits', 'arith_tool'\]"):
        prepare_embedded(cfg)
    assert not os.listdir(tmp_path)


def test_the_embedded_tool_task_round_trips_through_its_tokenizer():
    """A demonstration decodes to a program the python_block parser reads and a trajectory the scorer accepts."""
    from rewards.arith_tool import compute_score
    from rollout.multiturn import ToolChatTemplate
    from rollout.tools.parsers import parse_python_block
    from trainer.embedded_tool import build_tokenizer, demonstration, make_rows

    tok = build_tokenizer()
    row = make_rows(1, seed=5, min_digits=1, max_digits=2)[0]
    ids, model = demonstration(tok, ToolChatTemplate(tok), row)
    start = model.index(1)
    text = tok.decode(ids[start:], skip_special_tokens=True)
    x = row["extra_info"]
    (call,) = parse_python_block(tok.decode(ids[start:start + model[start:].index(0)], skip_special_tokens=False))
    assert call.arguments["code"].strip() == f"print( {x['a']} {x['op']} {x['b']} )"
    assert compute_score(text, row["reward_model"]["ground_truth"]) == {"score": 1.0, "acc": 1.0, "tool_used": 1.0}


# ---- the actor worker's generation ---------------------------------------------------------------------------------
def _script(ctx: str, k: int) -> str:
    """Sample 0 computes with the calculator and copies the answer, 1 writes a malformed call and then answers,
    2 calls the hanging tool, 3 calls an unregistered tool; then each states an answer."""
    if "<tool_response>" in ctx:
        return "#### " + re.findall(r"<tool_response>\n([^\n]*)", ctx)[-1] + "<|im_end|>"
    a, b = re.search(r"What is (\d+) \* (\d+)", ctx).groups()
    calls = ['<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s * %s"}}\n</tool_call>' % (a, b),
             "<tool_call>\n{not json}\n</tool_call>", '<tool_call>\n{"name": "hang", "arguments": {}}\n</tool_call>',
             '<tool_call>\n{"name": "shell", "arguments": {}}\n</tool_call>']
    return calls[k] + "<|im_end|>"


def _rollout(response_length: int, **values):
    """The packaged rollout section (hf engine, n=8, sampling at temperature 1) with ``values`` over it."""
    from trainer.config import RolloutConfig
    from trainer.config.packaged import packaged_section

    return packaged_section(RolloutConfig, "actor_rollout_ref.rollout",
                            [f"data.max_response_length={response_length}"], **values)


def _worker(tok, rollout_cfg):
    from trainer.workers.actor import ActorRolloutRefWorker

    w = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    w.rollout_cfg, w.tokenizer, w.rank, w.device = rollout_cfg, tok, 0, torch.device("cpu")
    w.engine = ScriptedEngine(tok, _script)
    w.generator = build_generator(w.engine, rollout_cfg.multi_turn, tok, {})
    w._rollout_context = lambda validate, memory_log=None, timing_log=None: nullcontext()
    return w


def _prompts(tok, questions):
    rows = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)
            for q in questions]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = torch.tensor(r), 1
    from rewards.arith_tool import TASK_NAME

    answers = [str(int(a) * int(b)) for a, b in (re.search(r"(\d+) \* (\d+)", q).groups() for q in questions)]
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask},
                               {"data_source": [TASK_NAME] * len(rows),
                                "reward_model": [{"ground_truth": a} for a in answers]}, meta={"seed": 1})


@pytest.fixture(scope="module")
def generated():
    tok = build_chat_tokenizer()
    rollout_cfg = _rollout(256, n=4, multi_turn={"enable": True, "max_assistant_turns": 2,
                                                 "max_tool_response_length": 64,
                                                 "tools": ["calculator", "tests.test_multiturn_trainer:HangingTool"]})
    w = _worker(tok, rollout_cfg)
    prompts = _prompts(tok, ["What is 123456 * 654321?", "What is 777 * 999?"])
    return tok, w, prompts, w.generate_sequences(prompts)


def test_generate_sequences_masks_turns_and_metrics(generated):
    tok, _, prompts, out = generated
    P, R = prompts["input_ids"].shape[1], 256
    resp_mask, attn = out["response_mask"], out["attention_mask"]
    assert out["responses"].shape == (8, R) and attn.shape == (8, P + R)
    tool = (attn[:, P:] == 1) & (resp_mask == 0)
    assert tool.any(dim=1).all()  # every sample got a tool answer (or an error message) back
    assert torch.all(resp_mask <= attn[:, P:]) and torch.all(out["rollout_log_probs"][resp_mask == 0] == 0)
    pos = out["position_ids"]  # tool tokens are attended, so positions run on through them
    for i in range(8):
        assert torch.equal(pos[i][attn[i] == 1], torch.arange(int(attn[i].sum())))
    first = tok.decode(out["responses"][0][attn[0, P:] == 1], skip_special_tokens=False)
    assert str(123456 * 654321) in tok.decode(out["responses"][0][tool[0]], skip_special_tokens=False)
    assert first.count("<tool_response>") == 1
    assert list(out["num_turns"]) == [4] * 8  # prompt + call + answer + final turn
    m = generation_metrics(out)
    assert m["multi_turn/num_turns/mean"] == 4.0 and m["multi_turn/tool_calls_total"] == 8.0
    assert m["multi_turn/malformed_calls"] == 4.0  # the bad JSON and the unregistered tool, per prompt
    assert m["multi_turn/tool_timeouts"] == 2.0 and m["multi_turn/tool_errors"] == 4.0  # errors: the malformed
    assert 0 < m["multi_turn/tool_token_share"] < 1
    assert all(isinstance(v, float) for v in m.values())
    texts = [tok.decode(out["responses"][i][tool[i]]) for i in (1, 2, 3)]
    assert "tool call is not valid" in texts[0] and "timed out" in texts[1] and "unknown tool 'shell'" in texts[2]


def test_single_turn_generation_is_one_engine_call():
    tok = build_chat_tokenizer()
    rollout_cfg = _rollout(64, n=2)
    w = _worker(tok, rollout_cfg)
    out = w.generate_sequences(_prompts(tok, ["What is 12 * 34?"]))
    P = out["prompts"].shape[1]
    assert len(w.engine.calls) == 1 and "num_turns" not in out
    assert torch.equal(out["attention_mask"][:, P:].float(), out["response_mask"])
    assert generation_metrics(out) == {}


def test_reward_sees_the_tool_answers(generated):
    from rewards.manager import RewardManager

    tok, _, _, out = generated
    rm = RewardManager(tok, num_workers=0)
    res = rm(out)
    # sample 0 of each prompt copied the calculator's answer; the scorer reads it after </tool_response>
    assert res.reward_extra_info["acc"] == [1.0, 0, 0, 0, 1.0, 0, 0, 0]
    assert res.reward_extra_info["tool_used"] == [1.0] * 8
    last = out["response_mask"].cumsum(1).argmax(1)  # the score sits on the last model token
    assert torch.equal(res.token_level_scores.argmax(1)[[0, 4]], last[[0, 4]])
    single = DataProto.from_dict({k: out[k] for k in ("responses", "response_mask")}, dict(out.non_tensor))
    assert rm(single).reward_extra_info["tool_used"] == [0.0] * 8  # under response_mask alone: no tool text


def test_dataset_prompts_show_the_tool_schemas(tmp_path):
    import json

    from trainer.dataset import PromptDataset

    tok = build_chat_tokenizer()
    path = tmp_path / "rows.jsonl"
    own = [{"type": "function", "function": {"name": "lookup", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}]
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "data_source": "x", "reward_model": {"ground_truth": "1"}},
            {"prompt": [{"role": "user", "content": "hi"}], "data_source": "x", "reward_model": {"ground_truth": "1"},
             "tools": json.dumps(own)}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    schemas = tool_schemas(_cfg(MT + "enable=true", MT + "tools=[calculator]"))
    ds = PromptDataset([str(path)], tok, 512, tools=schemas)
    texts = [tok.decode(r["input_ids"]) for r in ds.rows]
    assert '"calculator"' in texts[0] and '"lookup"' in texts[1] and '"calculator"' not in texts[1]
    plain = PromptDataset([str(path)], tok, 512)
    assert "<tools>" not in tok.decode(plain.rows[0]["input_ids"])


# ---- the actor loss ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kl_type", ["low_var_kl", "k3+", "mse"])
def test_p06_tool_tokens_get_no_gradient_through_the_actor_loss(generated, kl_type):
    """The worker's own loss function (policy loss + KL loss - entropy bonus over ``response_mask``): garbage in
    the per-token inputs at tool-answer and template positions, finite or not (a NaN reference log-prob there made
    the ``k3+`` and ``mse`` KL losses' gradients NaN), leaves every parameter gradient unchanged, while a change at
    one model token changes them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.workers.update import _actor_loss

    tok, _, _, out = generated
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=512, pad_token_id=tok.pad_token_id))
    role = SimpleNamespace(engine=model, use_remove_padding=True, sp=None, device=torch.device("cpu"))
    P = out["prompts"].shape[1]
    mask = out["response_mask"]
    not_model = mask == 0
    assert ((out["attention_mask"][:, P:] == 1) & not_model).any()
    from trainer.config import ActorConfig
    from trainer.config.packaged import packaged_section

    cfg = packaged_section(ActorConfig, "actor_rollout_ref.actor", entropy_coeff=0.01, use_kl_loss=True,
                           kl_loss_type=kl_type, kl_loss_coef=0.1, clip_ratio=0.2, clip_ratio_low=0.2,
                           clip_ratio_high=0.2, clip_ratio_c=3.0, policy_loss={"loss_mode": "vanilla"})
    base = {"old_log_probs": out["rollout_log_probs"] - 0.05,
            "advantages": torch.linspace(-1, 1, 8)[:, None].expand_as(mask).clone(),
            "ref_log_prob": out["rollout_log_probs"] - 0.1}

    def grads(columns):
        mb = DataProto.from_dict({**{k: out[k] for k in ("input_ids", "attention_mask", "position_ids", "responses",
                                                          "response_mask")}, **columns})
        model.zero_grad(set_to_none=True)
        loss, _ = _actor_loss(role, mb, cfg, 1.0, "token-mean", {})
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    ref = grads(base)
    noisy = {k: torch.where(not_model, torch.randn_like(v) * 50, v) for k, v in base.items()}
    assert torch.allclose(grads(noisy), ref, rtol=0, atol=1e-7)
    for bad in (float("nan"), float("inf"), -float("inf")):
        poisoned = {k: torch.where(not_model, torch.full_like(v, bad), v) for k, v in base.items()}
        assert torch.allclose(grads(poisoned), ref, rtol=0, atol=1e-7), bad
    row, col = torch.nonzero(mask)[3].tolist()
    moved = {k: v.clone() for k, v in base.items()}
    moved["advantages"][row, col] += 5.0
    assert not torch.allclose(grads(moved), ref, rtol=0, atol=1e-7)


# ---- end to end ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_e2e_synthetic_tool_logs_finite_multi_turn_metrics(tmp_path):
    """``python trainer/main.py data=synthetic_tool`` (Ray, 2 DeepSpeed workers, the python tool) for 2 short
    steps: the multi-turn metrics are logged every step and finite, the tool was called."""
    import math

    from tests.e2e_shared import run_main_forked
    from tests.e2e_utils import read_metrics

    out = str(tmp_path / "run")
    # the sandbox level is not under test here: accept the weakest, so a busy machine's failed probe cannot stop it
    tools = MT + "tools=[{class_name:python,config:{min_isolation:process}}]"
    run_main_forked(out, "data=synthetic_tool", tools, "data.warm_start_steps=20", "trainer.total_training_steps=2",
                  "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                  "actor_rollout_ref.rollout.n=2", timeout=300)
    steps = [r for r in read_metrics(out) if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("multi_turn/num_turns/mean", "multi_turn/tool_calls/mean", "multi_turn/tool_errors",
                    "multi_turn/tool_timeouts", "multi_turn/tool_seconds/sum", "multi_turn/tool_token_share",
                    "tool/python/isolation_level", "critic/score/mean", "actor/pg_loss"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (key, r.get(key))
        assert r["multi_turn/num_turns/max"] >= 3  # some sample called the tool and got an answer


def test_multi_worker_metrics_cover_every_workers_rows():
    """breakerD §4: the rows of two workers joined (``DataProto.concat``, what the worker group's dispatch does) give
    the ``multi_turn/*`` metrics of the whole batch, not of worker 0's rows: they are computed from the rows'
    per-sample columns. Worker 0's prompts make no tool call, worker 1's make two calls each (one malformed)."""
    from rollout.base import SamplingConfig
    from rollout.multiturn import MultiTurnConfig
    from rollout.multiturn.metrics import ROW_COLUMNS
    from tests.multiturn_utils import hermes
    from trainer.multi_turn import MultiTurnGenerator
    from trainer.roles import FORWARD_COLUMNS, UPDATE_COLUMNS, columns
    from trainer.workers.generation import generation_rows, prompt_lists

    tok, end = build_chat_tokenizer(), "<|im_end|>"

    def script(ctx, k):
        done, want = ctx.count("<tool_response>"), int(re.search(r"calls=(\d)", ctx).group(1))
        if done == 0 and want:
            return "bad <tool_call>\n{not json\n</tool_call>" + end
        return (f"s{done} " + hermes("calculator", expression=f"{done + 1} * 1000") + end) if done < want \
            else f"#### {done}{end}"

    def worker(questions):
        gen = MultiTurnGenerator(ScriptedEngine(tok, script), MultiTurnConfig(enable=True, tools=["calculator"]), tok)
        prompts = _prompts(tok, [f"{q} What is 2 * 3?" for q in questions])
        g = gen.generate(prompt_lists(prompts), SamplingConfig(n=2, max_new_tokens=256))
        rows = generation_rows(prompts, g, 2)
        rows.meta.update(g.metrics)  # the worker's call metrics, as generate_sequences puts them
        return rows

    parts = [worker(["calls=0", "calls=0"]), worker(["calls=2", "calls=2"])]
    batch = DataProto.concat(parts)
    m = generation_metrics(batch)
    assert set(ROW_COLUMNS) <= set(batch.non_tensor)
    assert m["multi_turn/tool_calls_total"] == 8.0 and m["multi_turn/tool_calls/mean"] == 1.0  # worker 0 alone: 0
    assert m["multi_turn/tool_calls/max"] == 2.0
    assert m["multi_turn/malformed_calls"] == 4.0 and m["multi_turn/tool_errors"] == 4.0
    assert m["multi_turn/assistant_turns/mean"] == 2.0 and m["multi_turn/assistant_turns/max"] == 3.0
    assert m["multi_turn/num_turns/mean"] == 4.0 and m["multi_turn/num_turns/min"] == 2.0
    assert m["multi_turn/stop_reason/no_tool_call"] == 1.0
    # the totals are the sums of the workers' own figures, the means those of the whole batch
    w0, w1 = (generation_metrics(p) for p in parts)
    for key in ("tool_calls_total", "tool_errors", "malformed_calls", "tool_timeouts", "tool_seconds/sum"):
        assert m[f"multi_turn/{key}"] == pytest.approx(w0[f"multi_turn/{key}"] + w1[f"multi_turn/{key}"]), key
    for key in ("tool_calls/mean", "assistant_turns/mean", "num_turns/mean", "dropped_after_call"):
        assert m[f"multi_turn/{key}"] == pytest.approx((w0[f"multi_turn/{key}"] + w1[f"multi_turn/{key}"]) / 2), key
    tokens = [p.non_tensor["mt_tool_tokens"].sum() + 0.0 for p in parts]
    assert m["multi_turn/tool_token_share"] == pytest.approx(
        sum(tokens) / float(batch["attention_mask"][:, batch["prompts"].shape[1]:].sum()))
    assert m["multi_turn/tool_seconds/max"] == max(w0["multi_turn/tool_seconds/max"], w1["multi_turn/tool_seconds/max"])
    assert all(isinstance(v, float) for v in m.values())
    # a subset of rows (a filter, a chunk) gives that subset's figures; the columns survive index/chunk/concat
    assert generation_metrics(batch.index([0, 1, 2, 3]))["multi_turn/tool_calls_total"] == 0.0
    assert generation_metrics(DataProto.concat(batch.chunk(4)[::-1])) == m
    # the worker calls ship none of them (only the columns the forwards and the update read)
    for keys in (FORWARD_COLUMNS, UPDATE_COLUMNS):
        assert not set(ROW_COLUMNS) & set(columns(batch, keys).non_tensor)
