"""verl's key space (issue #26): every key of verl's PPO trainer config is a key of configs/ or one row of
trainer/verl_keys.py, passes on the command line without '+', and is mapped, warned about or refused with a line
that says what to use instead; the README's table is generated from the same rows.
"""
import os
import re

import pytest

from tests.e2e_utils import ROOT
from trainer.config_checks import ConfigError, ConfigErrors
from trainer.overrides import CONFIG_DIR, FREE_FORM, check_overrides, config_groups, prepare_overrides
from trainer.verl_compat import Report, apply_verl_keys, leaves, markdown_table, match, override_errors
from trainer.verl_keys import VERL_KEYS

KEYS_FILE = os.path.join(ROOT, "tests", "data", "verl_ppo_trainer_keys.txt")


def verl_keys() -> list[str]:
    with open(KEYS_FILE, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _our_keys() -> set[str]:
    """Leaf keys of configs/ over every group option (with its defaults for the other groups)."""
    from trainer.overrides import _compose, _leaf_keys

    out = set()
    for group, options in config_groups(CONFIG_DIR).items():
        for option in options:
            cfg, _ = _compose(CONFIG_DIR, "ppo_trainer", [f"{group}={option}"])
            out |= set(_leaf_keys(cfg))
    return out


@pytest.fixture(scope="module")
def ours():
    return _our_keys()


def _ours_or_below(key: str, ours: set) -> bool:
    return key in ours or any(key.startswith(f + ".") for f in FREE_FORM)


def test_every_verl_key_is_ours_or_a_row_of_the_table(ours):
    missing = [k for k in verl_keys() if not _ours_or_below(k, ours) and match(k) is None]
    assert missing == []


def test_no_row_matches_a_key_of_ours(ours):
    # a row applies to keys that are NOT ours (it removes them from the composed config)
    assert sorted(k for k in ours if match(k) is not None) == []


def test_every_row_matches_a_verl_key():
    keys = verl_keys()
    from trainer.verl_compat import _compiled

    dead = [e.pattern for rx, e in _compiled() if not any(rx.match(k) for k in keys)]
    assert dead == []


def _value(key: str):
    """A value of a verl key that its row accepts (the first silent value, else a plausible one)."""
    entry = match(key)
    if entry.ok:
        return entry.ok[0]
    rules = {"strategy": "fsdp", "warmup_style": "cosine", "max_resp_len": None}
    return rules.get(entry.target, 1)


def _hydra_value(v) -> str:
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    return "{}" if v == {} else str(v)


def test_every_verl_key_is_accepted_without_plus_and_handled(ours, tmp_path):
    from tests.verl_scripts import composed

    foreign = [k for k in verl_keys() if not _ours_or_below(k, ours)]
    refused = {k for k in foreign if match(k).kind == "refuse"}
    overrides = [f"{k}={_hydra_value(_value(k))}" for k in foreign if k not in refused]
    prepared, _, resolved, report = composed([*overrides, f"trainer.output_dir={tmp_path}"])
    assert prepared.errors == []
    assert report.errors == []
    assert not any(match(k) for k, _ in leaves(resolved))  # every verl key was handled and removed
    # a refused key passes the parser too, and its error names the key and what to use instead
    for key in sorted(refused)[:20]:
        bad = "true" if match(key).ok == (False,) else "7"
        errors = prepare_overrides([f"{key}={bad}"]).errors
        assert len(errors) == 1 and errors[0].startswith(f"{key}={bad}: not supported: "), errors


def _cfg(**over):
    """A small resolved-config stand-in for apply_verl_keys."""
    cfg = {"trainer": {"device": "cuda", "strategy": "deepspeed"},
           "deepspeed": {"zero_stage": 2, "offload_param": False, "offload_optimizer": False,
                         "optimizer": "torch_adamw"},
           "data": {"max_response_length": 64, "max_rows": None},
           "algorithm": {"use_prime": False},
           "actor_rollout_ref": {"rollout": {"name": "vllm", "update_weights_bucket_megabytes": 512},
                                 "actor": {"grad_clip": 1.0}, "model": {"tokenizer_path": None}},
           "reward_model": {"overlong_buffer": {"enable": False, "len": 0, "penalty_factor": 1.0},
                            "custom_reward_function": {"path": None, "name": "compute_score"}}}
    for key, value in over.items():
        node = cfg
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def test_fsdp_offload_maps_onto_deepspeed_with_a_warning():
    cfg = _cfg(actor_rollout_ref__actor__fsdp_config={"param_offload": True, "optimizer_offload": True,
                                                      "fsdp_size": -1, "wrap_policy": {"min_num_params": 0}},
               actor_rollout_ref__ref__fsdp_config={"param_offload": True})
    report = apply_verl_keys(cfg)
    ds = cfg["deepspeed"]
    assert ds["offload_param"] and ds["offload_optimizer"] and ds["optimizer"] == "deepspeed_adamw"
    assert "fsdp_config" not in cfg["actor_rollout_ref"]["actor"] and "ref" not in cfg["actor_rollout_ref"]
    text = "\n".join(report.warnings)
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=true: read as deepspeed.offload_param=true" in text
    assert "read as deepspeed.offload_optimizer=true with deepspeed.optimizer=deepspeed_adamw" in text
    assert "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1: ignored: FSDP-only" in text
    assert "wrap_policy.min_num_params=0: ignored: FSDP-only" in text
    assert report.errors == [] and len(report.warnings) == 4  # the reference follows the actor: a note only
    assert report.notes == ["actor_rollout_ref.ref.fsdp_config.param_offload=true: follows "
                            "deepspeed.offload_param=true"]


def test_offload_on_cpu_has_no_effect_and_says_so():
    cfg = _cfg(trainer__device="cpu", actor_rollout_ref__actor__fsdp_config={"optimizer_offload": True})
    report = apply_verl_keys(cfg)
    assert not cfg["deepspeed"]["offload_optimizer"]
    assert report.warnings == ["actor_rollout_ref.actor.fsdp_config.optimizer_offload=true: no effect with "
                               "trainer.device=cpu (the weights and optimizer state are in host memory already)"]


def test_vllm_engine_keys_are_passed_to_vllm_llm():
    cfg = _cfg(actor_rollout_ref__rollout__enable_chunked_prefill=True,
               actor_rollout_ref__rollout__max_num_batched_tokens=8192,
               actor_rollout_ref__rollout__cudagraph_capture_sizes=[1, 2],
               actor_rollout_ref__rollout__engine_kwargs={"vllm": {"swap_space": 4}})
    report = apply_verl_keys(cfg)
    assert cfg["actor_rollout_ref"]["rollout"]["engine_kwargs"] == {"vllm": {
        "enable_chunked_prefill": True, "max_num_batched_tokens": 8192, "swap_space": 4,
        "compilation_config": {"cudagraph_capture_sizes": [1, 2]}}}
    assert report.warnings == [] and len(report.notes) == 4
    cfg = _cfg(actor_rollout_ref__rollout__enable_chunked_prefill=True)
    cfg["actor_rollout_ref"]["rollout"]["name"] = "hf"
    report = apply_verl_keys(cfg)
    assert "engine_kwargs" not in cfg["actor_rollout_ref"]["rollout"]
    assert report.warnings == ["actor_rollout_ref.rollout.enable_chunked_prefill=true: ignored: an argument of "
                               "vllm.LLM, and this run generates with actor_rollout_ref.rollout.name=hf"]


def test_vllm_worker_passes_the_collected_arguments_and_override_config():
    from trainer.config import ModelConfig, RolloutConfig
    from trainer.config.packaged import packaged_section
    from trainer.workers.actor import vllm_kwargs

    lengths = ["rollout=vllm", "data.max_prompt_length=8", "data.max_response_length=4"]
    rc = packaged_section(RolloutConfig, "actor_rollout_ref.rollout", lengths,
                          engine_kwargs={"vllm": {"enable_chunked_prefill": True, "max_model_len": 64}})
    model = packaged_section(ModelConfig, "actor_rollout_ref.model", override_config={"rope_theta": 1e6})
    assert vllm_kwargs(rc, model) == {"max_model_len": 64, "enable_chunked_prefill": True,
                                      "hf_overrides": {"rope_theta": 1e6}}
    assert vllm_kwargs(packaged_section(RolloutConfig, "actor_rollout_ref.rollout", lengths),
                       packaged_section(ModelConfig, "actor_rollout_ref.model")) == {"max_model_len": 12}


def test_dapo_reward_keys_of_reward_kwargs_map_onto_overlong_buffer():
    cfg = _cfg(reward_model__reward_kwargs={"overlong_buffer_cfg": {"enable": True, "len": 16, "penalty_factor": 0.5,
                                                                    "log": False}, "max_resp_len": 64},
               custom_reward_function={"path": "my.py", "name": "score"})
    report = apply_verl_keys(cfg)
    rm = cfg["reward_model"]
    assert rm["overlong_buffer"] == {"enable": True, "len": 16, "penalty_factor": 0.5}
    assert rm["custom_reward_function"] == {"path": "my.py", "name": "score"}
    assert "reward_kwargs" not in rm and "custom_reward_function" not in cfg
    assert report.errors == []
    assert report.warnings == ["reward_model.reward_kwargs.overlong_buffer_cfg.log=false: ignored: the overlong "
                               "penalty is always logged (reward/overlong_penalty_mean, reward/overlong_frac)"]
    cfg = _cfg(reward_model__reward_kwargs={"max_resp_len": 32})
    assert apply_verl_keys(cfg).errors == ["reward_model.reward_kwargs.max_resp_len=32: the overlong penalty counts "
                                           "up to data.max_response_length=64; set the two equal"]


def test_refused_keys_say_what_to_use_instead():
    cfg = _cfg(actor_rollout_ref__model__lora_adapter_path="/a", reward_model__enable=True,
               actor_rollout_ref__actor__strategy="x")
    errors = apply_verl_keys(cfg).errors
    assert errors == ["actor_rollout_ref.actor.strategy=x: expected fsdp, fsdp2 or megatron (fsdp: DeepSpeed ZeRO "
                      "here)",
                      "actor_rollout_ref.model.lora_adapter_path=/a: not supported: training starts from new adapters; "
                      "to go on from a saved one, merge it into its base first (peft's merge_and_unload) and pass the "
                      "merged folder as the model's path",
                      "reward_model.enable=true: model-based reward models are not supported: rewards come from rule "
                      "scorers (reward_model.scorer), custom_reward_function.path, or algorithm=prime's implicit PRM"]
    cfg = _cfg(actor_rollout_ref__model__lora_adapter_path=None, reward_model__enable=False)  # the values that mean "off"
    assert apply_verl_keys(cfg) == Report()
    assert override_errors("actor_rollout_ref.actor.ppo_micro_batch_size", 4) == [
        "actor_rollout_ref.actor.ppo_micro_batch_size=4: not supported: a global micro-batch size: set the rows per "
        "worker with the key's _per_gpu form (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)"]


def test_command_line_errors_come_all_at_once():
    with pytest.raises(ConfigErrors) as exc:
        check_overrides(["trainer.save_frq=5", "algorithm=nope", "actor_rollout_ref.model.lora_adapter_path=/a",
                         "reward_model.model.beta_train=0.1", "actor_rollout_ref.actor.optim.learning_rate=1"])
    lines = exc.value.messages
    assert len(lines) == 5, lines
    assert lines[0].startswith("unknown option algorithm=nope (configs/algorithm/nope.yaml does not exist): "
                               "expected one of [")
    assert "actor_rollout_ref.model.lora_adapter_path=/a: not supported" in lines[1]
    assert any(line.startswith("unknown config key 'trainer.save_frq'") and "did you mean 'trainer.save_freq'" in line
               for line in lines)
    assert "reward_model.model.beta_train: a key of algorithm=prime (PRIME); add algorithm=prime" in lines


def test_entry_point_prints_every_config_error_before_any_worker(tmp_path):
    """Command-line errors and the checks of the composed rest (validate, preflight) in one run, one line each."""
    from tests.e2e_shared import run_main_forked

    # trainer/main.py run as a command, forked from the session's pre-imported driver (4 s of imports less)
    proc = run_main_forked(str(tmp_path), "trainer.save_frq=5", "actor_rollout_ref.model.lora_rank=-1",
                           "data.train_batch_size=7", "actor_rollout_ref.actor.clip_ratio_c=0.5",
                           "data.val_files=/no/such.parquet", "trainer.test_freq=5",  # validation reads val_files
                           timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 5, proc.stderr[-3000:]
    for needle in ("trainer.save_frq", "lora_rank=-1", "data.train_batch_size=7", "clip_ratio_c=0.5",
                   "/no/such.parquet"):
        assert any(needle in e for e in errors), (needle, errors)
    assert not os.path.exists(tmp_path / "data")


def test_verl_habits_become_group_choices():
    prepared = prepare_overrides(["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/m"])
    assert prepared.errors == []
    assert "rollout=vllm" in prepared.overrides and "model=hf" in prepared.overrides
    prepared = prepare_overrides(["rollout=hf", "actor_rollout_ref.rollout.name=hf", "model=smollm2",
                                  "actor_rollout_ref.model.path=/m"])
    assert prepared.overrides.count("rollout=hf") == 1 and "model=hf" not in prepared.overrides


def test_added_keys_pass_only_when_something_reads_them(tmp_path):
    from tests.verl_scripts import composed

    errors = prepare_overrides(["+trainer.my_new_key=1"]).errors
    assert errors == ["unknown config key 'trainer.my_new_key': it is not in configs/ppo_trainer.yaml or its groups, "
                      "nor one of verl's keys (check the spelling)"]
    # verl's scripts add the DAPO reward keys with '+'; free-form dicts take any key
    _, _, cfg, report = composed(["+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                                  "+reward_model.reward_kwargs.overlong_buffer_cfg.len=1",
                                  "+reward_model.scorer_kwargs.format_score=0.2", f"trainer.output_dir={tmp_path}"])
    assert report.errors == [] and cfg["reward_model"]["overlong_buffer"]["enable"] is True
    assert cfg["reward_model"]["overlong_buffer"]["len"] == 1 and cfg["reward_model"]["scorer_kwargs"] == {
        "format_score": 0.2}


def test_resume_path_mode_reads_resume_from_path(tmp_path):
    from tests.verl_scripts import composed

    _, _, cfg, report = composed(["trainer.resume_mode=resume_path",
                                  f"trainer.resume_from_path={tmp_path}/global_step_2"])
    assert report.errors == [] and cfg["trainer"]["resume_mode"] == f"{tmp_path}/global_step_2"
    _, _, _, report = composed(["trainer.resume_mode=resume_path"])
    assert report.errors == ["trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>"]
    _, _, _, report = composed(["trainer.resume_mode=auto", f"trainer.resume_from_path={tmp_path}"])
    assert "only read with trainer.resume_mode=resume_path" in report.errors[0]


def test_readme_key_table_is_the_generated_one():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- verl-key-table start -->\n(.*?)\n<!-- verl-key-table end -->", text, re.S)
    assert m, "README.md lacks the generated verl key table (python -m trainer.verl_compat --markdown)"
    assert m.group(1) == markdown_table()
    assert len(VERL_KEYS) == markdown_table().count("\n| `")


def test_a_config_error_list_is_one_error_per_line():
    assert str(ConfigErrors(["a", "b"])) == "a\nb" and isinstance(ConfigErrors(["a"]), ConfigError)


@pytest.mark.parametrize("use_prime", [True, False])
def test_use_kl_in_reward_with_prime_warns_that_it_has_no_effect(use_prime):
    """verl's PRIME recipe sets use_kl_in_reward=True; PRIME's advantages never read the penalised rewards."""
    from trainer.unused_settings import unused_setting_warnings

    cfg = _cfg(algorithm={"use_prime": use_prime, "use_kl_in_reward": True})
    hits = [w for w in unused_setting_warnings(cfg) if w.startswith("algorithm.use_kl_in_reward=true")]
    assert len(hits) == (1 if use_prime else 0)


@pytest.mark.parametrize("enable", [False, True])
def test_multi_turn_settings_without_enable_warn_that_they_are_ignored(enable):
    """Tools and limits set while multi-turn rollouts are off changed nothing, without a word."""
    from tests.verl_scripts import composed

    mt = "actor_rollout_ref.rollout.multi_turn"
    prepared, _, _, report = composed([f"{mt}.enable={str(enable).lower()}", f"{mt}.tools=[python]",
                                       f"{mt}.max_assistant_turns=3", f"{mt}.format=hermes"])
    assert prepared.errors == [] and report.errors == []
    hits = [w for w in report.warnings if w.startswith(mt)]
    assert hits == ([] if enable else [f"{mt}.max_assistant_turns=3: ignored: multi-turn rollouts are off (set "
                                       f"{mt}.enable=true to use it)",
                                       f"{mt}.tools=['python']: ignored: multi-turn rollouts are off (set "
                                       f"{mt}.enable=true to use it)"])


@pytest.mark.parametrize("algo,warned", [("grpo", True), ("gae", False)])
def test_critic_settings_of_a_run_without_a_critic_warn(algo, warned):
    """A PPO command line turned into GRPO keeps its critic keys: they changed nothing, without a word."""
    from tests.verl_scripts import composed

    _, _, _, report = composed([f"algorithm={algo}", "critic.optim.lr=1e-4", "critic.ppo_micro_batch_size_per_gpu=4",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"])
    hits = [w for w in report.warnings if w.startswith("critic.")]
    # the micro-batch of the forward follows the one set (an interpolation): it is not named
    assert hits == ([f"critic.ppo_micro_batch_size_per_gpu=4, critic.optim.lr=0.0001: ignored: this run trains no "
                     f"critic (algorithm.adv_estimator={algo}, critic.enable unset or false); algorithm=gae or "
                     "critic.enable=true trains one"] if warned else [])


@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_kl_loss_settings_without_use_kl_loss_warn(use_kl_loss):
    from tests.verl_scripts import composed

    a = "actor_rollout_ref.actor"
    _, _, _, report = composed([f"{a}.use_kl_loss={str(use_kl_loss).lower()}", f"{a}.kl_loss_coef=0.01",
                                f"{a}.kl_loss_type=mse"])
    hits = [w for w in report.warnings if w.startswith(f"{a}.kl_loss")]
    assert hits == ([] if use_kl_loss else [f"{a}.kl_loss_coef=0.01, {a}.kl_loss_type=mse: ignored: "
                                            f"{a}.use_kl_loss=false (set it true for the KL loss term)"])


def _advantages(spec, gamma: float, lam: float):
    """``spec``'s advantages on one fixed batch (4 rows in 2 groups, 5 tokens, rewards at varied positions) with
    every input it declares made up."""
    import torch

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.rand(4, 5, generator=g) * mask
    extra = {"values": torch.rand(4, 5, generator=g) * mask, "reward_baselines": torch.rand(4, generator=g),
             "reward_components": torch.rand(4, 2, generator=g), "old_log_probs": -torch.rand(4, 5, generator=g),
             "sum_pi_squared": torch.rand(4, 5, generator=g) * mask, "rollout_is_weights": torch.ones(4, 5)}
    kwargs = {k: extra[k] for k in spec.inputs if k in extra}
    if "gdpo_reward_weights" in spec.config_kwargs:
        kwargs["gdpo_reward_weights"] = [1.0, 1.0]
    import numpy as np

    adv, _ = spec.fn(rewards, mask, index=np.array(["a", "a", "b", "b"], dtype=object), gamma=gamma, lam=lam,
                     **kwargs)
    return adv


def test_gamma_and_lam_warnings_name_exactly_the_estimators_that_read_them():
    """The 'ignored' warning for algorithm.gamma / lam must not fire for an estimator that reads them (nor stay
    silent for one that does not): every registered estimator is run with two values of each."""
    import torch

    from trainer.core_algos import ADV_ESTIMATOR_SPECS
    from trainer.unused_settings import GAMMA_READERS, LAM_READERS

    for name, spec in ADV_ESTIMATOR_SPECS.items():
        if name.startswith("unit_test"):
            continue
        base = _advantages(spec, 1.0, 1.0)
        reads_gamma = not torch.allclose(base, _advantages(spec, 0.5, 1.0))
        reads_lam = not torch.allclose(base, _advantages(spec, 1.0, 0.5))
        assert reads_gamma == (name in GAMMA_READERS), name
        assert reads_lam == (name in LAM_READERS), name


def test_settings_that_another_choice_leaves_unused_warn():
    """verl accepts these and changes nothing: each switch that leaves them unused names them in one line."""
    from tests.verl_scripts import composed

    _, _, _, report = composed(["algorithm.kl_ctrl.kl_coef=0.5", "algorithm.filter_groups.metric=score",
                                "reward_model.overlong_buffer.len=64",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",
                                "trainer.max_actor_ckpt_to_keep=2", "algorithm.gamma=0.5", "algorithm.lam=0.5"])
    ignored = sorted(w.split(": ignored: ")[0] for w in report.warnings if ": ignored: " in w)
    assert ignored == ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100", "algorithm.filter_groups.metric=score",
                       "algorithm.gamma=0.5", "algorithm.kl_ctrl.kl_coef=0.5", "algorithm.lam=0.5",
                       "reward_model.overlong_buffer.len=64", "trainer.max_actor_ckpt_to_keep=2"]
    _, _, _, report = composed(["algorithm=gae", "algorithm.gamma=0.5", "algorithm.lam=0.5",
                                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100", "algorithm.use_kl_in_reward=true",
                                "algorithm.kl_ctrl.kl_coef=0.5", "trainer.save_freq=5", "trainer.max_actor_ckpt_to_keep=2"])
    assert [w for w in report.warnings if ": ignored: " in w] == []  # each switched on: none is named


def test_critic_checkpoint_retention_is_one_message_either_warned_or_refused():
    """``trainer.max_critic_ckpt_to_keep=1`` without saves was warned as ignored AND refused as differing from
    ``max_actor_ckpt_to_keep``: now the warning alone without saves, the error alone with them."""
    from tests.verl_scripts import composed
    from trainer.launch import validate

    _, _, cfg, report = composed(["trainer.max_critic_ckpt_to_keep=1"])
    assert [w for w in report.warnings if "max_critic_ckpt_to_keep" in w] == [
        "trainer.max_critic_ckpt_to_keep=1: ignored: trainer.save_freq=-1 saves no checkpoints"]
    validate(cfg)
    _, _, cfg, report = composed(["trainer.max_critic_ckpt_to_keep=1", "trainer.save_freq=5"])
    assert not [w for w in report.warnings if "max_critic_ckpt_to_keep" in w]
    with pytest.raises(ConfigError, match="max_critic_ckpt_to_keep=1 differs from trainer.max_actor_ckpt_to_keep"):
        validate(cfg)


_A, _RC = "actor_rollout_ref.actor", "algorithm.rollout_correction"
#: (the keys set, the choice that leaves them unused, the one that reads them, the keys named): each used to be
#: accepted without a word while the run never read it
FAMILIES = [
    (["algorithm.norm_adv_by_std_in_grpo=false"], ["algorithm=rloo"], ["algorithm=grpo"],
     ["algorithm.norm_adv_by_std_in_grpo=false"]),
    (["algorithm.norm_adv_by_std_in_grpo=false"], ["algorithm=reinforce_plus_plus"], ["algorithm.adv_estimator=gdpo"],
     ["algorithm.norm_adv_by_std_in_grpo=false"]),
    ([f"{_A}.clip_ratio_c=10"], [f"{_A}.policy_loss.loss_mode=gspo"], [f"{_A}.policy_loss.loss_mode=dppo_tv"],
     [f"{_A}.clip_ratio_c=10"]),
    ([f"{_A}.tau_pos=2", f"{_A}.policy_loss.clip_cov_ratio=0.001", f"{_A}.policy_loss.ppo_kl_coef=0.5"],
     [f"{_A}.policy_loss.loss_mode=gpg"], [],
     [f"{_A}.tau_pos=2", f"{_A}.policy_loss.clip_cov_ratio=0.001", f"{_A}.policy_loss.ppo_kl_coef=0.5"]),
    ([f"{_A}.clip_ratio=0.3"], [f"{_A}.policy_loss.loss_mode=sapo"], [f"{_A}.policy_loss.loss_mode=cispo"],
     [f"{_A}.clip_ratio=0.3"]),  # clip_ratio_low/high follow it: not named
    (["trainer.log_val_generations=3", "actor_rollout_ref.rollout.val_kwargs.n=4", "data.val_max_rows=5",
      "trainer.val_also_greedy=true"], [], ["trainer.test_freq=5"],
     ["trainer.log_val_generations=3", "trainer.val_also_greedy=true", "actor_rollout_ref.rollout.val_kwargs.n=4",
      "data.val_max_rows=5"]),
    (["trainer.test_freq=5"], ["data.train_files=/d/train.parquet"], [], ["trainer.test_freq=5"]),
    ([f"{_RC}.rollout_is_threshold=5.0", f"{_RC}.rollout_is_batch_normalize=true"], [], [f"{_RC}.rollout_is=token"],
     [f"{_RC}.rollout_is_threshold=5.0", f"{_RC}.rollout_is_batch_normalize=true"]),
    (["actor_rollout_ref.model.lora_alpha=32", "actor_rollout_ref.model.target_modules=[q_proj]"], [],
     ["actor_rollout_ref.model.lora_rank=8"],
     ["actor_rollout_ref.model.lora_alpha=32", "actor_rollout_ref.model.target_modules=['q_proj']"]),
    (["actor_rollout_ref.rollout.n_gpus=2", "trainer.async.trace_file=/tmp/x.json"], [],
     ["trainer.rollout_placement=separate"], ["actor_rollout_ref.rollout.n_gpus=2", "trainer.async.trace_file=/tmp/x.json"]),
    ([f"{_A}.megatron.tensor_model_parallel_size=2", f"{_A}.megatron.ckpt_format=torch"], [],
     ["trainer.strategy=megatron"], [f"{_A}.megatron.tensor_model_parallel_size=2", f"{_A}.megatron.ckpt_format=torch"]),
    (["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.target_kl=0.5", "algorithm.kl_ctrl.horizon=50"], [],
     ["algorithm.kl_ctrl.type=adaptive"], ["algorithm.kl_ctrl.target_kl=0.5", "algorithm.kl_ctrl.horizon=50"]),
    (["trainer.test_freq=1", "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
      "actor_rollout_ref.rollout.val_kwargs.top_p=0.5", "actor_rollout_ref.rollout.val_kwargs.top_k=5"], [],
     ["actor_rollout_ref.rollout.val_kwargs.do_sample=true"],
     ["actor_rollout_ref.rollout.val_kwargs.temperature=0.7", "actor_rollout_ref.rollout.val_kwargs.top_p=0.5",
      "actor_rollout_ref.rollout.val_kwargs.top_k=5"]),
    # the actor's size reaches the rollout's and the reference's log-prob passes (their shipped sizes copy it): it
    # is unread only when they too form micro-batches by tokens
    ([f"{_A}.ppo_micro_batch_size_per_gpu=4", f"{_A}.ppo_mini_batch_size=16"], [f"{_A}.use_dynamic_bsz=true"],
     [f"{_A}.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false"],
     [f"{_A}.ppo_micro_batch_size_per_gpu=4"]),
    (["algorithm=gae", "critic.ppo_micro_batch_size_per_gpu=4"], ["critic.use_dynamic_bsz=true"], [],
     ["critic.ppo_micro_batch_size_per_gpu=4"]),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", f"{_A}.ppo_mini_batch_size=16"],
     ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true"], [],
     ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"]),
    # the old-log-prob pass runs only when a step is more than one optimizer step (or something reads its output)
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"], [f"{_A}.ppo_mini_batch_size=32"],
     [f"{_A}.ppo_mini_batch_size=16"], ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"]),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"], [], ["algorithm.use_kl_in_reward=true"],
     ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"]),
]


@pytest.mark.parametrize("keys,unused,reads,named", FAMILIES, ids=[f[0][0].split("=")[0] + "|" + ",".join(f[1])
                                                                   for f in FAMILIES])
def test_a_family_of_settings_that_the_run_never_reads_warns(keys, unused, reads, named):
    """One warning line per family naming the keys set away from their defaults; none with the choice that reads
    them (trainer/unused_settings.py SWITCHED_OFF, trainer/unused_conditions.py)."""
    from tests.verl_scripts import composed

    def ignored(overrides):
        _, _, _, report = composed(overrides)
        return [k for w in report.warnings if ": ignored: " in w for k in w.split(": ignored: ")[0].split(", ")
                if k.split("=")[0] in {n.split("=")[0] for n in named}]

    assert sorted(ignored(keys + unused)) == sorted(named)
    if reads:
        assert ignored(keys + reads) == []


def test_shipped_group_options_and_interpolated_defaults_are_not_named():
    """algorithm=dr_grpo ships norm_adv_by_std_in_grpo=false for an estimator that does not read it; the async
    trace file's default interpolates the output folder inside a string: neither is a setting of the user's."""
    from tests.verl_scripts import composed

    for overrides in (["algorithm=dr_grpo"], ["trainer.output_dir=/tmp/elsewhere"], ["data=gsm8k"], []):
        _, _, _, report = composed(overrides)
        assert [w for w in report.warnings if ": ignored: " in w] == [], (overrides, report.warnings)


class _Reads(dict):
    """A config mapping that records the keys read through ``get`` (nested sections too)."""

    def __init__(self, data, seen, prefix=""):
        super().__init__({k: _Reads(v, seen, f"{prefix}{k}.") if isinstance(v, dict) else v for k, v in data.items()})
        self.seen, self.prefix = seen, prefix

    def get(self, key, default=None):
        self.seen.add(self.prefix + key)
        return super().get(key, default)


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "gpg", "cispo", "geo_mean", "clip_cov", "kl_cov", "sapo",
                                  "dppo_tv", "dppo_kl"])
