"""Offline export: a saved ``global_step_<N>/<role>`` checkpoint (DeepSpeed or Megatron) -> Hugging Face model folder.

Usage::

    python tools/export_hf.py --local_dir ckpts/global_step_40/actor --target_dir hf_actor_step40 [--dtype bfloat16]
    python tools/export_hf.py merge --backend deepspeed --local_dir ckpts/global_step_40/actor --target_dir hf_actor
    python tools/export_hf.py --local_dir ckpts/global_step_40/actor --target_dir hf_actor --adapter   # LoRA

(the second form is verl's ``python -m verl.model_merger merge`` spelling; ``--backend`` must match the folder).

Weights come from DeepSpeed's ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``
(ZeRO 1/2/3: merges the fp32 master partitions of every rank; runs on CPU, no process group needed) or,
for a ZeRO-0 checkpoint, from the ``module`` entry of ``mp_rank_00_model_states.pt``. A Megatron role folder
(``trainer.strategy=megatron``; it holds ``meta.pt``) is read without megatron-core and without a process group:
a dist checkpoint (``dist_ckpt/``, the default ``ckpt_format=torch_dist``) through
``torch.distributed.checkpoint`` (only the model's tensors, at their global shapes, whatever TP/PP wrote them;
``trainer.megatron.weights.dist_ckpt_to_mcore``), a ``torch``-format one by merging the shards
``model/mp_rank_<tp>_<pp>/model.pt`` over tensor/pipeline ranks (``trainer.megatron.weights.mcore_to_hf``);
both are renamed to HF names and the optimizer state is not read. Config, tokenizer,
chat template and generation config come from ``<local_dir>/huggingface/`` written at save time; the model
class is the one that config names (the class that was trained: a critic exports as
``<Model>ForTokenClassification`` with one label). The output dtype defaults to the training dtype recorded in
that config, and ``config.json`` records the dtype written.

A role trained with LoRA adapters (its folder holds ``lora_adapter/adapter_config.json``; the checkpoint holds the
adapters only) is rebuilt from its base model folder (recorded at save time, or ``--base_model``), given the saved
adapters and written merged (``peft``'s ``merge_and_unload``); ``--adapter`` also writes the adapter folder that
``peft.PeftModel.from_pretrained`` loads to ``<target_dir>/lora_adapter``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.checkpoint.hf_export import to_dtype  # noqa: E402

logger = logging.getLogger("export_hf")


def load_consolidated_state_dict(local_dir: str, tag: str | None = None) -> dict:
    """Full fp32 state dict (CPU) of a DeepSpeed checkpoint folder holding a ``latest`` tag file.

    Raises FileNotFoundError when the folder has no DeepSpeed checkpoint.
    """
    if tag is None:
        latest = os.path.join(local_dir, "latest")
        if not os.path.isfile(latest):
            raise FileNotFoundError(f"{local_dir!r} holds neither a DeepSpeed checkpoint ({latest!r} not found) nor "
                                    "a Megatron one (meta.pt); expected a saved role folder .../global_step_<N>/actor")
        with open(latest) as f:
            tag = f.read().strip()
    folder = os.path.join(local_dir, tag)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    if any(n.endswith("optim_states.pt") for n in names):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        return dict(get_fp32_state_dict_from_zero_checkpoint(local_dir, tag=tag))
    states = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(states):
        raise FileNotFoundError(f"no ZeRO optimizer states and no {states!r}")
    from trainer.checkpoint.deepspeed_manager import load_deepspeed_file

    sd = load_deepspeed_file(states)["module"]
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def load_dist_model_tensors(dist_dir: str) -> dict[str, torch.Tensor]:
    """The model tensors of a Megatron dist checkpoint folder at their global shapes (CPU), keyed by sharded key.

    Read with ``torch.distributed.checkpoint`` in one process (``no_dist``); optimizer entries
    (``optimizer.*``) and non-tensor entries (``*_extra_state``) are skipped.

    Raises: FileNotFoundError when ``dist_dir`` has no ``.metadata``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not os.path.isfile(os.path.join(dist_dir, ".metadata")):
        raise FileNotFoundError(f"{dist_dir!r} is not a dist checkpoint (no .metadata)")
    reader = dcp.FileSystemReader(dist_dir)
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype)
          for k, m in reader.read_metadata().state_dict_metadata.items()
          if isinstance(m, TensorStorageMetadata) and not k.startswith("optimizer.")}
    dcp.load(sd, storage_reader=reader, no_dist=True)
    return sd


