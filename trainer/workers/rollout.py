"""The rollout worker of ``trainer.rollout_placement=separate``: a generation engine and its generator on a bundle
(or a share of one) of their own, fed with the actor's weights over the weight group
(:mod:`trainer.workers.weight_sync`).

The worker keeps the weight versions it received (:class:`WeightVersions`; version ``v`` = the actor's weights
after ``v`` training steps) until the controller releases them, and generates every batch with exactly the
version its prompts name (``meta["weights_version"]``), so that which weights made a batch never depends on
timing: a run and its resumed copy generate the same rows. Receiving runs in the Ray actor's ``weights``
concurrency group, beside generation in the default group, so a push does not wait for a generation in flight.
The versions still needed by batches not yet trained are the role's checkpoint (``rollout/``): on resume the
in-flight batches are generated again with the same weights.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time

import ray
import torch

from trainer.protocol import DataProto
from trainer.workers.base import DistributedWorker
from trainer.workers.generation import call_sampling, generation_rows, prompt_lists

logger = logging.getLogger(__name__)

__all__ = ["WeightVersions", "RolloutWorker"]

NamedTensor = tuple[str, torch.Tensor]
_INDEX = "versions.json"


class WeightVersions:
    """Weight versions (``version -> [(hf_name, CPU tensor)]``), thread-safe.

    Args:
        timeout_s: how long :meth:`get` waits for a version that has not arrived (None: no bound).
    """

    def __init__(self, timeout_s: float | None = None):
        self._held: dict[int, list[NamedTensor]] = {}
        self._cond = threading.Condition()
        self.timeout_s = timeout_s

    def put(self, version: int, tensors: list[NamedTensor]) -> None:
        with self._cond:
            self._held[int(version)] = tensors
            self._cond.notify_all()

    def get(self, version: int) -> list[NamedTensor]:
        """The tensors of ``version``, waiting for them to arrive.

        Raises:
            TimeoutError: the version did not arrive within ``timeout_s`` (naming it and the versions held).
        """
        with self._cond:
            if not self._cond.wait_for(lambda: int(version) in self._held, timeout=self.timeout_s):
                raise TimeoutError(f"rollout: weights version {version} did not arrive within {self.timeout_s} s "
                                   f"(held: {sorted(self._held)})")
            return self._held[int(version)]

    def release_below(self, version: int) -> None:
        """Drop every version older than ``version``."""
        with self._cond:
            for v in [v for v in self._held if v < int(version)]:
                del self._held[v]

    def versions(self) -> list[int]:
        with self._cond:
            return sorted(self._held)

    def save(self, folder: str) -> None:
        """Every held version as ``weights_<v>.safetensors`` and their list (``versions.json``, written last)."""
        from safetensors.torch import save_file

        with self._cond:
            held = dict(self._held)
        os.makedirs(folder, exist_ok=True)
        for v, tensors in held.items():
            save_file({n: t.contiguous() for n, t in tensors}, os.path.join(folder, f"weights_{v}.safetensors"))
        with open(os.path.join(folder, _INDEX), "w", encoding="utf-8") as f:
            json.dump({"versions": sorted(held)}, f)

    def load(self, folder: str) -> None:
        """Replace the held versions by those saved in ``folder``; none when it holds no ``versions.json`` (a
        checkpoint of a colocated run: the controller then pushes the actor's current weights)."""
        from safetensors.torch import load_file

        loaded = {}
        index = os.path.join(folder, _INDEX)
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                for v in json.load(f)["versions"]:
                    loaded[int(v)] = list(load_file(os.path.join(folder, f"weights_{v}.safetensors")).items())
        with self._cond:
            self._held = loaded
            self._cond.notify_all()


class RolloutWorker(DistributedWorker):
    """One rollout rank: the engine ``actor_rollout_ref.rollout.name`` names, awake for the whole run, and the
    generator over it (:func:`trainer.multi_turn.build_generator`). No DeepSpeed, no process group but the weight
    group.

    Controller calls: ``init_model``, ``init_weight_sync``, ``receive_weights``, ``release_below``,
    ``held_versions``, ``generate_sequences``, ``save_checkpoint``, ``load_checkpoint``. ``config`` is a
    :class:`trainer.config.workers.RolloutWorkerConfig`.
    """

    CONCURRENCY_GROUPS = {"weights": 1}

    def init_model(self) -> dict:
        from trainer.multi_turn import build_generator
        from trainer.workers.actor import build_engine

        if self.device_type == "cuda":
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        else:
            self.device = torch.device("cpu")
        cfg = self.config
        self.rollout_cfg = rc = cfg.rollout
        tok, hf_config, path = _load_tokenizer_and_config(cfg.model)
        from rollout.stop_tokens import resolve_stop_token_ids

        self.stop_token_ids = resolve_stop_token_ids(tok, hf_config, path, extra=list(rc.stop_token_ids))
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else self.stop_token_ids[0]
        self.engine = build_engine(cfg, hf_config, path, self.stop_token_ids, self.pad_token_id, self.device,
                                   self.device_type, self.param_dtype(), self.rank)
        self.engine.wake_up()  # nothing else uses this device share: the engine never sleeps
        self.generator = build_generator(self.engine, rc.multi_turn, tok, cfg.chat_template_kwargs)
        self.versions = WeightVersions(cfg.ray_timeout_s)
        self.loaded_version: int | None = None
        self._group = self._layout = None
        return {"stop_token_ids": list(self.stop_token_ids), "pad_token_id": self.pad_token_id}

    # ---- weights (the "weights" concurrency group) ------------------------------------------------------------
    @ray.method(concurrency_group="weights")
    def init_weight_sync(self, addr: str, port: int, world: int, backend: str, timeout_s: float,
                         layout: list) -> None:
        """Join the weight group as rank ``1 + self.rank``; ``layout``: :func:`trainer.workers.weight_sync.
        weights_layout` of the actor's push."""
        from trainer.workers.weight_sync import WeightGroup

        self._group = WeightGroup(addr, port, 1 + self.rank, world, backend, timeout_s)
        self._layout = layout

    @ray.method(concurrency_group="weights")
    def receive_weights(self, version: int, keep_from: int) -> float:
        """Receive one push as ``version``, then drop the versions older than ``keep_from``; returns seconds."""
        from trainer.workers.weight_sync import receive_bucket

        t0 = time.perf_counter()
        tensors = [pair for layout in self._layout for pair in receive_bucket(self._group, layout)]
        self.versions.put(version, tensors)
        self.versions.release_below(keep_from)
        return time.perf_counter() - t0

    @ray.method(concurrency_group="weights")
    def release_below(self, version: int) -> None:
        self.versions.release_below(version)

    @ray.method(concurrency_group="weights")
    def held_versions(self) -> list[int]:
        return self.versions.versions()

    @ray.method(concurrency_group="weights")
    def save_checkpoint(self, role_dir: str) -> None:
        """The held versions (rank 0 writes; every rank holds the same)."""
        if self.rank == 0:
            self.versions.save(role_dir)

    @ray.method(concurrency_group="weights")
    def check_finite_state(self, step_dir: str) -> None:
        """Nothing to check before a save (the weights versions held are the actor's, checked there); beside a
        generation in progress, like the other checkpoint calls."""

    @ray.method(concurrency_group="weights")
    def load_checkpoint(self, role_dir: str) -> None:
        self.versions.load(role_dir)
        self.loaded_version = None

    # ---- generation (the default group: one call at a time) ---------------------------------------------------
    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Rows of :meth:`trainer.workers.actor.ActorRolloutRefWorker.generate_sequences`, generated with the
        weights version ``prompts.meta["weights_version"]`` (loaded into the engine first when another one is
        there). ``meta`` also gets ``rollout_gen_window`` (wall-clock start and end of the generation, s since
        the epoch) and ``perf/rollout_s/{wait_weights,load_weights,generate}``.

        Raises:
            TimeoutError: the version never arrived (:meth:`WeightVersions.get`).
        """
        from rollout.context import sync_weights

        t0 = time.perf_counter()
        version = int(prompts.meta["weights_version"])
        tensors = self.versions.get(version)
        t1 = time.perf_counter()
        if self.loaded_version != version:
            bucket = self.rollout_cfg.update_weights_bucket_megabytes * 2 ** 20
            sync_weights(self.engine, tensors, bucket)
            self.loaded_version = version
        t2 = time.perf_counter()
        sampling = call_sampling(self.rollout_cfg, prompts, self.rank)
        start = time.time()
        mm = list(prompts["multi_modal_inputs"]) if "multi_modal_inputs" in prompts else None
        gen = self.generator.generate(prompt_lists(prompts), sampling, mm)
        end = time.time()
        result = generation_rows(prompts, gen, sampling.n, rope_model=getattr(self.engine, "model", None))
        result.meta.update(gen.metrics)
        result.meta.update({"rollout_gen_window": (start, end), "timing_gen_s": time.perf_counter() - t0,
                            "perf/rollout_s/wait_weights": t1 - t0, "perf/rollout_s/load_weights": t2 - t1,
                            "perf/rollout_s/generate": end - start})
        return result


def _load_tokenizer_and_config(model_cfg):
    """The policy's tokenizer (``custom_chat_template`` applied), its HF config (``override_config`` applied) and
    its folder, from its :class:`trainer.config.model.ModelConfig`."""
    from transformers import AutoConfig

    from trainer.workers.model_utils import apply_config_overrides, load_tokenizer

    tok, override, remote = load_tokenizer(model_cfg)
    hf_config = AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=remote)
    apply_config_overrides(hf_config, override)
    return tok, hf_config, model_cfg.path
