"""tools/bench/vs_trl.py: matching overrides, the TRL reward adapter, samples/s, and the --tiny run (slow)."""
import pytest

from tests.e2e_utils import run_tool
from tools.bench import vs_trl

JOB = dict(model="m", data="d/train.parquet", batch=16, n=8, micro=32, response_len=256, max_prompt_len=200, lr=2e-6,
           steps=5, seed=3, device="cuda", out_dir="/tmp/w")


def test_ours_command_matches_job():
    cmd = vs_trl.ours_command(JOB)
    assert cmd[1].endswith("trainer/main.py")
    for o in ["data=gsm8k", "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8",
              "actor_rollout_ref.actor.ppo_mini_batch_size=16",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
              "data.max_response_length=256", "data.max_prompt_length=200", "actor_rollout_ref.actor.optim.lr=2e-06",
              "trainer.n_gpus_per_node=1", "trainer.device=cuda", "trainer.total_training_steps=5", "algorithm=grpo",
              "rollout=hf", "actor_rollout_ref.actor.use_kl_loss=false", "trainer.output_dir=/tmp/w/ours"]:
        assert o in cmd, o
    assert "data=synthetic" in vs_trl.ours_command(dict(JOB, data="x/train.jsonl"))


def test_project_reward_adapter():
    r = vs_trl.project_reward(["so #### 72", [{"role": "assistant", "content": "#### 71"}], "the answer is 3"],
                              ground_truth=["72", "72", "3"], data_source=["openai/gsm8k", "openai/gsm8k",
                                                                            "synthetic/digits"])
    assert r == [1.0, 0.0, 1.0]


def test_summarize_leaves_out_first_step():
    s = vs_trl.summarize("x", [10.0, 2.0, 4.0], 16, 30.0)
    assert s["mean_step_s"] == 3.0 and s["samples_per_s"] == pytest.approx(16 / 3) and s["first_step_s"] == 10.0
    assert vs_trl.summarize("x", [4.0], 8, 1.0)["samples_per_s"] == 2.0


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        vs_trl.main(["--help"])
    assert e.value.code == 0 and "--trl-cache-implementation" in capsys.readouterr().out


@pytest.mark.slow
def test_tiny_both_frameworks(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "vt.json"
    doc = run_tool("tools/bench/vs_trl.py", "--tiny", out=str(out), timeout=900)
    trl, ours = doc["results"]
    assert trl["framework"] == "trl" and ours["framework"] == "ours" and trl["steps"] == ours["steps"] == 3
    assert doc["ratio_ours_over_trl"] == pytest.approx(ours["samples_per_s"] / trl["samples_per_s"])
    assert trl["samples_per_s"] == pytest.approx(16 / trl["mean_step_s"])
