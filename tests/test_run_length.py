"""verl's run length and schedule keys (issue #26): trainer.total_epochs with total_training_steps as verl defines
their interplay, warmup counted in training steps (lr_warmup_steps / lr_warmup_steps_ratio), cosine min_lr_ratio,
trainer.val_only, model.override_config / external_lib, and the checks of data.gen_batch_size and
reward_model.reward_manager.
"""
import logging
import os

import pytest
import torch

from tests.verl_scripts import composed
from trainer.config_checks import ConfigError
from trainer.dataset import DataExhausted, PromptLoader
from trainer.launch import plan_run_length


def _cfg(epochs=2, steps=None, warmup=-1, ratio=0.0):
    optim = {"total_training_steps": -1, "lr_warmup_steps": warmup, "lr_warmup_steps_ratio": ratio}
    return {"trainer": {"total_epochs": epochs, "total_training_steps": steps},
            "actor_rollout_ref": {"actor": {"optim": dict(optim)}}, "critic": {"optim": dict(optim)}}


def test_total_steps_default_to_epochs_times_batches_and_fill_the_schedules():
    cfg = _cfg(epochs=15, ratio=0.1)
    assert plan_run_length(cfg, batches_per_epoch=7) == 105
    assert cfg["trainer"]["total_training_steps"] == 105
    actor = cfg["actor_rollout_ref"]["actor"]["optim"]
    assert actor["total_training_steps"] == 105 and actor["lr_warmup_steps"] == 10  # int(0.1 x 105), verl's rule
    assert cfg["critic"]["optim"]["lr_warmup_steps"] == 10


def test_set_total_steps_win_and_a_longer_run_than_the_data_is_named(caplog):
    assert plan_run_length(_cfg(epochs=2, steps=5), batches_per_epoch=7) == 5
    with caplog.at_level(logging.WARNING):
        assert plan_run_length(_cfg(epochs=2, steps=50), batches_per_epoch=7) == 50
    assert "the run ends after the last epoch, at step 14 (verl's rule); raise trainer.total_epochs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # dynamic sampling: the step where the data end is not known ahead
        plan_run_length(_cfg(epochs=2, steps=50), batches_per_epoch=7, one_batch_per_step=False)
    assert "raise trainer.total_epochs" not in caplog.text


def test_embedded_default_is_one_epoch_of_seventy_steps(tmp_path):
    from trainer import embedded
    from trainer.dataset import PromptDataset

    _, _, cfg, _ = composed([])
    assert cfg["trainer"]["total_epochs"] == 1 and cfg["trainer"]["total_training_steps"] is None
    train, _ = embedded.write_task(str(tmp_path))
    tok = embedded.build_tokenizer()
    ds = PromptDataset(train, tok, max_prompt_length=int(cfg["data"]["max_prompt_length"]))
    loader = PromptLoader(ds, int(cfg["data"]["train_batch_size"]), 0, num_epochs=1)
    assert plan_run_length(cfg, len(loader)) == 70
    _, _, verl, _ = composed(["data=gsm8k"])
    assert verl["trainer"]["total_epochs"] == 30  # verl's default outside the embedded task


class _Rows(list):
    pass


def test_loader_ends_after_its_epochs():
    rows = _Rows({"input_ids": [3, 4], "prompt": "p", "reward_model": {"ground_truth": "1"}} for _ in range(6))
    loader = PromptLoader(rows, 2, 0, shuffle=True, num_epochs=2)
    epochs = [loader.next_batch()[1] for _ in range(6)]
    assert epochs == [0, 0, 0, 1, 1, 1]
    with pytest.raises(DataExhausted):
        loader.next_batch()


def test_trainer_stops_where_the_epochs_end_when_each_step_takes_one_batch():
    from trainer.hooks import AlgorithmHooks
    from trainer.config import TrainerConfig
    from trainer.config.packaged import packaged_section
    from trainer.hooks.dynamic_sampling import DynamicSampling, FilterGroupsConfig
    from trainer.ppo_trainer import RayPPOTrainer

    t = RayPPOTrainer.__new__(RayPPOTrainer)
    rows = _Rows({"input_ids": [3], "prompt": "p", "reward_model": {"ground_truth": "1"}} for _ in range(8))
    t.loader = PromptLoader(rows, 2, 0, num_epochs=3)
    t.cfg = {"trainer": {"total_training_steps": 100}, "algorithm": {"filter_groups": {"enable": False}}}
    t.trainer_cfg = packaged_section(TrainerConfig, "trainer", **t.cfg["trainer"])
    t.hooks = AlgorithmHooks([])
    assert t.last_step() == 12
    t.hooks = AlgorithmHooks([DynamicSampling(FilterGroupsConfig(), 2, 2, 0, 4)])  # draws a varying number of batches per step
    assert t.last_step() == 100


