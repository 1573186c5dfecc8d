"""``deepspeed.ds_config`` entries that first-class keys own, and top-level keys DeepSpeed does not read, are refused
before any worker starts (trainer/ds_config_checks.py); an entry equal to the first-class value is accepted."""
import os

import pytest

from tests.test_reliability_config import OK_BATCH, _cfg, assert_one_line_error, run_cli
from trainer.launch import ConfigError, validate


def _ds(entries: str, *more):
    return validate(_cfg(*OK_BATCH, "trainer.device=cpu", f"+deepspeed.ds_config={{{entries}}}", *more))


@pytest.mark.parametrize("entries,more,needles", [
    ("zero_optimization:{stage:3}", [],  # F4: DeepSpeed partitioned, the rollout's weight sharing expected whole
     ["deepspeed.ds_config.zero_optimization.stage=3 contradicts deepspeed.zero_stage=2"]),
    ("gradient_clipping:0.5", [],  # F5: it replaced actor.grad_clip=1.0 silently
     ["deepspeed.ds_config.gradient_clipping=0.5 contradicts actor_rollout_ref.actor.grad_clip=1.0"]),
    ("gradient_clipping:1.0", ["algorithm=gae", "critic.enable=true", "critic.grad_clip=0.5"],
     ["gradient_clipping=1.0 contradicts critic.grad_clip=0.5"]),
    ("gradient_clipping:1.0", ["algorithm=prime"],
     ["gradient_clipping=1.0 contradicts reward_model.model.optim.grad_clip=10.0"]),
    ("bf16:{enabled:true}", [], ["bf16.enabled=true contradicts deepspeed.bf16='auto' (off on trainer.device=cpu)"]),
    ("bf16:{enabled:false}", ["deepspeed.bf16=true"], ["bf16.enabled=false contradicts deepspeed.bf16=true"]),
    ("fp16:{enabled:true}", [], ["fp16.enabled=true contradicts deepspeed.bf16", "bf16 or fp32"]),
    ("optimizer:{type:Adam,params:{lr:0.1}}", [], ["deepspeed.ds_config.optimizer=", "deepspeed.optimizer=torch_adamw"]),
    ("scheduler:{type:WarmupLR}", [], ["deepspeed.ds_config.scheduler=", "lr_scheduler_type"]),
    ("train_batch_size:64", [], ["deepspeed.ds_config.train_batch_size=64", "data.train_batch_size=8"]),
    ("gradient_accumulation_steps:4", [], ["gradient_accumulation_steps=4", "sets gradient_accumulation_steps=1"]),
    ("zero_optimization:{offload_optimizer:{device:cpu}}", [],
     ["zero_optimization.offload_optimizer.device='cpu' contradicts deepspeed.offload_optimizer=false"]),
    ("zero_optimization:{offload_param:{device:none}}", ["deepspeed=zero3", "deepspeed.offload_param=true"],
     ["zero_optimization.offload_param.device='none' contradicts deepspeed.offload_param=true"]),
    ("bogus_key:1", [], ["deepspeed.ds_config.bogus_key: not a DeepSpeed config key", "remove it"]),
    ("gradent_clipping:1.0", [], ["deepspeed.ds_config.gradent_clipping: not a DeepSpeed config key",
                                  "did you mean gradient_clipping?"]),
])
def test_entry_that_contradicts_a_first_class_key_or_is_unknown_is_refused(entries, more, needles):
    with pytest.raises(ConfigError) as err:
        _ds(entries, *more)
    msg = str(err.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


@pytest.mark.parametrize("entries,more", [
    ("zero_optimization:{stage:2}", []), ("zero_optimization:{stage:3}", ["deepspeed=zero3"]),
    ("gradient_clipping:1.0", []), ("gradient_clipping:0.5", ["actor_rollout_ref.actor.grad_clip=0.5"]),
    ("gradient_clipping:10.0", ["algorithm=prime", "actor_rollout_ref.actor.grad_clip=10.0"]),
    ("bf16:{enabled:false}", []), ("bf16:{enabled:true}", ["deepspeed.bf16=true"]), ("fp16:{enabled:false}", []),
    ("train_micro_batch_size_per_gpu:1,gradient_accumulation_steps:1", []),
    ("zero_optimization:{offload_optimizer:{device:cpu,pin_memory:false}}", ["deepspeed.offload_optimizer=true",
                                                                             "deepspeed.optimizer=deepspeed_adamw"]),
    ("zero_optimization:{offload_optimizer:{pin_memory:false},overlap_comm:false}", []),  # tuning only
    ("wall_clock_breakdown:true,steps_per_print:5,zero_allow_untested_optimizer:true", []),
])
def test_entry_equal_to_the_first_class_value_or_tuning_only_is_accepted(entries, more):
    _ds(entries, *more)


def test_every_bad_entry_is_its_own_line():
    with pytest.raises(ConfigError) as err:
        _ds("zero_optimization:{stage:3},gradient_clipping:0.5,bogus_key:1")
    lines = str(err.value).splitlines()
    assert len(lines) == 3, lines
    assert {ln.split("=")[0].split(":")[0] for ln in lines} == {
        "deepspeed.ds_config.zero_optimization.stage", "deepspeed.ds_config.gradient_clipping",
        "deepspeed.ds_config.bogus_key"}


def test_known_keys_are_deepspeeds_own():
    from trainer.ds_config_checks import deepspeed_top_level_keys

    keys = deepspeed_top_level_keys()
    assert {"zero_optimization", "bf16", "optimizer", "scheduler", "gradient_clipping", "activation_checkpointing",
            "flops_profiler", "train_batch_size", "wandb"} <= keys
    assert "bogus_key" not in keys and "zero_stage" not in keys


def test_frozen_reference_keeps_its_stage_under_a_ds_config_stage():
    from tests.test_optimizer_defaults import _worker

    w = _worker("cpu", 2, ds_config={"zero_optimization": {"stage": 2}})
    assert w.ds_config(train=True)["zero_optimization"]["stage"] == 2
    assert w.ds_config(train=False)["zero_optimization"]["stage"] == 0


def test_f4_command_stops_before_workers_in_one_line(tmp_path):
    proc = run_cli(str(tmp_path / "out"), "trainer.total_training_steps=2",
                   "+deepspeed.ds_config={zero_optimization:{stage:3}}", forked=True)
    assert_one_line_error(proc, "deepspeed.ds_config.zero_optimization.stage=3 contradicts deepspeed.zero_stage=2")
    assert not os.path.exists(tmp_path / "out" / "init_model")


@pytest.mark.parametrize("entries,more,line", [
    ("zero_optimization:{stage3_prefetch_bucket_sizee:5}", ["deepspeed=zero3"],
     "deepspeed.ds_config.zero_optimization.stage3_prefetch_bucket_sizee: not a key of DeepSpeed's DeepSpeedZeroConfig "
     "(DeepSpeed refuses it); did you mean zero_optimization.stage3_prefetch_bucket_size?"),
    ("zero_optimization:{offload_optimizer:{pin_memry:false}}", [],
     "deepspeed.ds_config.zero_optimization.offload_optimizer.pin_memry: not a key of DeepSpeed's DeepSpeedZeroConfig "
     "(DeepSpeed refuses it); did you mean zero_optimization.offload_optimizer.pin_memory?"),
    ("bf16:{enabeld:false}", [],
     "deepspeed.ds_config.bf16.enabeld: not a key of DeepSpeed's DeepSpeedBF16Config (DeepSpeed refuses it); "
     "did you mean bf16.enabled?"),
    ("zero_optimization:{zzqqxx:1}", [],
     "deepspeed.ds_config.zero_optimization.zzqqxx: not a key of DeepSpeed's DeepSpeedZeroConfig (DeepSpeed refuses "
     "it); remove it"),
])
def test_a_nested_key_typo_names_its_path_and_the_nearest_key(entries, more, line):
    """A typo inside a section of ``ds_config`` was refused with pydantic's bare ``Extra inputs are not permitted`` and
    no near-name hint, which a top-level typo gets; now its dotted path and the nearest key DeepSpeed has there."""
    with pytest.raises(ConfigError) as err:
        _ds(entries, *more)
    assert str(err.value) == line
