"""Fixtures shared by several test modules."""
import sys
import weakref

import pytest

_ENGINES: "weakref.WeakSet" = weakref.WeakSet()


@pytest.fixture(scope="module", autouse=True)
def _destroy_deepspeed_engines():
    """DeepSpeed engines that tests build in this process are destroyed when their module ends: ZeRO's gradient
    hooks keep an engine alive after its last reference (with its reduce bucket, 2 GB at the default size), and a
    process that has collected many can no longer fork (``OSError: [Errno 12]``)."""
    engine_mod = sys.modules.get("deepspeed.runtime.engine")
    if engine_mod is not None and not getattr(engine_mod.DeepSpeedEngine, "_tests_tracked", False):
        cls, init = engine_mod.DeepSpeedEngine, engine_mod.DeepSpeedEngine.__init__

        def tracked_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            _ENGINES.add(self)

        cls.__init__, cls._tests_tracked = tracked_init, True
    yield
    import torch.distributed as dist

    for engine in list(_ENGINES):
        _ENGINES.discard(engine)
        if dist.is_available() and dist.is_initialized():  # destroy() needs the process group the module made
            engine.destroy()


@pytest.fixture
def cuda_deepspeed_accelerator():
    """DeepSpeed's CUDA accelerator for one test, then the previous one back. CPU test modules set
    ``DS_ACCELERATOR=cpu`` when pytest imports them (collection), so in a whole-suite ``-m gpu`` run DeepSpeed would
    keep an engine's model on the CPU and its first broadcast fails (``No backend type associated with device type
    cpu``)."""
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    previous = get_accelerator()
    set_accelerator(CUDA_Accelerator())
    yield
    set_accelerator(previous)


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """A real run's output folder with the checkpoint of its step 1 (2 DeepSpeed ranks, ZeRO-2), made once per
    pytest process (each xdist worker) for every module that damages or resumes a copy of it
    (tests/test_reliability_checkpoint_files.py, tests/test_reliability_resume_settings.py). Nothing may change it:
    copy it first."""
    from tests.e2e_utils import SHORT
    from tests.test_reliability_config import run_cli

    out = str(tmp_path_factory.mktemp("ckpt") / "run")
    proc = run_cli(out, *[a for a in SHORT if "total_training_steps" not in a], "trainer.total_training_steps=1",
                   "trainer.save_freq=1", "trainer.export_hf_on_end=false", timeout=300, forked=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return out
