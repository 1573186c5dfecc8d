"""Worker start-up: DeepSpeed's Muon module is imported without applying its ``torch.compile`` decorators."""
import subprocess
import sys

from tests.e2e_utils import ROOT

_PROBE = """
import os, sys
os.environ["DS_ACCELERATOR"] = "cpu"
import deepspeed
from deepspeed.runtime import compiler
from trainer.workers.base import import_deepspeed_muon_uncompiled

real = compiler.compile
import_deepspeed_muon_uncompiled()
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
from deepspeed.runtime.zero.muon import original_muon
print("inductor" if "torch._inductor.compile_fx" in sys.modules else "no-inductor",
      "restored" if compiler.compile is real else "changed", original_muon.muon_update.__name__)
"""


def test_muon_module_imports_without_loading_inductor_and_deepspeed_compile_is_restored():
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["no-inductor", "restored", "muon_update"], proc.stdout


def test_compile_on_first_call_compiles_once_and_runs_the_compiled_function(monkeypatch):
    import torch

    from trainer.workers.base import _compile_on_first_call

    made = []

    def fake_compile(fn):
        made.append(fn)
        return lambda *a, **k: ("compiled", fn(*a, **k))

    monkeypatch.setattr(torch, "compile", fake_compile)

    def add(a, b=1):
        return a + b

    lazy = _compile_on_first_call(add)
    assert made == [] and lazy.__name__ == "add" and lazy.__wrapped__ is add
    assert lazy(2, b=3) == ("compiled", 5) and lazy(1) == ("compiled", 2)
    assert made == [add]  # compiled at the first call only
