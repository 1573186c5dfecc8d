"""``trainer.single_process=true`` on a GPU: the embedded default's worker (DeepSpeed, the transformers engine's
compiled decode loop, sleep and wake) built in the driver process. ``python -m pytest -m gpu
tests/test_single_process_gpu.py``."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from tests.e2e_utils import ROOT, read_metrics

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_embedded_default_on_cuda_in_one_process(tmp_path):
    # CPU test modules set DS_ACCELERATOR=cpu when pytest collects them: the run gets the environment without it
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"} | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "trainer", "main.py"), f"trainer.output_dir={tmp_path}",
                           "trainer.device=cuda", "trainer.n_gpus_per_node=1", "trainer.single_process=true",
                           "trainer.total_training_steps=5"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "no Ray, the worker's start-up" in log
    rows = [r for r in read_metrics(str(tmp_path)) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"]) for r in rows)
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 for r in rows)
    assert "destroy_process_group() was not called" not in log
