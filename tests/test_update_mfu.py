"""perf/mfu/actor: the actor update's model FLOPs utilisation (trainer.workers.update_mfu)."""
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

from trainer.metric_utils import compute_mfu
from trainer.workers import update_mfu as um


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12),
                                        ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H20", 148e12),
                                        ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A10G", 125e12),
                                        ("NVIDIA L40S", 362e12), ("Tesla T4", None)])
def test_device_peak_flops_takes_the_longest_name_in_the_device_name(name, peak):
    assert um.device_peak_flops(name) == peak


def _role(sp_size=1):
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=100)
    return SimpleNamespace(hf_config=cfg, sp_size=sp_size)


def test_update_mfu_is_none_off_cuda():
    assert um.update_mfu(_role(), {}, 1, time.perf_counter() - 1.0, torch.device("cpu")) is None  # mask not read


@pytest.mark.parametrize("epochs, sp", [(1, 1), (2, 1), (1, 2)])
def test_update_mfu_counts_every_rows_own_length_epochs_and_sp(monkeypatch, epochs, sp):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    mask = torch.zeros(3, 10, dtype=torch.long)
    for i, n in enumerate((10, 4, 7)):
        mask[i, :n] = 1
    monkeypatch.setattr(um.time, "perf_counter", lambda: 102.0)
    got = um.update_mfu(_role(sp), {"attention_mask": mask}, epochs, 100.0, torch.device("cuda"))
    want = compute_mfu(_role().hf_config, 21, [10, 4, 7], 2.0, 1, 989e12) * epochs / sp
    assert synced, "the device is synchronised before the update's time is read"
    assert got == pytest.approx(want, rel=1e-9)


def test_update_mfu_is_none_on_an_unknown_gpu_or_an_empty_batch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    mask = {"attention_mask": torch.ones(2, 4, dtype=torch.long)}
    assert um.update_mfu(_role(), mask, 1, time.perf_counter() - 1.0, torch.device("cuda")) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    empty = {"attention_mask": torch.zeros(2, 4)}
    assert um.update_mfu(_role(), empty, 1, time.perf_counter() - 1.0, torch.device("cuda")) is None
