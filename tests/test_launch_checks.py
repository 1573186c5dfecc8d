"""Config checks that stop a run before any worker starts: group estimators need n >= 2; vLLM needs CUDA + vllm."""
import importlib.util
import json
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.e2e_utils import ROOT
from trainer.launch import ConfigError, validate


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        return OmegaConf.to_container(compose("ppo_trainer", overrides=list(overrides)), resolve=True)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "dr_grpo", "reinforce_plus_plus_baseline"])
def test_group_estimators_refuse_a_single_sample(algo):
    with pytest.raises(ConfigError, match="rollout.n=1"):
        validate(_cfg(f"algorithm={algo}", "actor_rollout_ref.rollout.n=1"))
    validate(_cfg("algorithm=gae", "actor_rollout_ref.rollout.n=1"))  # GAE has a critic baseline


def test_vllm_needs_cuda_and_the_package():
    with pytest.raises(ConfigError, match="trainer.device=cuda"):
        validate(_cfg("rollout=vllm"))
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match=r"pip install -e \.\[vllm\]"):
            validate(_cfg("rollout=vllm", "trainer.device=cuda"))


def test_resume_path_is_checked_before_start(tmp_path):
    from trainer.launch import preflight

    cfg = _cfg(f"trainer.resume_mode={tmp_path}/global_step_3")
    with pytest.raises(ConfigError, match="does not exist") as info:
        preflight(cfg)
    assert str(info.value) == f"trainer.resume_mode names '{tmp_path}/global_step_3', which does not exist"
    cfg = _cfg(f"trainer.resume_mode={tmp_path}")
    with pytest.raises(ConfigError, match="global_step"):
        preflight(cfg)


def _resume_cfg(strategy="deepspeed", tp=1, n_gpus=2):
    return {"trainer": {"strategy": strategy, "nnodes": 1, "n_gpus_per_node": n_gpus},
            "critic": {"enable": False}, "algorithm": {},
            "actor_rollout_ref": {"actor": {"megatron": {"tensor_model_parallel_size": tp,
                                                         "pipeline_model_parallel_size": 1}}}}


def _fake_ckpt(root, kind, sizes=None):
    """A step folder with what a save writes: the trainer state, and DeepSpeed's tag file, tag folder and one
    rng file per rank (2), or Megatron's meta.pt."""
    import torch

    actor = os.path.join(str(root), "global_step_2", "actor")
    os.makedirs(actor)
    torch.save({"global_step": 2}, os.path.join(os.path.dirname(actor), "data.pt"))
    if kind == "deepspeed":
        with open(os.path.join(actor, "latest"), "w") as f:
            f.write("global_step_2")
        os.makedirs(os.path.join(actor, "global_step_2"))
        torch.save({}, os.path.join(actor, "global_step_2", "mp_rank_00_model_states.pt"))
        for rank in range(2):
            torch.save({}, os.path.join(actor, f"rng_rank_{rank}.pt"))
    else:
        torch.save({"global_step": 2, **sizes}, os.path.join(actor, "meta.pt"))
    return os.path.dirname(actor)


def test_resume_refuses_a_checkpoint_of_the_other_strategy_before_start(tmp_path):
    from trainer.launch import check_resume_checkpoint

    ds = _fake_ckpt(tmp_path / "ds", "deepspeed")
    mg = _fake_ckpt(tmp_path / "mg", "megatron", {"tp_size": 1, "pp_size": 1, "dp_size": 2})
    check_resume_checkpoint(_resume_cfg("deepspeed"), ds)
    check_resume_checkpoint(_resume_cfg("megatron"), mg)
    with pytest.raises(ConfigError, match="is a megatron checkpoint but trainer.strategy=deepspeed"):
        check_resume_checkpoint(_resume_cfg("deepspeed"), mg)
    with pytest.raises(ConfigError, match="is a deepspeed checkpoint but trainer.strategy=megatron"):
        check_resume_checkpoint(_resume_cfg("megatron"), ds)
    with pytest.raises(ConfigError, match=r"saved with \{'tp_size': 1, 'pp_size': 1, 'dp_size': 2\} but this run "
                                          r"has \{'tp_size': 2, 'pp_size': 1, 'dp_size': 1\}"):
        check_resume_checkpoint(_resume_cfg("megatron", tp=2), mg)
    with pytest.raises(ConfigError, match="dp_size': 4"):
        check_resume_checkpoint(_resume_cfg("megatron", n_gpus=4), mg)
    os.remove(os.path.join(ds, "actor", "latest"))
    with pytest.raises(ConfigError, match="neither a DeepSpeed"):
        check_resume_checkpoint(_resume_cfg("deepspeed"), ds)


