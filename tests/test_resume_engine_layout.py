"""A resume with another optimizer or precision than the checkpoint's is refused before any worker starts. Found by
trying it: a checkpoint saved with the default ``deepspeed.optimizer=torch_adamw`` resumed with ``deepspeed_adamw``
started the workers and died at the first step with ``KeyError: 'bias_correction'``; an fp32 checkpoint resumed
with ``deepspeed.bf16=true`` died in the workers' load with ``FileNotFoundError: ... bf16_zero_pp_rank_0_...``.
Checked here on small fake role folders (a ``latest`` file, a model-states file with the client state and DeepSpeed's
``ds_config``, ZeRO file names), in the new record, in checkpoints saved before it, and through the entry point."""
import os

import pytest
import torch

from trainer.checkpoint.deepspeed_manager import CLIENT_STATE_KEY, optimizer_layout
from trainer.config_checks import ConfigError
from trainer.resume_checks import _check_engine_settings
from trainer.resume_engine import check_engine_layout, run_layout, saved_layout


def _role(step_dir, role="actor", client=None, ds_config=None, zero_files=()):
    folder = os.path.join(step_dir, role, "global_step_1")
    os.makedirs(folder)
    with open(os.path.join(step_dir, role, "latest"), "w") as f:
        f.write("global_step_1")
    sd = {CLIENT_STATE_KEY: {"global_step": 1, "world_size": 2, "zero_stage": 2, "lora": False, **(client or {})}}
    if ds_config is not None:
        sd["ds_config"] = ds_config
    torch.save(sd, os.path.join(folder, "mp_rank_00_model_states.pt"))
    for name in zero_files:
        open(os.path.join(folder, name), "wb").close()
    return step_dir


def _cfg(optimizer="torch_adamw", bf16="auto", ds_config=None, critic=False, prime=False, offload=False):
    return {"trainer": {"device": "cpu"}, "algorithm": {"use_prime": prime},
            "deepspeed": {"zero_stage": 2, "bf16": bf16, "optimizer": optimizer, "offload_optimizer": offload,
                          "offload_param": False, "ds_config": ds_config},
            "actor_rollout_ref": {"model": {"lora_rank": 0}}, "critic": {"enable": critic, "model": {"lora_rank": 0}}}


NEW = {"optimizer": "AdamW", "precision": "fp32"}


@pytest.mark.parametrize("cfg,needles", [
    (_cfg(optimizer="deepspeed_adamw"), ["(actor) was saved with deepspeed.optimizer=torch_adamw but this run has "
                                         "deepspeed.optimizer=deepspeed_adamw", "resume with "
                                         "deepspeed.optimizer=torch_adamw", "trainer.resume_mode=disable"]),
    (_cfg(bf16=True), ["(actor) was saved with fp32 precision (deepspeed.bf16=false) but this run has bf16 precision "
                       "(deepspeed.bf16=true)", "resume with deepspeed.bf16=false", "trainer.resume_mode=disable"]),
    (_cfg(ds_config={"fp16": {"enabled": True}}), ["saved with fp32 precision", "this run has fp16 precision"]),
])
def test_another_optimizer_or_precision_than_the_recorded_one_is_refused(tmp_path, cfg, needles):
    step = _role(str(tmp_path), client=NEW)
    with pytest.raises(ConfigError) as exc:
        _check_engine_settings(cfg, step)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("trainer.resume_mode: ")
    for n in needles:
        assert n in msg, (n, msg)


@pytest.mark.parametrize("client,cfg", [
    (NEW, _cfg()),
    (NEW, _cfg(bf16=False)),
    ({"optimizer": "FusedAdam", "precision": "fp32"}, _cfg()),  # torch's AdamW reads DeepSpeed's Adam state
    ({"optimizer": "FusedAdam", "precision": "bf16"}, _cfg("deepspeed_adamw", bf16=True, offload=True)),
    ({"optimizer": "DeepSpeedCPUAdam", "precision": "bf16"},
     _cfg("deepspeed_adamw", ds_config={"bf16": {"enabled": True}})),
])
def test_the_same_optimizer_and_precision_resume(tmp_path, client, cfg):
    """Optimizer offload on or off with deepspeed_adamw (FusedAdam / DeepSpeedCPUAdam) loads the same state, and
    torch_adamw loads DeepSpeed's Adam state (found by trying it: the resume trains on)."""
    _check_engine_settings(cfg, _role(str(tmp_path), client=client))


