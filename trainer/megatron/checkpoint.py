"""MegatronCheckpointManager: the ``trainer.checkpoint.CheckpointManager`` interface for megatron-core models.

Folder written by :meth:`MegatronCheckpointManager.save` (``path`` = ``.../global_step_<N>/<role>``), in the
default format ``ckpt_format="torch_dist"`` (``megatron.core.dist_checkpointing``, see ``trainer.megatron.dist_ckpt``)::

    <role>/
        meta.pt                                    # rank 0: step, tp/pp/dp sizes, ckpt_format (weights_only)
        dist_ckpt/                                 # every rank: model + optimizer as sharded tensors of GLOBAL
                                                   #   shape (reshardable: resume at other TP/PP/DP sizes)
        extra/extra_tp{tp}_pp{pp}_dp{dp}.pt        # every rank: LR scheduler + RNG (python, numpy, torch CPU,
                                                   #   CUDA, Megatron's tensor-parallel RNG tracker states)
        huggingface/                               # rank 0: config.json, generation_config.json, tokenizer

``ckpt_format="torch"`` (``torch.save`` per rank; resume needs the same tp/pp/dp sizes) writes instead of
``dist_ckpt/``::

        model/mp_rank_{tp:02d}_{pp:03d}/model.pt   # DP rank 0 of each (tp, pp): list of state_dicts, one per
                                                   #   model chunk (stage-local layer names + layer_offset)
        optim/optim_tp{tp}_pp{pp}_dp{dp}.pt        # every rank: optimizer.state_dict() (its own shard)
        optim/param_state_tp{tp}_pp{pp}.pt         # Megatron DistributedOptimizer.save_parameter_state (if any)

:meth:`load` reads either format (``meta.pt`` says which; folders without ``ckpt_format`` are ``torch``). A
dist checkpoint loaded at other parallel sizes restores the LR scheduler and the python/numpy/torch RNG from the
saved rank with the same data-parallel rank (else DP rank 0) at tp = pp = 0, and keeps the tensor-parallel
RNG tracker as seeded (its per-TP-rank streams have no counterpart at another TP size).

Per-rank file names avoid verl's #1046 (every rank wrote one RNG file). Atomicity as the DeepSpeed manager:
everything goes to ``<role>.tmp``, renamed after a barrier; the trainer writes ``data.pt`` and the tracker
after, and retention runs last (verl #4873). The saved ``huggingface/config.json`` must describe the model
being loaded (checked: ``trainer.megatron.config.model_config_difference``).
HF export of the weights: :meth:`export_hf` (TP/PP gathered through ``trainer.megatron.sync``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import torch

from trainer.checkpoint.atomic import atomic_torch_save, barrier, give_umask_modes, replace_dir
from trainer.checkpoint.base import (CheckpointManager, capture_rng_state, parse_step, rate_at_restored_step,
                                     restore_rng_state)
from trainer.megatron.dist_ckpt import step_state_set_aside as _step_state_set_aside
from trainer.megatron.engine import unwrap

logger = logging.getLogger(__name__)
HF_SUBDIR = "huggingface"
DIST_SUBDIR = "dist_ckpt"
CKPT_FORMATS = ("torch_dist", "torch")


def megatron_ranks() -> dict[str, int]:
    """``{tp, pp, dp, tp_size, pp_size, dp_size, rank}`` from megatron's parallel state."""
    from megatron.core import parallel_state as ps

    return dict(tp=ps.get_tensor_model_parallel_rank(), pp=ps.get_pipeline_model_parallel_rank(),
                dp=ps.get_data_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
                pp_size=ps.get_pipeline_model_parallel_world_size(), dp_size=ps.get_data_parallel_world_size(),
                rank=torch.distributed.get_rank() if torch.distributed.is_initialized() else 0)


def _tracker_states() -> dict | None:
    try:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    except ImportError:
        return None
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in get_cuda_rng_tracker().get_states().items()}


def _set_tracker_states(states: dict | None) -> None:
    if not states:
        return
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    get_cuda_rng_tracker().set_states(dict(states))


