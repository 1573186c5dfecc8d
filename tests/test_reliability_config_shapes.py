"""A model folder whose ``config.json`` transformers does not load (an unknown ``model_type``, a value its config class
refuses) or whose shape keys disagree with the weights (``intermediate_size``, ``num_key_value_heads``, ``head_dim``,
...) is refused before any worker starts in one line naming the key, the path, the bad value and what to do
(``trainer/meta_shapes.py``), instead of a traceback from the driver or from every worker's ``from_pretrained``.

Each case copies the suite's tiny Llama model (``tests.verl_scripts.embedded_assets``) and edits its config.json."""
import json
import os
import shutil

import pytest

from tests.test_reliability_config import _cfg, assert_one_line_error, run_cli
from tests.test_reliability_model_files import write_shards
from trainer.launch import ConfigError, preflight

KEY = "actor_rollout_ref.model.path"
FIX = "the config and the weights come from different models; use the config.json that came with these weights"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The suite's tiny model folder (Llama: hidden 32, intermediate 64, 8 heads of 4, 2 layers, vocabulary 23)."""
    from tests.verl_scripts import embedded_assets

    return embedded_assets(str(tmp_path_factory.mktemp("tiny")))["model"]


def _edited(tiny, tmp_path, name="m", **edits) -> str:
    """A copy of the tiny model whose config.json has ``edits`` (None: the key removed)."""
    m = shutil.copytree(tiny, str(tmp_path / name))
    path = os.path.join(m, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key, value in edits.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    with open(path, "w") as f:
        json.dump(config, f)
    return m


def _error(tmp_path, *overrides) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", *overrides))
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


MISMATCHES = {
    "intermediate_size": ({"intermediate_size": 96}, "model.layers.0.mlp.down_proj.weight shape (32, 96) but the "
                          "weights hold (32, 64) (intermediate_size=96) (and 5 more parameters)"),
    "num_key_value_heads": ({"num_key_value_heads": 4}, "model.layers.0.self_attn.k_proj.weight shape (16, 32) but "
                            "the weights hold (32, 32) (num_key_value_heads=4 x head_dim=4) (and 3 more parameters)"),
    "head_dim": ({"head_dim": 8}, "model.layers.0.self_attn.k_proj.weight shape (64, 32) but the weights hold "
                 "(32, 32) (num_key_value_heads=8 x head_dim=8) (and 7 more parameters)"),
    "two_causes": ({"intermediate_size": 96, "num_key_value_heads": 4}, "model.layers.0.mlp.down_proj.weight shape "
                   "(32, 96) but the weights hold (32, 64) (intermediate_size=96); model.layers.0.self_attn.k_proj."
                   "weight shape (16, 32) but the weights hold (32, 32) (num_key_value_heads=4 x head_dim=4) (and 8 "
                   "more parameters)"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_a_shape_key_that_the_weights_contradict_is_one_line(tiny, tmp_path, case):
    """Before: the start-up checks compared only the embedding and the layer count, so every worker failed in
    ``from_pretrained`` with transformers' size-mismatch traceback."""
    edits, said = MISMATCHES[case]
    m = _edited(tiny, tmp_path, **edits)
    assert _error(tmp_path, f"{KEY}={m}") == f"{KEY}={m!r}: config.json gives {said}; {FIX}"


def test_an_unknown_model_type_is_one_line_naming_the_value_and_what_to_do(tiny, tmp_path):
    """Before: ``AutoConfig.from_pretrained`` in ``trainer/launch.py`` ended the run with a traceback (exit 1)."""
    from transformers import __version__

    m = _edited(tiny, tmp_path, model_type="nosuchmodel")
    assert _error(tmp_path, f"{KEY}={m}") == (
        f"{KEY}={m!r}: config.json gives model_type='nosuchmodel', which transformers {__version__} does not know; "
        "install a newer transformers that has this architecture, set actor_rollout_ref.model.trust_remote_code=true "
        "if the folder ships its code (auto_map in config.json), or fix config.json's model_type")
    shipped = _edited(tiny, tmp_path, "shipped", model_type="nosuchmodel", auto_map={"AutoConfig": "x.XConfig"})
    assert "the folder ships its own code (auto_map); set actor_rollout_ref.model.trust_remote_code=true" in _error(
        tmp_path, f"{KEY}={shipped}")


def test_a_config_that_transformers_refuses_is_a_config_problem_not_a_tokenizer_problem(tiny, tmp_path):
    """``num_attention_heads=3`` with ``hidden_size=32``: transformers' own ValueError, named as config.json's fault
    (before: ``the tokenizer does not load (...); download or copy it again``), in the preflight and in the launch's
    own loading of the model folder (which reads the config before the tokenizer)."""
    from trainer.launch import load_model_files

    m = _edited(tiny, tmp_path, num_attention_heads=3)
    want = (f"{KEY}={m!r}: transformers refuses config.json (StrictDataclassClassValidationError: Class validation "
            "error for validator 'validate_architecture': ValueError: The hidden size (32) is not a multiple of the "
            "number of attention heads (3).); fix config.json (use the config.json that came with these weights)")
    assert _error(tmp_path, f"{KEY}={m}") == want
    with pytest.raises(ConfigError) as info:
        load_model_files(_cfg(f"{KEY}={m}"))
    assert str(info.value) == want


def test_critic_and_prime_folders_are_judged_under_their_own_keys(tiny, tmp_path):
    m = _edited(tiny, tmp_path, intermediate_size=96)
    assert _error(tmp_path, "algorithm=gae", f"critic.model.path={m}").startswith(
        f"critic.model.path={m!r}: config.json gives model.layers.0.mlp.down_proj.weight shape (32, 96)")
    bad = _edited(tiny, tmp_path, "bad", model_type="nosuchmodel")
    assert _error(tmp_path, "algorithm=prime", f"reward_model.model.path={bad}").startswith(
        f"reward_model.model.path={bad!r}: config.json gives model_type='nosuchmodel'")


def test_sound_folders_and_names_the_headers_do_not_hold_are_not_refused(tiny, tmp_path):
    """The tiny model, the same weights as shards with an index (a mismatch is found there too), a header whose names
    lack the base-model prefix (transformers adds it on load), one without some parameters (tied or missing weights:
    not judged) and a quantized config: none refused for what they lack."""
    from safetensors.numpy import load_file, save_file

    from trainer.meta_shapes import transformers_config_problem as problem

    preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={tiny}"))
    with open(os.path.join(tiny, "config.json")) as f:
        hf = json.load(f)
    tensors = load_file(os.path.join(tiny, "model.safetensors"))
    sharded = _edited(tiny, tmp_path, "sharded")
    os.remove(os.path.join(sharded, "model.safetensors"))
    write_shards(sharded, tensors, 2)
    index = ["model.safetensors.index.json"]
    assert problem(sharded, hf, index, False) is None
    with open(os.path.join(sharded, "config.json"), "w") as f:
        json.dump({**hf, "intermediate_size": 96}, f)
    assert "intermediate_size=96" in problem(sharded, {**hf, "intermediate_size": 96}, index, False)
    bare = _edited(tiny, tmp_path, "bare")
    save_file({n.removeprefix("model."): t for n, t in tensors.items() if "mlp" not in n},
              os.path.join(bare, "model.safetensors"))
    assert problem(bare, hf, ["model.safetensors"], False) is None  # no MLP weights held: nothing to contradict
    wrong = _edited(tiny, tmp_path, "wrong", num_key_value_heads=4)
    save_file({n.removeprefix("model."): t for n, t in tensors.items()}, os.path.join(wrong, "model.safetensors"))
    assert "model.layers.0.self_attn.k_proj.weight shape (16, 32)" in problem(
        wrong, {**hf, "num_key_value_heads": 4}, ["model.safetensors"], False)
    quantized = {**hf, "intermediate_size": 96, "quantization_config": {"quant_method": "fp8"}}
    with open(os.path.join(wrong, "config.json"), "w") as f:
        json.dump(quantized, f)
    assert problem(wrong, quantized, ["model.safetensors"], False) is None  # packed shapes: not judged


def test_a_shape_key_that_bin_weights_contradict_is_found(tiny, tmp_path):
    """The same weights as ``pytorch_model.bin`` (torch's zip format) and as ``.bin`` shards with
    ``pytorch_model.bin.index.json``: parameter shapes read on the meta device are compared like the safetensors
    headers' (before, ``.bin`` weights were not judged and every worker failed in ``from_pretrained``)."""
    import torch
    from safetensors.numpy import load_file

    from trainer.meta_shapes import transformers_config_problem as problem

    tensors = load_file(os.path.join(tiny, "model.safetensors"))
    single = _edited(tiny, tmp_path, "single", intermediate_size=96)
    os.remove(os.path.join(single, "model.safetensors"))
    torch.save({n: torch.from_numpy(t) for n, t in tensors.items()}, os.path.join(single, "pytorch_model.bin"))
    said = MISMATCHES["intermediate_size"][1]
    assert _error(tmp_path, f"{KEY}={single}") == f"{KEY}={single!r}: config.json gives {said}; {FIX}"
    sharded = _edited(tiny, tmp_path, "sharded")
    os.remove(os.path.join(sharded, "model.safetensors"))
    write_shards(sharded, tensors, 2, fmt="bin")
    with open(os.path.join(sharded, "config.json")) as f:
        hf = json.load(f)
    index = ["pytorch_model.bin.index.json"]
    assert problem(sharded, hf, index, False) is None
    with open(os.path.join(sharded, "config.json"), "w") as f:
        json.dump({**hf, "num_key_value_heads": 4}, f)
    assert MISMATCHES["num_key_value_heads"][1] in problem(sharded, {**hf, "num_key_value_heads": 4}, index, False)


def test_the_entry_point_stops_before_any_worker_starts(tiny, tmp_path):
    m = _edited(tiny, tmp_path, intermediate_size=96)
    proc = run_cli(str(tmp_path / "out"), "trainer.total_training_steps=2", f"{KEY}={m}", timeout=120, forked=True)
    assert_one_line_error(proc, f"{KEY}={m!r}: config.json gives model.layers.0.mlp.down_proj.weight shape (32, 96) "
                          "but the weights hold (32, 64) (intermediate_size=96)")


def test_a_config_with_values_transformers_encodes_in_json_loads(tmp_path):
    """transformers writes an infinite float as ``{"__float__": "Infinity"}`` (Mamba-2's ``time_step_limit``) and
    decodes it on reading: the check reads config.json with transformers' reader, so such a sound config loads."""
    from transformers import AutoConfig

    from trainer.meta_shapes import load_config_problem

    AutoConfig.for_model("mamba2").save_pretrained(str(tmp_path))
    with open(tmp_path / "config.json") as f:
        hf = json.load(f)
    assert "__float__" in json.dumps(hf)
    config, problem = load_config_problem(hf, str(tmp_path), False)
    assert problem is None and config.time_step_limit[1] == float("inf")
