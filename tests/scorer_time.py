"""The CPU time of one scorer call, for the tests that bound it."""
import gc
import time


def scorer_cpu_ms(scorer, *args, **kwargs):
    """``(scorer(*args, **kwargs), CPU milliseconds of the call)``. CPU time: the scorer's own cost, whatever else
    shares the cores. The objects the test process already holds (torch and the trainer, imported by other test
    modules) are frozen out of the garbage collector's passes during the call, so that a full collection over them
    is not counted as the scorer's."""
    gc.freeze()
    try:
        t0 = time.process_time()
        result = scorer(*args, **kwargs)
        return result, (time.process_time() - t0) * 1e3
    finally:
        gc.unfreeze()
