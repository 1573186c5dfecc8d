"""Run the default suite on pytest-xdist workers where pytest-xdist is loaded (``-p tests.xdist_auto`` in
pytest.ini).

With the pytest-xdist plugin loaded (the ``[test]`` extra installs it; not with ``-p no:xdist`` or
``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` unless ``-p xdist`` is given), the arguments start with ``-n auto --dist
loadfile``: ``auto`` is :func:`pytest_xdist_auto_num_workers`'s count, and ``loadfile`` keeps each file's tests in
one worker (module fixtures, such as a shared end-to-end run, are made once). Arguments given on the command line
come after, so ``-n 0`` runs everything in one process and ``-n N`` starts N workers. Without pytest-xdist (a GPU
machine with only pytest installed) nothing is added and the suite runs in one process.
"""
import os

import pytest

# At most this many workers for ``-n auto``. Each worker starts its own Ray instance for the end-to-end tests
# (tests/e2e_shared.py) and its runs start 2-3 more processes, so more workers than this would mostly wait on each
# other; the suite was measured with 2 workers on 2 cores.
MAX_WORKERS = 2
XDIST_ARGS = ["-n", "auto", "--dist", "loadfile"]
# Markers whose tests run in one process: they share the machine's GPUs, or time whole scripts.
ONE_PROCESS_MARKERS = ("gpu", "bench")


def pytest_load_initial_conftests(early_config, parser, args):
    """Put :data:`XDIST_ARGS` before ``args`` (the ini's ``addopts`` and the command line, which pytest parses next)
    when the pytest-xdist plugin is loaded."""
    if early_config.pluginmanager.hasplugin("xdist"):
        args[:0] = XDIST_ARGS


def selects_one_process_tests(markexpr: str | None) -> bool:
    """Whether ``-m markexpr`` selects tests marked with one of :data:`ONE_PROCESS_MARKERS` (alone or with the
    ``slow`` marker); an empty or missing expression selects every test. An expression pytest cannot parse counts as
    selecting them (pytest reports it)."""
    if not markexpr:
        return True
    from _pytest.mark.expression import Expression

    try:
        expr = Expression.compile(markexpr)
    except Exception:  # noqa: BLE001 - pytest's own -m check reports a bad expression
        return True
    return any(expr.evaluate(lambda name, /, **kw: name in marks)
               for marker in ONE_PROCESS_MARKERS for marks in ({marker}, {marker, "slow"}))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own (all cores)
def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto``: ``PYTEST_XDIST_AUTO_NUM_WORKERS`` when set (xdist's own hook reads it); else none
    (one process, as without xdist) on a single core, when ``-m`` selects the ``gpu`` or ``bench`` tests
    (:func:`selects_one_process_tests`), or with ``--trace`` or ``-s`` (a debugger prompt or printed output needs
    the test in this process); else ``min(MAX_WORKERS, CPU cores)``."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    opt = config.option
    if (selects_one_process_tests(opt.markexpr) or getattr(opt, "trace", False)
            or getattr(opt, "capture", None) == "no"):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(MAX_WORKERS, cores)
    return workers if workers > 1 else 0
