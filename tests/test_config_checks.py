"""trainer.config_checks.ErrorCollector: a bad value is reported by its own line only, not again by the checks
that read it (a group estimator's n >= 2, a divisibility)."""
from __future__ import annotations

import logging
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.config_checks import ConfigError, ErrorCollector, named_key
from trainer.overrides import CONFIG_DIR

N = "actor_rollout_ref.rollout.n"
GROUP = "algorithm.adv_estimator=grpo compares the samples of one prompt, but {N}=0: every advantage would be 0"


def _compose(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


@pytest.mark.parametrize("algo,n", [("grpo", 0), ("grpo", -1), ("rloo", 0), ("dr_grpo", -3)])
def test_a_refused_rollout_n_is_one_line_under_a_group_estimator(algo, n):
    from trainer.config_validate import validate

    with pytest.raises(ConfigError) as info:
        validate(OmegaConf.to_container(_compose(f"algorithm={algo}", f"{N}={n}"), resolve=True))
    assert str(info.value) == f"{N}={n}; expected >= 1"


def test_the_entry_points_every_error_pass_shows_rollout_n_once():
    """What ``python trainer/main.py actor_rollout_ref.rollout.n=0`` prints (:func:`start_errors` over the
    launcher's checks): the direct line only."""
    from trainer.config_types import start_errors
    from trainer.launch import prestart

    defaults = OmegaConf.to_container(_compose(), resolve=False)
    logging.disable(logging.WARNING)
    try:
        lines = start_errors(_compose(f"{N}=0", "algorithm.adv_estimator=grpo"), defaults, prestart)
    finally:
        logging.disable(logging.NOTSET)
    assert lines == [f"{N}=0; expected >= 1"]


@pytest.mark.parametrize("order", [1, -1])
def test_a_line_that_reads_a_refused_key_is_left_out_whichever_comes_first(order):
    errors = ErrorCollector()
    for m in [f"{N}=0; expected >= 1", GROUP.format(N=N)][::order]:
        errors.add(m)
    assert errors.messages == [f"{N}=0; expected >= 1"]


def test_lines_about_other_keys_or_the_same_key_are_kept():
    direct = f"{N}=0; expected >= 1"
    kept = [f"{N}=0 must divide data.train_batch_size=32",  # the same key's own line
            "actor_rollout_ref.rollout.n_gpus=0; expected >= 1",  # a longer key
            "trainer.val_before_train=true: validation samples greedily with actor_rollout_ref.rollout."
            "val_kwargs.n=4",  # a line that reads another key ending in .n
            "algorithm.adv_estimator=grpo compares the samples of one prompt: set rollout.n >= 2"]  # not the key=
    errors = ErrorCollector([direct, *kept])
    assert errors.messages == [direct, *kept]


def test_a_line_on_a_combination_of_values_hides_no_other_line():
    """``trainer.strategy=megatron`` is a valid value refused only beside ``critic.enable``: the LoRA line that
    quotes it is another error of its own."""
    critic = "trainer.strategy=megatron has no critic worker yet, but critic.enable is on (set critic.enable=false)"
    lora = ("actor_rollout_ref.model.lora_rank=8 with trainer.strategy=megatron: LoRA adapters are built on the "
            "DeepSpeed path only; use trainer.strategy=deepspeed or lora_rank=0")
    for order in (1, -1):
        assert ErrorCollector([critic, lora][::order]).messages == [critic, lora][::order]
    other_value = f"algorithm.adv_estimator=grpo needs groups, but {N}=1: every advantage would be 0"
    assert ErrorCollector([f"{N}=0; expected >= 1", other_value]).messages == [f"{N}=0; expected >= 1", other_value]


def test_the_entry_point_shows_both_lines_of_megatron_with_lora_and_a_critic():
    from trainer.config_types import start_errors
    from trainer.launch import prestart

    defaults = OmegaConf.to_container(_compose(), resolve=False)
    logging.disable(logging.WARNING)
    try:
        lines = start_errors(_compose("trainer.strategy=megatron", "actor_rollout_ref.model.lora_rank=8",
                                      "critic.enable=true", "algorithm.adv_estimator=gae"), defaults, prestart)
    finally:
        logging.disable(logging.NOTSET)
    assert any(m.startswith("actor_rollout_ref.model.lora_rank=8 with trainer.strategy=megatron") for m in lines)
    assert any(m.startswith("trainer.strategy=megatron has no critic worker") for m in lines), lines


@pytest.mark.parametrize("message,key", [
    (f"{N}=0; expected >= 1", N), ("data.max_rows=None; expected an integer", "data.max_rows"),
    ("rollout=vllm but vLLM is not installed", None),
    ("trainer.nnodes*trainer.n_gpus_per_node=0; expected >= 1", None)])
def test_named_key_is_the_dotted_key_a_line_starts_with(message, key):
    assert named_key(message) == key


@pytest.mark.parametrize("overrides, line, copies", [
    (("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=0"),
     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=0; expected an integer >= 1",
     ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")),
    (("algorithm=gae", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"),
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0; expected >= 1",
     ("critic.forward_micro_batch_size_per_gpu",))])
def test_keys_that_copy_a_refused_value_add_no_line(overrides, line, copies):
    """The ref's and rollout's token budgets copy the actor's, the critic's micro-batches the actor's (through its
    own ``ppo_micro_batch_size_per_gpu``): one line, where the value was written."""
    from trainer.config_types import all_errors
    from trainer.launch import prestart

    cfg = _compose(*overrides)
    logging.disable(logging.WARNING)
    try:
        first = ConfigError("\n".join([line] + [f"{k}=0; expected an integer >= 1" for k in copies]))
        assert str(all_errors(cfg, first, prestart)) == line
    finally:
        logging.disable(logging.NOTSET)


def test_copied_keys_resolve_relative_paths_and_a_key_set_apart_is_kept():
    from trainer.config_types import copied_keys, without_copies

    copies = copied_keys(_compose("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096"))
    assert copies["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"] == \
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"  # ${..actor.ppo_max_token_len_per_gpu}
    assert copies["critic.forward_micro_batch_size_per_gpu"] == "critic.ppo_micro_batch_size_per_gpu"  # ${.x}
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu" not in copies  # set apart: its own value
    lines = ["a.b=0; expected >= 1", "c.d=0; expected >= 1", "e.f=0; expected >= 1"]
    assert without_copies(lines, {"c.d": "x.y", "x.y": "a.b", "e.f": "e.f"}) == [lines[0], lines[2]]
    assert copied_keys({"a": "${b}"}) == {}  # a plain mapping has no interpolations left


def test_a_copy_refused_for_another_reason_keeps_its_line():
    """The reference's token budget copies the actor's, but is checked with the reference's own sequence-parallel
    size: following the actor's line alone would fail again on the reference's."""
    from trainer.config_types import without_copies

    copies = {"r.budget": "a.budget", "r.micro": "a.micro"}
    lines = ["a.budget=8 x a.sp=2 = 16 tokens is less than the longest sequence, 18",
             "r.budget=8 tokens is less than the longest sequence, 18",
             "a.micro=0; expected >= 1", "r.micro=0 rows x r.sp=1: too few; expected >= 2"]
    assert without_copies(lines, copies) == lines
    assert without_copies(["a.micro=0; expected >= 1", "r.micro=0; expected an integer >= 1"], copies) == \
        ["a.micro=0; expected >= 1"]  # the same value refused by the same kind of check: once


def test_a_copy_refused_with_its_sources_value_and_expectation_adds_no_line():
    """A token budget too small for the longest sequence: the rollout's copy of the actor's budget, checked with the
    same sizes and the copied switch, is mended with the actor's (one line); a copy checked with its own
    sequence-parallel size, or whose switch is set apart, is not."""
    from trainer.config_types import without_copies

    copies = {"r.budget": "a.budget", "q.budget": "a.budget", "r.dyn": "a.dyn"}
    lines = ["a.budget=8 tokens with a.dyn=true is less than 18; expected >= 18",
             "r.budget=8 tokens with r.dyn=true is less than 18; expected >= 18",
             "q.budget=8 x q.sp=1 tokens is less than 18; expected >= 9"]
    assert without_copies(lines, copies) == [lines[0], lines[2]]
    assert without_copies(lines[1:2], copies) == lines[1:2]  # the source's line absent: the copy's is kept
    set_apart = {"r.budget": "a.budget"}  # r.dyn=true written by the user: turning a.dyn off leaves r's line
    assert without_copies(lines[:2], set_apart) == lines[:2]


@pytest.mark.parametrize("more, keys", [
    ((), ["actor"]),
    (("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",), ["actor", "rollout"]),
    (("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true"),
     ["actor", "ref"])])
def test_a_token_budget_refused_once_unless_a_copy_has_its_own_switch(more, keys):
    """The rollout's and reference's budgets copy the actor's; their switches too, unless the user sets them: then
    turning the actor's switch off would not mend theirs, so their lines stay."""
    from trainer.config_types import all_errors
    from trainer.launch import prestart

    a = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    cfg = _compose("actor_rollout_ref.actor.use_dynamic_bsz=true", f"{a}=8", *more)
    logging.disable(logging.WARNING)
    try:
        with pytest.raises(ConfigError) as first:  # the launcher's first refusal, as trainer/main.py meets it
            prestart(cfg)
        out = str(all_errors(cfg, first.value, prestart)).splitlines()
    finally:
        logging.disable(logging.NOTSET)
    assert sorted({m.split(".")[1] for m in out if "max_token_len" in m}) == sorted(keys), out


@pytest.mark.parametrize("override, line", [
    ("actor_rollout_ref.actor.clip_ratio_low=${nope.x}",
     "actor_rollout_ref.actor.clip_ratio_low=${nope.x}: does not resolve (Interpolation key 'nope.x' not found)"),
    ("data.train_batch_size=???", "data.train_batch_size=???: does not resolve (Missing mandatory value: "
                                  "data.train_batch_size)")])
def test_a_value_that_does_not_resolve_is_one_line_and_its_copies_none(override, line):
    """``data.gen_batch_size`` copies ``data.train_batch_size``: one line, where the value is written."""
    from trainer.config_types import check_run_config

    with pytest.raises(ConfigError) as info:
        check_run_config(_compose(override))
    assert str(info.value) == line and info.value.alone


def test_the_entry_point_reports_an_unresolved_value_as_an_error_line(tmp_path):
    import subprocess
    import sys

    from tests.e2e_utils import ROOT

    cmd = [sys.executable, os.path.join(ROOT, "trainer", "main.py"), "data.train_batch_size=${oc.env:DSRL_NOPE}",
           f"trainer.output_dir={tmp_path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "DSRL_NOPE"})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        "error: data.train_batch_size=${oc.env:DSRL_NOPE}: does not resolve (")


@pytest.mark.parametrize("algo, role", [("gae", "critic.ppo_micro_batch_size_per_gpu"),
                                        ("prime", "reward_model.micro_batch_size_per_gpu")])
def test_every_role_whose_micro_batch_does_not_divide_is_named_at_once(algo, role):
    """The actor's refused micro-batch no longer hides the critic's or PRIME reward model's (it used to show only
    after the actor's was mended)."""
    from trainer.config_validate import validate

    actor = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    with pytest.raises(ConfigError) as info:
        validate(OmegaConf.to_container(_compose(f"algorithm={algo}", f"{actor}=3", f"{role}=3"), resolve=True))
    assert [m.rpartition(" by ")[2] for m in str(info.value).splitlines()] == [f"{actor}=3", f"{role}=3"]


def _error_lines(*overrides) -> list[str]:
    """The error lines ``trainer/main.py`` prints for ``overrides``: the launcher's first refusal and the rest."""
    from trainer.config_types import all_errors
    from trainer.launch import prestart

    cfg = _compose(*overrides)
    logging.disable(logging.WARNING)
    try:
        with pytest.raises(ConfigError) as first:
            prestart(cfg)
        return str(all_errors(cfg, first.value, prestart)).splitlines()
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("overrides, line", [
    (("algorithm=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=5"),
     "actor_rollout_ref.actor.ppo_mini_batch_size=5 must divide data.train_batch_size=32"),
    (("algorithm=gae", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
     "a mini-batch holds 128 rows per data-parallel rank, not divisible by "
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
    (("data.train_batch_size=33", "algorithm.filter_groups.enable=true"),
     "data.train_batch_size=33 must be divisible by the 2 workers (trainer.nnodes*trainer.n_gpus_per_node)")])
def test_a_line_about_keys_that_copy_another_lines_keys_is_left_out(overrides, line):
    """The critic's batch sizes and data.gen_batch_size copy the actor's and data.train_batch_size: their lines
    would say the same again under the copies' names."""
    assert _error_lines(*overrides) == [line]


@pytest.mark.parametrize("overrides, line", [
    (("algorithm=gae", "critic.ppo_micro_batch_size_per_gpu=3.0"),
     "a mini-batch holds 128 rows per data-parallel rank, not divisible by critic.ppo_micro_batch_size_per_gpu=3.0"),
    (("actor_rollout_ref.actor.ppo_mini_batch_size=5.0",),
     "actor_rollout_ref.actor.ppo_mini_batch_size=5.0 must divide data.train_batch_size=32"),
    (("actor_rollout_ref.actor.ppo_mini_batch_size=-4.0",),
     "actor_rollout_ref.actor.ppo_mini_batch_size=-4.0; expected an integer >= 1")])
def test_a_batch_size_is_quoted_as_written(overrides, line):
    """A whole float is taken as the integer it is, and quoted as the user wrote it."""
    assert _error_lines(*overrides) == [line]


def test_a_mini_batch_set_apart_that_does_not_divide_the_batch_is_named_beside_the_worker_count():
    """A mini-batch size the user set that does not divide data.train_batch_size is wrong whatever the workers:
    named at once, not after the worker count is mended. The shipped mini-batch beside a batch size that does not
    divide over the workers is not (mending the batch size may mend it too)."""
    workers = "data.train_batch_size=32 must be divisible by the 3 workers (trainer.nnodes*trainer.n_gpus_per_node)"
    assert _error_lines("trainer.n_gpus_per_node=3", "actor_rollout_ref.actor.ppo_mini_batch_size=5") == [
        workers, "actor_rollout_ref.actor.ppo_mini_batch_size=5 must divide data.train_batch_size=32"]
    assert _error_lines("trainer.n_gpus_per_node=3", "actor_rollout_ref.actor.ppo_mini_batch_size=8") == [workers]
    assert _error_lines("algorithm=gae", "trainer.n_gpus_per_node=3", "critic.ppo_mini_batch_size=0") == [
        workers, "critic.ppo_mini_batch_size=0; expected an integer >= 1"]
    assert _error_lines("data.train_batch_size=7") == [
        "data.train_batch_size=7 must be divisible by the 2 workers (trainer.nnodes*trainer.n_gpus_per_node)"]


@pytest.mark.parametrize("overrides, line", [
    (("algorithm=prime", "reward_model.ulysses_sequence_parallel_size=0"),
     "reward_model.ulysses_sequence_parallel_size=0; expected an integer >= 1"),
    (("algorithm=prime", "reward_model.ulysses_sequence_parallel_size=-1"),
     "reward_model.ulysses_sequence_parallel_size=-1; expected an integer >= 1"),
    (("algorithm=prime", "reward_model.ulysses_sequence_parallel_size=4"),
     "reward_model.ulysses_sequence_parallel_size=4 must divide the 2 workers (trainer.nnodes*trainer.n_gpus_per_node)"),
    (("algorithm=gae", "critic.ppo_mini_batch_size=abc"), "critic.ppo_mini_batch_size='abc'; expected an integer"),
    (("algorithm=prime", "reward_model.micro_batch_size_per_gpu=null"),
     "reward_model.micro_batch_size_per_gpu=None; expected an integer"),
    (("actor_rollout_ref.actor.ppo_mini_batch_size=-4",),
     "actor_rollout_ref.actor.ppo_mini_batch_size=-4; expected an integer >= 1")])
def test_batch_and_ulysses_sizes_of_every_role_are_one_line_each(overrides, line):
    """PRIME's reward model's Ulysses size is checked with the others (it was a ZeroDivisionError, or a crash when
    the workers started); a mistyped critic or reward-model batch size is a line, not a traceback."""
    assert line in _error_lines(*overrides)
