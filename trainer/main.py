"""Entry point: ``python trainer/main.py [overrides]`` or ``deepspeed --launcher ray trainer/main.py [overrides]``.

Run directly, this process is the Ray driver. Under DeepSpeed's launcher on one node (which ignores
``--launcher`` and starts one process per GPU), local rank 0 becomes the driver and the other ranks exit 0 at
once, before importing torch; the ``--local_rank=N`` argument the launcher appends is removed before Hydra
parses. ``RAY_ADDRESS`` joins an existing Ray cluster (multi-node runs use a Ray cluster).

Run as a command (``__main__``), nothing this process starts outside Ray's management outlives it
(:mod:`trainer.leftovers`); imported as ``trainer.main`` (a test, a program of one's own) it leaves its caller's
processes alone.
"""
from __future__ import annotations

import os
import signal
import sys


def _strip_launcher_args(argv: list[str]) -> list[str]:
    """Remove ``--local_rank=N`` / ``--local_rank N`` (DeepSpeed's launcher) and record it in LOCAL_RANK."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.startswith("--local_rank="):
            os.environ.setdefault("LOCAL_RANK", a.split("=", 1)[1])
            continue
        if a == "--local_rank" and i + 1 < len(argv):
            os.environ.setdefault("LOCAL_RANK", argv[i + 1])
            skip = True
            continue
        out.append(a)
    return out


sys.argv = _strip_launcher_args(sys.argv)
if os.environ.get("LOCAL_RANK", "0") != "0":
    # a secondary process of `deepspeed` on one node: the Ray driver on local rank 0 does the work
    sys.exit(0)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `python trainer/main.py` puts trainer/ first on sys.path, where trainer/megatron would shadow megatron-core
sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != os.path.join(_ROOT, "trainer")]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

if __name__ == "__main__":
    from trainer.leftovers import adopt_descendants

    adopt_descendants()  # what this process starts stays below it and is killed at its exit, however it ends
    from trainer.interrupt import install_handlers

    install_handlers(held=True)  # Ctrl-C / SIGTERM / SIGHUP from here on are recorded; they stop the run in the try below

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


# a worker process that died (trainer.max_restarts used up) and a diverged run: one line, not the driver's traceback
RUN_FAILURES = ("WorkerDied", "TrainingDiverged")
USER_ERRORS = ("ConfigError", "ConfigErrors", "DataError", "PlacementError", "FileNotFoundError", "ScorerError")


def report_user_error(exc: BaseException) -> None:
    """Print a user error as ``error: <line>`` lines on stderr (a :class:`ConfigErrors` holds one per line)."""
    for line in str(exc).splitlines() or [""]:
        print(f"error: {line}", file=sys.stderr)


@hydra.main(config_path="../configs", config_name="ppo_trainer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from trainer.interrupt import (as_interrupt, exit_interrupted, interrupted_by, own_checkpoints, quiet_exit,
                                   shutdown_ray, stop_requested)
    from trainer.config_types import all_errors, check_run_config
    from trainer.launch import prestart, run

    logged = False  # whether run() logged the config's warnings and notes (all_errors does not log them again)
    t = cfg.trainer  # the folder's checkpoints are this run's unless it starts afresh (then once set aside)
    own_checkpoints(None if str(t.get("resume_mode")) == "disable" else t.get("default_local_dir"))
    try:
        check_run_config(cfg)  # mistyped values (all_errors below adds every other error of the config)
        logged = True  # run() logs them first
        last = run(cfg)
        shutdown_ray()  # no Ray process of this run outlives it
        if last.get("_stopped_by_sigterm"):  # the step finished and the work was kept, but the run did not end
            sys.exit(128 + (stop_requested() or (signal.SIGTERM,))[0])  # 143 SIGTERM, 129 SIGHUP
        quiet_exit()  # a complete run: a signal during the rest of the exit leaves the exit code 0
    except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM: one line, exit 130 / 143 (trainer/interrupt.py)
        exc = as_interrupt(exc)
        exit_interrupted(exc.signum, exc.step)
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:  # Ray's own driver handler (sys.exit(15)), were it ever in force: SIGTERM
            exit_interrupted(signal.SIGTERM, None)
        raise
    except Exception as exc:
        if interrupted_by() is not None:  # a worker died of the same Ctrl-C before the driver's handler ran
            exit_interrupted(interrupted_by(), None)
        if stop_requested() is not None:  # SIGTERM asked the loop to stop; the workers died of the same signal
            signum, step = stop_requested()
            exit_interrupted(signum, step)
        if type(exc).__name__ in USER_ERRORS:  # a user error ends the run with one line naming the bad value
            report_user_error(all_errors(cfg, exc, prestart, logged))  # a config error: with every other one
            sys.exit(2)
        if type(exc).__name__ in RUN_FAILURES:  # a worker process died, or training diverged: one line, exit 1
            shutdown_ray()
            report_run_failure(exc)
            sys.exit(1)
        raise


def report_run_failure(exc: BaseException) -> None:
    """One ``error:`` line on stderr for a :data:`RUN_FAILURES` exception: its first line (a dead worker's carries
    Ray's report of the death after it) and, unless it names one already, the last checkpoint the run can resume
    from (``trainer.resume_mode=auto``)."""
    from trainer.interrupt import last_checkpoint

    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(" :.")
    if "last checkpoint:" not in line.lower():  # not "save_checkpoint: ...", a call named by a dead worker
        line += f"; last checkpoint: {last_checkpoint()}"
    print(f"error: {line}", file=sys.stderr, flush=True)


def check_command_line(args: list[str]) -> list[str]:
    """The overrides for Hydra (:func:`trainer.overrides.prepare_overrides`). When the command line has errors,
    the config composed from its valid part is checked too (verl keys, validate, preflight), every error is
    printed and the process exits 2, before Hydra runs."""
    from trainer.overrides import prepare_overrides

    prepared = prepare_overrides(args)
    if not prepared.errors:
        _check_output_dir_before_hydra(prepared.overrides)
        return prepared.overrides
    from trainer.config_checks import ConfigError, ErrorCollector

    errors = ErrorCollector(prepared.errors)
    keys = [o for o in prepared.overrides if "=" in o and not o.startswith("-") and
            not o.lstrip("+~").startswith("hydra.")]
    groups = [o for o in keys if "." not in o.split("=", 1)[0] and not o.startswith(("+", "~"))]
    try:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from trainer.config_types import start_errors
        from trainer.launch import prestart

        with initialize_config_dir(config_dir=os.path.join(_ROOT, "configs"), version_base="1.3"):
            cfg = compose(config_name="ppo_trainer", overrides=keys)
            defaults = OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=groups), resolve=False)
        for line in start_errors(cfg, defaults, prestart):
            errors.add(line)
    except Exception:  # noqa: BLE001 (what does not compose is already among the command line's errors)
        pass
    report_user_error(ConfigError("\n".join(errors.messages)))
    sys.exit(2)


def _check_output_dir_before_hydra(overrides: list[str]) -> None:
    """Hydra creates its run folder (``hydra.run.dir``: ``trainer.output_dir``) before the run's own checks: a
    ``trainer.output_dir=`` given on the command line that cannot be a folder (a file, a path under a file,
    ``/proc/x``) is refused here in one line (exit 2) instead of Hydra's traceback."""
    from trainer.config_checks import ConfigError
    from trainer.config_preflight import check_writable_folder

    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "trainer.output_dir" and value and "${" not in value:
            try:
                check_writable_folder(key, os.path.expanduser(value.strip("'\"")),
                                      "the run's metrics and exports")
            except ConfigError as exc:
                report_user_error(exc)
                sys.exit(2)


if __name__ == "__main__":
    from trainer.interrupt import as_interrupt, exit_interrupted, release

    try:
        release()  # a signal that came during the imports above stops the run here
        sys.argv = [sys.argv[0], *check_command_line(sys.argv[1:])]
        main()
    except KeyboardInterrupt as exc:  # before the run started
        exit_interrupted(as_interrupt(exc).signum, None)
