"""Estimator traits live in the registry; the config checks and the trainer ask it (case P31)."""
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.test_launch_checks import _cfg
from trainer import adv_inputs, core_algos as ca
from trainer.launch import ConfigError, resolve_config, validate
from trainer.protocol import DataProto


def test_traits_of_the_built_in_estimators():
    specs = ca.ADV_ESTIMATOR_SPECS
    assert {k for k, s in specs.items() if s.needs_critic} == {"gae"}
    assert {k for k, s in specs.items() if s.group_based} >= {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline",
                                                              "opo", "grpo_passk", "optimal_token_baseline"}
    assert specs["remax"].inputs == ("reward_baselines",) and specs["gae"].inputs == ("values",)
    assert specs["grpo"].config_kwargs == ("norm_adv_by_std_in_grpo",)
    assert set(specs) == set(ca.ADV_ESTIMATOR_REGISTRY)


def test_unknown_names_list_every_registered_name():
    with pytest.raises(ConfigError) as exc:
        validate(_cfg("algorithm.adv_estimator=grpoo"))
    assert all(repr(name) in str(exc.value) for name in ca.ADV_ESTIMATOR_REGISTRY)
    with pytest.raises(ConfigError) as exc:
        validate(_cfg("actor_rollout_ref.actor.policy_loss.loss_mode=ppo"))
    assert "policy_loss.loss_mode='ppo'" in str(exc.value)
    assert all(repr(name) in str(exc.value) for name in ca.POLICY_LOSS_REGISTRY)


