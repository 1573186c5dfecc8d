"""The typed config sections (trainer/config/): built from every group option of the packaged config, defaults only
in configs/, one-line errors naming the dotted key, every field read by some code, and what workers receive."""
import ast
import dataclasses
import os
import pickle

import pytest

from tests.e2e_utils import ROOT
from trainer.config import (ActorConfig, CriticConfig, DataConfig, DeepSpeedConfig, ModelConfig, OptimConfig,
                            RolloutConfig, Section, TrainerConfig, actor_worker_config, check_sections,
                            critic_worker_config, rollout_worker_config)
from trainer.config.prm import PRMWorkerConfig, prm_worker_config
from trainer.config.workers import ActorWorkerConfig, CriticWorkerConfig, RolloutWorkerConfig, WorkerRuntime
from trainer.config_checks import ConfigError, ConfigErrors
from trainer.overrides import CONFIG_DIR, config_groups

WORKER_CONFIGS = (WorkerRuntime, ActorWorkerConfig, CriticWorkerConfig, RolloutWorkerConfig, PRMWorkerConfig)


def _sections() -> list[type]:
    out, todo = [], list(Section.__subclasses__())
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return out


def _cfg(*overrides, planned=True):
    from hydra import compose, initialize_config_dir

    from trainer.launch import plan_run_length, resolve_config

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = resolve_config(compose(config_name="ppo_trainer", overrides=list(overrides)))
    if planned:
        plan_run_length(cfg, 4)
    return cfg


def test_the_sections_have_no_defaults_in_python():
    """configs/ holds every default: a field with a Python default would be a second one that can drift."""
    for cls in (*_sections(), *WORKER_CONFIGS):
        with_default = [f.name for f in dataclasses.fields(cls)
                        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
        assert with_default == [], cls.__name__


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in config_groups(CONFIG_DIR).items() for o in opts])
def test_every_group_option_builds_the_workers_configs(group, option):
    cfg = _cfg(f"{group}={option}", "algorithm=gae" if group != "algorithm" else f"{group}={option}")
    check_sections(cfg)
    for build in (actor_worker_config, critic_worker_config, rollout_worker_config):
        made = build(cfg)
        assert pickle.loads(pickle.dumps(made)) == made  # what Ray sends to the workers
    actor = actor_worker_config(cfg)
    arr = cfg["actor_rollout_ref"]
    assert actor.actor.optim.lr == float(arr["actor"]["optim"]["lr"])
    assert actor.rollout.val_kwargs.temperature == float(arr["rollout"]["val_kwargs"]["temperature"])
    assert actor.deepspeed.zero_stage == int(cfg["deepspeed"]["zero_stage"])


def test_a_frozen_section_refuses_writes():
    section = OptimConfig.from_dict(_cfg()["critic"]["optim"], "critic.optim")
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.lr = 1.0


