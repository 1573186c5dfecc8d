"""What every worker takes from outside its role's sections (:class:`WorkerRuntime`), and whether the run needs the
reference model; the base of :mod:`trainer.config.workers` and :mod:`trainer.config.prm`."""
from __future__ import annotations

from dataclasses import dataclass

from trainer.config.deepspeed import DeepSpeedConfig

__all__ = ["ARR", "WorkerRuntime", "needs_reference", "runtime_kwargs"]

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class WorkerRuntime:
    """What every worker takes from outside its role's sections.

    Attributes:
        deepspeed: the ``deepspeed`` section (ZeRO stage, precision, offload, optimizer).
        seed: ``trainer.seed`` (LoRA adapters' initialisation, vLLM's seed, megatron's RNG).
        cpus_per_worker: ``trainer.cpus_per_worker`` (torch threads of a CPU worker).
    """

    deepspeed: DeepSpeedConfig
    seed: int
    cpus_per_worker: int


def runtime_kwargs(cfg: dict) -> dict:
    """The :class:`WorkerRuntime` fields of the run config ``cfg``."""
    t = cfg["trainer"]
    return {"deepspeed": DeepSpeedConfig.from_dict(cfg["deepspeed"], "deepspeed"), "seed": int(t["seed"]),
            "cpus_per_worker": max(1, int(t["cpus_per_worker"]))}


def needs_reference(cfg: dict) -> bool:
    """Whether a KL term needs reference log-probs: ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``."""
    return bool(cfg[ARR]["actor"]["use_kl_loss"] or cfg["algorithm"]["use_kl_in_reward"])