def load_megatron_state_dict(local_dir: str, hf_config) -> dict:
    """Full HF-named fp32 state dict (CPU) of a Megatron role folder written by ``MegatronCheckpointManager``.

    Raises:
        FileNotFoundError: ``meta.pt``, ``dist_ckpt/.metadata`` or a ``model/mp_rank_<tp>_<pp>/model.pt`` shard is
            missing (named).
        ValueError: a shard holds several model chunks (virtual pipeline), or the config cannot be converted.
    """
    from trainer.megatron.config import model_shape
    from trainer.megatron.weights import dist_ckpt_to_mcore, iter_hf_from_mcore

    meta = torch.load(os.path.join(local_dir, "meta.pt"), map_location="cpu", weights_only=True)
    if meta.get("ckpt_format", "torch") == "torch_dist":
        tensors = load_dist_model_tensors(os.path.join(local_dir, "dist_ckpt"))
        mcore = dist_ckpt_to_mcore(tensors, int(hf_config.num_hidden_layers))
        sd = dict(iter_hf_from_mcore(mcore, model_shape(hf_config, 1, 1)))
    else:
        sd = _merge_torch_shards(local_dir, hf_config, int(meta["tp_size"]), int(meta["pp_size"]))
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def _merge_torch_shards(local_dir: str, hf_config, tp: int, pp: int) -> dict:
    from trainer.megatron.config import model_shape
    from trainer.megatron.weights import mcore_to_hf

    shards = {}
    for t in range(tp):
        for p in range(pp):
            f = os.path.join(local_dir, "model", f"mp_rank_{t:02d}_{p:03d}", "model.pt")
            if not os.path.isfile(f):
                raise FileNotFoundError(f"Megatron shard {f!r} is missing (checkpoint saved with tp={tp}, pp={pp})")
            chunks = torch.load(f, map_location="cpu", weights_only=True)["chunks"]
            if len(chunks) != 1:
                raise ValueError(f"{f!r} holds {len(chunks)} model chunks; only one chunk per stage is supported")
            shards[(t, p)] = chunks[0]
    return mcore_to_hf(shards, model_shape(hf_config, tp, pp), tp, pp)


_VALUE_HEADS = ("score.weight", "classifier.weight")  # the one-output token heads of transformers' models


def model_architecture(config, state_dict: dict) -> str:
    """The transformers class to rebuild: ``config.architectures[0]`` (``AutoModelForCausalLM`` when unset),
    except that a causal-LM name with weights holding a token head (``score.weight``) and no ``lm_head`` (a critic
    saved with its backbone's config) becomes ``<Model>ForTokenClassification`` with ``config.num_labels`` set
    from the head's rows (in place)."""
    arch = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    head = next((k for k in _VALUE_HEADS if k in state_dict), None)
    if arch.endswith("ForCausalLM") and head is not None and "lm_head.weight" not in state_dict:
        arch = arch[:-len("ForCausalLM")] + "ForTokenClassification"
        config.num_labels = int(state_dict[head].shape[0])
        logger.warning("the checkpoint's config names a causal LM but its weights hold a value head %r: "
                       "exporting as %s (num_labels=%d)", head, arch, config.num_labels)
    return arch


def lora_adapter_config(local_dir: str) -> dict | None:
    """The ``lora_adapter/adapter_config.json`` of a role folder saved with LoRA adapters, or None."""
    import json

    from trainer.checkpoint.deepspeed_manager import LORA_SUBDIR
    from trainer.workers.lora import ADAPTER_CONFIG

    path = os.path.join(local_dir, LORA_SUBDIR, ADAPTER_CONFIG)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def merge_lora_checkpoint(local_dir: str, config, adapter_cfg: dict, sd: dict, base_model: str | None = None,
                          adapter_dir: str | None = None):
    """The merged model (``merge_and_unload``) of a LoRA role folder: the base model (``base_model``, else the
    adapter config's ``base_model_name_or_path``) as the class the checkpoint's config names, wrapped with the
    saved adapter config, given the checkpoint's fp32 adapter (and value-head) tensors ``sd`` (peft names).
    ``adapter_dir``: also write the adapter there as the folder ``peft.PeftModel.from_pretrained`` loads.

    Raises:
        FileNotFoundError: the base model folder does not exist (pass ``--base_model``).
        RuntimeError: the checkpoint's adapter tensors do not match the adapter built from its config.
    """
    import dataclasses

    import transformers
    from peft import LoraConfig, get_peft_model

    base = base_model or adapter_cfg.get("base_model_name_or_path")
    if not base or not os.path.isfile(os.path.join(base, "config.json")):
        raise FileNotFoundError(f"{local_dir!r} holds LoRA adapters of the base model {base!r}, which is not a model "
                                "folder here; pass its folder with --base_model")
    arch = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    cls = getattr(transformers, arch, None) or transformers.AutoModelForCausalLM
    model = cls.from_pretrained(base, config=config, dtype=torch.float32)
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    peft_model = get_peft_model(model, LoraConfig(**{k: v for k, v in adapter_cfg.items() if k in known}))
    trained = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    missing, unexpected = trained - set(sd), set(sd) - trained
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {local_dir!r} does not match its adapter config: missing "
                           f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    peft_model.load_state_dict(sd, strict=False)
    if adapter_dir is not None:
        peft_model.save_pretrained(adapter_dir)
    return peft_model.merge_and_unload()