@pytest.mark.parametrize("cls,key,name,value,line", [
    (ActorConfig, "actor_rollout_ref.actor", "clip_ratio_c", 1.0, "actor_rollout_ref.actor.clip_ratio_c=1.0; expected > 1 "
     "(the dual clip of actor_rollout_ref.actor.policy_loss.loss_mode=vanilla)"),
    (ActorConfig, "actor_rollout_ref.actor", "ppo_epochs", "two", "actor_rollout_ref.actor.ppo_epochs='two'; expected an integer"),
    (ActorConfig, "actor_rollout_ref.actor", "grad_clip", float("nan"),
     "actor_rollout_ref.actor.grad_clip=nan; expected a finite number"),
    (ActorConfig, "actor_rollout_ref.actor", "use_kl_loss", "yes",
     "actor_rollout_ref.actor.use_kl_loss='yes'; expected true or false"),
    (RolloutConfig, "actor_rollout_ref.rollout", "name", "sglang",
     "actor_rollout_ref.rollout.name='sglang'; expected hf or vllm"),
    (RolloutConfig, "actor_rollout_ref.rollout", "n", 0, "actor_rollout_ref.rollout.n=0; expected >= 1"),
    (DeepSpeedConfig, "deepspeed", "optimizer", "sgd",
     "deepspeed.optimizer='sgd'; expected torch_adamw or deepspeed_adamw"),
    (CriticConfig, "critic", "forward_micro_batch_size_per_gpu", 0,
     "critic.forward_micro_batch_size_per_gpu=0; expected an integer >= 1"),
    (CriticConfig, "critic", "ppo_micro_batch_size_per_gpu", 0,
     "critic.ppo_micro_batch_size_per_gpu=0; expected an integer >= 1"),
    (TrainerConfig, "trainer", "device", "tpu", "trainer.device='tpu'; expected auto, cpu or cuda"),
    (TrainerConfig, "trainer", "n_gpus_per_node", 0, "trainer.n_gpus_per_node=0; expected an integer >= 1"),
    (TrainerConfig, "trainer", "nnodes", -1, "trainer.nnodes=-1; expected an integer >= 1"),
    (TrainerConfig, "trainer", "max_restarts", -1, "trainer.max_restarts=-1; expected an integer >= 0"),
    (TrainerConfig, "trainer", "save_freq", "often", "trainer.save_freq='often'; expected an integer"),
    (TrainerConfig, "trainer", "val_only", "yes", "trainer.val_only='yes'; expected true or false"),
    (TrainerConfig, "trainer", "total_epochs", 0, "trainer.total_epochs=0; expected an integer >= 1"),
    (TrainerConfig, "trainer", "log_val_generations", -2, "trainer.log_val_generations=-2; expected an integer >= 0"),
    (DataConfig, "data", "max_response_length", 0, "data.max_response_length=0; expected a positive integer"),
    (DataConfig, "data", "gen_batch_size", 0, "data.gen_batch_size=0; expected an integer >= 1"),
    (DataConfig, "data", "val_batch_size", -1, "data.val_batch_size=-1; expected an integer >= 1"),
    (DataConfig, "data", "val_batch_size", 0, "data.val_batch_size=0; expected an integer >= 1"),
    (DataConfig, "data", "shuffle", "no", "data.shuffle='no'; expected true or false"),
])
def test_a_bad_value_is_one_line_naming_the_dotted_key(cls, key, name, value, line):
    cfg = _cfg("algorithm=gae")
    section = cfg
    for part in key.split("."):
        section = section[part]
    section[name] = value
    with pytest.raises(ValueError) as info:
        cls.from_dict(section, key)
    assert str(info.value) == line


@pytest.mark.parametrize("mode,value,error", [
    ("gspo", 0.5, None), ("sapo", 1.0, None), ("dppo_tv", 0.5, None),
    ("dppo_kl", 0.0, "actor_rollout_ref.actor.clip_ratio_c=0.0; expected a number > 0 (the importance-weight "
                     "truncation of actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl)"),
    ("vanilla", 1.0, "actor_rollout_ref.actor.clip_ratio_c=1.0; expected > 1 (the dual clip of "
                     "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla)"),
])
def test_clip_ratio_c_is_checked_only_by_the_loss_that_reads_it(mode, value, error):
    """verl asserts ``clip_ratio_c > 1`` in the dual-clip loss only: a loss mode that never reads it does not
    refuse it, and DPPO's truncation needs only > 0 (its loss's own bound)."""
    cfg = _cfg(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}", f"actor_rollout_ref.actor.clip_ratio_c={value}")
    section = cfg["actor_rollout_ref"]["actor"]
    if error is None:
        assert ActorConfig.from_dict(section, "actor_rollout_ref.actor").clip_ratio_c == value
        return
    with pytest.raises(ConfigError) as info:
        ActorConfig.from_dict(section, "actor_rollout_ref.actor")
    assert str(info.value) == error


def test_a_negative_kl_loss_coef_is_refused_like_the_in_reward_one():
    """A negative weight turns the KL loss into a reward for leaving the reference (the in-reward
    algorithm.kl_ctrl.kl_coef refused it already)."""
    section = _cfg()["actor_rollout_ref"]["actor"]
    section["kl_loss_coef"] = -1
    with pytest.raises(ValueError) as info:
        ActorConfig.from_dict(section, "actor_rollout_ref.actor")
    assert str(info.value) == ("actor_rollout_ref.actor.kl_loss_coef=-1; expected a number >= 0 (the weight of the KL "
                               "loss against the reference)")
    section["kl_loss_coef"] = 0.0
    ActorConfig.from_dict(section, "actor_rollout_ref.actor")


