"""The package layout rules: no import circles among the project's modules (module-level imports, nor through imports
inside functions: each one is a dependency that a later move can turn into an import-time failure), nothing in
rewards/, rollout/ or patches/ importing trainer/, no file over 400 lines and no function over 60 lines there."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer", "rollout", "rewards", "patches")


def _modules() -> dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[:-9] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
    return out


def _top_level_imports(path: str, name: str, known: set[str], deep: bool = False) -> set[str]:
    """Project modules imported at module level (not under TYPE_CHECKING); with ``deep`` those imported inside
    functions and classes too."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            continue
        for sub in ([node] if not (deep or isinstance(node, (ast.If, ast.Try))) else ast.walk(node)):
            if isinstance(sub, ast.Import):
                names = [a.name for a in sub.names]
            elif isinstance(sub, ast.ImportFrom):
                base = sub.module or ""
                if sub.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - sub.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in sub.names]
            else:
                continue
            for n in names:
                while n and n not in known:
                    n = n.rpartition(".")[0]
                if n and n != name:
                    found.add(n)
    return found


def test_no_import_circles_and_no_arrow_up_into_trainer():
    mods = _modules()
    graph = {m: _top_level_imports(p, m, set(mods)) for m, p in mods.items()}
    up = sorted(f"{m} -> {d}" for m, deps in graph.items() if not m.startswith("trainer")
                for d in deps if d.startswith("trainer"))
    assert not up, up
    assert not _cycles(graph), _cycles(graph)[:5]


def test_no_import_circles_through_imports_inside_functions():
    mods = _modules()
    graph = {m: _top_level_imports(p, m, set(mods), deep=True) for m, p in mods.items()}
    up = sorted(f"{m} -> {d}" for m, deps in graph.items() if not m.startswith("trainer")
                for d in deps if d.startswith("trainer"))
    assert not up, up
    assert not _cycles(graph), _cycles(graph)[:5]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles of ``graph`` (module -> the project modules it imports), each as the path that closes it."""
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in graph[m]:
            if d.startswith(m + "."):  # a package importing its own submodule is not a circle
                continue
            if state.get(d) == 1 and not m.startswith(d + "."):
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_file_and_function_sizes():
    long_files, long_funcs = [], []
    for name, path in _modules().items():
        text = open(path, encoding="utf-8").read()
        if text.count("\n") > 400:
            long_files.append((name, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_funcs.append((name, node.name, node.end_lineno - node.lineno + 1))
    assert not long_files and not long_funcs, (long_files, long_funcs)


def _declared_distributions() -> set[str]:
    """Normalized names of setup.py's install_requires and its test extra (what ``tools/install.sh test`` installs)."""
    import re

    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
    reqs = list(kw["install_requires"]) + list(kw["extras_require"]["test"])
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_the_e2e_driver_pre_imports_only_the_project_and_declared_dependencies():
    """The shared e2e driver imports these before any run; a module the install does not declare (present on one
    machine, absent from a fresh install) kills the driver there, and every forked run with it."""
    from importlib.metadata import packages_distributions

    from tests.e2e_shared import _PREIMPORT

    declared, owners = _declared_distributions(), packages_distributions()
    own = {"trainer", "rollout", "rewards", "patches", "tools", "tests"}
    stray = {}
    for name in _PREIMPORT:
        top = name.split(".")[0]
        dists = {d.lower().replace("_", "-") for d in owners.get(top, [])}
        if top not in own and not dists & declared:
            stray[name] = sorted(dists) or "no installed distribution"
    assert not stray, f"pre-imported but not declared in setup.py: {stray}"


def test_no_python_file_has_an_invalid_escape_sequence():
    """Every .py file of the repository compiles without a SyntaxWarning: an invalid escape such as ``"\\c"`` in a
    docstring prints a warning on the first import of a fresh install (no cached bytecode) and becomes an error in a
    later Python; a valid one such as ``"\\t"`` in ``"\\times"`` silently changes the text."""
    import warnings

    bad = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("__pycache__", "outputs")]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    compile(open(path, encoding="utf-8").read(), path, "exec")
                bad += [f"{os.path.relpath(path, ROOT)}:{w.lineno}: {w.message}" for w in caught
                        if issubclass(w.category, (SyntaxWarning, DeprecationWarning))]
    assert not bad, bad