def _check_folders(local_dir: str, target_dir: str, tag: str | None, overwrite: bool = False) -> None:
    """``local_dir`` is a role folder with HF metadata whose files are complete, and ``target_dir`` is a new or
    empty folder, or holds files that may be replaced (``overwrite``); nothing is read or written otherwise.

    Raises:
        FileNotFoundError: a missing folder or HF metadata; ValueError: a step folder or the checkpoint root instead
            of a role folder, a file cut short, a ``target_dir`` that is a file, or one that holds files without
            ``overwrite``.
    """
    from trainer.checkpoint.base import list_checkpoints
    from trainer.checkpoint.verify import unreadable_files, verify_deepspeed_role

    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"--local_dir {local_dir!r} does not exist")
    if os.path.exists(target_dir) and not os.path.isdir(target_dir):
        raise ValueError(f"--target_dir {target_dir!r} is a file; expected a folder (new or existing)")
    if not overwrite and os.path.isdir(target_dir) and os.listdir(target_dir):
        raise ValueError(f"--target_dir {target_dir!r} already holds files ({sorted(os.listdir(target_dir))[0]}, ...) "
                         "that the export would replace; expected a new or empty folder, or --overwrite")
    roles = [r for r in ("actor", "critic", "reward") if os.path.isdir(os.path.join(local_dir, r))]
    steps = list_checkpoints(local_dir)
    if not roles and steps and not os.path.isdir(os.path.join(local_dir, "huggingface")):
        raise ValueError(f"{local_dir!r} is the checkpoint root (trainer.default_local_dir); pass a role folder "
                         f"of one of its steps, e.g. {os.path.join(steps[-1][1], 'actor')}")
    if roles and not os.path.isdir(os.path.join(local_dir, "huggingface")):
        raise ValueError(f"{local_dir!r} is a step folder; pass one of its role folders: "
                         + ", ".join(os.path.join(local_dir, r) for r in roles))
    hf_dir = os.path.join(local_dir, "huggingface")
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(f"{hf_dir}/config.json not found; the checkpoint was saved without HF metadata")
    if tag is not None and not os.path.isdir(os.path.join(local_dir, tag)):
        tags = sorted(n for n in os.listdir(local_dir) if os.path.isdir(os.path.join(local_dir, n))
                      and n not in ("huggingface", "lora_adapter"))
        raise ValueError(f"--tag {tag!r}: no such tag in {local_dir!r} (tags there: {', '.join(tags) or 'none'}; "
                         "without --tag, the one its 'latest' file names)")
    if tag is not None or os.path.isfile(os.path.join(local_dir, "latest")):
        verify_deepspeed_role(local_dir, tag)
    bad = unreadable_files(local_dir)
    if bad:
        raise ValueError(f"{bad[0]!r} is not a complete torch checkpoint file (cut short or corrupted)")


def export_checkpoint(local_dir: str, target_dir: str, dtype: str | torch.dtype | None = None,
                      tag: str | None = None, adapter: bool = False, base_model: str | None = None,
                      overwrite: bool = False) -> str:
    """Write an HF folder from ``local_dir`` (a saved role folder); returns ``target_dir``.

    A role saved with LoRA adapters (it holds ``lora_adapter/adapter_config.json``) is written merged into its base
    model (:func:`merge_lora_checkpoint`); with ``adapter`` the peft adapter folder goes to
    ``<target_dir>/lora_adapter`` as well (verl's merger writes it there). A ``target_dir`` that already holds files
    is written into only with ``overwrite``.

    Raises:
        FileNotFoundError: no ``huggingface/config.json``, or neither a DeepSpeed (``latest``) nor a Megatron
            (``meta.pt``) checkpoint in ``local_dir``; a LoRA checkpoint whose base model folder is missing.
        RuntimeError: the checkpoint's weight names do not match the model built from the config.
        ValueError: ``adapter`` for a checkpoint without LoRA adapters; a ``target_dir`` holding files without
            ``overwrite`` (see :func:`_check_folders`).
    """
    import transformers
    from transformers import AutoConfig

    _check_folders(local_dir, target_dir, tag, overwrite)
    hf_dir = os.path.join(local_dir, "huggingface")
    config = AutoConfig.from_pretrained(hf_dir)
    out_dtype = to_dtype(dtype if dtype is not None else (getattr(config, "dtype", None) or torch.float32))
    config.dtype = out_dtype
    adapter_cfg = lora_adapter_config(local_dir)
    if adapter and adapter_cfg is None:
        raise ValueError(f"--adapter: {local_dir!r} was saved without LoRA adapters "
                         "(no lora_adapter/adapter_config.json)")
    if adapter_cfg is not None:
        merged = merge_lora_checkpoint(local_dir, config, adapter_cfg, load_consolidated_state_dict(local_dir, tag),
                                       base_model, os.path.join(target_dir, "lora_adapter") if adapter else None)
        return _write_export(merged.to(out_dtype), hf_dir, target_dir, None, out_dtype)
    if os.path.isfile(os.path.join(local_dir, "meta.pt")):
        sd = load_megatron_state_dict(local_dir, config)
    else:
        sd = load_consolidated_state_dict(local_dir, tag)
    arch = model_architecture(config, sd)
    cls = getattr(transformers, arch, None) or transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(config) if cls.__name__.startswith("Auto") else cls(config)
    model.to(out_dtype)  # save_pretrained records the model's dtype in config.json
    expected = set(model.state_dict().keys())
    tied = {k for k in expected - set(sd) if getattr(config, "tie_word_embeddings", False) and "lm_head" in k}
    missing, unexpected = expected - set(sd) - tied, set(sd) - expected
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {local_dir!r} does not match {arch}: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")
    sd = {k: v.to(out_dtype) if v.is_floating_point() else v for k, v in sd.items()}
    return _write_export(model, hf_dir, target_dir, sd, out_dtype)