@pytest.mark.parametrize("override,line", [
    ("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name='sglang'; expected hf or vllm"),
    ("deepspeed.optimizer=sgd", "deepspeed.optimizer='sgd'; expected torch_adamw or deepspeed_adamw"),
    ("reward_model.model.beta_train=0", "reward_model.model.beta_train=0; expected > 0"),
])
def test_values_a_worker_refused_are_refused_before_start_up(override, line):
    """These values used to stop a run only inside a worker, after Ray and the workers had started."""
    from trainer.config_validate import validate

    cfg = _cfg("algorithm=prime", override, planned=False)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert line in getattr(info.value, "messages", [str(info.value)])


@pytest.mark.parametrize("override,line", [
    ("trainer.logger=[console,tensorboard]",
     "trainer.logger=['console', 'tensorboard']: unknown backend(s) ['tensorboard']; expected a list of "
     "['console', 'wandb']"),
    ("trainer.logger=consol", "trainer.logger='consol': unknown backend(s) ['consol']; expected a list of "
     "['console', 'wandb']"),
])
def test_an_unknown_logger_backend_is_refused_before_start_up(override, line):
    """The tracker is built only after the workers start, so its check alone came too late."""
    from trainer.config_validate import validate

    with pytest.raises(ConfigError) as info:
        validate(_cfg(override, planned=False))
    assert line in getattr(info.value, "messages", [str(info.value)])


def test_known_logger_backends_pass_validate():
    from trainer.config_validate import validate

    for override in ("trainer.logger=console", "trainer.logger=[console,wandb]", "trainer.logger=[]"):
        validate(_cfg(override, planned=False))


def test_a_nested_section_names_its_whole_path_and_a_missing_key_is_named():
    cfg = _cfg()
    actor = cfg["actor_rollout_ref"]["actor"]
    actor["optim"]["lr"] = -1
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.optim\.lr=-1; expected >= 0$"):
        ActorConfig.from_dict(actor, "actor_rollout_ref.actor")
    del cfg["deepspeed"]["offload_param"]
    with pytest.raises(ConfigError, match=r"^deepspeed\.offload_param is missing"):
        DeepSpeedConfig.from_dict(cfg["deepspeed"], "deepspeed")


def test_validate_reports_every_section_error_together():
    from trainer.config_validate import validate

    cfg = _cfg(planned=False)
    cfg["actor_rollout_ref"]["actor"]["clip_ratio_c"] = 0.5
    cfg["actor_rollout_ref"]["rollout"]["temperature"] = -1
    cfg["deepspeed"]["zero_stage"] = 4
    cfg["trainer"]["max_consecutive_skipped_steps"] = 0  # the driver's sections too
    cfg["data"]["max_prompt_length"] = -4
    with pytest.raises(ConfigErrors) as info:
        validate(cfg)
    assert {"actor_rollout_ref.actor.clip_ratio_c=0.5; expected > 1 (the dual clip of "
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla)",
            "actor_rollout_ref.rollout.temperature=-1; expected >= 0 (0: greedy)",
            "deepspeed.zero_stage=4; expected 0, 1, 2 or 3", "trainer.max_consecutive_skipped_steps=0; expected >= 1",
            "data.max_prompt_length=-4; expected a positive integer"} <= set(info.value.messages)


def test_the_critic_model_is_its_own_section_over_the_actors():
    cfg = _cfg("algorithm=gae", "critic.model.lora_rank=4", "+critic.model.override_config.rope_theta=5.0",
               "+actor_rollout_ref.model.override_config.attention_dropout=0.0")
    critic = critic_worker_config(cfg)
    assert critic.model.lora_rank == 4 and actor_worker_config(cfg).model.lora_rank == 0
    assert critic.model.override_config == {"attention_dropout": 0.0, "rope_theta": 5.0}
    assert critic.model.use_liger is False  # the actor's (critic.model has no kernel keys)
    assert critic.total_steps == 4 * 32 // 32 and critic.rollout_n == 8