def unshare_step_tensors(optimizer) -> int:
    """Give every parameter state of torch Adam(W) its own ``step`` tensor; returns how many were replaced.

    Megatron's ``DistributedOptimizer.load_state_dict`` without Transformer Engine / apex puts ONE ``step`` tensor
    object into every parameter's state (megatron-core 0.19.2), and torch's Adam increments each state's step in
    place, so after a resume the shared counter advances by the number of parameters per optimizer step: the bias
    corrections ``1 - beta^step`` jump to 1 and the updates become several times larger than in the uninterrupted
    run (seen on 2 x H200 as a KL jump right after a resume). Accepts a torch optimizer, a Megatron optimizer
    (``.optimizer``) or a chained one (``.chained_optimizers``).
    """
    outer = getattr(optimizer, "chained_optimizers", [optimizer])
    inner = [getattr(o, "optimizer", o) for o in outer]
    seen, replaced = set(), 0
    for opt in inner:
        for state in (getattr(opt, "state", None) or {}).values():
            step = state.get("step") if isinstance(state, dict) else None
            if isinstance(step, torch.Tensor):
                if id(step) in seen:
                    state["step"] = step.detach().clone()
                    replaced += 1
                seen.add(id(state["step"]))
    return replaced


class MegatronCheckpointManager(CheckpointManager):
    """Saves/restores megatron-core model chunks, optimizer, LR scheduler and per-rank RNG.

    Args:
        model: a module or a list of model chunks (virtual pipeline stages), unwrapped or DDP-wrapped.
        optimizer: any object with ``state_dict``/``load_state_dict`` (a torch optimizer or a Megatron optimizer;
            with ``ckpt_format="torch"`` the distributed optimizer's ``save_parameter_state`` /
            ``load_parameter_state`` are used too); None skips it.
        lr_scheduler: ``state_dict``/``load_state_dict`` object (Megatron's ``OptimizerParamScheduler`` or a
            torch scheduler); None skips it.
        ranks: ``{tp, pp, dp, tp_size, pp_size, dp_size, rank}``; default from megatron's parallel state.
        layer_offset: first global layer index of this pipeline stage (stored with ``torch`` model files).
        hf_config, tokenizer: saved under ``huggingface/`` by rank 0 (None: skipped); ``hf_config`` is also
            compared with a loaded checkpoint's config.
        ckpt_format: ``"torch_dist"`` (default, reshardable) or ``"torch"`` for what :meth:`save` writes.

    Raises:
        ValueError: ``ranks`` lacks a key, or ``ckpt_format`` is not one of the two.
    """

    def __init__(self, model: Any, optimizer: Any = None, lr_scheduler: Any = None, ranks: dict | None = None,
                 layer_offset: int = 0, hf_config: Any = None, tokenizer: Any = None,
                 ckpt_format: str = "torch_dist"):
        self.chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.r = dict(ranks) if ranks is not None else megatron_ranks()
        for k in ("tp", "pp", "dp", "tp_size", "pp_size", "dp_size", "rank"):
            if k not in self.r:
                raise ValueError(f"ranks lacks {k!r}; got {sorted(self.r)}")
        if ckpt_format not in CKPT_FORMATS:
            raise ValueError(f"ckpt_format={ckpt_format!r}; expected one of {CKPT_FORMATS}")
        self.layer_offset, self.hf_config, self.tokenizer = int(layer_offset), hf_config, tokenizer
        self.ckpt_format = ckpt_format

    # ------------------------------------------------------------------------------------------ file names
    def _model_file(self, root: str) -> str:
        return os.path.join(root, "model", f"mp_rank_{self.r['tp']:02d}_{self.r['pp']:03d}", "model.pt")

    def _suffix(self, with_dp: bool = True) -> str:
        s = f"tp{self.r['tp']}_pp{self.r['pp']}"
        return s + (f"_dp{self.r['dp']}" if with_dp else "")

    def _sizes(self) -> dict:
        return {k: int(self.r[k]) for k in ("tp_size", "pp_size", "dp_size")}

    # ------------------------------------------------------------------------------------------------ save
    def save(self, path: str, step: int | None = None) -> None:
        """Save into ``path`` atomically (every rank of the role calls it; also accepts ``save(step, path)``).

        Raises: ValueError when no step is given and ``path`` has no ``global_step_<N>``.
        """
        if isinstance(path, int) and isinstance(step, str):
            path, step = step, path
        path = os.path.abspath(path)
        step = parse_step(path) if step is None else int(step)
        tmp = path + ".tmp"
        if self.r["rank"] == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.join(tmp, DIST_SUBDIR) if self.ckpt_format == "torch_dist" else tmp)
        barrier()
        if self.ckpt_format == "torch_dist":
            from trainer.megatron.dist_ckpt import save_dist

            save_dist(self.chunks, self.optimizer, os.path.join(tmp, DIST_SUBDIR))
        else:
            self._save_torch(tmp)
        extra = {"lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                 "rng": capture_rng_state(), "rng_tracker": _tracker_states()}
        atomic_torch_save(extra, os.path.join(tmp, "extra", f"extra_{self._suffix()}.pt"))
        if self.r["rank"] == 0:
            atomic_torch_save({"global_step": step, "ckpt_format": self.ckpt_format, **self._sizes()},
                              os.path.join(tmp, "meta.pt"))
            if self.hf_config is not None or self.tokenizer is not None:
                from trainer.checkpoint.deepspeed_manager import save_hf_metadata

                save_hf_metadata(os.path.join(tmp, HF_SUBDIR), self.hf_config, self.tokenizer)
        barrier()
        if self.r["rank"] == 0:
            replace_dir(tmp, path)
        barrier()
        logger.info("saved Megatron checkpoint (step %d, %s) to %s", step, self.ckpt_format, path)

    def _save_torch(self, tmp: str) -> None:
        if self.r["dp"] == 0:
            sds = [{k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                    for k, v in unwrap(c).state_dict().items() if not k.endswith("_extra_state")}
                   for c in self.chunks]
            atomic_torch_save({"chunks": sds, "layer_offset": self.layer_offset}, self._model_file(tmp))
        if self.optimizer is not None:
            atomic_torch_save(self.optimizer.state_dict(), os.path.join(tmp, "optim", f"optim_{self._suffix()}.pt"))
            if hasattr(self.optimizer, "save_parameter_state"):  # Megatron DistributedOptimizer (collective)
                self.optimizer.save_parameter_state(
                    os.path.join(tmp, "optim", f"param_state_{self._suffix(with_dp=False)}.pt"))

    # ------------------------------------------------------------------------------------------------ load
    def load(self, path: str, load_optimizer: bool = True, load_lr_scheduler: bool = True,
             load_rng: bool = True) -> dict:
        """Restore model chunks, optimizer, LR scheduler and RNG (incl. the TP RNG tracker) from ``path``.

        Returns: ``{"global_step", "tp_size", "pp_size", "dp_size", "ckpt_format"}`` as saved.
        Raises:
            FileNotFoundError: ``path``, ``meta.pt`` or one of this rank's files is missing (names it).
            ValueError: the saved ``huggingface/config.json`` differs from ``hf_config`` (names the value); a
                ``torch``-format checkpoint saved with other tp/pp/dp sizes or another number of model chunks.
        """
        path = os.path.abspath(path)
        meta_file = os.path.join(path, "meta.pt")
        if not os.path.isfile(meta_file):
            raise FileNotFoundError(f"{meta_file!r} is missing: {path!r} is not a complete Megatron checkpoint")
        meta = {"ckpt_format": "torch", **torch.load(meta_file, map_location="cpu", weights_only=True)}
        self._check_model_config(path)
        saved = {k: int(meta[k]) for k in ("tp_size", "pp_size", "dp_size")}
        if meta["ckpt_format"] == "torch_dist":
            from trainer.megatron.dist_ckpt import load_dist

            load_dist(self.chunks, self.optimizer, os.path.join(path, DIST_SUBDIR),
                      load_optimizer=load_optimizer and self.optimizer is not None)
            if load_optimizer and self.optimizer is not None:
                unshare_step_tensors(self.optimizer)
        else:
            if saved != self._sizes():
                raise ValueError(f"checkpoint {path!r} (ckpt_format=torch) was saved with {saved} but this run has "
                                 f"{self._sizes()}; resume with the same parallel sizes or convert through the HF "
                                 "export")
            self._load_torch(path, load_optimizer)
        same = saved == self._sizes()
        if not same:
            logger.warning("resharding %s from %s to %s: LR scheduler and RNG from the tp0/pp0 rank of this DP rank; "
                           "the tensor-parallel RNG tracker keeps its seed", path, saved, self._sizes())
        dp = self.r["dp"] if self.r["dp"] < saved["dp_size"] else 0
        name = f"extra_{self._suffix()}.pt" if same else f"extra_tp0_pp0_dp{dp}.pt"
        extra = torch.load(_need(os.path.join(path, "extra", name)), map_location="cpu", weights_only=True)
        if load_lr_scheduler and self.lr_scheduler is not None:
            if extra["lr_scheduler"] is None:
                raise KeyError(f"checkpoint {path!r} has no LR scheduler state")
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            rate_at_restored_step(self.lr_scheduler)  # a LambdaLR (CPU); the shadow applies it itself
        if load_rng:
            restore_rng_state(extra["rng"])
            if same:
                _set_tracker_states(extra.get("rng_tracker"))
        barrier()
        return dict(meta)

    def _check_model_config(self, path: str) -> None:
        from trainer.megatron.config import model_config_difference

        saved_cfg = os.path.join(path, HF_SUBDIR, "config.json")
        if self.hf_config is None or not os.path.isfile(saved_cfg):
            return
        with open(saved_cfg, encoding="utf-8") as f:
            diff = model_config_difference(json.load(f), self.hf_config)
        if diff:
            raise ValueError(f"checkpoint {path!r} holds another model: {diff}")

    def _load_torch(self, path: str, load_optimizer: bool) -> None:
        blob = torch.load(_need(self._model_file(path)), map_location="cpu", weights_only=True)
        if len(blob["chunks"]) != len(self.chunks):
            raise ValueError(f"checkpoint has {len(blob['chunks'])} model chunks, the model has {len(self.chunks)}")
        for c, sd in zip(self.chunks, blob["chunks"]):
            res = unwrap(c).load_state_dict(sd, strict=False)
            bad = [k for k in res.missing_keys if not k.endswith("_extra_state")] + list(res.unexpected_keys)
            if bad:
                raise RuntimeError(f"model state mismatch loading {path!r}: {bad}")
        if load_optimizer and self.optimizer is not None:
            self.optimizer.load_state_dict(torch.load(_need(os.path.join(path, "optim", f"optim_{self._suffix()}.pt")),
                                                      map_location="cpu", weights_only=False))
            if hasattr(self.optimizer, "load_parameter_state"):
                # no_grad: megatron copies into the fp32 main params (leaves that require grad) in place, which
                # autograd refuses outside no_grad (RuntimeError on 2 x H200, megatron-core 0.19.2)
                with _step_state_set_aside(self.optimizer), torch.no_grad():
                    self.optimizer.load_parameter_state(
                        _need(os.path.join(path, "optim", f"param_state_{self._suffix(with_dp=False)}.pt")))
            unshare_step_tensors(self.optimizer)

    # ------------------------------------------------------------------------------------------- HF export
    def export_hf(self, out_dir: str, shape, dtype: torch.dtype | None = None) -> None:
        """Write ``model.safetensors`` + config + tokenizer loadable by ``from_pretrained`` (rank 0 writes;
        every rank must call: TP/PP shards are gathered). Single model chunk only.

        Raises: ValueError with virtual pipeline chunks; ValueError without ``hf_config``.
        """
        from safetensors.torch import save_file

        from trainer.megatron.sync import iter_hf_weights

        if len(self.chunks) != 1:
            raise ValueError("HF export of virtual-pipeline models (several chunks) is not supported; export with one chunk per stage")
        if self.hf_config is None:
            raise ValueError("export_hf needs hf_config")
        tensors = {n: t.to(dtype or t.dtype).cpu().contiguous() for n, t in iter_hf_weights(unwrap(self.chunks[0]), shape)}
        if self.r["rank"] == 0:
            from trainer.checkpoint.deepspeed_manager import save_hf_metadata

            save_hf_metadata(out_dir, self.hf_config, self.tokenizer, dtype)
            save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
            give_umask_modes(out_dir)  # safetensors writes its weights 0600
        barrier()


def _need(path: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file {path!r} is missing")
    return path
