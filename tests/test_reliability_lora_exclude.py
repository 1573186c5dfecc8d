"""LoRA's ``exclude_modules`` that takes out every module ``target_modules`` picks is refused before start-up in one
line (found by trying it: peft raised NoMatchingPeftModuleError inside the worker, with a traceback). The check
follows peft's matching: a name, or a dotted module name ending in it; ``all-linear`` is every linear layer but the
output head."""
import pytest

from tests.test_lora_checks import _error, _prestart

A = "actor_rollout_ref.model"
ALL = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


@pytest.mark.parametrize("overrides", [
    [f"{A}.exclude_modules={ALL}"],                                              # all-linear minus every linear
    [f"{A}.target_modules=[q_proj,v_proj]", f"{A}.exclude_modules=[q_proj,v_proj]"],
    [f"{A}.target_modules=[q_proj]", f"{A}.exclude_modules=[layers.0.self_attn.q_proj,layers.1.self_attn.q_proj]"],
], ids=["all_linear", "same_list", "every_layer_by_path"])
def test_exclude_that_leaves_nothing_to_adapt_is_one_line(tmp_path, overrides):
    line = _error(tmp_path, f"{A}.lora_rank=8", *overrides)
    assert f"{A}.exclude_modules=" in line and "leaves no module to adapt" in line, line


@pytest.mark.parametrize("overrides", [
    [f"{A}.exclude_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj]"],     # down_proj is left
    [f"{A}.target_modules=[q_proj]", f"{A}.exclude_modules=[layers.0.self_attn.q_proj]"],
])
def test_exclude_that_leaves_some_module_passes(tmp_path, overrides):
    _prestart(tmp_path, f"{A}.lora_rank=8", *overrides)
