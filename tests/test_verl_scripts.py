"""verl's own scripts on trainer/main.py (issue #26): GRPO, GAE with sequence balancing, REINFORCE++, DAPO, PRIME.

Each script (tests/verl_scripts.py: the override lists of verl's examples and recipes, paths replaced by the
embedded model and data) must compose, pass every pre-start check with no unknown key and no error, and run one
CPU step with the tiny model in which every key of the composed config is read by the code (recorded through
``trainer.config_reads``), or is one of the keys that a setting of that run switches off (``CONDITIONAL``).
"""
import json
import os

import pytest

from tests.e2e_shared import run_main_forked
from tests.e2e_utils import read_metrics
from tests.verl_scripts import (CONDITIONAL, CPU_STEP, CPU_STEP_EXTRA, NO_VLLM, SCRIPTS, composed, embedded_assets,
                                script, unread_keys)
from trainer.config_reads import ENV, read_keys
from trainer.verl_compat import leaves, match


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return embedded_assets(str(tmp_path_factory.mktemp("verl_assets")))


def _handled(key: str, resolved: dict) -> bool:
    """A script key is a key of the resolved config, or one of verl's keys of the table (mapped, warned or refused)."""
    keys = {k for k, _ in leaves(resolved)}
    return key in keys or any(k.startswith(key + ".") for k in keys) or match(key) is not None


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_verl_script_composes_and_passes_every_prestart_check(name, assets, tmp_path):
    from trainer.launch import preflight, validate

    overrides = script(name, assets, NO_VLLM, {"trainer.output_dir": str(tmp_path)})
    prepared, _, resolved, report = composed(overrides)
    assert prepared.errors == [] and report.errors == []
    validate(resolved)
    preflight(resolved)
    keys = [o.split("=", 1)[0].lstrip("+") for o in overrides if not o.startswith(("algorithm=", "rollout="))]
    assert [k for k in keys if not _handled(k, resolved)] == []


def test_verl_script_with_vllm_on_a_machine_without_it_says_what_to_do(assets, tmp_path):
    import importlib.util

    from trainer.config_checks import ConfigError
    from trainer.launch import prestart

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    _, _, resolved, _ = composed(script("grpo", assets, {"trainer.output_dir": str(tmp_path)}))
    with pytest.raises(ConfigError, match=r"pip install -e \.\[vllm\].*rollout=hf"):
        prestart(resolved)


def test_prime_keys_without_algorithm_prime_say_add_it(assets):
    from trainer.overrides import prepare_overrides

    prepared = prepare_overrides(script("prime", assets)[1:])  # the recipe's keys without algorithm=prime
    assert len(prepared.errors) == 1
    assert "reward_model.model.beta_train" in prepared.errors[0]
    assert prepared.errors[0].endswith("keys of algorithm=prime (PRIME); add algorithm=prime")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_verl_script_runs_a_cpu_step_reading_every_key(name, assets, tmp_path):
    out, reads = str(tmp_path / "out"), str(tmp_path / "reads")
    overrides = script(name, assets, NO_VLLM, CPU_STEP, CPU_STEP_EXTRA.get(name, {}),
                       {"trainer.test_freq": "1", "trainer.log_val_generations": "2", "trainer.output_dir": out})
    os.environ[ENV] = reads
    try:
        proc = run_main_forked(out, *overrides, timeout=600)  # a process of its own: its reads are its own
    finally:
        del os.environ[ENV]
    assert "done: step 1 of 1" in proc.stderr, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1]
    with open(os.path.join(out, "val_generations.jsonl"), encoding="utf-8") as f:  # trainer.log_val_generations=2
        assert len([json.loads(line) for line in f]) == 2
    _, unresolved, resolved, _ = composed(overrides)
    unread = unread_keys(resolved, unresolved, read_keys(reads))
    assert unread == [], f"keys no code read in this run: {unread}"
    if name == "gae_seq_balance":  # the critic's own keys are read (they are CONDITIONAL in the other scripts)
        assert {"critic.ppo_max_token_len_per_gpu", "critic.forward_micro_batch_size_per_gpu",
                "critic.model.enable_gradient_checkpointing"} <= read_keys(reads)
    assert CONDITIONAL  # documented in tests/verl_scripts.py
