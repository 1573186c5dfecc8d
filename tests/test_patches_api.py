"""patches/ as a library: its public API used the way patches/README.md shows it (no trainer code), and the import
rules around it: nothing outside patches/ reaches into its private names or the patch's private state, and
patches/ imports nothing from trainer/, rollout/ or rewards/."""
from __future__ import annotations

import ast
import copy
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import patches
from patches import (UlyssesGroup, apply_ulysses_patch, mark_layers_compiled, pack_batch, patch_info,
                     set_static_shapes, sp_forward)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLERS = ("trainer", "rollout", "rewards", "tools")
PRIVATE_STATE = "_ulysses_state"


def _py_files(root: str, top: str):
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                yield os.path.relpath(path, root), ast.parse(open(path, encoding="utf-8").read(), path)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _patches_aliases(tree: ast.AST) -> set[str]:
    """Local names bound to a module of patches/ (``import patches.x as m``, ``from patches import x``)."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in n.names if a.name.split(".")[0] == "patches"}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module == "patches":
            names |= {a.asname or a.name for a in n.names}
    return names


def private_uses(root: str, tops=CALLERS, imports_only: bool = False) -> list[str]:
    """``file:line what`` for every private name of patches/ used under ``tops``: ``from patches.x import _y``;
    unless ``imports_only``, also ``m._y`` on a patches module ``m`` and the patch's state (``_ulysses_state``)."""
    found = []
    for top in tops:
        for rel, tree in _py_files(root, top):
            aliases = set() if imports_only else _patches_aliases(tree)
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "patches":
                    found += [f"{rel}:{n.lineno} from {n.module} import {a.name}" for a in n.names if _private(a.name)]
                if imports_only:
                    continue
                if isinstance(n, ast.Attribute) and _private(n.attr):
                    base = n.value
                    while isinstance(base, ast.Attribute):
                        base = base.value
                    if n.attr == PRIVATE_STATE or (isinstance(base, ast.Name) and base.id in aliases):
                        found.append(f"{rel}:{n.lineno} .{n.attr}")
                if isinstance(n, ast.Constant) and n.value == PRIVATE_STATE:
                    found.append(f"{rel}:{n.lineno} {PRIVATE_STATE!r}")
    return found


def upward_imports(root: str, top: str = "patches", banned=("trainer", "rollout", "rewards")) -> list[str]:
    """``file:line module`` for every import (module level or inside a function) under ``top`` of a banned
    package."""
    found = []
    for rel, tree in _py_files(root, top):
        for n in ast.walk(tree):
            mods = ([a.name for a in n.names] if isinstance(n, ast.Import) else
                    [n.module or ""] if isinstance(n, ast.ImportFrom) and n.level == 0 else [])
            found += [f"{rel}:{n.lineno} {m}" for m in mods if m.split(".")[0] in banned]
    return found


def test_no_private_name_of_patches_is_used_outside_it():
    """trainer/, rollout/, rewards/ and tools/ use patches/ through its public names only; tests import no private
    name from it either."""
    assert private_uses(ROOT) == []
    assert private_uses(ROOT, ("tests",), imports_only=True) == []


def test_patches_imports_nothing_from_trainer_rollout_or_rewards():
    assert upward_imports(ROOT) == []


def test_the_scans_find_what_they_look_for(tmp_path):
    """Each form the scans look for is found in a small tree (so an empty result above means something)."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "patches").mkdir()
    (tmp_path / "trainer" / "a.py").write_text(
        "import patches.ulysses as ul\nfrom patches.varlen import _sdpa_reference, varlen_attention\n"
        "from patches import ulysses\nx = ul._HOST_PACKED\ny = ulysses._attention_eager\n"
        "def f(m):\n    return getattr(m, '_ulysses_state', None), m._ulysses_state, ul.apply_ulysses_patch\n")
    (tmp_path / "patches" / "b.py").write_text("def f():\n    from trainer.forward import to_device\n")
    assert sorted(private_uses(str(tmp_path), ("trainer",))) == [
        "trainer/a.py:2 from patches.varlen import _sdpa_reference", "trainer/a.py:4 ._HOST_PACKED",
        "trainer/a.py:5 ._attention_eager", "trainer/a.py:7 '_ulysses_state'", "trainer/a.py:7 ._ulysses_state"]
    assert upward_imports(str(tmp_path)) == ["patches/b.py:2 trainer.forward"]


# ---------------------------------------------------------------------------------------------- the API itself
def _tiny():
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


def _rows():
    """Three rows, left and right padding and an empty row; position ids as the README asks for."""
    ids = torch.randint(1, 96, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids)
    for i, (a, b) in enumerate([(0, 9), (3, 7), (5, 5), (2, 9)]):
        mask[i, a:b] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


@pytest.mark.parametrize("device", [None, "cpu"], ids=["on_the_inputs_device", "host_packed"])
def test_readme_recipe_gives_the_padded_log_probs(device):
    """pack_batch -> sp_forward -> a log-softmax of the local logits -> PackedBatch.gather (the README's recipe,
    no trainer code) equals transformers' padded forward of the unpatched model at every valid next-token position,
    and is 0 at the padding."""
    base = _tiny()
    ids, mask, pos = _rows()
    with torch.no_grad():
        logits = base(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        want = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        model = apply_ulysses_patch(copy.deepcopy(base), 1)
        batch = pack_batch(model, ids, mask, pos, device=device)
        out = sp_forward(model, batch)
        lp_local = torch.log_softmax(out.logits[0].float(), -1).gather(-1, batch.labels[:, None])[:, 0]
        lp = batch.gather(lp_local)
    assert batch.sp.size == 1 and lp.shape == ids.shape and out.logits.shape[1] == batch.labels.shape[0]
    both = (mask[:, :-1] * mask[:, 1:]).bool()  # the token and its next one are valid
    torch.testing.assert_close(lp[:, :-1][both], want[both], atol=1e-5, rtol=0)
    assert torch.all(lp[~mask.bool()] == 0)


def test_pack_batch_refuses_bad_input_before_the_forward():
    model = apply_ulysses_patch(_tiny(), 1)
    ids, mask, pos = _rows()
    with pytest.raises(ValueError, match=r"attention_mask has shape \(4, 8\), expected \(4, 9\)"):
        pack_batch(model, ids, mask[:, 1:], pos)
    with pytest.raises(ValueError, match="position_ids must be 0 at the first valid token"):
        pack_batch(model, ids, mask, pos + 1)
    with pytest.raises(ValueError, match=r"sp=2 needs a model patched by patches.ulysses.apply_ulysses_patch"):
        pack_batch(_tiny(), ids, mask, pos, sp=UlyssesGroup(group=object(), size=2))


def test_patch_settings_are_read_and_set_through_the_public_functions():
    plain = _tiny()
    assert patch_info(plain) is None
    for setter in (mark_layers_compiled, lambda m: set_static_shapes(m, 16)):
        with pytest.raises(ValueError, match="is not patched by patches.ulysses.apply_ulysses_patch"):
            setter(plain)
    model = apply_ulysses_patch(plain, 1)
    info = patch_info(model)
    assert (info.sp_size, info.traceable, info.compiled, info.static_token_multiple) == (1, True, False, 0)
    mark_layers_compiled(model)
    set_static_shapes(model, 16)
    assert patch_info(model) == patches.UlyssesPatchInfo(1, True, True, 16, "auto")
    with pytest.raises(ValueError, match="token_multiple must be >= 1, got 0"):
        set_static_shapes(model, 0)
    assert not patch_info(apply_ulysses_patch(_tiny(), 2)).traceable  # SP size taken at run time: no kwargs