def test_rollout_attn_implementation_is_checked_before_start():
    for ok in ("auto", "sdpa", "sdpa_gqa", "eager", "flex_attention"):  # flash_attention_*: tests/test_attention_checks.py
        validate(_cfg(f"actor_rollout_ref.rollout.attn_implementation={ok}"))
    with pytest.raises(ConfigError, match=r"attn_implementation='sdpa-gqa'; expected auto, sdpa, sdpa_gqa, eager"):
        validate(_cfg("actor_rollout_ref.rollout.attn_implementation=sdpa-gqa"))


@pytest.mark.parametrize("overrides,needle", [
    (["algorithm.kl_ctrl.kl_coef=-1"], "kl_coef must be >= 0, got -1"),
    (["algorithm.kl_ctrl.type=adaptiv"], "unknown kl_ctrl type 'adaptiv'"),
    (["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"], "horizon > 0"),
])
def test_a_kl_controller_that_does_not_build_is_refused_before_start(overrides, needle):
    """The driver builds the controller after Ray is up, whether or not the KL is in the reward."""
    with pytest.raises(ConfigError) as info:
        validate(_cfg(*overrides))
    lines = getattr(info.value, "messages", [str(info.value)])
    assert any(ln.startswith("algorithm.kl_ctrl=") and needle in ln for ln in lines), lines
    validate(_cfg("algorithm.kl_ctrl.type=adaptive"))  # the shipped adaptive defaults build


