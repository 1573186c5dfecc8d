"""The run's roles: which worker groups exist, what each is for, and the typed calls the controller makes on them.

A :class:`Role` names one worker group (its worker class, how many Ulysses/TP peers share a data-parallel rank,
its checkpoint folder); :class:`Roles` holds the run's list and loops over it at start-up, checkpoint save and
load, and teardown (``trainer.recovery`` re-creates the groups through it). The trainer always has the actor;
the algorithm's hooks add theirs (the critic, PRIME's PRM; :mod:`trainer.hooks`).

Three uses of the policy have their own names, so that each can move without the step changing:
:attr:`Roles.actor` (the trained policy), :attr:`Roles.rollout` (generation) and :attr:`Roles.ref` (reference
log-probs; None when no KL term needs them). Today all three are the actor's workers (rollout engine and
reference model colocated in them); generation placed on other devices, or a reference that is the actor with its
adapters disabled, changes what these return, not the step.

Every call on a group goes through a typed client (:class:`ActorGroup`, :class:`CriticGroup`, :class:`PRMGroup`);
each method says how its batch is split over ranks (:class:`trainer.placement.WorkerGroup`'s dispatch modes).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from trainer.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["Role", "Roles", "GroupClient", "ActorGroup", "CriticGroup", "PRMGroup", "actor_role"]


class GroupClient:
    """Typed calls on one worker group (a :class:`trainer.placement.WorkerGroup` or any object with its dispatch
    methods): set-up, checkpoints and teardown, shared by every role."""

    def __init__(self, wg):
        self.wg = wg

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks (a batch is split into this many equal chunks)."""
        return self.wg.dp_size

    @property
    def sp_size(self) -> int:
        """Ranks that receive the same rows (Ulysses sequence-parallel or tensor-parallel peers)."""
        return self.wg.sp_size

    def init_model(self) -> list[dict]:
        """Build the models on every rank; returns each rank's info (``num_params``, ...)."""
        return self.wg.run_all("init_model")

    def save_checkpoint(self, role_dir: str) -> None:
        self.wg.run_all("save_checkpoint", role_dir)

    def load_checkpoint(self, role_dir: str) -> None:
        self.wg.run_all("load_checkpoint", role_dir)

    def shutdown(self) -> None:
        self.wg.shutdown()


class ActorGroup(GroupClient):
    """The actor workers (:class:`trainer.workers.actor.ActorRolloutRefWorker`): policy, rollout engine, reference."""

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``rollout.n`` responses per prompt; rows split over every rank (generation is not sequence-parallel).
        ``prompts``: left-padded ``input_ids`` / ``attention_mask`` (B, P), a row count divisible by the world."""
        return self.wg.dispatch_all("generate_sequences", prompts)

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (B, R) f32 of the current policy."""
        return self.wg.dispatch_dp("compute_log_prob", batch)

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) f32 of the frozen reference model."""
        return self.wg.dispatch_dp("compute_ref_log_prob", batch)

    def update_actor(self, batch: DataProto) -> list[dict]:
        """One PPO-family update; returns every rank's ``{metric: [values]}``."""
        return self.wg.dispatch_dp_metrics("update_actor", batch)

    def export_hf(self, out_dir: str) -> None:
        """The trained policy as a Hugging Face folder (every rank takes part)."""
        self.wg.run_all("export_hf", out_dir)


class CriticGroup(GroupClient):
    """The critic workers (:class:`trainer.workers.critic.CriticWorker`)."""

    def compute_values(self, batch: DataProto) -> DataProto:
        """``values`` (B, R) f32."""
        return self.wg.dispatch_dp("compute_values", batch)

    def update_critic(self, batch: DataProto) -> list[dict]:
        """One value-loss update; returns every rank's ``{metric: [values]}``."""
        return self.wg.dispatch_dp_metrics("update_critic", batch)


class PRMGroup(GroupClient):
    """PRIME's implicit PRM workers (:class:`trainer.workers.prm.PRMWorker`)."""

    def compute_rm_scores(self, batch: DataProto) -> DataProto:
        """``rm_scores`` (B, R) f32, the implicit token rewards."""
        return self.wg.dispatch_dp("compute_rm_scores", batch)

    def update_rm(self, batch: DataProto) -> tuple[DataProto, list[dict]]:
        """One pass of the PRM loss; returns the ``rm_scores`` of the training forwards (every row, in order) and
        every rank's ``{metric: [values]}``."""
        outs = self.wg.dispatch_dp_metrics("update_rm", batch)
        sp, dp = self.wg.sp_size, self.wg.dp_size
        return DataProto.concat([outs[d * sp] for d in range(dp)]), [o.meta["metrics"] for o in outs]


@dataclass(frozen=True)
class Role:
    """One worker group of the run.

    Attributes:
        name: the group's name in logs and errors (``actor``, ``critic``, ``prm``).
        worker: returns the worker class (imported when the group is created).
        client: the typed client class of its calls.
        sp_size: ranks per data-parallel rank that receive the same rows (Ulysses SP, or TP on Megatron).
        ckpt_dir: its folder inside a ``global_step_N`` checkpoint; None: it saves nothing.
        missing_hint: when set, loading a checkpoint without ``ckpt_dir`` raises FileNotFoundError with this
            reason (a role that older checkpoints may lack).
    """

    name: str
    worker: Callable[[], type]
    client: type[GroupClient]
    sp_size: int = 1
    ckpt_dir: str | None = None
    missing_hint: str = ""