def test_p31_estimator_whose_input_no_stage_makes_is_refused_naming_it():
    @ca.register_adv_est("unit_test_unmade_input", inputs=("no_stage_makes_this",))
    def unmade(token_level_rewards, response_mask, index=None, no_stage_makes_this=None, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        with pytest.raises(ConfigError, match=r"unit_test_unmade_input needs the batch column\(s\) "
                                              r"\['no_stage_makes_this'\]"):
            validate(_cfg("algorithm.adv_estimator=unit_test_unmade_input"))
    finally:
        ca.ADV_ESTIMATOR_REGISTRY.pop("unit_test_unmade_input")
        ca.ADV_ESTIMATOR_SPECS.pop("unit_test_unmade_input")
    validate(_cfg("algorithm.adv_estimator=optimal_token_baseline"))  # the actor's log-prob pass makes its input
    with pytest.raises(ConfigError, match="gae needs a critic.*critic.enable=false"):
        validate(_cfg("algorithm=gae", "critic.enable=false"))
    validate(_cfg("algorithm.adv_estimator=remax"))      # its input has a producer: the greedy baseline rollout
    validate(_cfg("algorithm=gae"))                      # critic.enable null: on for an estimator needing one
    assert resolve_config(_hydra("algorithm=gae"))["critic"]["enable"] is True
    assert resolve_config(_hydra("algorithm=grpo"))["critic"]["enable"] is False


def _hydra(*overrides):
    import os

    from hydra import compose, initialize_config_dir

    from tests.e2e_utils import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def test_rollout_is_weights_count_as_made_exactly_when_the_rollout_correction_is_on():
    # the rollout-correction stage (algorithm.rollout_correction.rollout_is) puts rollout_is_weights in the batch
    off = adv_inputs.stage_columns(resolve_config(_cfg()))
    on = adv_inputs.stage_columns(resolve_config(_cfg("algorithm.rollout_correction.rollout_is=token")))
    seq = adv_inputs.stage_columns(resolve_config(_cfg("algorithm.rollout_correction.rollout_is=sequence")))
    assert "rollout_is_weights" not in off
    assert "rollout_is_weights" in on and "rollout_is_weights" in seq


@contextmanager
def _length_baseline_estimator():
    """A test-only estimator whose baseline is the response length, added the way the registry's docstring says:
    one registry entry (declaring its new input, ``response_lengths``, with the input's producer) plus one function.
    Registered for the ``with`` block; yields its name."""
    @ca.register_adv_est("unit_test_length_baseline",
                         inputs={"response_lengths": lambda step, batch: batch["response_mask"].sum(-1)})
    def length_baseline(token_level_rewards, response_mask, index=None, response_lengths=None, **kwargs):
        adv = (token_level_rewards.sum(-1) - response_lengths)[:, None] * response_mask
        return adv, adv

    try:
        yield "unit_test_length_baseline"
    finally:
        ca.ADV_ESTIMATOR_REGISTRY.pop("unit_test_length_baseline")
        ca.ADV_ESTIMATOR_SPECS.pop("unit_test_length_baseline")


def test_p31_new_estimator_with_a_new_input_is_one_entry_plus_one_function():
    """The test-only estimator: its input and producer are declared in its registry entry; the config check
    accepts it, the trainer's input stage makes the column, and compute_advantage passes it."""
    with _length_baseline_estimator() as name:
        validate(_cfg(f"algorithm.adv_estimator={name}"))
        spec = ca.get_adv_estimator_spec(name)
        r = torch.tensor([[0.0, 3.0], [0.0, 1.0]])
        batch = DataProto.from_dict({"token_level_rewards": r, "response_mask": torch.tensor([[1.0, 1], [1, 0]])})
        timing = {}
        adv_inputs.produce_inputs(None, batch, spec, timing)
        ca.compute_advantage(batch, name)
        assert batch["advantages"].tolist() == [[1.0, 1.0], [0.0, 0.0]]   # score - length: 3 - 2, 1 - 1
        assert "adv_inputs/response_lengths" in timing


def test_p31_the_test_only_estimator_trains_through_the_trainers_step():
    """The same estimator, chosen by ``algorithm.adv_estimator`` alone, through ``RayPPOTrainer.train_step`` with a
    fake actor group and reward (tests/test_dynamic_sampling_train_step.py): the hooks the trainer builds from the
    config produce the new input and compute the estimator's advantages, and the actor's update receives them. No
    trainer code names the estimator."""
    from tests.e2e_utils import resolved_config
    from tests.test_dynamic_sampling_train_step import R, FakeActor, _row, make_reward
    from trainer.dataset import PromptLoader
    from trainer.ppo_trainer import RayPPOTrainer

    class VaryingLengths(FakeActor):
        """Responses of 1..R tokens (row i: 1 + i % R), so that the length baseline differs between rows."""

        def __init__(self):
            super().__init__()
            self.updated = []

        def dispatch_all(self, method, prompts):
            out = super().dispatch_all(method, prompts)
            lengths = torch.arange(len(out)) % R + 1
            out["response_mask"] = (torch.arange(R)[None] < lengths[:, None]).float()
            return out

        def dispatch_dp_metrics(self, method, data):
            self.updated.append((method, data))
            return super().dispatch_dp_metrics(method, data)

    with _length_baseline_estimator() as name:
        cfg = resolved_config(f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=2",
                              "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                              "actor_rollout_ref.actor.use_kl_loss=false")
        validate(cfg)
        tok = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 0})()
        rows = [_row(0, "mixed", 2), _row(1, "wrong", 2)]
        tr = RayPPOTrainer(cfg, tok, PromptLoader(rows, 2, 0, shuffle=False), None, make_reward(), None)
        tr.global_step = 1
        actor = VaryingLengths()
        tr.roles.attach("actor", actor)
        timing = {}
        trained, metrics = tr.train_step(tr.loader.next_batch()[0], timing)
    mask = trained["response_mask"]
    score = trained["token_level_scores"].sum(-1)
    assert mask.sum(-1).tolist() == [1.0, 2.0, 3.0, 1.0] and score.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert torch.equal(trained["response_lengths"], mask.sum(-1))                  # made by the entry's producer
    assert torch.equal(trained["advantages"], (score - mask.sum(-1))[:, None] * mask)   # the estimator's formula
    assert "adv_inputs/response_lengths" in timing and "adv" in timing
    (method, sent), = actor.updated
    assert method == "update_actor" and torch.equal(sent["advantages"], trained["advantages"])