def _write_export(model, hf_dir: str, target_dir: str, sd: dict | None, out_dtype: torch.dtype) -> str:
    """``model.save_pretrained`` (with ``sd`` when given) into ``target_dir`` (``config.json`` records
    ``out_dtype``), then the generation config and the tokenizer saved in ``hf_dir``."""
    from transformers import AutoTokenizer, GenerationConfig

    os.makedirs(target_dir, exist_ok=True)
    model.config.dtype = out_dtype
    model.save_pretrained(target_dir, safe_serialization=True, **({"state_dict": sd} if sd is not None else {}))
    try:
        GenerationConfig.from_pretrained(hf_dir).save_pretrained(target_dir)
    except OSError:
        logger.info("no generation_config.json in %s", hf_dir)
    try:
        AutoTokenizer.from_pretrained(hf_dir).save_pretrained(target_dir)
    except (OSError, ValueError) as e:
        logger.warning("no tokenizer exported from %s: %s", hf_dir, e)
    from trainer.checkpoint.atomic import give_umask_modes

    give_umask_modes(target_dir)  # safetensors writes its weights 0600 (an adapter folder inside is included)
    return target_dir


def checkpoint_backend(local_dir: str) -> str:
    """``megatron`` when the role folder holds ``meta.pt``, else ``deepspeed``."""
    return "megatron" if os.path.isfile(os.path.join(local_dir, "meta.pt")) else "deepspeed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, in this tool's form or as verl's model merger spells it
    (``merge --backend deepspeed|megatron --local_dir ... --target_dir ...``).

    Raises:
        SystemExit: argparse's usage error (exit 2), e.g. verl's ``--backend fsdp`` (this framework saves DeepSpeed
            or Megatron checkpoints) or its ``test`` operation.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("operation", nargs="?", choices=["merge"],
                   help="verl's model-merger spelling: merge (the only operation; the default)")
    p.add_argument("--backend", choices=["deepspeed", "megatron"], default=None,
                   help="the checkpoint's strategy (verl's flag; default: read from the folder)")
    p.add_argument("--local_dir", required=True, help="saved role folder: <default_local_dir>/global_step_<N>/actor")
    p.add_argument("--target_dir", required=True, help="output Hugging Face folder")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: training dtype)")
    p.add_argument("--tag", default=None, help="DeepSpeed tag inside local_dir (default: its 'latest' file)")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA checkpoint: also write the adapter folder peft loads to <target_dir>/lora_adapter")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a --target_dir that already holds files (default: refuse)")
    p.add_argument("--base_model", default=None,
                   help="a LoRA checkpoint: the base model folder (default: the one recorded at save time)")
    args = p.parse_args(argv)
    if args.backend is not None and os.path.isdir(args.local_dir):
        found = checkpoint_backend(args.local_dir)
        if found != args.backend:
            p.error(f"--backend {args.backend}, but {args.local_dir!r} holds a {found} checkpoint "
                    f"({'meta.pt' if found == 'megatron' else 'no meta.pt'}); use --backend {found}")
    return args


def main(argv: list[str] | None = None) -> None:
    """The command line: export, or stop with one ``error: <line>`` on stderr and exit status 2 for a folder that is
    missing or holds no exportable checkpoint (FileNotFoundError, ValueError of :func:`export_checkpoint`)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        out = export_checkpoint(args.local_dir, args.target_dir, args.dtype, args.tag, adapter=args.adapter,
                                base_model=args.base_model, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {args.local_dir} -> {out}")


if __name__ == "__main__":
    main()
