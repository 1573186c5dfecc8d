"""Where generation runs and how far its weights may lag the actor's: ``trainer.rollout_placement``,
``actor_rollout_ref.rollout.n_gpus`` and ``trainer.async.*``, read and checked before any worker starts.

* ``colocated`` (the default): the rollout engine lives in the actor's workers, asleep while DeepSpeed trains;
  generation and the update take turns (``trainer.async.staleness`` must be 0).
* ``separate``: the engine runs in rollout workers of its own (:class:`trainer.workers.rollout.RolloutWorker`).
  ``rollout.n_gpus`` = N >= 1 (an integer) gives N workers, each on a bundle of its own (a GPU, or one more CPU
  process with ``trainer.device=cpu``); a fraction 0 < f < 1 gives one worker that shares the actor's first bundle,
  taking ``f`` of its GPU (or CPUs). The actor pushes its weights to them after each update
  (:mod:`trainer.workers.weight_sync`).

``trainer.async.staleness`` = s >= 1 (separate only) lets generation run ahead of the update
(:mod:`trainer.async_rollout`): the batch trained at step k was generated with the weights after step
``max(0, k - 1 - s)``, so the rollout of step k+1 runs while the actor trains on step k (s = 1: verl's
one-step-off-policy recipe). s = 0 is the on-policy loop (with ``separate``: generation on its own workers, one
step at a time).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from trainer.config_checks import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["PLACEMENTS", "RolloutPlacement", "check_rollout_placement", "resolve_async_defaults",
           "separate_placement_warnings"]

PLACEMENTS = ("colocated", "separate")
_N_GPUS = "actor_rollout_ref.rollout.n_gpus"


@dataclass(frozen=True)
class RolloutPlacement:
    """The run's rollout placement and staleness bound.

    Attributes:
        placement: ``colocated`` or ``separate``.
        n_gpus: rollout workers of their own (an integer >= 1), or the share 0 < f < 1 of the actor's first bundle
            that one rollout worker takes.
        staleness: s >= 0, how many updates the rollout weights may lag the trained policy.
        trace_file: a Chrome trace (``chrome://tracing``, Perfetto) of generation and update times, or None.
    """

    placement: str
    n_gpus: float
    staleness: int
    trace_file: str | None = None

    @classmethod
    def from_config(cls, cfg: dict) -> "RolloutPlacement":
        """Read the keys of the run config ``cfg`` (``configs/ppo_trainer.yaml`` holds their defaults).

        Raises:
            ConfigError: an unknown placement, a staleness that is not an integer >= 0, an ``n_gpus`` that is
                neither an integer >= 1 nor a fraction in (0, 1); the message names the key and the value.
        """
        t = cfg["trainer"]
        placement = t["rollout_placement"]
        if placement not in PLACEMENTS:
            raise ConfigError(f"trainer.rollout_placement={placement!r}; expected {' or '.join(PLACEMENTS)}")
        section = t["async"]
        s = section["staleness"]
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"trainer.async.staleness={s!r}; expected an integer >= 0 (0: on-policy)")
        n = cfg["actor_rollout_ref"]["rollout"]["n_gpus"]
        ok = not isinstance(n, bool) and isinstance(n, (int, float)) and math.isfinite(n) and (
            0 < n < 1 or (n >= 1 and float(n).is_integer()))
        if not ok:
            raise ConfigError(f"{_N_GPUS}={n!r}; expected an integer >= 1 (rollout workers with a GPU or CPU "
                              "process of their own) or a fraction in (0, 1) of the actor's first GPU")
        return cls(placement, float(n), int(s), section["trace_file"] or None)

    @property
    def separate(self) -> bool:
        return self.placement == "separate"

    @property
    def workers(self) -> int:
        """Rollout workers (separate placement)."""
        return 1 if self.n_gpus < 1 else int(self.n_gpus)

    @property
    def share(self) -> float:
        """The share of its bundle each rollout worker takes (1: a bundle of its own)."""
        return self.n_gpus if self.n_gpus < 1 else 1.0

    @property
    def rollout_bundles(self) -> int:
        """Bundles of the rollout workers' own, beside the other roles' (0 when colocated or sharing bundle 0)."""
        return self.workers if self.separate and self.n_gpus >= 1 else 0


def check_rollout_placement(cfg: dict) -> None:
    """The keys' values, always (so a typo shows while colocated), and what ``separate`` / ``staleness >= 1``
    cannot be combined with.

    Raises:
        ConfigError: one line naming the value and what is expected.
    """
    rp = RolloutPlacement.from_config(cfg)
    if rp.staleness and not rp.separate:
        raise ConfigError(f"trainer.async.staleness={rp.staleness} needs trainer.rollout_placement=separate: a "
                          "colocated engine sleeps while the actor trains, so generation cannot overlap the update "
                          "(set trainer.rollout_placement=separate, or trainer.async.staleness=0)")
    if not rp.separate:
        return
    from trainer.config.trainer import run_strategy

    arr = cfg["actor_rollout_ref"]
    rollout_tp = arr["rollout"]["tensor_model_parallel_size"]
    why = {
        "trainer.strategy=megatron": run_strategy(cfg) == "megatron",
        f"actor_rollout_ref.model.lora_rank={arr['model']['lora_rank']}": bool(arr["model"]["lora_rank"]),
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout_tp}": int(rollout_tp) != 1,
    }
    for setting, bad in why.items():
        if bad:
            raise ConfigError(f"trainer.rollout_placement=separate does not take {setting} (the weight push sends "
                              "a DeepSpeed actor's full weights to single-device engines); use "
                              "trainer.rollout_placement=colocated")
    if rp.staleness and cfg["algorithm"]["filter_groups"]["enable"]:
        raise ConfigError(f"trainer.async.staleness={rp.staleness} with algorithm.filter_groups.enable=true: "
                          "dynamic sampling draws more prompt batches during a step, which the pipelined rollout "
                          "has already run past; use trainer.async.staleness=0")


def separate_placement_warnings(cfg: dict) -> list[str]:
    """Warnings for the colocated engine's settings that ``separate`` placement leaves without effect (its engine
    never sleeps and the actor never generates): ``rollout.offload_optimizer_during_rollout=true`` and a
    ``rollout.sleep_level`` other than the default 1."""
    try:
        if not RolloutPlacement.from_config(cfg).separate:
            return []
    except ConfigError:
        return []
    rc, out = cfg["actor_rollout_ref"]["rollout"], []
    if rc["offload_optimizer_during_rollout"]:
        out.append("actor_rollout_ref.rollout.offload_optimizer_during_rollout=true: no effect with "
                   "trainer.rollout_placement=separate (the actor's workers never generate)")
    if int(rc["sleep_level"]) != 1:
        out.append(f"actor_rollout_ref.rollout.sleep_level={rc['sleep_level']}: no effect with "
                   "trainer.rollout_placement=separate (the rollout workers' engine never sleeps)")
    return out


def resolve_async_defaults(cfg: dict) -> None:
    """``algorithm.rollout_correction.rollout_is=auto`` becomes ``token`` (truncated importance sampling between
    the rollout's and the actor's log-probs) when ``trainer.async.staleness >= 1``, else null (off). In place;
    values the checks refuse are left for :func:`check_rollout_placement` to report."""
    section = cfg["algorithm"]["rollout_correction"]
    if section["rollout_is"] != "auto":
        return
    try:
        stale = RolloutPlacement.from_config(cfg).staleness > 0
    except ConfigError:
        stale = False
    section["rollout_is"] = "token" if stale else None
    if stale:
        logger.info("trainer.async.staleness >= 1: algorithm.rollout_correction.rollout_is=token (truncated "
                    "importance sampling, C=%s)", section["rollout_is_threshold"])
