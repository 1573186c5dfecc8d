"""`empty_cache(` may appear only inside rollout/memory.py::empty_cache (verl #556/#575, peer case P19).

Calls of that wrapper (`memory.empty_cache()`) are allowed in rollout/ and in the benchmarks of BENCH_WAKE_CALLS
only; any other `...empty_cache(` (torch.cuda,
accelerator, ...) anywhere in trainer/ patches/ rollout/ rewards/ tools/ fails the test.
"""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ["trainer", "patches", "rollout", "rewards", "tools"]
PATTERN = re.compile(r"([\w.()]*)empty_cache\(")
# benchmarks that drive a vLLM engine by hand call the wrapper where the rule puts it (before a wake-up), and
# vllm_memory.py measures what breaking the rule costs
BENCH_WAKE_CALLS = {"tools/bench/rollout.py", "tools/bench/vllm_memory.py"}


def _function_span(path: pathlib.Path, name: str) -> tuple[int, int]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.lineno, node.end_lineno
    raise AssertionError(f"{path} has no function {name}")


def scan(root: pathlib.Path = ROOT) -> list[tuple[str, int, str]]:
    hits = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for m in PATTERN.finditer(line):
                    hits.append((path.relative_to(root).as_posix(), lineno, m.group(0)))
    return hits


def test_empty_cache_only_in_rollout_memory():
    mem = ROOT / "rollout" / "memory.py"
    start, end = _function_span(mem, "empty_cache")
    bad, real_calls = [], []
    for rel, lineno, text in scan():
        if rel == "rollout/memory.py" and start <= lineno <= end:
            if text != "empty_cache(" or lineno != start:  # the def line itself is fine
                real_calls.append(text)
            continue
        if rel.startswith("rollout/") and text == "memory.empty_cache(":
            continue
        if rel in BENCH_WAKE_CALLS and text == "memory.empty_cache(":
            continue
        bad.append(f"{rel}:{lineno}: {text}")
    assert not bad, "empty_cache outside rollout/memory.py::empty_cache:\n" + "\n".join(bad)
    assert real_calls == ["torch.cuda.empty_cache("], real_calls


def test_scanner_finds_a_planted_call(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "probe.py").write_text("import torch\n\ntorch.cuda.empty_cache()\n")
    assert scan(tmp_path) == [("tools/probe.py", 3, "torch.cuda.empty_cache(")]
