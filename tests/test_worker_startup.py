"""Worker start-up: DeepSpeed's Muon module is imported with its ``torch.compile`` decorators applied at first call."""
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

# DeepSpeed's own decorator factory replaced by a recording one: the deferred decorator must be the one that
# compiler.compile(...) returns, made with the same arguments, at the first call of a Muon function only
_DELEGATION_PROBE = """
import os
os.environ["DS_ACCELERATOR"] = "cpu"
import torch
import deepspeed
from deepspeed.runtime import compiler
from trainer.workers.base import import_deepspeed_muon_uncompiled

made = []
def factory(*args, **kwargs):
    def decorator(fn):
        made.append((fn.__name__, args, kwargs))
        return lambda *a, **k: ("decorated", fn(*a, **k))
    return decorator
compiler.compile = factory
import_deepspeed_muon_uncompiled()
from deepspeed.runtime.zero.muon import original_muon
print(len(made), compiler.compile is factory)
tag, out = original_muon.zeropower_via_newtonschulz5(torch.eye(4), steps=1)
again, _ = original_muon.zeropower_via_newtonschulz5(torch.eye(4), steps=1)
print(tag, again, tuple(out.shape), made)
"""


def _probe(code):
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_muon_module_imports_without_loading_inductor_and_deepspeed_compile_is_restored():
    assert _probe(_PROBE)[-1].split() == ["no-inductor", "restored", "muon_update"]


def test_muon_functions_get_deepspeeds_decorator_at_their_first_call():
    before, after = _probe(_DELEGATION_PROBE)[-2:]
    assert before == "0 True"  # nothing decorated at import; DeepSpeed's compiler.compile is back
    assert after == "decorated decorated (4, 4) [('zeropower_via_newtonschulz5', (), {})]", after


def test_decorate_on_first_call_decorates_once_and_runs_the_decorated_function():
    from trainer.workers.base import _decorate_on_first_call

    made = []

    def decorator(fn):
        made.append(fn)
        return lambda *a, **k: ("decorated", fn(*a, **k))

    def add(a, b=1):
        return a + b

    lazy = _decorate_on_first_call(add, lambda: decorator)
    assert made == [] and lazy.__name__ == "add" and lazy.__wrapped__ is add
    assert lazy(2, b=3) == ("decorated", 5) and lazy(1) == ("decorated", 2)
    assert made == [add]  # decorated at the first call only
