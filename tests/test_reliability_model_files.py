"""A model folder that lacks its weights, holds a weights file cut short by a failed download or copy, or has no
tokenizer is refused by ``preflight`` (before any worker starts) in one line naming the key, the path and what is
wrong (``trainer/model_folder_checks.py``), instead of tracebacks from every worker after Ray has started.

Each case copies the suite's tiny model (``tests.verl_scripts.embedded_assets``) and damages the copy."""
import json
import os
import shutil

import pytest

from tests.test_reliability_config import _cfg, assert_one_line_error, run_cli
from trainer.launch import ConfigError, preflight

KEY = "actor_rollout_ref.model.path"



def write_shards(folder: str, tensors: dict, parts: int, fmt: str = "safetensors") -> None:
    """Save ``tensors`` (name -> numpy array) into ``folder`` as ``parts`` shards with their index:
    ``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``, or (``fmt="bin"``, ``torch.save``'s
    zip format) ``pytorch_model-0000i-of-0000n.bin`` and ``pytorch_model.bin.index.json``."""
    names, weight_map = sorted(tensors), {}
    for i in range(parts):
        part = {n: tensors[n] for n in names[i::parts]}
        if fmt == "bin":
            import torch

            shard = f"pytorch_model-{i + 1:05d}-of-{parts:05d}.bin"
            torch.save({n: torch.from_numpy(t) for n, t in part.items()}, os.path.join(folder, shard))
        else:
            from safetensors.numpy import save_file

            shard = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
            save_file(part, os.path.join(folder, shard))
        weight_map.update({n: shard for n in part})
    index = "pytorch_model.bin.index.json" if fmt == "bin" else "model.safetensors.index.json"
    with open(os.path.join(folder, index), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The suite's tiny model folder (single ``model.safetensors`` + tokenizer), the same weights as three
    safetensors shards with their index, as ``pytorch_model.bin``, as two ``.bin`` shards with
    ``pytorch_model.bin.index.json`` and as a legacy-format (pickle, not zip) ``pytorch_model.bin``; nothing may
    change them: copy first."""
    import torch
    from safetensors.numpy import load_file

    from tests.verl_scripts import embedded_assets

    root = tmp_path_factory.mktemp("tiny")
    single = embedded_assets(str(root))["model"]
    tensors = load_file(os.path.join(single, "model.safetensors"))
    sharded = str(root / "sharded")
    shutil.copytree(single, sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    write_shards(sharded, tensors, 3)
    bin_dir = str(root / "bin")
    shutil.copytree(single, bin_dir, ignore=shutil.ignore_patterns("model.safetensors"))
    torch.save({n: torch.from_numpy(t) for n, t in tensors.items()}, os.path.join(bin_dir, "pytorch_model.bin"))
    bin_sharded = str(root / "bin_sharded")
    shutil.copytree(single, bin_sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    write_shards(bin_sharded, tensors, 2, fmt="bin")
    legacy = str(root / "bin_legacy")
    shutil.copytree(single, legacy, ignore=shutil.ignore_patterns("model.safetensors"))
    torch.save({n: torch.from_numpy(t) for n, t in tensors.items()}, os.path.join(legacy, "pytorch_model.bin"),
               _use_new_zipfile_serialization=False)
    return {"single": single, "sharded": sharded, "bin": bin_dir, "bin_sharded": bin_sharded, "bin_legacy": legacy}


def _copy(tiny, tmp_path, kind="single", name="m") -> str:
    return shutil.copytree(tiny[kind], str(tmp_path / name))


def _cut(path: str, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def _errors(tmp_path, *overrides) -> list[str]:
    """The lines of the ConfigError that ``preflight`` raises for the config of ``overrides``."""
    with pytest.raises(ConfigError) as info:
        preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", *overrides))
    return str(info.value).splitlines()


def test_the_tiny_model_passes_as_one_file_as_shards_and_as_bin(tiny, tmp_path):
    for kind in ("single", "sharded", "bin"):
        preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={tiny[kind]}"))
    preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}"))  # the embedded default builds its own model


def _no_weights(m):
    os.remove(os.path.join(m, "model.safetensors"))


def _truncated(m):
    """Keeps the first half of model.safetensors; returns the words that name the sizes (from its header)."""
    path = os.path.join(m, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    tensors, keep = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), 8 + n + 40_000
    assert 8 + n + tensors == os.path.getsize(path) > keep
    _cut(path, keep)
    return [f"header says {tensors} bytes of tensors, file holds 40000"]


def _cut_in_header(m):
    _cut(os.path.join(m, "model.safetensors"), 50)


def _header_not_json(m):
    with open(os.path.join(m, "model.safetensors"), "r+b") as f:
        f.seek(8)
        f.write(b"X")  # the header's opening brace


def _shard_missing(m):
    os.remove(os.path.join(m, "model-00002-of-00003.safetensors"))


def _shard_truncated(m):
    path = os.path.join(m, "model-00002-of-00003.safetensors")
    _cut(path, os.path.getsize(path) - 10)


def _bin_truncated(m):
    path = os.path.join(m, "pytorch_model.bin")
    _cut(path, os.path.getsize(path) // 2)


def _config_not_json(m):
    _cut(os.path.join(m, "config.json"), 20)


def _no_tokenizer(m):
    os.remove(os.path.join(m, "tokenizer.json"))


def _tokenizer_truncated(m):
    path = os.path.join(m, "tokenizer.json")
    _cut(path, os.path.getsize(path) // 2)
    return [f"tokenizer.json is truncated: its {os.path.getsize(path)} bytes end before its JSON is complete"]


def _tokenizer_not_json(m):
    with open(os.path.join(m, "tokenizer.json"), "w") as f:
        f.write("{nope}")


def _tokenizer_config_truncated(m):
    path = os.path.join(m, "tokenizer_config.json")
    _cut(path, os.path.getsize(path) - 5)


def _tokenizer_broken_link(m):
    os.remove(os.path.join(m, "tokenizer.json"))
    os.symlink(os.path.join(m, "gone.json"), os.path.join(m, "tokenizer.json"))


def _named_weights_missing(m):
    with open(os.path.join(m, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(m, "config.json"), "w") as f:
        json.dump({**config, "transformers_weights": "other.safetensors"}, f)


def _edit_config(m, **changes):
    with open(os.path.join(m, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(m, "config.json"), "w") as f:
        json.dump({**config, **changes}, f)


def _hidden_doubled(m):
    _edit_config(m, hidden_size=64)


def _vocab_changed(m):
    _edit_config(m, vocab_size=5)


def _more_layers_in_config(m):
    _edit_config(m, num_hidden_layers=4)


def _generation_config_truncated(m):
    path = os.path.join(m, "generation_config.json")
    _cut(path, os.path.getsize(path) // 2)
    return [f"generation_config.json is truncated: its {os.path.getsize(path)} bytes end before its JSON is complete"]


DIFFERENT = "(the config and the weights come from different models); use the config.json that came with these weights"

DAMAGE = {  # name: (the folder copied, the damage, the words the one line must hold)
    "no_weights": ("single", _no_weights, ["no weights (expected model.safetensors, pytorch_model.bin or a "
                                           "*.index.json with its shards)"]),
    "truncated": ("single", _truncated, ["model.safetensors is truncated: header says"]),
    "cut_in_header": ("single", _cut_in_header, ["model.safetensors is truncated: its header length says"]),
    "header_not_json": ("single", _header_not_json, ["model.safetensors has a header that is not valid JSON"]),
    "shard_missing": ("sharded", _shard_missing, ["model.safetensors.index.json lists 3 shard files, 1 of them "
                                                  "missing: model-00002-of-00003.safetensors"]),
    "shard_truncated": ("sharded", _shard_truncated, ["model-00002-of-00003.safetensors is truncated",
                                                      "(a shard listed in model.safetensors.index.json)"]),
    "bin_truncated": ("bin", _bin_truncated, ["pytorch_model.bin is truncated"]),
    "config_not_json": ("single", _config_not_json, ["config.json is truncated: its 20 bytes end before its JSON is "
                                                     "complete"]),
    "no_tokenizer": ("single", _no_tokenizer, ["no tokenizer (expected tokenizer.json or tokenizer.model / vocab "
                                               "files)", "actor_rollout_ref.model.tokenizer_path"]),
    "tokenizer_truncated": ("single", _tokenizer_truncated, []),
    "tokenizer_not_json": ("single", _tokenizer_not_json, ["tokenizer.json is not valid JSON (Expecting property"]),
    "tokenizer_config_truncated": ("single", _tokenizer_config_truncated, ["tokenizer_config.json is truncated"]),
    "tokenizer_broken_link": ("single", _tokenizer_broken_link, ["tokenizer.json is a broken symbolic link"]),
    "hidden_doubled": ("single", _hidden_doubled, ["config.json says hidden_size=64 and vocab_size=23, but "
                                                   "model.safetensors holds model.embed_tokens.weight of shape "
                                                   f"[23, 32] {DIFFERENT}"]),
    "vocab_changed": ("sharded", _vocab_changed, ["config.json says hidden_size=32 and vocab_size=5, but "
                                                  "model-00001-of-00003.safetensors holds model.embed_tokens.weight "
                                                  f"of shape [23, 32] {DIFFERENT}"]),
    "more_layers_in_config": ("single", _more_layers_in_config,
                              ["config.json says num_hidden_layers=4, but model.safetensors holds layers 0-1 only "
                               f"(model.layers.<i>), so layers 2-3 would start from random values {DIFFERENT}"]),
    # .bin weights (torch's zip format): their shapes read on the meta device, the same lines as safetensors
    "bin_hidden_doubled": ("bin", _hidden_doubled, ["config.json says hidden_size=64 and vocab_size=23, but "
                                                    "pytorch_model.bin holds model.embed_tokens.weight of shape "
                                                    f"[23, 32] {DIFFERENT}"]),
    "bin_vocab_changed": ("bin", _vocab_changed, ["config.json says hidden_size=32 and vocab_size=5, but "
                                                  "pytorch_model.bin holds model.embed_tokens.weight of shape "
                                                  f"[23, 32] {DIFFERENT}"]),
    "bin_more_layers_in_config": ("bin", _more_layers_in_config,
                                  ["config.json says num_hidden_layers=4, but pytorch_model.bin holds layers 0-1 "
                                   f"only (model.layers.<i>), so layers 2-3 would start from random values "
                                   f"{DIFFERENT}"]),
    "bin_sharded_vocab_changed": ("bin_sharded", _vocab_changed,
                                  ["config.json says hidden_size=32 and vocab_size=5, but pytorch_model-0000",
                                   "-of-00002.bin holds model.embed_tokens.weight of shape [23, 32]"]),
    "bin_sharded_more_layers_in_config": ("bin_sharded", _more_layers_in_config,
                                          ["config.json says num_hidden_layers=4, but pytorch_model.bin.index.json "
                                           "holds layers 0-1 only (model.layers.<i>)"]),
    "generation_config_truncated": ("single", _generation_config_truncated, ["; download or copy it again"]),
    "named_weights_missing": ("single", _named_weights_missing,
                              ["other.safetensors, the weights file that config.json's transformers_weights names, "
                               "is missing"]),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_a_damaged_model_folder_is_one_line_naming_key_path_and_problem(tiny, tmp_path, name):
    kind, damage, needles = DAMAGE[name]
    m = _copy(tiny, tmp_path, kind)
    more = damage(m) or []
    (line,) = _errors(tmp_path, f"{KEY}={m}")
    assert line.startswith(f"{KEY}={m!r}: "), line
    for needle in [*needles, *more]:
        assert needle in line, (needle, line)
    # one thing to do, at the end: a damaged file is fetched again, nothing follows that advice
    if "download or copy it again" in line:
        assert line.endswith("; download or copy it again") and line.count("download or copy") == 1, line
    assert line.count("(") == line.count(")"), line


def test_a_separate_tokenizer_folder_is_checked_and_replaces_the_model_folders(tiny, tmp_path):
    m, empty = _copy(tiny, tmp_path), tmp_path / "tok"
    _no_tokenizer(m)
    empty.mkdir()
    tok_key = "actor_rollout_ref.model.tokenizer_path"
    (line,) = _errors(tmp_path, f"{KEY}={m}", f"{tok_key}={empty}")
    assert line.startswith(f"{tok_key}={str(empty)!r}: no tokenizer"), line
    (line,) = _errors(tmp_path, f"{KEY}={m}", f"{tok_key}={tmp_path / 'nowhere'}")
    assert line.startswith(f"{tok_key}={str(tmp_path / 'nowhere')!r} does not exist"), line
    preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={m}", f"{tok_key}={tiny['single']}"))
    # a Hub id is left to the download (no folder of that name here)
    preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={m}", f"{tok_key}=HuggingFaceTB/SmolLM2-135M"))


def test_the_critic_and_prime_folders_are_checked_under_their_own_keys(tiny, tmp_path):
    bad = _copy(tiny, tmp_path)
    _no_weights(bad)
    (line,) = _errors(tmp_path, "algorithm=gae", f"{KEY}={tiny['single']}", f"critic.model.path={bad}")
    assert line.startswith(f"critic.model.path={bad!r}: no weights"), line
    (line,) = _errors(tmp_path, "algorithm=prime", f"{KEY}={tiny['single']}", f"reward_model.model.ref_path={bad}")
    assert line.startswith(f"reward_model.model.ref_path={bad!r}: no weights"), line
    (line,) = _errors(tmp_path, "algorithm=prime", f"reward_model.model.path={tmp_path / 'nowhere'}")
    assert line.startswith("reward_model.model.path=") and "does not exist" in line, line


def test_every_problem_is_reported_together_with_the_other_config_errors(tiny, tmp_path):
    m = _copy(tiny, tmp_path)
    _truncated(m)
    _no_tokenizer(m)
    lines = _errors(tmp_path, f"{KEY}={m}", "data.train_files=/nonexistent/train.parquet")
    assert len(lines) == 3, lines
    assert [s for s in ("is truncated", "no tokenizer", "/nonexistent/train.parquet")
            if not any(s in line for line in lines)] == [], lines


def test_entry_point_refuses_a_truncated_model_before_ray_starts(tiny, tmp_path):
    m = _copy(tiny, tmp_path)
    _truncated(m)
    proc = run_cli(str(tmp_path / "out"), f"{KEY}={m}", timeout=120, forked=True)
    assert_one_line_error(proc, f"{KEY}={m!r}: model.safetensors is truncated: header says")
    assert "Ray" not in proc.stdout + proc.stderr and not os.path.exists(tmp_path / "out" / "init_model")


def test_a_broken_weights_link_is_named_and_a_folder_shared_by_roles_is_reported_once(tiny, tmp_path):
    """A ``model.safetensors`` left as a broken symbolic link (a cleaned HF cache) is named as such (it read
    ``None (config.json's transformers_weights) is missing``, and crashed the Megatron check); the same folder as
    actor and critic is one line, whatever loader each role uses."""
    from trainer.model_folder_checks import check_model_folders, weights_problem

    m = _copy(tiny, tmp_path)
    os.remove(os.path.join(m, "model.safetensors"))
    os.symlink(str(tmp_path / "gone"), os.path.join(m, "model.safetensors"))
    for megatron in (False, True):
        problem = weights_problem(m, {}, all_safetensors=megatron)
        assert problem.startswith("model.safetensors is a broken symbolic link") and "None" not in problem, problem
    for strategy in ("deepspeed", "megatron"):
        cfg = _cfg("algorithm=gae", f"{KEY}={m}", f"critic.model.path={m}", f"trainer.strategy={strategy}")
        with pytest.raises(ConfigError) as info:
            check_model_folders(cfg)
        assert len(str(info.value).splitlines()) == 1, str(info.value)


def test_a_tokenizer_without_a_chat_template_is_refused_when_prompts_are_chat_messages(tiny, tmp_path):
    """It crashed every worker with ``tokenizer.chat_template is not set`` (28 lines) from the dataset."""
    from trainer.model_folder_checks import check_model_folders

    m = _copy(tiny, tmp_path)
    os.remove(os.path.join(m, "chat_template.jinja"))
    (line,) = _errors(tmp_path, f"{KEY}={m}")  # the embedded task's prompts are chat messages
    assert line.startswith(f"{KEY}={m!r}: the tokenizer has no chat template"), line
    assert "actor_rollout_ref.model.custom_chat_template" in line and "tokenizer_path" in line, line
    check_model_folders(_cfg(f"{KEY}={m}", "actor_rollout_ref.model.custom_chat_template='{{ messages }}'"))
    os.symlink(str(tmp_path / "gone.jinja"), os.path.join(m, "chat_template.jinja"))
    with pytest.raises(ConfigError, match="no chat template: chat_template.jinja is a broken symbolic link") as info:
        check_model_folders(_cfg(f"{KEY}={m}"))
    assert str(info.value).count("(") == str(info.value).count(")"), str(info.value)
    plain, chat = tmp_path / "plain.jsonl", tmp_path / "chat.jsonl"
    plain.write_text(json.dumps({"prompt": "1 2 ?", "reward_model": {"ground_truth": "2"}}) + "\n")
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "1 ?"}], "reward_model": {}}) + "\n")
    check_model_folders(_cfg(f"{KEY}={m}", f"data.train_files={plain}"))  # plain strings: no template needed
    with pytest.raises(ConfigError, match="no chat template"):
        check_model_folders(_cfg(f"{KEY}={m}", f"data.train_files={chat}"))
    with open(os.path.join(m, "tokenizer_config.json")) as f:
        config = json.load(f)
    with open(os.path.join(m, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "chat_template": "{{ messages }}"}, f)
    check_model_folders(_cfg(f"{KEY}={m}", f"data.train_files={chat}"))


@pytest.mark.parametrize("tokenizer_path", [False, True])
def test_a_tokenizer_without_eos_names_the_key_the_folder_and_its_tokenizer_config(tiny, tmp_path, tokenizer_path):
    """A tokenizer loaded without an EOS token is one line in the form of the other model-folder lines: the key it
    was read from, its folder, what its ``tokenizer_config.json`` says and what to set."""
    from types import SimpleNamespace

    from trainer.config_preflight import check_model_context

    m = _copy(tiny, tmp_path)
    key, keys = KEY, [f"{KEY}={m}"]
    if tokenizer_path:
        key = "actor_rollout_ref.model.tokenizer_path"
        keys = [f"{KEY}={tiny['single']}", f"{key}={m}"]
    cfg = _cfg(f"trainer.output_dir={tmp_path / 'out'}", *keys)
    no_eos = SimpleNamespace(eos_token_id=None)
    config_file = os.path.join(m, "tokenizer_config.json")
    with open(config_file) as f:
        config = json.load(f)
    with open(config_file, "w") as f:
        json.dump({k: v for k, v in config.items() if k != "eos_token"}, f)
    fix = f'; set "eos_token" in {config_file} to the token that ends a response'
    with pytest.raises(ConfigError) as info:
        check_model_context(cfg, SimpleNamespace(), no_eos)
    assert str(info.value) == (f"{key}={m!r}: the tokenizer has no EOS token (tokenizer_config.json names no "
                               f"eos_token){fix}"), str(info.value)
    os.remove(config_file)
    with pytest.raises(ConfigError) as info:
        check_model_context(cfg, SimpleNamespace(), no_eos)
    assert str(info.value) == (f"{key}={m!r}: the tokenizer has no EOS token (the folder has no "
                               f"tokenizer_config.json){fix}"), str(info.value)


def test_a_tokenizer_eos_outside_the_models_vocabulary_is_one_line(tiny, tmp_path):
    """``"eos_token": "<|eot|>"`` in ``tokenizer_config.json`` makes the tokenizer add that token past the model's
    ``vocab_size``: it was accepted (the vocabulary check took the larger of the tokenizer's and the model's size)
    and the run stopped at an id the model can never generate. Now one line naming the key, the token and the
    sizes; the stop-token check itself now bounds every stop id by the model's ``vocab_size``."""
    from transformers import AutoConfig, AutoTokenizer

    from rollout.stop_tokens import resolve_stop_token_ids
    from trainer.config_preflight import check_model_context

    m = _copy(tiny, tmp_path)
    config_file = os.path.join(m, "tokenizer_config.json")
    with open(config_file) as f:
        config = json.load(f)
    with open(config_file, "w") as f:
        json.dump({**config, "eos_token": "<|eot|>"}, f)
    tok, hf = AutoTokenizer.from_pretrained(m), AutoConfig.from_pretrained(m)
    vocab = hf.vocab_size
    assert tok.eos_token_id == vocab and len(tok) == vocab + 1  # the added token, one past the embedding
    cfg = _cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={m}")
    with pytest.raises(ConfigError) as info:
        check_model_context(cfg, hf, tok)
    assert str(info.value) == (f"{KEY}={m!r}: the tokenizer's eos_token '<|eot|>' has id {vocab}, outside the "
                               f"model's vocabulary (vocab_size {vocab}): the model can never generate it; set "
                               f'"eos_token" in {config_file} to a token of the model\'s vocabulary'), str(info.value)
    with pytest.raises(ValueError, match=rf"stop token ids \[{vocab}\] are outside the vocabulary \(size {vocab}\)"):
        resolve_stop_token_ids(tok, hf)


def _header_only(folder, shapes, name="model.safetensors"):
    """A safetensors file of ``folder`` that holds only the header of tensors ``shapes`` (name -> shape): enough for
    the shape checks, which read nothing else."""
    raw = json.dumps({n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for n, s in shapes.items()}).encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)


def _llama_like(prefix="model.", vocab=32, hidden=8, layers=2, head=False):
    out = {f"{prefix}embed_tokens.weight": [vocab, hidden], f"{prefix}norm.weight": [hidden]}
    for i in range(layers):
        out[f"{prefix}layers.{i}.self_attn.q_proj.weight"] = [hidden, hidden]
    if head:
        out["lm_head.weight"] = [vocab, hidden]
    return out


def test_config_against_weight_shapes_judges_what_it_can_and_leaves_the_rest(tmp_path):
    """:func:`trainer.weight_shapes.config_weights_problem` on headers of the layouts it meets: a mismatch is named
    with the config's values and the tensor's shape; working models whose embedding or layer count differs from the
    plain rule (padded vocabularies, Mllama's extra rows, OPT's projection, multi-token-prediction layers, remote
    code, quantized weights, a weights file that cannot be read) are not refused."""
    from trainer.weight_shapes import config_weights_problem as problem

    files = ["model.safetensors"]
    llama = {"model_type": "llama", "vocab_size": 32, "hidden_size": 8, "num_hidden_layers": 2}
    _header_only(tmp_path, _llama_like(head=True))
    assert problem(tmp_path, llama, files) is None
    assert problem(tmp_path, {**llama, "vocab_size": 40}, files).startswith(
        "config.json says hidden_size=8 and vocab_size=40, but model.safetensors holds model.embed_tokens.weight of "
        "shape [32, 8]")
    for skipped in ({"auto_map": {}}, {"quantization_config": {}, "num_hidden_layers": 2}):
        assert problem(tmp_path, {**llama, "hidden_size": 16, **skipped}, files) is None, skipped
    assert "layers 0-1 only" in problem(tmp_path, {**llama, "quantization_config": {}, "num_hidden_layers": 3}, files)
    assert problem(tmp_path, {**llama, "num_hidden_layers": 1}, files) is None  # extra layers (MTP) are not loaded
    assert problem(tmp_path, {**llama, "model_type": "dory", "num_hidden_layers": 4}, files) is None  # 2 per layer
    assert problem(tmp_path, {**llama, "hidden_size": 16}, ["pytorch_model.bin"]) is None  # no such file
    # a vision-language model: the text config against the language model's tensors, the vision tower's layers aside
    vlm = {"model_type": "qwen2_5_vl", "text_config": llama, "vision_config": {"depth": 4}}
    _header_only(tmp_path, {**_llama_like("model.language_model."), "model.visual.blocks.3.mlp.weight": [4, 4]})
    assert problem(tmp_path, vlm, files) is None
    assert problem(tmp_path, {**vlm, "text_config": {**llama, "num_hidden_layers": 3}}, files).startswith(
        "config.json's text_config says num_hidden_layers=3, but model.safetensors holds layers 0-1 only "
        "(model.language_model.layers.<i>)")
    # Mllama's embedding has vocab_size + 8 rows; OPT-350m's is word_embed_proj_dim wide
    _header_only(tmp_path, _llama_like("language_model.model.", vocab=40))
    assert problem(tmp_path, {"model_type": "mllama", "text_config": {**llama, "model_type": "mllama_text_model"}},
                   files) is None
    _header_only(tmp_path, _llama_like("model.decoder.", hidden=4))
    assert problem(tmp_path, {**llama, "model_type": "opt", "word_embed_proj_dim": 4}, files) is None
    # GPT-2's names and keys; an embedding found only by its rows; several candidates: not judged
    gpt2 = {"model_type": "gpt2", "vocab_size": 32, "n_embd": 8, "n_layer": 3}
    _header_only(tmp_path, {"wte.weight": [32, 8], "wpe.weight": [16, 8], "h.0.attn.c_attn.weight": [8, 24]})
    assert problem(tmp_path, gpt2, files).startswith("config.json says n_layer=3, but model.safetensors holds "
                                                     "layer 0 only (h.<i>), so layers 1-2 would start")
    _header_only(tmp_path, {"backbone.emb.weight": [32, 6], "backbone.layers.0.mixer.weight": [6, 6]})
    assert "backbone.emb.weight of shape [32, 6]" in problem(tmp_path, llama, files)
    _header_only(tmp_path, {"encoder.embed_tokens.weight": [32, 6], "decoder.embed_tokens.weight": [32, 6]})
    assert problem(tmp_path, llama, files) is None


def test_config_against_sharded_and_megatron_weights(tiny, tmp_path):
    """The index's ``weight_map`` names the shard that holds the embedding; the Megatron path reads every
    ``*.safetensors`` of the folder; a critic folder is judged under its own key."""
    from trainer.model_folder_checks import check_model_folders, loaded_weight_files, weights_problem
    from trainer.weight_shapes import config_weights_problem

    m = _copy(tiny, tmp_path, "sharded")
    assert loaded_weight_files(m) == ["model.safetensors.index.json"]
    _hidden_doubled(m)
    hf = {"model_type": "llama", "vocab_size": 23, "hidden_size": 64, "num_hidden_layers": 2}
    assert weights_problem(m, hf, all_safetensors=True) is None
    line = config_weights_problem(m, hf, loaded_weight_files(m, hf, all_safetensors=True))
    assert line.startswith("config.json says hidden_size=64 and vocab_size=23, but model-00001-of-00003.safetensors "
                           "holds model.embed_tokens.weight of shape [23, 32]"), line
    with pytest.raises(ConfigError) as info:
        check_model_folders(_cfg("algorithm=gae", f"{KEY}={tiny['single']}", f"critic.model.path={m}"))
    assert str(info.value).startswith(f"critic.model.path={m!r}: config.json says hidden_size=64"), str(info.value)


def test_bin_weights_are_judged_from_their_zip_archive_and_a_legacy_bin_is_left_alone(tiny, tmp_path, monkeypatch):
    """``pytorch_model.bin`` and the shards of ``pytorch_model.bin.index.json`` (torch's zip format): every shape is
    read (on the meta device, no tensor data), a sound folder passes and a mismatch is named. A legacy-format
    (pickle) ``.bin`` is not judged and not read (``torch.load`` is not called: it would read the whole file); a
    zip that torch does not read gives no shapes and no error. Before, no ``.bin`` was judged."""
    import torch
    from safetensors.numpy import load_file

    from trainer.model_folder_checks import loaded_weight_files
    from trainer.weight_shapes import config_weights_problem, header_shapes

    want = {n: list(t.shape) for n, t in load_file(os.path.join(tiny["single"], "model.safetensors")).items()}
    with open(os.path.join(tiny["single"], "config.json")) as f:
        hf = json.load(f)
    wrong = {**hf, "hidden_size": 64, "num_hidden_layers": 4}
    for kind, files in (("bin", ["pytorch_model.bin"]), ("bin_sharded", ["pytorch_model.bin.index.json"])):
        m = tiny[kind]
        assert loaded_weight_files(m, hf) == files
        assert header_shapes(m, files) == want, kind
        assert config_weights_problem(m, hf, files) is None
        preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={m}"))
        assert "but pytorch_model" in config_weights_problem(m, wrong, files), kind
    legacy = _copy(tiny, tmp_path, "bin_legacy")
    _edit_config(legacy, hidden_size=64, num_hidden_layers=4)

    def no_load(*args, **kwargs):
        raise AssertionError("a legacy .bin must not be read")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "load", no_load)
        assert header_shapes(legacy, ["pytorch_model.bin"]) == {}
        assert config_weights_problem(legacy, wrong, ["pytorch_model.bin"]) is None
    preflight(_cfg(f"trainer.output_dir={tmp_path / 'out'}", f"{KEY}={legacy}"))  # not judged: no error
    import zipfile

    with zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as z:
        z.writestr("data.pkl", b"not a pickle")
    assert header_shapes(str(tmp_path), ["pytorch_model.bin"]) == {}
    assert config_weights_problem(str(tmp_path), wrong, ["pytorch_model.bin"]) is None


def test_a_tokenizer_that_does_not_load_or_encode_is_one_line_naming_the_key_the_path_and_the_error(tiny, tmp_path):
    """A ``tokenizer.json`` that parses but holds an empty WordLevel vocabulary loads, then ended the run with the
    tokenizers library's traceback from the dataset's first prompt (``Exception: WordLevel error: Missing [UNK]
    token from the vocabulary``); one whose model type is unknown did not load (a traceback from the driver)."""
    from trainer.launch import load_tokenizer

    m = _copy(tiny, tmp_path)
    path = os.path.join(m, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    with open(path, "w") as f:
        json.dump({**tokenizer, "model": {**tokenizer["model"], "vocab": {}}}, f)
    with pytest.raises(ConfigError) as info:
        load_tokenizer(_cfg(f"{KEY}={m}"))
    assert str(info.value) == (f"{KEY}={m!r}: the tokenizer does not encode text (Exception: WordLevel error: "
                               "Missing [UNK] token from the vocabulary); download or copy it again"), str(info.value)
    with open(path, "w") as f:
        json.dump({**tokenizer, "model": {**tokenizer["model"], "type": "Nope"}}, f)
    tok_key = "actor_rollout_ref.model.tokenizer_path"
    with pytest.raises(ConfigError) as info:
        load_tokenizer(_cfg(f"{KEY}={tiny['single']}", f"{tok_key}={m}"))
    line = str(info.value)
    assert line.startswith(f"{tok_key}={m!r}: the tokenizer does not load (Exception: data did not match any "
                           "variant of untagged enum") and line.endswith("; download or copy it again"), line
    assert len(load_tokenizer(_cfg(f"{KEY}={tiny['single']}"))) == 23
