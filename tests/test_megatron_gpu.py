"""tools/bench/megatron_gpu_check.py: Megatron actor vs HF log-probs (bf16 and fp32), DDP + DistributedOptimizer
update, weight sync and checkpoint round trip on CUDA at TP=1 and TP=2; and a CPU smoke run of the same script.

GPU: ``python -m pytest -m gpu tests/test_megatron_gpu.py`` (TP=2 needs 2 GPUs; the script is started with
``torchrun --nproc_per_node <min(2, GPUs)>``; set ``SMOL_HF=/tmp/smol_hf`` to include SmolLM2).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.e2e_utils import ROOT  # noqa: E402

SCRIPT = os.path.join(ROOT, "tools", "bench", "megatron_gpu_check.py")


def _run(cmd, tmp_path, timeout):
    env = {k: v for k, v in os.environ.items()  # rendezvous variables left by in-process tests would collide
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update({"MEGATRON_CHECK_DIR": str(tmp_path / "work"), "PYTHONUNBUFFERED": "1"})
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    with open(tmp_path / "out.json") as f:
        return json.load(f), proc.stdout


@pytest.mark.bench
def test_check_script_runs_on_cpu(tmp_path):
    res, out = _run([sys.executable, SCRIPT, "--device", "cpu", "--out", str(tmp_path / "out.json")], tmp_path, 300)
    assert res["ok"] and res["device"] == "cpu"
    (r,) = res["results"]
    assert r["tp"] == 1 and r["dtype"] == "fp32" and r["max_vs_fp32"] <= 1e-5 and r["sync_ok"]
    assert r["resume_max_abs_diff"] == 0.0
    assert "PASS" in out and "qwen2_rand" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_megatron_matches_hf_on_gpu(tmp_path):
    n = min(2, torch.cuda.device_count())
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", SCRIPT,
           "--out", str(tmp_path / "out.json")]
    if os.path.isfile(os.path.join(os.environ.get("SMOL_HF", "/tmp/smol_hf"), "config.json")):
        cmd += ["--model", os.environ.get("SMOL_HF", "/tmp/smol_hf")]
    res, out = _run(cmd, tmp_path, 580)
    print(out)
    assert res["ok"]
    tps = {(r["case"], r["tp"], r["dtype"]) for r in res["results"]}
    assert ("qwen2_rand", 1, "bf16") in tps and ("qwen2_rand", 1, "fp32") in tps
    if n == 2:
        assert ("qwen2_rand", 2, "bf16") in tps and ("qwen2_rand", 2, "fp32") in tps