def test_reading_a_field_records_its_key_and_building_only_what_its_checks_read(tmp_path, monkeypatch):
    import trainer.config_reads as cr

    cfg = _cfg()
    monkeypatch.setenv(cr.ENV, str(tmp_path))
    monkeypatch.setattr(cr, "_seen", set())
    model = pickle.loads(pickle.dumps(ModelConfig.from_dict(cr.TrackedDict(cfg["actor_rollout_ref"]["model"]),
                                                            "actor_rollout_ref.model")))
    assert not os.listdir(tmp_path)
    assert model.use_remove_padding is True
    assert cr.read_keys(str(tmp_path)) == {"actor_rollout_ref.model.use_remove_padding"}
    DeepSpeedConfig.from_dict(cr.TrackedDict(cfg["deepspeed"]), "deepspeed")  # its check reads four keys
    assert cr.read_keys(str(tmp_path)) - {"actor_rollout_ref.model.use_remove_padding"} == {
        "deepspeed.zero_stage", "deepspeed.optimizer", "deepspeed.offload_optimizer", "deepspeed.ds_config"}


def _attributes_read_outside_the_config_package() -> set[str]:
    from tests.test_config_reads import ACCESSORS, CODE

    out = set()
    for folder in CODE:
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            if os.path.relpath(base, ROOT).replace(os.sep, "/").startswith("trainer/config"):
                continue
            for name in (f for f in files if f.endswith(".py")):
                with open(os.path.join(base, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                        out.add(node.attr)
                    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                            node.func.id in ACCESSORS:  # the policy losses read their options by name
                        out |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return out


def test_every_field_of_a_section_is_read_by_code_outside_the_config_package():
    """A key read only to fill a field that nothing reads would be a config key that nothing reads (the static
    scan of tests/test_config_reads.py counts every section field as read because of this test)."""
    used = _attributes_read_outside_the_config_package()
    unread = {f"{cls.__name__}.{f.name}" for cls in (*_sections(), *WORKER_CONFIGS)
              for f in dataclasses.fields(cls) if f.name not in used}
    assert unread == set()


def test_the_driver_reads_the_trainer_and_data_sections_and_a_planned_value_replaces_null():
    from trainer.config.section import replaced

    cfg = _cfg("data=synthetic_tool", "trainer.save_freq=3", "data.val_batch_size=5", planned=False)
    trainer, data = TrainerConfig.from_dict(cfg["trainer"], "trainer"), DataConfig.from_dict(cfg["data"], "data")
    assert (trainer.save_freq, trainer.total_training_steps, trainer.device) == (3, 20, "cpu")
    assert (data.val_batch_size, data.synthetic_task, data.warm_start_steps) == (5, "arith_tool", 170)
    plain = DataConfig.from_dict(_cfg(planned=False)["data"], "data")
    assert (plain.synthetic_task, plain.warm_start_steps) == (None, None)  # only data=synthetic_tool has them
    unplanned = TrainerConfig.from_dict(_cfg(planned=False)["trainer"], "trainer")
    assert unplanned.total_training_steps is None
    planned = replaced(unplanned, "trainer", total_training_steps=70)
    assert planned.total_training_steps == 70 and planned.seed == unplanned.seed
    with pytest.raises(ConfigError, match=r"^trainer\.total_training_steps=0; expected an integer >= 1$"):
        replaced(unplanned, "trainer", total_training_steps=0)
    with pytest.raises(TypeError, match="no field"):
        replaced(unplanned, "trainer", total_steps=1)



@pytest.mark.parametrize("value", [-3, 0])
def test_a_batch_size_below_one_is_one_line(value):
    """Not also 'must be divisible by the N workers', which only repeats the same fault."""
    from trainer.config_validate import validate

    with pytest.raises(ConfigError) as info:
        validate(_cfg(f"data.train_batch_size={value}", planned=False))
    lines = getattr(info.value, "messages", [str(info.value)])
    assert lines == [f"data.train_batch_size={value}; expected a positive integer"]


@pytest.mark.parametrize("override,line", [
    ("algorithm.gamma=2", "algorithm.gamma=2; expected a number in [0, 1]"),
    ("algorithm.gamma=-0.5", "algorithm.gamma=-0.5; expected a number in [0, 1]"),
    ("algorithm.lam=-1", "algorithm.lam=-1; expected a number in [0, 1]"),
])
def test_a_discount_or_gae_lambda_outside_zero_one_is_refused(override, line):
    from trainer.config_validate import validate

    with pytest.raises(ConfigError) as info:
        validate(_cfg("algorithm=gae", override, planned=False))
    assert line in getattr(info.value, "messages", [str(info.value)])


def test_discounts_at_the_edges_pass():
    from trainer.config_validate import validate

    validate(_cfg("algorithm=gae", "algorithm.gamma=0", "algorithm.lam=1", planned=False))
