"""Shutting Ray down at a run's end so that no process of it outlives the driver (:func:`stop_ray`; the driver of
``trainer/main.py`` calls it through :func:`trainer.interrupt.shutdown_ray`)."""
from __future__ import annotations

import os
import sys

__all__ = ["stop_ray"]


def _is_ray_process(cmdline: list[str]) -> bool:
    """A process of Ray's own (GCS, raylet, dashboard, monitors: a program under the ray package; workers: ``ray::``).
    Other children of the driver (wandb's service, which ends at the driver's exit) are left alone."""
    if not cmdline:
        return False
    return cmdline[0].startswith("ray::") or any(f"{os.sep}ray{os.sep}" in part for part in cmdline[:3])


def stop_ray(timeout_s: float = 15.0, driver: bool = False) -> None:
    """``ray.shutdown()``, then wait up to ``timeout_s`` for the Ray processes this driver started (a local Ray's
    GCS, raylet and worker processes, :func:`_is_ray_process`, and their descendants) to end; kill those still there.
    No-op when Ray is not initialized, except in the driver of ``trainer/main.py`` (``driver``) after a ``ray.init``
    that a second signal interrupted: the Ray processes it had started are stopped (SIGTERM, then SIGKILL)."""
    if "ray" not in sys.modules:
        return
    import ray

    node = getattr(sys.modules.get("ray._private.worker"), "_global_node", None)  # set before ray.init connects
    connected = ray.is_initialized() or node is not None
    if not connected and not driver:
        return
    import psutil  # shipped with Ray (ray/thirdparty_files)

    me = psutil.Process()
    started = []
    for p in me.children():
        try:  # Ray's processes and theirs; not the driver's forks (reward scoring) nor other libraries' helpers
            if _is_ray_process(p.cmdline()):
                started += [p, *p.children(recursive=True)]
        except psutil.Error:
            pass
    if connected:
        ray.shutdown()
    else:  # ray.init stopped half-way, before Ray knew of its node
        for p in started:
            try:
                p.terminate()
            except psutil.Error:
                pass
    _, alive = psutil.wait_procs(started, timeout=timeout_s if connected else min(timeout_s, 5.0))
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
