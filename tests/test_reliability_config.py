"""Config errors stop ``python trainer/main.py`` before any worker starts: exit code 2 and ONE ``error:`` line that
names the bad key/value (no traceback, no Ray worker)."""
import json
import os
import subprocess
import sys

import pytest

from trainer.launch import ConfigError, preflight, resolve_config, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OK_BATCH = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]


def run_cli(out_dir, *overrides, timeout=180, forked=False, env=None):
    """``trainer/main.py`` as a user runs it: a new Python process that starts its own Ray; ``forked=True``: forked
    from the session's pre-imported driver on the shared Ray instance (:func:`tests.e2e_shared.run_main_forked`,
    about 5 s less per run), for runs whose subject is not Ray's start-up or which Ray they join; ``env``: more
    environment variables of the forked run (``{"RAY_ADDRESS": None}``: none, as for a run that starts its own
    Ray)."""
    if forked:
        from tests.e2e_shared import run_main_forked

        return run_main_forked(out_dir, *overrides, timeout=timeout, check=False, env=env)
    assert env is None, "env: forked runs only"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"trainer.output_dir={out_dir}",
                           *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc, *needles):
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2, out[-3000:]
    assert len(errors) == 1, out[-3000:]
    for n in needles:
        assert n in errors[0], (n, errors[0])
    assert "Traceback" not in out and "ActorRolloutRefWorker" not in out and "workers: rank" not in out
    return errors[0]


