"""What ``trainer.single_process=true`` (:mod:`trainer.local_workers`) cannot run, refused before start-up, and
what it leaves without effect, warned about."""
from __future__ import annotations

import os

__all__ = ["single_process_problems", "single_process_problem", "check_single_process", "single_process_warnings"]


def single_process_problems(cfg: dict) -> list[str]:
    """Why ``trainer.single_process=true`` cannot run the resolved config ``cfg``: one line per setting it cannot run
    (naming it and what to change); empty when it can, or when the key is false."""
    t = cfg["trainer"]
    if not t.get("single_process"):
        return []
    key, out = "trainer.single_process=true", []
    workers = int(t["nnodes"]) * int(t["n_gpus_per_node"])
    if workers != 1:
        out.append(f"{key} runs one worker in this process; trainer.nnodes={t['nnodes']} x "
                   f"trainer.n_gpus_per_node={t['n_gpus_per_node']} asks for {workers}: set both to 1, or "
                   "trainer.single_process=false")
    if t.get("strategy", "deepspeed") != "deepspeed":
        out.append(f"{key} runs the DeepSpeed worker; trainer.strategy={t['strategy']}: set "
                   "trainer.single_process=false")
    if t.get("rollout_placement", "colocated") != "colocated":
        out.append(f"{key} runs the actor's worker alone; trainer.rollout_placement={t['rollout_placement']} needs "
                   "rollout workers of their own: set trainer.single_process=false")
    from trainer.run_roles import trained_roles

    others = {"critic": "a critic (critic.enable, or algorithm.adv_estimator=gae)",
              "reward_model.model": "PRIME's reward model (algorithm.use_prime=true)"}
    out += [f"{key} runs the actor's worker alone; this run also trains {others[role]}: set "
            "trainer.single_process=false" for role, _ in trained_roles(cfg) if role in others]
    if int(t.get("max_restarts") or 0) > 0:
        out.append(f"{key} has no worker process to re-create; trainer.max_restarts={t['max_restarts']}: set it to "
                   "0, or trainer.single_process=false")
    return out


def single_process_problem(cfg: dict) -> str | None:
    """The first of :func:`single_process_problems`, or None."""
    problems = single_process_problems(cfg)
    return problems[0] if problems else None


def check_single_process(cfg: dict) -> None:
    """:func:`single_process_problems` as a check (:func:`trainer.config_validate.validate`).

    Raises:
        ConfigError: one line per setting that single-process mode cannot run (:class:`ConfigErrors` for several).
    """
    from trainer.config_checks import ConfigError, ConfigErrors

    problems = single_process_problems(cfg)
    if len(problems) > 1:
        raise ConfigErrors(problems)
    if problems:
        raise ConfigError(problems[0])


def single_process_warnings(cfg: dict) -> list[str]:
    """Warnings for what ``trainer.single_process=true`` leaves without effect: a ``trainer.ray_timeout_s`` bound set
    away from its default (the calls run in this process, unbounded) and ``RAY_ADDRESS`` (no Ray cluster is
    joined)."""
    from trainer.unused_settings import set_by_user

    t = cfg["trainer"]
    if not t.get("single_process"):
        return []
    out = []
    timeout = t.get("ray_timeout_s")
    if timeout and set_by_user(cfg, "trainer.ray_timeout_s", timeout):  # null / 0: no bound, as in one process
        out.append(f"trainer.ray_timeout_s={timeout}: no effect with trainer.single_process=true (the worker's calls "
                   "run in this process, without a time bound)")
    if os.environ.get("RAY_ADDRESS"):
        out.append(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}: not used with trainer.single_process=true (the worker "
                   "runs in this process; no Ray cluster is joined)")
    return out
