"""The driver's end-of-run Ray shutdown waits for and stops Ray's own processes only: a helper process another
library started beside them (wandb's service, which ends at the driver's exit and flushes the run there) is neither
waited for nor killed. Found by trying ``trainer.logger=[console,wandb]``: every run ended 15 s late and printed
wandb's ``ConnectionResetError`` traceback, its service killed under it."""
import subprocess
import sys
import time

import pytest

from trainer.interrupt import shutdown_ray

psutil = pytest.importorskip("psutil")


def test_wandb_style_helper_is_left_alone_while_ray_stops_at_once():
    import ray

    earlier = {p.pid for p in psutil.Process().children()}  # other tests' helpers of this pytest process
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        ray_procs = [p for p in psutil.Process().children() if p.pid != helper.pid and p.pid not in earlier]
        assert ray_procs
        start = time.monotonic()
        shutdown_ray(timeout_s=15.0)
        assert time.monotonic() - start < 10.0
        assert helper.poll() is None
        assert not [p for p in ray_procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        helper.kill()
        helper.wait()


def test_ray_processes_are_told_from_others():
    from trainer.interrupt import _is_ray_process

    assert _is_ray_process(["ray::ActorRolloutRefWorker.update_actor"])
    assert _is_ray_process(["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--x"])
    assert _is_ray_process(["/usr/bin/python", "-u", "/venv/lib/site-packages/ray/_private/log_monitor.py"])
    assert not _is_ray_process(["/venv/lib/python3.11/site-packages/wandb/bin/wandb-core", "--port-filename", "f"])
    assert not _is_ray_process([])
