"""A numeric setting out of its range stops the run before any worker starts, in one line naming the key, the value
and the range (found by trying them: each of these used to start the workers and then either fail there with a
traceback -- torch's AdamW, the rollout's sampling config, the KL estimator, the value loss -- or train silently
wrong: a negative clip ratio inverts the PPO clip, ``ppo_epochs=0`` trains nothing, a SAPO temperature of 0 gives a
NaN loss every step)."""
import os

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.launch import ConfigError, resolve_config, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return resolve_config(compose(config_name="ppo_trainer", overrides=list(overrides)))


BAD = [
    (f"{A}.clip_ratio=-0.2", [f"{A}.clip_ratio=-0.2", "> 0"]),
    (f"{A}.clip_ratio_high=-1", [f"{A}.clip_ratio_high=-1", "> 0"]),
    (f"{A}.clip_ratio_low=0", [f"{A}.clip_ratio_low=0", "> 0"]),
    (f"{A}.ppo_epochs=0", [f"{A}.ppo_epochs=0", ">= 1"]),
    (f"{A}.ppo_epochs=-1", [f"{A}.ppo_epochs=-1", ">= 1"]),
    ("critic.ppo_epochs=0", ["critic.ppo_epochs=0", ">= 1"]),
    ("critic.cliprange_value=-1", ["critic.cliprange_value=-1", ">= 0"]),
    # DeepSpeed clips only when > 0: a negative clip was accepted and silently trained without clipping
    (f"{A}.grad_clip=-1", [f"{A}.grad_clip=-1", ">= 0", "0: no clipping"]),
    ("critic.grad_clip=-0.5", ["critic.grad_clip=-0.5", ">= 0", "0: no clipping"]),
    (f"{A}.tau_pos=0", [f"{A}.tau_pos=0", "> 0"]),
    (f"{A}.tau_neg=-1", [f"{A}.tau_neg=-1", "> 0"]),
    (f"{A}.policy_loss.clip_cov_ratio=2", ["clip_cov_ratio=2", "<= 1"]),
    (f"{A}.kl_loss_type=k9", [f"{A}.kl_loss_type='k9'", "low_var_kl"]),
    ("algorithm.kl_penalty=zz", ["algorithm.kl_penalty='zz'", "low_var_kl"]),
    (f"{A}.optim.betas=[0.9,1.5]", [f"{A}.optim.betas=[0.9, 1.5]", "[0, 1)"]),
    (f"{A}.optim.betas=[0.9]", [f"{A}.optim.betas=[0.9]", "two numbers"]),
    (f"{A}.optim.weight_decay=-0.1", [f"{A}.optim.weight_decay=-0.1", ">= 0"]),
    ("critic.optim.weight_decay=-1", ["critic.optim.weight_decay=-1", ">= 0"]),
    (f"{R}.top_p=1.5", [f"{R}.top_p=1.5", "<= 1"]),
    (f"{R}.top_p=0", [f"{R}.top_p=0", "> 0"]),
    (f"{R}.top_k=-5", [f"{R}.top_k=-5", "-1 or 0"]),
    (f"{R}.val_kwargs.top_p=0", [f"{R}.val_kwargs.top_p=0", "> 0"]),
    (f"{R}.val_kwargs.top_k=-2", [f"{R}.val_kwargs.top_k=-2"]),
    (f"{R}.val_kwargs.n=0", [f"{R}.val_kwargs.n=0", ">= 1"]),
    (f"{A}.optim.lr_scheduler_type=cosin", [f"{A}.optim.lr_scheduler_type='cosin'", "'cosine'"]),
    ("critic.optim.lr_scheduler_type=step", ["critic.optim.lr_scheduler_type='step'", "'linear'"]),
    (f"{A}.ppo_max_token_len_per_gpu=0", [f"{A}.ppo_max_token_len_per_gpu=0", ">= 1"]),
    (f"{R}.log_prob_max_token_len_per_gpu=0", [f"{R}.log_prob_max_token_len_per_gpu=0", ">= 1"]),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=-1",
     ["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=-1", ">= 1"]),
]