def test_the_critic_and_prime_reward_folders_are_judged_too(tmp_path):
    step = _role(str(tmp_path), client={"optimizer": "FusedAdam", "precision": "fp32"})
    _role(step, "critic", client=NEW)
    with pytest.raises(ConfigError, match=r"\(critic\) was saved with deepspeed.optimizer=torch_adamw"):
        _check_engine_settings(_cfg("deepspeed_adamw", critic=True), step)
    _role(step, "reward", client={"optimizer": "AdamW", "precision": "bf16"})
    with pytest.raises(ConfigError, match=r"\(reward\) was saved with bf16 precision"):
        _check_engine_settings(_cfg(prime=True), step)


def test_a_checkpoint_saved_before_the_record_is_judged_from_its_files_and_config(tmp_path):
    """No ``optimizer`` / ``precision`` in the client state: DeepSpeed's ds_config of the model-states file, else
    the ZeRO file names, give the precision; the run config of ``data.pt`` the optimizer."""
    saved_cfg = {"deepspeed": {"optimizer": "torch_adamw"}}
    step = _role(str(tmp_path / "a"), ds_config={"bf16": {"enabled": True}})
    assert saved_layout(os.path.join(step, "actor"), saved_cfg) == {"optimizer": "torch_adamw", "precision": "bf16"}
    with pytest.raises(ConfigError, match="was saved with bf16 precision"):
        check_engine_layout(_cfg(), step, ["actor"], saved_cfg)
    with pytest.raises(ConfigError, match="deepspeed.optimizer=torch_adamw but this run has"):
        check_engine_layout(_cfg("deepspeed_adamw", bf16=True), step, ["actor"], saved_cfg)
    bf16_files = _role(str(tmp_path / "b"), zero_files=["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"])
    assert saved_layout(os.path.join(bf16_files, "actor")) == {"precision": "bf16"}
    fp32_files = _role(str(tmp_path / "c"), zero_files=["zero_pp_rank_0_mp_rank_00_optim_states.pt"])
    with pytest.raises(ConfigError, match="was saved with fp16 or fp32 precision but this run has bf16"):
        check_engine_layout(_cfg(bf16=True), fp32_files, ["actor"])
    check_engine_layout(_cfg(ds_config={"fp16": {"enabled": True}}), fp32_files, ["actor"])  # not told apart
    unknown = _role(str(tmp_path / "d"))  # stage 0 fp32: no ZeRO files, nothing recorded: unjudged
    assert saved_layout(os.path.join(unknown, "actor")) == {}
    check_engine_layout(_cfg("deepspeed_adamw", bf16=True), unknown, ["actor"])


def test_an_unreadable_role_folder_is_left_to_the_workers_load(tmp_path):
    os.makedirs(tmp_path / "actor")
    check_engine_layout(_cfg(bf16=True), str(tmp_path), ["actor"])


def test_auto_bf16_follows_the_device():
    assert run_layout({**_cfg(), "trainer": {"device": "cuda"}})["precision"] == "bf16"
    assert run_layout(_cfg())["precision"] == "fp32"


def test_the_saved_client_state_records_the_optimizer_class_and_precision():
    class Engine:
        client_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])

        def bfloat16_enabled(self):
            return True

    assert optimizer_layout(Engine()) == {"optimizer": "AdamW", "precision": "bf16"}


@pytest.mark.slow
def test_a_resume_with_another_optimizer_is_refused_before_the_workers(saved, tmp_path):
    """The entry point on tests/conftest.py's real checkpoint (saved with torch_adamw, fp32 on CPU)."""
    from tests.test_reliability_checkpoint_files import _copy, _resume
    from tests.test_reliability_config import assert_one_line_error

    out, step = _copy(saved, tmp_path)
    before = sorted(os.listdir(os.path.join(step, "actor", "global_step_1")))
    for override, needle in [("deepspeed.optimizer=deepspeed_adamw", "deepspeed.optimizer=torch_adamw but this run "
                                                                      "has deepspeed.optimizer=deepspeed_adamw"),
                             ("deepspeed.bf16=true", "fp32 precision (deepspeed.bf16=false) but this run has bf16")]:
        proc = _resume(out, override)
        assert_one_line_error(proc, "trainer.resume_mode", "(actor) was saved with", needle)
        assert "workers ready" not in proc.stdout + proc.stderr
    assert sorted(os.listdir(os.path.join(step, "actor", "global_step_1"))) == before