def test_a_fresh_run_that_saves_does_not_write_over_earlier_checkpoints(tmp_path):
    from trainer.launch import preflight

    root = _fake_ckpt(tmp_path / "ckpt", "deepspeed")
    fresh = _cfg(f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=1")
    with pytest.raises(ConfigError, match=r"holds checkpoints \(steps 2\.\.2\).*trainer.resume_mode=auto") as info:
        preflight(fresh)
    assert "\n" not in str(info.value)
    # a run that saves nothing is refused too: a later resume_mode=auto would resume the earlier run's checkpoint
    # into its metrics (outside trainer.output_dir the checkpoints cannot be set aside with its other outputs)
    with pytest.raises(ConfigError, match=r"holds checkpoints \(steps 2\.\.2\) of an earlier run outside "
                                          r"trainer\.output_dir=.*cannot set them aside"):
        preflight(_cfg(f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=-1"))
    preflight(_cfg(f"trainer.default_local_dir={tmp_path}/other", "trainer.save_freq=1"))
    # inside trainer.output_dir (the default layout) a fresh run sets them aside at start-up instead
    preflight(_cfg(f"trainer.output_dir={tmp_path}", f"trainer.default_local_dir={tmp_path}/ckpt",
                   "trainer.save_freq=1"))
    assert os.path.isfile(os.path.join(root, "data.pt"))


def test_prime_prm_optimizer_setting_a_resume_would_ignore_is_refused(tmp_path):
    import torch

    from trainer.resume_checks import check_resume_optim

    saved = _cfg("algorithm=prime")
    step = tmp_path / "global_step_1"
    step.mkdir()
    torch.save({"global_step": 1, "config": saved}, str(step / "data.pt"))
    check_resume_optim(_cfg("algorithm=prime"), str(step))
    with pytest.raises(ConfigError, match=r"reward_model\.model\.optim\.lr=0\.5 \(checkpoint: 1e-06\).*ignored"):
        check_resume_optim(_cfg("algorithm=prime", "reward_model.model.optim.lr=0.5"), str(step))


def test_resume_refuses_another_row_order_or_batch_size(tmp_path):
    import torch

    from trainer.resume_checks import check_resume_data

    step = tmp_path / "global_step_1"
    step.mkdir()
    torch.save({"global_step": 1, "config": _cfg()}, str(step / "data.pt"))
    check_resume_data(_cfg("trainer.total_training_steps=99", "actor_rollout_ref.actor.optim.lr=0.1"), str(step))
    for override, needle in [("data.train_batch_size=16", r"data\.train_batch_size=16 \(checkpoint: 32\): "),
                             ("data.shuffle=false", r"data\.shuffle=False \(checkpoint: True\)")]:
        with pytest.raises(ConfigError, match=needle + ".*rows would repeat or be skipped") as info:
            check_resume_data(_cfg(override), str(step))
        assert "gen_batch_size" not in str(info.value)  # it follows train_batch_size: the user did not change it
    with pytest.raises(ConfigError, match=r"data\.gen_batch_size=16 \(checkpoint: 32\)"):  # set on its own: named
        check_resume_data(_cfg("data.gen_batch_size=16", "algorithm.filter_groups.enable=true"), str(step))
    torch.save({"global_step": 1}, str(step / "data.pt"))  # saved without a config: not compared
    check_resume_data(_cfg("data.seed=7"), str(step))


def _saved_step(tmp_path, cfg, dataloader=None):
    import torch

    step = tmp_path / "global_step_1"
    step.mkdir(exist_ok=True)
    torch.save({"global_step": 1, "config": cfg, "dataloader": dataloader or {}}, str(step / "data.pt"))
    return str(step)


@pytest.mark.parametrize("saved,now,needle", [
    ((), ("data.max_rows=100",), "data.max_rows=100 (checkpoint: None)"),
    (("data.train_files=/d/a.parquet",), ("data.train_files=/d/b.parquet",),
     "data.train_files='/d/b.parquet' (checkpoint: '/d/a.parquet')"),
    ((), ("data.prompt_key=question",), "data.prompt_key='question' (checkpoint: 'prompt')"),
    ((), ("data.filter_overlong_prompts=false",), "data.filter_overlong_prompts=False (checkpoint: True)"),
    ((), ("data.max_prompt_length=64",), "data.max_prompt_length=64 (checkpoint: 16)"),
    ((), ("+data.apply_chat_template_kwargs.enable_thinking=false",),
     "data.apply_chat_template_kwargs={'enable_thinking': False} (checkpoint: {})"),
    (("data.gen_batch_size=64",), ("data.gen_batch_size=64", "algorithm.filter_groups.enable=true"),
     "algorithm.filter_groups.enable=True (checkpoint: False)"),   # the loader's batch: gen_batch_size from now on
    (("algorithm=prime",), ("algorithm=prime", "data.oversample_factor=2"),
     "data.oversample_factor=2 (checkpoint: 4.0)"),
])
def test_resume_refuses_every_key_that_changes_the_loaders_rows(tmp_path, saved, now, needle):
    """Found by a tester: a resume with another ``data.max_rows`` was not refused and the row order changed without a
    word. Every key ``build_data`` reads that changes which rows the loader yields, in which order or how many per
    batch is compared now, in one line naming the key and both values."""
    from trainer.resume_checks import check_resume_data

    step = _saved_step(tmp_path, _cfg(*saved))
    check_resume_data(_cfg(*saved), step)
    with pytest.raises(ConfigError) as info:
        check_resume_data(_cfg(*now), step)
    assert needle in str(info.value) and "rows would repeat or be skipped" in str(info.value)
    assert str(info.value).startswith("trainer.resume_mode: ") and "\n" not in str(info.value)


def test_resume_compares_only_what_changes_the_loaders_rows(tmp_path):
    from trainer.resume_checks import check_resume_data

    step = _saved_step(tmp_path, _cfg("data.filter_overlong_prompts=false"))
    for same in ("trainer.total_epochs=3", "data.val_max_rows=4", "data.truncation=left",
                 "data.max_prompt_length=64",            # without the overlong filter the rows stay (cut or refused)
                 "algorithm.filter_groups.enable=true"):  # gen_batch_size = train_batch_size: the same batches
        check_resume_data(_cfg("data.filter_overlong_prompts=false", same), step)
    saved = _cfg("data.filter_overlong_prompts=false")
    saved["data"]["train_files"] = "/run/data/train.jsonl"  # the embedded task's file, filled in at start-up
    check_resume_data(_cfg("data.filter_overlong_prompts=false"), _saved_step(tmp_path, saved))


def test_resume_refuses_other_rows_under_the_same_settings(tmp_path):
    """Rows the config cannot show (a data file rewritten under its name, a tokenizer that filters other prompts):
    the checkpoint keeps the dataset's fingerprint with the loader position and the rows built are compared."""
    from trainer import embedded
    from trainer.dataset import PromptDataset, PromptLoader
    from trainer.resume_checks import check_resume_rows

    tok = embedded.build_tokenizer()
    rows = embedded.make_rows(40, seed=3)
    path = tmp_path / "train.jsonl"

    def dataset(rs):
        path.write_text("".join(json.dumps(r) + "\n" for r in rs))
        return PromptDataset(str(path), tok, max_prompt_length=16)

    state = PromptLoader(dataset(rows), 8, 0).state_dict()
    assert state["rows"] == 40
    step = _saved_step(tmp_path, _cfg(), state)
    check_resume_rows(step, dataset(rows))
    with pytest.raises(ConfigError, match=r"^trainer\.resume_mode: data\.train_files=\[.*train\.jsonl'\] gives 39 "
                                          r"training rows \(checkpoint: 40\):.*rows would repeat or be skipped"):
        check_resume_rows(step, dataset(rows[1:]))
    with pytest.raises(ConfigError, match="the same number of training rows \\(40\\) but other prompts"):
        check_resume_rows(step, dataset(rows[20:] + rows[:20]))
    check_resume_rows(_saved_step(tmp_path / "..", _cfg()), dataset(rows[1:]))  # saved without one: not compared


def test_resume_path_mode_without_a_path_is_one_error_not_two(tmp_path):
    """``resume_mode=resume_path`` without ``resume_from_path`` gave a second, confusing line ("checkpoint path
    'resume_path' has no 'global_step_<N>'") besides the one that says what to add."""
    from trainer.config_preflight import resume_path
    from trainer.launch import prestart

    cfg = _cfg("trainer.resume_mode=resume_path", f"trainer.output_dir={tmp_path}")
    assert resume_path(cfg) is None
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        from hydra import compose

        hydra_cfg = compose("ppo_trainer", overrides=["trainer.resume_mode=resume_path", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(ConfigError) as info:
        prestart(hydra_cfg)
    assert str(info.value) == "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>"


def test_a_changed_lr_schedule_on_resume_is_warned(tmp_path):
    """The scheduler's position is restored and the new schedule is followed from there (the rate jumped from
    0.005 to 0.002 at the resumed step without a word)."""
    import torch

    from trainer.resume_schedule import resume_schedule_warnings

    step = tmp_path / "global_step_1"
    step.mkdir()
    torch.save({"global_step": 1, "config": _cfg("actor_rollout_ref.actor.optim.lr_warmup_steps=2")}, str(step / "data.pt"))
    assert resume_schedule_warnings(_cfg("actor_rollout_ref.actor.optim.lr_warmup_steps=2"), str(step)) == []
    assert resume_schedule_warnings(_cfg("actor_rollout_ref.actor.optim.lr_warmup_steps=-1"), str(step)) == []
    (line,) = resume_schedule_warnings(_cfg("actor_rollout_ref.actor.optim.lr_warmup_steps=2",
                                            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"), str(step))
    assert "actor_rollout_ref.actor.optim.lr_scheduler_type='cosine' (checkpoint: 'constant')" in line
    assert "schedule changes at the resumed step" in line


def test_lr1_a_changed_run_length_with_a_decaying_schedule_is_warned(tmp_path):
    import torch

    from trainer.resume_schedule import resume_schedule_warnings

    step = tmp_path / "global_step_4"
    step.mkdir()
    cosine = "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"
    torch.save({"global_step": 4, "config": _cfg(cosine, "trainer.total_training_steps=4")}, str(step / "data.pt"))
    assert resume_schedule_warnings(_cfg(cosine, "trainer.total_training_steps=4"), str(step)) == []
    (line,) = resume_schedule_warnings(_cfg(cosine, "trainer.total_training_steps=8"), str(step))
    assert line.startswith("trainer.resume_mode: trainer.total_training_steps=8 (checkpoint: 4): the decaying "
                           "learning-rate schedule (lr_scheduler_type=cosine)")
    assert "the new schedule's rate applies from the first resumed step" in line
    assert resume_schedule_warnings(_cfg("trainer.total_training_steps=8"), str(step))[0].count("\n") == 0
    torch.save({"global_step": 4, "config": _cfg("trainer.total_training_steps=4")}, str(step / "data.pt"))
    assert resume_schedule_warnings(_cfg("trainer.total_training_steps=8"), str(step)) == []  # constant: no decay


def test_p17_a_longer_run_with_the_schedule_length_set_is_not_warned(tmp_path):
    """A schedule whose length is set (``optim.total_training_steps``) does not follow the run's length: the resumed
    rates equal the uninterrupted run's, and the warning said the rate may jump."""
    import torch

    from trainer.resume_schedule import resume_schedule_warnings

    step = tmp_path / "global_step_3"
    step.mkdir()
    pinned = ("actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
              "actor_rollout_ref.actor.optim.total_training_steps=6")
    torch.save({"global_step": 3, "config": _cfg(*pinned, "trainer.total_training_steps=3")}, str(step / "data.pt"))
    assert resume_schedule_warnings(_cfg(*pinned, "trainer.total_training_steps=6"), str(step)) == []
    (line,) = resume_schedule_warnings(_cfg(*pinned[:2], "actor_rollout_ref.actor.optim.total_training_steps=9",
                                            "trainer.total_training_steps=6"), str(step))  # the set length changed
    assert "actor_rollout_ref.actor.optim.total_training_steps=9 (checkpoint: 6)" in line
    (line,) = resume_schedule_warnings(_cfg(*pinned[:2], "trainer.total_training_steps=6"), str(step))  # unset now
    assert "spans the run's new length" in line


def test_a_changed_seed_on_resume_is_warned(tmp_path):
    """The sampling after the resumed step follows trainer.seed: another seed changed the resumed run without a
    word (its steps differed from a plain resume's)."""
    import torch

    from trainer.resume_checks import resume_seed_warnings

    step = tmp_path / "global_step_1"
    step.mkdir()
    torch.save({"global_step": 1, "config": _cfg("trainer.seed=3")}, str(step / "data.pt"))
    assert resume_seed_warnings(_cfg("trainer.seed=3"), str(step)) == []
    assert resume_seed_warnings(_cfg("trainer.seed=7"), str(step)) == [
        "trainer.resume_mode: trainer.seed=7 (checkpoint: 3): the sampling after the resumed step follows the new "
        "seed, so the run is not the one the checkpoint's run would have continued"]
    torch.save({"global_step": 1}, str(step / "data.pt"))  # saved without a config: not compared
    assert resume_seed_warnings(_cfg("trainer.seed=7"), str(step)) == []


def test_resume_compares_the_rows_not_the_path_when_the_checkpoint_has_their_fingerprint(tmp_path):
    """The same file under another path (relative, through a symlinked folder, moved, copied) resumes when the
    checkpoint holds its rows' fingerprint (the rows are compared by :func:`check_resume_rows`); a checkpoint
    without one is still compared by path."""
    from trainer.resume_checks import check_resume_data

    step = _saved_step(tmp_path, _cfg("data.train_files=/d/a.parquet"), {"rows": 40, "rows_digest": "ab"})
    for moved in ("/e/a.parquet", "a.parquet", "/d/copy.parquet"):
        check_resume_data(_cfg(f"data.train_files={moved}"), step)
    with pytest.raises(ConfigError, match=r"data\.seed=7"):  # the other keys are still compared
        check_resume_data(_cfg("data.train_files=/e/a.parquet", "data.seed=7"), step)
    (tmp_path / "old").mkdir()
    old = _saved_step(tmp_path / "old", _cfg("data.train_files=/d/a.parquet"))  # saved without a fingerprint
    with pytest.raises(ConfigError, match=r"data\.train_files='/e/a\.parquet' \(checkpoint: '/d/a\.parquet'\)"):
        check_resume_data(_cfg("data.train_files=/e/a.parquet"), old)


def test_a_filter_key_change_that_keeps_the_rows_resumes_when_the_checkpoint_has_their_fingerprint(tmp_path, caplog):
    """Found by a tester: with the overlong filter on, a resume with a larger ``data.max_prompt_length`` was refused
    though no prompt had been long, and so was ``data.max_rows`` raised beyond the rows there are. Where the
    checkpoint keeps its rows' fingerprint the rows built decide: the same rows resume with a note naming the change,
    other rows are refused naming the keys and both row counts; without a fingerprint the values are compared."""
    from trainer import embedded
    from trainer.dataset import PromptDataset, PromptLoader
    from trainer.resume_checks import check_resume_data, check_resume_rows

    tok = embedded.build_tokenizer()
    path = tmp_path / "train.jsonl"
    lengths = [3 + i % 8 for i in range(40)]
    lengths[5:5] = [20]                                  # two prompts of 20 tokens: filtered at 16 and at 18
    lengths[30:30] = [20]
    path.write_text("".join(json.dumps({"prompt": " ".join("7" * n), "data_source": "d",
                                        "reward_model": {"ground_truth": "7"}}) + "\n" for n in lengths))

    def rows(max_prompt_length, max_rows=None):
        return PromptDataset(str(path), tok, max_prompt_length=max_prompt_length, max_rows=max_rows)

    step = _saved_step(tmp_path, _cfg(), PromptLoader(rows(16), 8, 0).state_dict())
    same = _cfg("data.max_prompt_length=18", "data.max_rows=1000")
    check_resume_data(same, step)
    with caplog.at_level("INFO", logger="trainer.resume_checks"):
        check_resume_rows(step, rows(18, 1000), cfg=same)
    (note,) = [r.getMessage() for r in caplog.records if r.name == "trainer.resume_checks"]
    assert note == ("trainer.resume_mode: data.max_rows=1000 (checkpoint: None), data.max_prompt_length=18 "
                    "(checkpoint: 16): the same 40 training rows as the checkpoint's, so its data-loader position "
                    "holds; resuming")
    for overrides, built, needle in [
            (["data.max_prompt_length=64"], rows(64), "data.max_prompt_length=64 (checkpoint: 16) gives 42 training "
                                                      "rows (checkpoint: 40): "),
            (["data.max_rows=30"], rows(16, 30), "data.max_rows=30 (checkpoint: None) gives 30 training rows "
                                                 "(checkpoint: 40): ")]:
        check_resume_data(_cfg(*overrides), step)        # decided once the rows are built
        with pytest.raises(ConfigError) as info:
            check_resume_rows(step, built, cfg=_cfg(*overrides))
        assert str(info.value).startswith("trainer.resume_mode: " + needle), str(info.value)
        assert "rows would repeat or be skipped" in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "old").mkdir()
    old = _saved_step(tmp_path / "old", _cfg())          # saved without a fingerprint: the values are compared
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length=18 \(checkpoint: 16\)"):
        check_resume_data(_cfg("data.max_prompt_length=18"), old)


def test_a_gae_runs_critic_schedule_change_is_warned_with_critic_enable_left_null(tmp_path):
    """``critic.enable`` null means on for GAE: the critic's schedule is compared as the actor's is (it was skipped,
    as if the run had no critic)."""
    import torch

    from trainer.resume_checks import trained_roles
    from trainer.resume_schedule import resume_schedule_warnings

    gae = ("algorithm.adv_estimator=gae", "critic.enable=null")
    assert [k for k, _ in trained_roles(_cfg(*gae))] == ["actor_rollout_ref.actor", "critic"]
    assert [k for k, _ in trained_roles(_cfg("critic.enable=null"))] == ["actor_rollout_ref.actor"]
    step = tmp_path / "global_step_1"
    step.mkdir()
    torch.save({"global_step": 1, "config": _cfg(*gae)}, str(step / "data.pt"))
    (line,) = resume_schedule_warnings(_cfg(*gae, "critic.optim.lr_scheduler_type=cosine"), str(step))
    assert "critic.optim.lr_scheduler_type='cosine' (checkpoint: 'constant')" in line


def test_a_resume_that_changes_the_optimizer_steps_per_step_under_a_moving_schedule_is_warned(tmp_path):
    """The schedule counts optimizer steps: with half the mini-batch (or twice the epochs) the restored count falls
    at another point of the run, and a cosine run went back into warm-up with its rate rising, without a word."""
    import torch

    from trainer.resume_schedule import resume_schedule_warnings

    step = tmp_path / "global_step_2"
    step.mkdir()
    cosine = ("actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.optim.lr_warmup_steps=1")
    base = ("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    torch.save({"global_step": 2, "config": _cfg(*cosine, *base)}, str(step / "data.pt"))
    assert resume_schedule_warnings(_cfg(*cosine, *base), str(step)) == []
    (line,) = resume_schedule_warnings(_cfg(*cosine, "data.train_batch_size=8",
                                            "actor_rollout_ref.actor.ppo_mini_batch_size=4"), str(step))
    assert line.startswith("trainer.resume_mode: actor_rollout_ref.actor.ppo_mini_batch_size=4 (checkpoint: 8): "
                           "actor_rollout_ref.actor makes 2 optimizer steps per training step (checkpoint: 1)")
    assert "\n" not in line and "may go back into warm-up" in line
    (line,) = resume_schedule_warnings(_cfg(*cosine, *base, "actor_rollout_ref.actor.ppo_epochs=3"), str(step))
    assert "actor_rollout_ref.actor.ppo_epochs=3 (checkpoint: 1)" in line and "makes 3 optimizer steps" in line
    torch.save({"global_step": 2, "config": _cfg(*base)}, str(step / "data.pt"))  # constant, no warm-up: nothing moves
    assert resume_schedule_warnings(_cfg("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"),
                                    str(step)) == []