def _lrs(optim_cfg, total_steps):
    from transformers import get_scheduler

    from trainer.config import OptimConfig
    from trainer.config.packaged import packaged_section
    from trainer.workers.base import _lr_scheduler

    optim = packaged_section(OptimConfig, "actor_rollout_ref.actor.optim", **optim_cfg)  # the rest: the defaults
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = _lr_scheduler(get_scheduler, opt, optim, total_steps)
    out = []
    for _ in range(total_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_counts_training_steps_like_verl():
    # 4 training steps of 2 optimizer steps each; lr_warmup_steps=1 training step = 2 optimizer steps
    lrs = _lrs({"total_training_steps": 4, "lr_warmup_steps": 1, "lr_scheduler_type": "constant"}, 8)
    assert lrs == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    lrs = _lrs({"total_training_steps": 4, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.5,
                "lr_scheduler_type": "constant"}, 8)
    assert lrs[:4] == [0.0, 0.25, 0.5, 0.75] and lrs[4] == 1.0


def test_cosine_decays_to_min_lr_ratio():
    lrs = _lrs({"total_training_steps": 10, "lr_warmup_steps": 0, "lr_scheduler_type": "cosine",
                "min_lr_ratio": 0.5, "num_cycles": 0.5}, 10)
    assert lrs[0] == 1.0 and 0.5 < lrs[-1] < 0.52 and all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_override_config_reaches_the_hf_config_and_the_model(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer import embedded
    from trainer.workers.model_utils import apply_config_overrides, load_hf_model

    conf = embedded.tiny_model_config(23, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=32)
    AutoModelForCausalLM.from_config(conf).save_pretrained(str(tmp_path))
    hf = AutoConfig.from_pretrained(str(tmp_path))
    apply_config_overrides(hf, {"rms_norm_eps": 1e-3, "rope_parameters": {"rope_theta": 1234.0}})
    assert hf.rms_norm_eps == 1e-3 and hf.rope_parameters["rope_theta"] == 1234.0
    model = load_hf_model(str(tmp_path), hf, value_head=False, trust_remote_code=False)
    assert model.config.rms_norm_eps == 1e-3
    critic = load_hf_model(str(tmp_path), hf, value_head=True, trust_remote_code=False)
    assert critic.config.num_labels == 1 and critic.config.rms_norm_eps == 1e-3


def test_override_config_is_seen_by_the_prestart_context_check(tmp_path):
    from trainer.launch import preflight

    _, _, cfg, _ = composed(["data.max_prompt_length=100", "data.max_response_length=100"])
    with pytest.raises(ConfigError, match="exceeds the model's context max_position_embeddings=128"):
        preflight(cfg)
    _, _, cfg, _ = composed(["data.max_prompt_length=100", "data.max_response_length=100",
                             "+actor_rollout_ref.model.override_config.max_position_embeddings=256"])
    preflight(cfg)


def test_external_lib_is_imported_or_named():
    from trainer.launch import import_external_lib

    import_external_lib({"external_lib": "json"})
    with pytest.raises(ConfigError, match="external_lib='no_such_module_xyz' cannot be imported"):
        import_external_lib({"external_lib": "no_such_module_xyz"})


def test_gen_batch_size_and_reward_manager_are_checked():
    from trainer.launch import validate

    _, _, cfg, _ = composed(["data.gen_batch_size=64"])
    with pytest.raises(ConfigError, match="data.gen_batch_size=64 differs from data.train_batch_size=32"):
        validate(cfg)
    _, _, cfg, _ = composed(["data.gen_batch_size=64", "algorithm.filter_groups.enable=true"])
    validate(cfg)
    _, _, cfg, _ = composed(["reward_model.reward_manager=remote"])
    with pytest.raises(ConfigError, match="reward_model.reward_manager='remote'; expected one of"):
        validate(cfg)
    for name in ("naive", "dapo", "prime"):  # batch needs its batch function (test_unread_and_range_checks.py)
        validate(composed([f"reward_model.reward_manager={name}"])[2])


def test_val_only_validates_once_and_stops(tmp_path, monkeypatch):
    from trainer.config import TrainerConfig
    from trainer.config.packaged import packaged_section
    from trainer.hooks import AlgorithmHooks
    from trainer.ppo_trainer import RayPPOTrainer

    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.cfg = {"trainer": {"total_training_steps": 5, "val_only": True, "project_name": "p", "experiment_name": "e",
                         "logger": [], "output_dir": str(tmp_path), "resume_mode": "disable",
                         "default_local_dir": str(tmp_path / "ckpt"), "log_val_generations": 0},
             "algorithm": {"filter_groups": {"enable": False}}}
    t.trainer_cfg = packaged_section(TrainerConfig, "trainer", **t.cfg["trainer"])
    t.loader, t.val_dataset, t.global_step, t.stop_reason = PromptLoader(_Rows([{}] * 4), 2, 0), [1], 0, ""
    t._stop_requested = False
    t.hooks = AlgorithmHooks([])
    monkeypatch.setattr(t, "validate", lambda: {"val/x/acc": 0.5}, raising=False)
    monkeypatch.setattr(t, "train_step", lambda *a: pytest.fail("val_only trained"), raising=False)
    assert t.fit() == {"val/x/acc": 0.5} and t.global_step == 0 and "val_only" in t.stop_reason
    with open(os.path.join(tmp_path, "metrics.jsonl"), encoding="utf-8") as f:
        assert '"step": 0, "val/x/acc": 0.5' in f.read()
