"""The run's roles: which worker groups exist, what each is for, and the typed calls the controller makes on them.

A :class:`Role` names one worker group (its worker class, how many Ulysses/TP peers share a data-parallel rank,
its checkpoint folder); :class:`Roles` holds the run's list and loops over it at start-up, checkpoint save and
load, and teardown (``trainer.recovery`` re-creates the groups through it). The trainer always has the actor;
the algorithm's hooks add theirs (the critic, PRIME's PRM; :mod:`trainer.hooks`).

Three uses of the policy have their own names, so that each can move without the step changing:
:attr:`Roles.actor` (the trained policy), :attr:`Roles.rollout` (generation) and :attr:`Roles.ref` (reference
log-probs; None when no KL term needs them). All three are the actor's workers (rollout engine and reference model
colocated in them), except with ``trainer.rollout_placement=separate``, where :attr:`Roles.rollout` is the rollout
role's own workers (:class:`RolloutGroup`, :func:`rollout_role`); the step is the same either way.

Every call on a group goes through a typed client (:class:`ActorGroup`, :class:`CriticGroup`, :class:`PRMGroup`);
each method says how its batch is split over ranks (:class:`trainer.placement.WorkerGroup`'s dispatch modes).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from trainer.checkpoint.finite import one_line_errors
from trainer.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["Role", "Roles", "GroupClient", "ActorGroup", "CriticGroup", "PRMGroup", "RolloutGroup", "actor_role",
           "rollout_role", "columns", "FORWARD_COLUMNS", "UPDATE_COLUMNS"]


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
        """Every rank loads ``role_dir``; a damaged one (non-finite state) is a one-line ConfigError."""
        with one_line_errors():
            self.wg.run_all("load_checkpoint", role_dir)

    def check_finite_state(self, step_dir: str) -> None:
        """Before saving ``step_dir``: a state that is not finite on any rank is a one-line TrainingDiverged."""
        with one_line_errors():
            self.wg.run_all("check_finite_state", step_dir)

    def shutdown(self) -> None:
        self.wg.shutdown()


#: the columns the actor's log-prob forwards read (:func:`trainer.workers.model_utils.forward_micro`), and the
#: non-tensor column they may read; the rest of the step's batch is not sent to the workers
FORWARD_COLUMNS = ("input_ids", "attention_mask", "position_ids", "responses")
FORWARD_NON_TENSOR = ("multi_modal_inputs",)
#: the columns the actor update may read besides (:func:`trainer.workers.update.ppo_update`, ``_actor_loss``)
UPDATE_COLUMNS = FORWARD_COLUMNS + ("response_mask", "advantages", "old_log_probs", "ref_log_prob",
                                    "rollout_is_weights", "rollout_log_probs")


def columns(batch: DataProto, tensor_keys, non_tensor_keys=FORWARD_NON_TENSOR) -> DataProto:
    """The columns of ``batch`` among ``tensor_keys`` / ``non_tensor_keys`` (those present), with its ``meta``: what a
    worker call ships through Ray instead of the whole batch (prompts, scores, rewards, the dataset's non-tensor
    columns stay in the driver)."""
    return batch.select([k for k in tensor_keys if k in batch.tensor_keys()],
                        [k for k in non_tensor_keys if k in batch.non_tensor])


class ActorGroup(GroupClient):
    """The actor workers (:class:`trainer.workers.actor.ActorRolloutRefWorker`): policy, rollout engine, reference.
    The log-prob and update calls ship only the columns the workers read (:func:`columns`)."""

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``rollout.n`` responses per prompt; rows split over every rank (generation is not sequence-parallel).
        ``prompts``: left-padded ``input_ids`` / ``attention_mask`` (B, P), a row count divisible by the world."""
        return self.wg.dispatch_all("generate_sequences", prompts)

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` (B, R) f32 of the current policy."""
        return self.wg.dispatch_dp("compute_log_prob", columns(batch, FORWARD_COLUMNS))

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) f32 of the frozen reference model."""
        return self.wg.dispatch_dp("compute_ref_log_prob", columns(batch, FORWARD_COLUMNS))

    def update_actor(self, batch: DataProto) -> list[dict]:
        """One PPO-family update; returns every rank's ``{metric: [values]}``."""
        return self.wg.dispatch_dp_metrics("update_actor", columns(batch, UPDATE_COLUMNS))

    def export_hf(self, out_dir: str) -> None:
        """The trained policy as a Hugging Face folder (every rank takes part)."""
        self.wg.run_all("export_hf", out_dir)

    # ---- weight pushes to separate rollout workers (trainer.async_rollout.WeightPush)
    def weight_sync_address(self) -> tuple[str, int]:
        """Rank 0's ``(host, free port)`` for the weight group's rendezvous."""
        return tuple(self.wg.run_all("weight_sync_address")[0])

    def weights_layout(self) -> list:
        """Rank 0's bucket layout of the weights it pushes (names, shapes, dtypes per bucket)."""
        return self.wg.run_all("weights_layout")[0]

    def start_weight_sync(self, addr: str, port: int, world: int, backend: str, timeout_s: float):
        """Join the weight group as its rank 0, without waiting (a :class:`trainer.placement.PendingCall`)."""
        return self.wg.start_all("init_weight_sync", addr, port, world, backend, timeout_s)

    def start_push(self):
        """Broadcast the current weights, without waiting; the result is every rank's ``{"seconds", "bytes"}``."""
        return self.wg.start_all("push_weights")


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
        """One PRM loss pass: the training forwards' ``rm_scores`` (all rows, in order), every rank's metrics."""
        outs = self.wg.dispatch_dp_metrics("update_rm", batch)
        sp, dp = self.wg.sp_size, self.wg.dp_size
        return DataProto.concat([outs[d * sp] for d in range(dp)]), [o.meta["metrics"] for o in outs]


class RolloutGroup(GroupClient):
    """The rollout workers of ``trainer.rollout_placement=separate`` (:class:`trainer.workers.rollout.
    RolloutWorker`), fed by the actor's weight pushes (:class:`trainer.async_rollout.WeightPush`).

    Attributes:
        version_for: ``prompts -> weights version`` for calls whose prompts name none (``meta["weights_version"]``):
            validation, ReMax's greedy baselines; set by :class:`trainer.async_rollout.OffPolicyPipeline`.
    """

    version_for: Callable[[DataProto], int] | None = None

    def submit(self, prompts: DataProto):
        """Start generating ``prompts`` (any row count: padded up to a multiple of the workers and cut back) and
        return a handle whose ``result()`` waits for the rows (:class:`trainer.placement.PendingCall`)."""
        from trainer.dataset import pad_rows_to_multiple

        if "weights_version" not in prompts.meta:
            prompts.meta["weights_version"] = int(self.version_for(prompts))
        padded, pad = pad_rows_to_multiple(prompts, self.wg.world_size)
        pending = self.wg.submit_all("generate_sequences", padded)
        return _CutRows(pending, len(prompts), len(padded)) if pad else pending

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """:meth:`submit` and wait: the rows of :meth:`ActorGroup.generate_sequences`."""
        return self.submit(prompts).result()

    def held_versions(self) -> list[int]:
        """The weight versions rank 0 holds."""
        return self.wg.run_all("held_versions")[0]

    def release_below(self, version: int) -> None:
        """Drop the weight versions older than ``version`` on every rank."""
        self.wg.run_all("release_below", int(version))

    def start_weight_sync(self, addr: str, port: int, world: int, backend: str, timeout_s: float, layout: list):
        """Join the actor's weight group (ranks 1..), without waiting."""
        return self.wg.start_all("init_weight_sync", addr, port, world, backend, timeout_s, layout)

    def start_receive(self, version: int, keep_from: int):
        """Receive the next push as ``version`` and drop versions older than ``keep_from``, without waiting."""
        return self.wg.start_all("receive_weights", int(version), int(keep_from))


class _CutRows:
    """A pending generation of prompts padded from ``prompts`` to ``padded`` rows: the result keeps the responses
    of the first ``prompts`` (their samples come first, prompt-major)."""

    def __init__(self, pending, prompts: int, padded: int):
        self.pending, self.prompts, self.padded = pending, prompts, padded

    def done(self) -> bool:
        return self.pending.done()

    def result(self) -> DataProto:
        rows = self.pending.result()
        return rows.index(slice(0, self.prompts * (len(rows) // self.padded)))


@dataclass(frozen=True)
class Role:
    """One worker group of the run.

    Attributes:
        name: the group's name in logs and errors (``actor``, ``critic``, ``prm``).
        worker: returns the worker class (imported when the group is created).
        client: the typed client class of its calls.
        worker_config: ``run config -> what each of its workers receives`` (a frozen dataclass of
            :mod:`trainer.config.workers`, built when the group starts; no worker receives the whole config).
        sp_size: ranks per data-parallel rank that receive the same rows (Ulysses SP, or TP on Megatron).
        ckpt_dir: its folder inside a ``global_step_N`` checkpoint; None: it saves nothing.
        missing_hint: set: loading a checkpoint without ``ckpt_dir`` is a FileNotFoundError giving this reason.
        world: its workers; None: the run's world (one per bundle of the shared roles).
        share: the share of its bundle each of its workers takes; None: a role sharing the run's bundles with
            the other such roles (each takes an equal part of what roles with a ``share`` leave there).
        bundle_offset: its rank ``r`` runs on bundle ``bundle_offset + r``.
    """

    name: str
    worker: Callable[[], type]
    client: type[GroupClient]
    worker_config: Callable[[dict], Any]
    sp_size: int = 1
    ckpt_dir: str | None = None
    missing_hint: str = ""
    world: int | None = None
    share: float | None = None
    bundle_offset: int = 0


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
        self.startup_s: dict[str, float] = {}  # seconds of each part of the last start (trainer.placement.init_models)
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
    def rollout(self) -> ActorGroup | RolloutGroup:
        """The group that generates responses: the rollout role's workers when the run has one
        (``trainer.rollout_placement=separate``), else the actor's (engine colocated with sleep/wake)."""
        return self.groups.get("rollout") or self.groups["actor"]

    @property
    def ref(self) -> ActorGroup | None:
        """The group that computes reference log-probs, or None when the run needs none."""
        return self.groups["actor"] if self.ref_from_actor else None

    # ---- start-up, checkpoints, teardown ----------------------------------------------------------------------
    def start(self, pg, world: int, config: Any, device: str, cpus_per_worker: int) -> dict[str, list[dict]]:
        """Create every role's worker group on the placement group ``pg``, then build their models; returns
        ``{role: [per-rank init info]}``. The roles without a ``share`` split each of the first ``world`` bundles
        equally (``1/len`` of its CPUs and GPU each), after the shares of the roles with one placed there."""
        from trainer.placement import WorkerGroup, init_models

        shared = [r for r in self.specs if r.share is None]
        reserved = sum(r.share for r in self.specs if r.share is not None and r.bundle_offset < world)
        share = (1.0 - reserved) / max(1, len(shared))
        timeout_s = float(config["trainer"]["ray_timeout_s"] or 0) or None  # every call of a group; 0/null: none
        t0, groups = time.perf_counter(), []  # every role's processes start side by side (a failed start stops all)
        for r in self.specs:
            groups.append(WorkerGroup(r.worker(), r.name, pg, r.world or world, r.worker_config(config), device,
                                      cpus_per_worker, share=share if r.share is None else r.share, sp_size=r.sp_size,
                                      bundle_offset=r.bundle_offset, timeout_s=timeout_s, wait=False))
            self.attach(r.name, groups[-1])
        for g in groups:
            g.wait_started()
        infos, self.startup_s = init_models([(r.name, self.groups[r.name]) for r in self.specs], t0)
        return infos

    def save(self, step_dir: str) -> None:
        """Every role with a checkpoint folder saves into ``step_dir/<ckpt_dir>``, once every role's state is seen
        finite on every rank (:mod:`trainer.checkpoint.finite`: else nothing of the step is written)."""
        saving = [r for r in self.specs if r.ckpt_dir is not None]
        for r in saving:
            self.groups[r.name].check_finite_state(step_dir)
        for r in saving:
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
    from trainer.config.trainer import run_strategy
    from trainer.config.workers import actor_worker_config

    strategy = run_strategy(config)
    actor = config["actor_rollout_ref"]["actor"]
    sp = int(actor["ulysses_sequence_parallel_size"])
    if strategy == "megatron":
        sp = int(actor["megatron"]["tensor_model_parallel_size"])
    return Role("actor", _actor_worker(strategy), ActorGroup, sp_size=sp, ckpt_dir="actor",
                worker_config=actor_worker_config)


def _rollout_worker() -> type:
    from trainer.workers.rollout import RolloutWorker

    return RolloutWorker


def rollout_role(config, world: int) -> Role | None:
    """The rollout workers' :class:`Role` with ``trainer.rollout_placement=separate`` (checkpoint folder
    ``rollout/``: the weight versions the batches in flight were generated with), else None.

    ``actor_rollout_ref.rollout.n_gpus`` = N >= 1: N workers on the bundles after the ``world`` of the other roles;
    0 < f < 1: one worker taking ``f`` of the first bundle (:class:`trainer.rollout_placement.RolloutPlacement`)."""
    from trainer.config.workers import rollout_worker_config
    from trainer.rollout_placement import RolloutPlacement

    rp = RolloutPlacement.from_config(config)
    if not rp.separate:
        return None
    return Role("rollout", _rollout_worker, RolloutGroup, ckpt_dir="rollout", world=rp.workers, share=rp.share,
                bundle_offset=world if rp.rollout_bundles else 0, worker_config=rollout_worker_config)