DYNAMIC = [f"{A}.use_dynamic_bsz=true", f"{R}.log_prob_use_dynamic_bsz=true",
           "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true"]


@pytest.mark.parametrize("override,needles", BAD, ids=[b[0] for b in BAD])
def test_out_of_range_value_is_refused_before_start_up(override, needles):
    dynamic = DYNAMIC if "max_token_len" in override else []   # a token budget is read with dynamic batches only
    with pytest.raises(ConfigError) as info:
        validate(_cfg(override, "algorithm=gae", *dynamic))
    lines = [ln for ln in str(info.value).splitlines() if any(n in ln for n in needles[:1])]
    assert len(lines) == 1, str(info.value)
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("override", [f"{A}.clip_ratio_low=0.2", f"{A}.clip_ratio_high=0.28", f"{A}.ppo_epochs=2",
                                      f"{A}.kl_loss_type=k3+", "algorithm.kl_penalty=low_var_kl", f"{R}.top_p=1.0",
                                      f"{R}.top_k=0", f"{R}.top_k=50", f"{A}.optim.betas=[0.9,0.95]",
                                      f"{A}.optim.weight_decay=0.1", f"{R}.val_kwargs.top_p=0.7",
                                      "critic.cliprange_value=0", f"{A}.grad_clip=0",
                                      f"{A}.optim.lr_scheduler_type=linear", f"{A}.ppo_max_token_len_per_gpu=0"])
def test_values_in_range_pass(override):
    validate(_cfg(override, "algorithm=gae"))


def test_cli_stops_in_one_line_before_workers(tmp_path):
    proc = run_cli(str(tmp_path / "out"), f"{R}.top_p=1.5", forked=True)
    assert_one_line_error(proc, f"{R}.top_p=1.5", "<= 1")
    assert not os.path.exists(tmp_path / "out" / "init_model")


def test_a_negative_prm_grad_clip_is_refused_like_the_actors():
    """PRIME's PRM clips with its own ``reward_model.model.optim.grad_clip``: a negative one meant no clipping."""
    with pytest.raises(ConfigError) as info:
        validate(_cfg("algorithm=prime", "reward_model.model.optim.grad_clip=-1"))
    lines = [ln for ln in str(info.value).splitlines() if "reward_model.model.optim.grad_clip" in ln]
    assert len(lines) == 1 and "=-1" in lines[0] and ">= 0" in lines[0], str(info.value)
    validate(_cfg("algorithm=prime", "reward_model.model.optim.grad_clip=0"))  # 0: no clipping, allowed