def test_p31_input_without_producer_fails_with_its_name():
    spec = ca.EstimatorSpec("x", lambda *a, **k: None, inputs=("nothing_makes_this",))
    with pytest.raises(ValueError, match="needs the batch column 'nothing_makes_this'"):
        adv_inputs.produce_inputs(None, DataProto.from_dict({"response_mask": torch.ones(1, 1)}), spec)
    with pytest.raises(ValueError, match=r"remax' needs the batch column\(s\) \['reward_baselines'\]"):
        ca.compute_advantage(DataProto.from_dict({"token_level_rewards": torch.ones(1, 1),
                                                  "response_mask": torch.ones(1, 1)}), "remax")


class _FakeActorGroup:
    def __init__(self):
        self.calls = []

    def dispatch_all(self, method, prompts):
        """Greedy 'generation': the response is the prompt's last token (a stand-in for the engine)."""
        self.calls.append((method, prompts))
        last = prompts["input_ids"][:, -1:]
        return DataProto.from_dict({"responses": last, "response_mask": torch.ones_like(last).float()},
                                   dict(prompts.non_tensor))


def test_p31_remax_baseline_is_one_greedy_rollout_per_prompt_scored_by_the_same_reward():
    # 3 prompts x 2 samples, rows interleaved by uid; the prompt's last token is 10 + prompt number
    uids = ["p0", "p1", "p0", "p2", "p1", "p2"]
    last = torch.tensor([10, 11, 10, 12, 11, 12])
    prompts = torch.stack([torch.tensor([0, 1, int(t)]) for t in last])
    batch = DataProto.from_dict({"prompts": prompts, "attention_mask": torch.ones(6, 5, dtype=torch.long),
                                 "response_mask": torch.ones(6, 2)}, {"uid": uids, "data_source": ["d"] * 6})
    scored = []

    def reward_fn(rows):
        scored.append(rows)
        return SimpleNamespace(token_level_scores=rows["responses"].float() * 0.5)

    from trainer.hooks.base import StepContext
    from trainer.roles import Roles, actor_role

    actor_wg = _FakeActorGroup()
    roles = Roles([actor_role(resolve_config(_cfg()))])
    roles.attach("actor", actor_wg)
    step = StepContext(global_step=3, world=2, roles=roles, reward_fn=reward_fn)
    spec = ca.get_adv_estimator_spec("remax")
    adv_inputs.produce_inputs(step, batch, spec)
    assert batch["reward_baselines"].tolist() == [5.0, 5.5, 5.0, 6.0, 5.5, 6.0]
    (method, sent), = actor_wg.calls
    assert method == "generate_sequences" and sent.meta["greedy"] is True
    assert len(sent) == 4 and sent["uid"].tolist()[:3] == ["p0", "p1", "p2"]  # one per prompt, padded to 2 workers
    assert sent["input_ids"].shape == (4, 3) and sent["attention_mask"].shape == (4, 3)  # the prompt part only
    assert len(scored) == 1 and len(scored[0]) == 3                                     # padding dropped
    batch["token_level_rewards"] = torch.tensor([[0.0, 1.0]] * 6)
    ca.compute_advantage(batch, "remax")
    assert torch.equal(batch["advantages"], batch["returns"] - batch["reward_baselines"][:, None])