def test_loss_mode_readers_name_exactly_the_keys_each_builtin_loss_reads(mode):
    """Every built-in policy loss run once with a recording config: the keys it reads are exactly those whose
    LOSS_MODE_READERS entry lists it."""
    import torch

    from trainer import core_algos
    from trainer.unused_conditions import BUILTIN_LOSS_MODES, LOSS_MODE_READERS

    assert set(BUILTIN_LOSS_MODES) <= set(core_algos.POLICY_LOSS_REGISTRY)
    own = {k.split("actor_rollout_ref.actor.")[1] for keys in LOSS_MODE_READERS for k in keys}
    seen: set = set()
    cfg = _Reads({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                  "tau_pos": 1.0, "tau_neg": 1.05, "policy_loss": {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0,
                  "clip_cov_ub": 5.0, "kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1}}, seen)
    torch.manual_seed(0)
    old, new, adv = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
    core_algos.get_policy_loss_fn(mode)(old, new, adv, torch.ones(2, 4), "token-mean", config=cfg)
    expected = {k.split("actor_rollout_ref.actor.")[1] for keys, readers in LOSS_MODE_READERS.items()
                if mode in readers for k in keys}
    assert seen & own == expected, (mode, sorted(seen & own))


@pytest.mark.parametrize("unknown", [False, True])
def test_a_mistyped_value_does_not_hide_the_other_errors(tmp_path, unknown):
    """``data.train_batch_size=abc`` stopped the checks of every other value (they were printed only after it was
    fixed); with an unknown key too, only the unknown key was printed. Now the other values are checked with the
    mistyped one at its default, and every error is printed in the same run."""
    from tests.test_reliability_config import run_cli

    bad = ["data.train_batch_size=abc", "algorithm.adv_estimator=grp0", "actor_rollout_ref.rollout.temperature=-1"]
    proc = run_cli(str(tmp_path / "out"), *bad, *(["actor_rollout_ref.actor.ppo_epoch=2"] if unknown else []),
                   forked=True)
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    needles = ["data.train_batch_size='abc'; expected an integer", "algorithm.adv_estimator='grp0'",
               "actor_rollout_ref.rollout.temperature=-1"] + (["'actor_rollout_ref.actor.ppo_epoch'"] if unknown else [])
    assert len(errors) == len(needles), errors
    for needle in needles:
        assert any(needle in e for e in errors), (needle, errors)


def test_several_bad_values_of_one_section_are_all_named(tmp_path):
    """A config section stops at its first bad value: ppo_epochs=0, clip_ratio_c=0.5 and loss_agg_mode=token_mean
    of the actor came one per run. The checks now run again with each named key at its default."""
    from tests.test_reliability_config import run_cli

    a = "actor_rollout_ref.actor"
    proc = run_cli(str(tmp_path / "out"), f"{a}.loss_agg_mode=token_mean", f"{a}.ppo_epochs=0", f"{a}.clip_ratio_c=0.5",
                   forked=True)
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 3, errors
    for needle in (f"{a}.loss_agg_mode='token_mean'", f"{a}.ppo_epochs=0", f"{a}.clip_ratio_c=0.5"):
        assert any(needle in e for e in errors), (needle, errors)


@pytest.mark.parametrize("overrides,warned", [
    (["data=synthetic_tool", "data.synthetic_task=digits", "data.warm_start_steps=50"],
     "data.warm_start_steps=50: ignored: data.synthetic_task=digits has no warm start"),
    (["data=synthetic_tool", "data.warm_start_steps=50"], None),
    (["actor_rollout_ref.model.path=/m", "actor_rollout_ref.model.tiny.hidden_size=48"],
     "actor_rollout_ref.model.tiny.hidden_size=48: ignored: actor_rollout_ref.model.path=/m is loaded"),
    (["actor_rollout_ref.model.tiny.hidden_size=48"], None),
    (["actor_rollout_ref.model.path=/m"], None),
])
def test_embedded_model_settings_that_the_run_never_reads_warn(overrides, warned):
    """The tiny model's settings are read only when it is built (no model path), and its warm start only by a task
    that has one: otherwise they changed nothing, without a word."""
    from tests.verl_scripts import composed

    _, _, _, report = composed(overrides)
    hits = [w for w in report.warnings if "tiny." in w.split(":")[0] or "warm_start_steps" in w.split(":")[0]]
    assert hits == ([] if warned is None else [hits[0]]) and (warned is None or hits[0].startswith(warned)), hits


@pytest.mark.parametrize("overrides,warned", [
    (["actor_rollout_ref.actor.loss_scale_factor=5"],
     ["actor_rollout_ref.actor.loss_scale_factor=5: ignored: actor_rollout_ref.actor.loss_agg_mode=token-mean (only "
      "seq-mean-token-sum-norm divides by it)"]),
    (["actor_rollout_ref.actor.loss_scale_factor=5", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"],
     []),
    (["algorithm=gae", "critic.loss_scale_factor=7", "critic.loss_agg_mode=token-mean"],
     ["critic.loss_scale_factor=7: ignored: critic.loss_agg_mode=token-mean (only seq-mean-token-sum-norm divides "
      "by it)"]),
])
def test_a_loss_scale_factor_that_the_loss_mode_never_reads_warns(overrides, warned):
    """Only seq-mean-token-sum-norm divides by loss_scale_factor: with another mode it changed nothing."""
    from tests.verl_scripts import composed

    _, _, _, report = composed(overrides)
    assert [w for w in report.warnings if "loss_scale_factor=" in w.split(":")[0]] == warned


A_ = "actor_rollout_ref.actor"
_BOTH = [("custom_reward_function.path=/tmp/a.py", "reward_model.custom_reward_function.path=/tmp/b.py"),
         (f"{A_}.optim.clip_grad=5", f"{A_}.grad_clip=2"),
         ("data.train_max_samples=64", "data.max_rows=128"),
         ("data.train_max_samples=-1", "data.max_rows=128"),  # named as written (-1: every row), not as null
         (f"{A_}.optim.warmup_style=cosine", f"{A_}.optim.lr_scheduler_type=linear"),
         ("trainer.val_generations_to_log_to_wandb=3", "trainer.log_val_generations=5"),
         ("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
          "actor_rollout_ref.rollout.update_weights_bucket_megabytes=128")]


@pytest.mark.parametrize("verl,ours", _BOTH)
def test_a_verl_name_and_its_own_key_with_different_values_are_refused(verl, ours):
    """Both names of one setting given with different values: one error naming both, not a silent winner."""
    from tests.verl_scripts import composed

    _, _, _, report = composed([verl, ours])
    assert report.errors == [f"{verl}: contradicts {ours} (the same setting under verl's name); give one of the "
                             "two, or the same value to both"]


def test_a_verl_mapping_contradicting_the_users_own_mapping_is_refused():
    """verl's empty ``reward_kwargs`` replaced the options the user gave under this project's key without a word;
    a verl mapping given alone, or equal to the user's, is read as before."""
    from tests.verl_scripts import composed

    own = "+reward_model.custom_reward_function.reward_kwargs.bonus=2"
    _, _, _, report = composed(["+custom_reward_function.reward_kwargs={}", own])
    assert report.errors == ["custom_reward_function.reward_kwargs={}: contradicts reward_model.custom_reward_function."
                             "reward_kwargs={'bonus': 2} (the same setting under verl's name); give one of the two, "
                             "or the same value to both"]
    _, _, cfg, report = composed(["+custom_reward_function.reward_kwargs.bonus=3"])
    assert report.errors == [] and cfg["reward_model"]["custom_reward_function"]["reward_kwargs"] == {"bonus": 3}
    _, _, _, report = composed(["+custom_reward_function.reward_kwargs.bonus=2", own])
    assert report.errors == []


@pytest.mark.parametrize("verl,ours", [(f"{A_}.optim.clip_grad=2", f"{A_}.grad_clip=2"),
                                       ("data.train_max_samples=-1", "data.max_rows=null"),
                                       ("custom_reward_function.path=/tmp/a.py",
                                        "reward_model.custom_reward_function.path=/tmp/a.py")])
def test_a_verl_name_and_its_own_key_with_the_same_value_pass(verl, ours):
    from tests.verl_scripts import composed

    _, _, _, report = composed([verl, ours])
    assert report.errors == []


def test_a_verl_name_contradicting_a_command_line_key_at_its_default_is_refused():
    """The key given on the command line counts as set even at the value configs/ ships."""
    cfg = _cfg(actor_rollout_ref__actor__optim={"clip_grad": 5.0})
    report = apply_verl_keys(cfg, given={f"{A_}.grad_clip"})
    assert report.errors == [f"{A_}.optim.clip_grad=5.0: contradicts {A_}.grad_clip=1.0 (the same setting under "
                             "verl's name); give one of the two, or the same value to both"]
    assert cfg["actor_rollout_ref"]["actor"]["grad_clip"] == 1.0
    cfg = _cfg(actor_rollout_ref__actor__optim={"clip_grad": 5.0})
    assert apply_verl_keys(cfg).errors == [] and cfg["actor_rollout_ref"]["actor"]["grad_clip"] == 5.0


_REF = "actor_rollout_ref.ref"


@pytest.mark.parametrize("kl,warned", [([], True), (["actor_rollout_ref.actor.use_kl_loss=true"], False),
                                       (["algorithm.use_kl_in_reward=true"], False)])
def test_reference_settings_of_a_run_without_a_reference_model_warn(kl, warned):
    """Without a KL term no reference model is built: its settings changed nothing, without a word. With one, its
    row-count micro-batch is unread beside its token-budget switch."""
    from tests.verl_scripts import composed

    _, _, _, report = composed([*kl, f"{_REF}.log_prob_micro_batch_size_per_gpu=4",
                                f"{_REF}.log_prob_use_dynamic_bsz=true"])
    hits = [w for w in report.warnings if w.startswith(f"{_REF}.")]
    assert hits == ([f"{_REF}.log_prob_micro_batch_size_per_gpu=4, {_REF}.log_prob_use_dynamic_bsz=true: ignored: "
                     "this run has no reference model (actor_rollout_ref.actor.use_kl_loss=false, "
                     "algorithm.use_kl_in_reward=false; either one true computes reference log-probs)"]
                    if warned else
                    [f"{_REF}.log_prob_micro_batch_size_per_gpu=4: ignored: {_REF}.log_prob_use_dynamic_bsz=true "
                     f"forms micro-batches by their tokens ({_REF}.log_prob_max_token_len_per_gpu), not by a row "
                     "count"])


def test_reference_settings_that_follow_the_actor_are_not_named():
    from tests.verl_scripts import composed

    _, _, _, report = composed(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    assert not [w for w in report.warnings if w.startswith(f"{_REF}.")]
