"""How many pytest-xdist workers run the suite (tests/xdist_auto.py)."""
import types

import pytest

from tests import xdist_auto


def _config(markexpr, **option):
    return types.SimpleNamespace(option=types.SimpleNamespace(markexpr=markexpr, **option))


@pytest.mark.parametrize("markexpr,cores,workers", [
    ("not gpu and not bench", 2, 2), ("not gpu and not bench", 16, 2), ("not gpu and not bench", 1, 0),
    ("gpu", 16, 0), ("bench", 16, 0), ("gpu or slow", 4, 0), ("slow and not gpu", 4, 0), ("not (gpu or bench)", 4, 2),
    ("not  gpu and not bench", 4, 2), ("not(gpu) and not(bench)", 4, 2), ("not slow", 4, 0), ("", 3, 0),
    (None, 2, 0), ("slow and not gpu and not bench", 4, 2)])
def test_auto_workers_are_capped_and_none_when_gpu_or_bench_tests_are_selected(monkeypatch, markexpr, cores,
                                                                               workers):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(xdist_auto.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert xdist_auto.pytest_xdist_auto_num_workers(_config(markexpr)) == workers


def test_trace_capture_off_and_the_environment_variable(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(xdist_auto.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    expr = "not gpu and not bench"
    assert xdist_auto.pytest_xdist_auto_num_workers(_config(expr, trace=True)) == 0
    assert xdist_auto.pytest_xdist_auto_num_workers(_config(expr, capture="no")) == 0
    assert xdist_auto.pytest_xdist_auto_num_workers(_config(expr, capture="fd")) == 2
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert xdist_auto.pytest_xdist_auto_num_workers(_config(expr)) is None  # xdist's own hook reads it


@pytest.mark.parametrize("loaded", [True, False])
def test_xdist_arguments_go_first_only_when_the_plugin_is_loaded(loaded):
    early = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(hasplugin=lambda name: loaded))
    args = ["-m", "not gpu", "-n", "0"]
    xdist_auto.pytest_load_initial_conftests(early, None, args)
    # the command line comes after, so its -n 0 wins; without the plugin -n would be an unknown option
    assert args == (["-n", "auto", "--dist", "loadfile"] if loaded else []) + ["-m", "not gpu", "-n", "0"]