class Roles:
    """The run's roles in start-up order, and their worker groups once :meth:`start` created them.

    Args:
        specs: the roles, the actor first.
        ref_from_actor: the reference log-probs come from the actor's workers (a KL term needs them).
    """

    def __init__(self, specs: list[Role], ref_from_actor: bool = False):
        names = [r.name for r in specs]
        if not names or names[0] != "actor" or len(set(names)) != len(names):
            raise ValueError(f"roles {names}: expected the actor first and each role once")
        self.specs, self.ref_from_actor = list(specs), bool(ref_from_actor)
        self.groups: dict[str, GroupClient] = {}

    # ---- the groups ---------------------------------------------------------------------------------------------
    def attach(self, name: str, worker_group) -> GroupClient:
        """Use ``worker_group`` (a WorkerGroup, or an object with its dispatch methods) for the role ``name``."""
        spec = self._spec(name)
        self.groups[name] = spec.client(worker_group)
        return self.groups[name]

    def get(self, name: str) -> GroupClient | None:
        """The client of role ``name``, or None when the run has no such role (or it is not started)."""
        return self.groups.get(name)

    def has(self, name: str) -> bool:
        """The run has the role ``name``."""
        return any(r.name == name for r in self.specs)

    @property
    def actor(self) -> ActorGroup:
        """The trained policy."""
        return self.groups["actor"]

    @property
    def rollout(self) -> ActorGroup:
        """The group that generates responses (the actor's workers, engine colocated with sleep/wake)."""
        return self.groups["actor"]

    @property
    def ref(self) -> ActorGroup | None:
        """The group that computes reference log-probs, or None when the run needs none."""
        return self.groups["actor"] if self.ref_from_actor else None

    # ---- start-up, checkpoints, teardown ----------------------------------------------------------------------
    def start(self, pg, world: int, config: Any, device: str, cpus_per_worker: int) -> dict[str, list[dict]]:
        """Create every role's worker group on the placement group ``pg`` (the roles split each bundle: ``1/len``
        of its CPUs and GPU each), then build their models; returns ``{role: [per-rank init info]}``."""
        from trainer.placement import WorkerGroup

        share = 1.0 / len(self.specs)
        for r in self.specs:
            self.attach(r.name, WorkerGroup(r.worker(), r.name, pg, world, config, device, cpus_per_worker,
                                            share=share, sp_size=r.sp_size))
        return {r.name: self.groups[r.name].init_model() for r in self.specs}

    def save(self, step_dir: str) -> None:
        """Every role with a checkpoint folder saves into ``step_dir/<ckpt_dir>``."""
        for r in self.specs:
            if r.ckpt_dir is not None:
                self.groups[r.name].save_checkpoint(os.path.join(step_dir, r.ckpt_dir))

    def load(self, step_dir: str) -> None:
        """Every role with a checkpoint folder loads from ``step_dir/<ckpt_dir>``.

        Raises:
            FileNotFoundError: a role with a ``missing_hint`` finds no folder (naming the checkpoint and why).
        """
        for r in self.specs:
            if r.ckpt_dir is None:
                continue
            path = os.path.join(step_dir, r.ckpt_dir)
            if r.missing_hint and not os.path.isdir(path):
                raise FileNotFoundError(f"checkpoint {step_dir} has no {r.missing_hint}")
            self.groups[r.name].load_checkpoint(path)

    def shutdown(self) -> None:
        """Kill every role's workers (started or attached)."""
        for client in self.groups.values():
            client.shutdown()
        self.groups.clear()

    def _spec(self, name: str) -> Role:
        for r in self.specs:
            if r.name == name:
                return r
        raise KeyError(f"no role {name!r}; the run's roles: {[r.name for r in self.specs]}")


def _actor_worker(strategy: str) -> Callable[[], type]:
    def load() -> type:
        if strategy == "megatron":
            from trainer.workers.megatron_actor import MegatronActorRefWorker

            return MegatronActorRefWorker
        from trainer.workers.actor import ActorRolloutRefWorker

        return ActorRolloutRefWorker
    return load


def actor_role(config) -> Role:
    """The actor's :class:`Role` (policy + rollout engine + reference; checkpoint folder ``actor/``).

    ``trainer.strategy=megatron`` uses the Megatron worker, whose tensor-parallel peers of a data-parallel rank
    receive the same rows; the DeepSpeed worker's Ulysses peers do."""
    strategy = config["trainer"].get("strategy", "deepspeed")
    actor = config["actor_rollout_ref"]["actor"]
    sp = int(actor["ulysses_sequence_parallel_size"])
    if strategy == "megatron":
        sp = int(actor["megatron"]["tensor_model_parallel_size"])
    return Role("actor", _actor_worker(strategy), ActorGroup, sp_size=sp, ckpt_dir="actor")
