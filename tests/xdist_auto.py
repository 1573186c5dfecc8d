"""Run the default suite on pytest-xdist workers where pytest-xdist is installed (``-p tests.xdist_auto`` in
pytest.ini).

With pytest-xdist importable (the ``[test]`` extra installs it) and not disabled (``-p no:xdist``), the arguments
start with ``-n auto --dist loadfile``: ``auto`` is :func:`pytest_xdist_auto_num_workers`'s count, and ``loadfile``
keeps each file's tests in one worker (module fixtures, such as a shared end-to-end run, are made once). Arguments
given on the command line come after, so ``-n 0`` runs everything in one process and ``-n N`` starts N workers.
Without pytest-xdist (a GPU machine with only pytest installed) nothing is added and the suite runs in one process.
"""
import os
import re

import pytest

# At most this many workers for ``-n auto``. Each worker starts its own Ray instance for the end-to-end tests
# (tests/e2e_shared.py) and its runs start 2-3 more processes, so more workers than this would mostly wait on each
# other; the suite was measured with 2 workers on 2 cores.
MAX_WORKERS = 2
XDIST_ARGS = ["-n", "auto", "--dist", "loadfile"]


def _xdist_disabled(args: list[str]) -> bool:
    """Whether ``args`` hold ``-p no:xdist`` (or ``-pno:xdist``)."""
    for i, a in enumerate(args):
        value = args[i + 1] if a == "-p" and i + 1 < len(args) else a[2:] if a.startswith("-p") else None
        if value == "no:xdist":
            return True
    return False


def pytest_load_initial_conftests(early_config, parser, args):
    """Put :data:`XDIST_ARGS` before ``args`` (the ini's ``addopts`` and the command line, which pytest parses next)
    when pytest-xdist can be imported and is not disabled."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return
    if not _xdist_disabled(args):
        args[:0] = XDIST_ARGS


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own (all cores)
def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto``: ``min(MAX_WORKERS, CPU cores)``, and none (one process, as without xdist) on a
    single core or when ``-m`` selects the ``gpu`` or ``bench`` tests, which share the machine's GPUs and time
    whole scripts."""
    if re.search(r"(?<!not )\b(gpu|bench)\b", config.option.markexpr or ""):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(MAX_WORKERS, cores)
    return workers if workers > 1 else 0