REF = "actor_rollout_ref.ref"
SHORT_BUDGETS = [
    ((f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=4", f"{R}.log_prob_max_token_len_per_gpu=64"),
     f"{A}.ppo_max_token_len_per_gpu=4 tokens with {A}.use_dynamic_bsz=true"),
    ((f"{R}.log_prob_use_dynamic_bsz=true", f"{R}.log_prob_max_token_len_per_gpu=10"),
     f"{R}.log_prob_max_token_len_per_gpu=10 tokens with {R}.log_prob_use_dynamic_bsz=true"),
    ((f"{A}.use_kl_loss=true", f"{REF}.log_prob_use_dynamic_bsz=true", f"{REF}.log_prob_max_token_len_per_gpu=4"),
     f"{REF}.log_prob_max_token_len_per_gpu=4 tokens"),
    (("algorithm=gae", "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=64",
      "critic.forward_max_token_len_per_gpu=4"), "critic.forward_max_token_len_per_gpu=4 tokens"),
    (("trainer.n_gpus_per_node=2", f"{A}.ulysses_sequence_parallel_size=2", f"{A}.use_dynamic_bsz=true",
      f"{A}.ppo_max_token_len_per_gpu=8", f"{R}.log_prob_max_token_len_per_gpu=64"),
     f"{A}.ppo_max_token_len_per_gpu=8 x {A}.ulysses_sequence_parallel_size=2 = 16 tokens"),
    # Megatron's tensor-parallel ranks hold whole sequences: the budget is not multiplied by TP
    (("trainer.device=cuda", "trainer.strategy=megatron", f"{A}.megatron.tensor_model_parallel_size=2",
      f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=10", f"{R}.log_prob_max_token_len_per_gpu=64"),
     f"{A}.ppo_max_token_len_per_gpu=10 tokens"),
    (("algorithm=prime", f"{A}.use_dynamic_bsz=true", "reward_model.max_token_len_per_gpu=4"),
     "reward_model.max_token_len_per_gpu=4 tokens with reward_model.use_dynamic_bsz=true"),
]


@pytest.mark.parametrize("overrides,needle", SHORT_BUDGETS, ids=[" ".join(s[0]) for s in SHORT_BUDGETS])
def test_a_dynamic_token_budget_below_the_longest_sequence_is_refused(overrides, needle):
    """verl asserts a token budget holds the longest sequence (prompt + response, 16 + 2 tokens here)."""
    with pytest.raises(ConfigError) as info:
        validate(_cfg(*overrides))
    lines = [ln for ln in str(info.value).splitlines() if needle in ln]
    assert len(lines) == 1 and "the longest sequence" in lines[0] and "= 18" in lines[0], str(info.value)


@pytest.mark.parametrize("overrides", [
    (f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=18"),
    (f"{A}.use_dynamic_bsz=false", f"{A}.ppo_max_token_len_per_gpu=4"),  # not read (warned as ignored)
    (f"{REF}.log_prob_use_dynamic_bsz=true", f"{REF}.log_prob_max_token_len_per_gpu=4"),  # no reference model
    ("critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=4"),  # no critic
    ("trainer.n_gpus_per_node=2", f"{A}.ulysses_sequence_parallel_size=2", f"{A}.use_dynamic_bsz=true",
     f"{A}.ppo_max_token_len_per_gpu=9")])  # 9 per SP rank x 2 = 18
def test_a_token_budget_that_holds_the_longest_sequence_or_is_not_read_passes(overrides):
    validate(_cfg(*overrides))


def test_the_sequence_parallel_size_of_a_role_that_does_not_run_is_not_checked():
    """A reference model's Ulysses size (verl's DAPO script sets one with every KL term off) is warned about as
    ignored, not refused against the workers or the heads, when no KL term needs a reference model; with one it is
    checked as the actor's is."""
    validate(_cfg(f"{REF}.ulysses_sequence_parallel_size=3"))
    validate(_cfg("critic.ulysses_sequence_parallel_size=3"))  # no critic
    for overrides in ((f"{A}.use_kl_loss=true",), ("algorithm=gae",)):
        key = f"{REF}.ulysses_sequence_parallel_size" if overrides[0].startswith(A) else "critic.ulysses_sequence_parallel_size"
        with pytest.raises(ConfigError) as info:
            validate(_cfg(*overrides, f"{key}=3"))
        assert f"{key}=3 must divide" in str(info.value), str(info.value)


def test_a_micro_batch_that_does_not_divide_names_its_full_key():
    with pytest.raises(ConfigError) as info:
        validate(_cfg(f"{A}.ppo_micro_batch_size_per_gpu=7"))
    assert f"not divisible by {A}.ppo_micro_batch_size_per_gpu=7" in str(info.value)
    with pytest.raises(ConfigError) as info:
        validate(_cfg("trainer.n_gpus_per_node=3", "data.train_batch_size=6", f"{A}.ppo_mini_batch_size=1",
                      f"{R}.n=1"))
    assert f"{A}.ppo_mini_batch_size*{R}.n=1 rows must be divisible" in str(info.value)