CASES = {
    # a value DeepSpeed's own config refuses (it failed inside every worker with pydantic's report)
    "ds_config_stage": (["+deepspeed.ds_config.zero_optimization.stage=9"],
                        ["deepspeed.ds_config: stage=9", "DeepSpeedZeroConfig", "Input should be 0, 1, 2, 3"]),
    "max_rows_zero": (["data.max_rows=0"], ["data.max_rows=0; expected an integer >= 1"]),
    "ds_config_type": (["+deepspeed.ds_config.zero_optimization.reduce_bucket_size=abc"],
                       ["deepspeed.ds_config: reduce_bucket_size='abc'", "valid integer"]),
    "unknown_key": (["trainer.n_gpu_per_node=2"], ["'trainer.n_gpu_per_node'", "unknown config key"]),
    "renamed_key": (["actor_rollout_ref.actor.ppo_micro_batch_size=4"],
                    ["actor_rollout_ref.actor.ppo_micro_batch_size=4: not supported",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)"]),
    "unknown_group_option": (["deepspeed=zero4"], ["deepspeed/zero4"]),
    "batch_not_divisible_by_workers": (["data.train_batch_size=7"], ["data.train_batch_size=7", "2 workers"]),
    "mini_batch_does_not_divide": ([*OK_BATCH, "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
                                   ["ppo_mini_batch_size=3", "data.train_batch_size=8"]),
    "micro_batch_does_not_divide": ([*OK_BATCH, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
                                    ["ppo_micro_batch_size_per_gpu=3", "8 rows"]),
    "sp_does_not_divide_world": ([*OK_BATCH, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"],
                                 ["ulysses_sequence_parallel_size=4", "2 workers"]),
    "sp_does_not_divide_heads": (["trainer.n_gpus_per_node=3", "data.train_batch_size=6",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=6",
                                  "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"],
                                 ["ulysses_sequence_parallel_size=3", "num_attention_heads=4", "num_key_value_heads=2"]),
    "missing_model_path": (["actor_rollout_ref.model.path=/nonexistent/model"],
                           ["actor_rollout_ref.model.path='/nonexistent/model'", "does not exist"]),
    "missing_data_file": (["data.train_files=/nonexistent/train.parquet"], ["'/nonexistent/train.parquet'"]),
    "zero_response_length": (["data.max_response_length=0"], ["data.max_response_length=0"]),
    "zero_prompt_length": (["data.max_prompt_length=0"], ["data.max_prompt_length=0"]),
    "beyond_context": (["data.max_prompt_length=200"], ["=202", "max_position_embeddings=128"]),
    "non_finite_coef": (["actor_rollout_ref.actor.entropy_coeff=inf"], ["entropy_coeff", "finite"]),
    "bad_skip_limit": (["trainer.max_consecutive_skipped_steps=0"], ["max_consecutive_skipped_steps=0"]),
    "unknown_logger": (["trainer.logger=[console,tensorbord]"], ["trainer.logger=", "'tensorbord'", "wandb"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_error_stops_before_workers(tmp_path, name):
    overrides, needles = CASES[name]
    proc = run_cli(str(tmp_path / "out"), *overrides, forked=True)
    assert_one_line_error(proc, *needles)
    assert not os.path.exists(tmp_path / "out" / "init_model")   # nothing was built


@pytest.mark.parametrize("source,name,needles", [
    ("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n", "my_scor",
     ["custom_reward_function.name='my_scor'", "has no function 'my_scor'", "['my_score']"]),
    ("my_score = 3\n", "my_score", ["custom_reward_function.name='my_score'", "expected a function"]),
    ("def my_score(:\n", "my_score", ["custom_reward_function.path=", "failed", "SyntaxError"]),
])
def test_custom_reward_function_that_does_not_load_is_one_line(tmp_path, source, name, needles):
    """A wrong function name, a non-callable or a file that does not import stops the run in one line."""
    path = tmp_path / "my_reward.py"
    path.write_text(source)
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}", f"custom_reward_function.name={name}", forked=True)
    assert_one_line_error(proc, *needles)
    out = proc.stdout + proc.stderr  # the notes of start-up are printed once, not again with the errors
    assert out.count(f"custom_reward_function.path={path}: read as") == 1, out[-3000:]
    assert out.count(f"custom_reward_function.name={name}: read as") == 1, out[-3000:]


def _model_dir(tmp_path, eos: bool):
    """A model folder with the tiny model (random weights) and the project's tokenizer, with or without an EOS
    token."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from trainer import embedded

    d = tmp_path / ("model_eos" if eos else "model_noeos")
    tok = embedded.build_tokenizer()
    if not eos:
        tok = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, pad_token="<pad>", unk_token="<unk>")
        tok.chat_template = embedded.build_tokenizer().chat_template  # only the EOS token is missing
    tok.save_pretrained(str(d))
    model = AutoModelForCausalLM.from_config(embedded.tiny_model_config(len(tok)))
    model.save_pretrained(str(d))  # preflight refuses a folder without weights
    return str(d)


def test_tokenizer_without_eos(tmp_path):
    path = _model_dir(tmp_path, eos=False)
    proc = run_cli(str(tmp_path / "out"), f"actor_rollout_ref.model.path={path}", timeout=300, forked=True)
    assert_one_line_error(proc, "has no EOS token", path)


def test_world_size_the_cluster_cannot_place(tmp_path):
    # device=cuda on a machine whose Ray cluster has no GPU: refused before any worker is created
    proc = run_cli(str(tmp_path / "out"), "trainer.device=cuda", timeout=300, forked=True, env={"RAY_ADDRESS": None})
    assert_one_line_error(proc, "2 GPUs requested", "trainer.n_gpus_per_node")


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        return resolve_config(compose(config_name="ppo_trainer", overrides=list(overrides)))


def test_preflight_reads_a_model_folders_config(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_attention_heads": 6, "num_key_value_heads": 3,
                                               "max_position_embeddings": 4096}))
    (d / "model.safetensors").write_bytes(b"\x02" + bytes(7) + b"{}")  # no tensors: a sound header, nothing else
    (d / "tokenizer.json").write_text("{}")  # preflight only sees that the folder has its tokenizer
    (d / "chat_template.jinja").write_text("{{ messages }}")  # and a chat template for the chat prompts
    cfg = _cfg(f"actor_rollout_ref.model.path={d}", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    validate(cfg)
    with pytest.raises(ConfigError, match=r"num_attention_heads=6, num_key_value_heads=3"):
        preflight(cfg)     # 6 % 2 == 0 but neither 3 % 2 nor 2 % 3 is 0
    preflight(_cfg(f"actor_rollout_ref.model.path={d}"))   # sp=1 fits any model
    (d / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config.json"):
        preflight(cfg)


def test_micro_batch_larger_than_mini_batch_is_clamped_not_refused():
    validate(_cfg(*OK_BATCH, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"))   # 8 rows per rank < 64