def test_gdpo_config_needs_component_keys_and_takes_no_penalty_of_the_summed_score():
    gdpo = "algorithm.adv_estimator=gdpo"
    with pytest.raises(ConfigError, match=r"adv_estimator=gdpo normalises each reward component on its own: set "
                                          r"algorithm.gdpo_reward_keys=\[\.\.\.\]"):
        validate(_cfg(gdpo))
    keys = "algorithm.gdpo_reward_keys=[acc,format]"
    cfg = resolve_config(_cfg(gdpo, keys, "reward=format"))
    validate(cfg)
    assert adv_inputs.reward_component_keys(cfg) == ("acc", "format")
    assert "reward_components" in adv_inputs.stage_columns(cfg, ca.get_adv_estimator_spec("gdpo"))
    validate(_cfg(gdpo, keys, "algorithm.gdpo_reward_weights=[1.0,0.5]"))
    validate(_cfg(gdpo, keys, "reward_model.reward_manager=gdpo"))  # verl's manager keeping the components
    for bad, msg in ((["algorithm.gdpo_reward_weights=[1.0]"], r"gdpo_reward_weights=\[1.0\]; expected null or 2 "
                                                               r"finite numbers"),
                     (["algorithm.gdpo_reward_keys=[acc,acc]"], "expected a list of distinct non-empty names"),
                     (["algorithm.use_kl_in_reward=true"], "the KL penalty goes into the summed reward"),
                     (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=1"],
                      "return a length component from the scorer")):
        with pytest.raises(ConfigError, match=msg):
            validate(_cfg(gdpo, keys, *bad))
    with pytest.raises(ConfigError, match=r"gdpo_reward_keys=\['acc'\] is set, but algorithm.adv_estimator=grpo "
                                          r"does not read reward components"):
        validate(_cfg("algorithm.gdpo_reward_keys=[acc]"))
    assert adv_inputs.reward_component_keys(resolve_config(_cfg())) == ()


class _EmptyDecode:
    """A tokenizer stand-in: every response decodes to the empty string."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["" for _ in rows]


def _number_scorer(solution_str, ground_truth):
    return 0.0


def _dict_without_format(solution_str, ground_truth):
    return {"score": 0.0, "acc": 0.0}


def _both_components(solution_str, ground_truth):
    return {"score": 0.0, "acc": 0.0, "format": 0.0}


def _raises_on_empty(solution_str, ground_truth):
    raise ValueError("no answer")


@pytest.mark.parametrize("scorer,needles", [
    ("synthetic/digits", ["data_source='synthetic/digits'", "returned a number"]),
    (_number_scorer, ["returned a number"]),
    (_dict_without_format, ["lacks the reward component 'format'"]),
    (_both_components, None),
    (_raises_on_empty, None),  # cannot be judged from an empty response: left to the run
])
def test_p31_gdpo_components_the_scorer_does_not_return_are_refused_before_start_up(scorer, needles):
    """The reward stage raised at the first step, after the workers had started."""
    from rewards.manager import RewardManager
    from trainer.config_checks import check_reward_scorers

    route = scorer if isinstance(scorer, str) else None
    make = lambda: RewardManager(_EmptyDecode(), scorer=None if route else scorer,  # noqa: E731
                                 component_keys=("acc", "format"), num_workers=1)
    ds = SimpleNamespace(rows=[{"data_source": route or "x", "reward_model": {"ground_truth": "7"}}], files=["f"])
    if needles is None:
        check_reward_scorers(make, "data_source", [ds, None])
        return
    with pytest.raises(ConfigError) as info:
        check_reward_scorers(make, "data_source", [ds, None])
    for n in ["algorithm.gdpo_reward_keys=['acc', 'format']", "empty response", *needles]:
        assert n in str(info.value), (n, str(info.value))


@pytest.mark.parametrize("est", ["gae", "remax", "grpo", "gdpo"])
def test_p31_prime_with_an_estimator_it_never_runs_is_refused_before_start_up(est):
    """PRIME's advantages are its own (RLOO of each reward source): another ``adv_estimator`` was accepted and never
    ran (with gae a critic was built and trained every step for nothing; with remax no baseline rollout ran)."""
    with pytest.raises(ConfigError, match=rf"^algorithm\.adv_estimator={est} with algorithm\.use_prime=true: PRIME "
                                          rf"computes its own advantages .* so {est} would never run; expected rloo"):
        validate(_cfg("algorithm=prime", f"algorithm.adv_estimator={est}"))
    validate(_cfg("algorithm=prime"))
