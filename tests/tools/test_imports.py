"""The shape of ``tools/``: no module imports itself back, and the packages stand in layers.

The graph is read from the source with ``ast``, every import counted wherever it stands (at module
level, inside a function, under ``TYPE_CHECKING``): absolute ``tools.x.y`` imports and relative
ones. ``tools.shared`` imports no other package; ``tools.engine`` only shared; ``tools.delivery``
shared and the engine; ``tools.measure`` any of those. ``tools/__main__.py`` and ``tools/lint.py``
stand above them all, and no package imports them.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
# Lowest first: a package may import those before it, never one after it.
LAYERS = ("shared", "engine", "delivery", "measure")
# Run inside a stage venv by file path, never imported by the tools (they import the harness).
STAGE_VENV_ONLY = {"tools.measure.bench_probe", "tools.measure.chaos_probe"}


def modules() -> dict[str, Path]:
    """Every module under tools/ by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(TOOLS.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports; ``from P import x`` is P.x where that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def package_of(module: str) -> str | None:
    """``engine`` for ``tools.engine.apply``; None for a module of ``tools`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "tools.engine.venvs" in edges["tools.engine.lock"]  # a module-level import
    assert "tools.engine.venvs" in edges["tools.delivery.pr_testrun"]  # one inside a function
    assert {package_of(m) for m in edges} == {None, *LAYERS}


def test_find_cycle_names_it() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_package_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for module, deps in graph().items():
        edges.setdefault(f"tools.{package_of(module) or '(top)'}", set()).update(
            f"tools.{package_of(d) or '(top)'}" for d in deps if package_of(d) != package_of(module)
        )
    cycle = find_cycle(edges)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle or [])


def test_packages_import_only_lower_layers() -> None:
    wrong = []
    for module, deps in sorted(graph().items()):
        pkg = package_of(module)
        if pkg is None:
            continue  # tools/__main__.py, tools/lint.py: above every package
        for dep in sorted(deps):
            dep_pkg = package_of(dep)
            if dep_pkg is None and dep != "tools":
                wrong.append(f"{module} -> {dep} (a package imports nothing of tools' top level)")
            elif dep_pkg is not None and LAYERS.index(dep_pkg) > LAYERS.index(pkg):
                wrong.append(f"{module} -> {dep} ({pkg} stands below {dep_pkg})")
    assert wrong == []


def packages() -> list[str]:
    return sorted(name for name, path in modules().items() if path.name == "__init__.py" and name != "tools")


@pytest.mark.parametrize("package", packages())
def test_package_imports_on_its_own(package: str) -> None:
    """A fresh interpreter imports the package and each of its modules, with nothing imported before."""
    mods = modules()
    members = [
        m
        for m in sorted(mods)
        if m.startswith(f"{package}.")
        and m.count(".") == package.count(".") + 1
        and mods[m].name not in ("__init__.py", "__main__.py")
        and m not in STAGE_VENV_ONLY
    ]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    for code in [f"import {package}", "; ".join(f"import {m}" for m in members)]:
        if not code:
            continue
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        assert proc.returncode == 0, f"python -c {code!r}: {last}"
