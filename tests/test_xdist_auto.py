"""How many pytest-xdist workers run the suite (tests/xdist_auto.py)."""
import types

import pytest

from tests import xdist_auto


def _config(markexpr):
    return types.SimpleNamespace(option=types.SimpleNamespace(markexpr=markexpr))


@pytest.mark.parametrize("markexpr,cores,workers", [
    ("not gpu and not bench", 2, 2), ("not gpu and not bench", 16, 2), ("not gpu and not bench", 1, 0),
    ("gpu", 16, 0), ("bench", 16, 0), ("slow and not gpu", 4, 2), ("", 3, 2), (None, 2, 2)])
def test_auto_workers_are_capped_and_none_for_gpu_bench_or_one_core(monkeypatch, markexpr, cores, workers):
    monkeypatch.setattr(xdist_auto.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert xdist_auto.pytest_xdist_auto_num_workers(_config(markexpr)) == workers


def test_xdist_arguments_go_first_so_the_command_line_overrides_them():
    args = ["-m", "not gpu", "-n", "0"]
    xdist_auto.pytest_load_initial_conftests(None, None, args)
    assert args == ["-n", "auto", "--dist", "loadfile", "-m", "not gpu", "-n", "0"]
    for off in (["-p", "no:xdist"], ["-pno:xdist"]):
        args = ["-q"] + off
        xdist_auto.pytest_load_initial_conftests(None, None, args)
        assert args == ["-q"] + off  # disabled: -n would be an unknown option
    assert not xdist_auto._xdist_disabled(["-p", "no:cacheprovider", "--pdb"])


def test_nothing_is_added_without_xdist(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_xdist(name, *a, **kw):
        if name == "xdist":
            raise ImportError("no module named xdist")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_xdist)
    args = ["-q"]
    xdist_auto.pytest_load_initial_conftests(None, None, args)
    assert args == ["-q"]
