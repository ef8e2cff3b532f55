"""``python -m tools lock``: exact constraints so nothing a test environment installs floats.

``constraints/tools.txt`` pins the tooling (nox, uv, pytest, ruff, vermin, mypy, towncrier, psutil) and
everything they pull in; ``constraints/<line>.txt`` pins a line's ``apache-airflow-core``
with all of Airflow's dependencies plus the same pytest and pytest-timeout. Both are
resolved by ``uv pip compile`` for every Python from 3.10 on (markers where they differ).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

from tools.engine import fetch
from tools.engine.venvs import (
    TEST_PACKAGES,
    TOOLS_TEST_PACKAGES,
    UPSTREAM_TEST_PACKAGES,
    oldest_python,
    run_uv,
    upstream_tests_constraints,
)
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

# What the tools' test venv installs, and the tooling.
TOOLS = (*TOOLS_TEST_PACKAGES, "nox[uv]", "ruff", "mypy", "towncrier", "uv", "vermin")
COMPILE = ("pip", "compile", "-", "--universal", "--quiet")


def compile_requirements(
    requirements: Sequence[str],
    command: str,
    python_version: str = "3.10",
    *,
    constraints: str | None = None,
    exclude_newer: str | None = None,
    cwd: Path | None = None,
) -> str:
    """``uv pip compile`` of ``requirements`` for every Python from ``python_version`` on (markers where
    they differ), the file's header naming ``command``; ``exclude_newer``: only what the index had then."""
    args = [*COMPILE, "--python-version", python_version, "--custom-compile-command", command]
    args += ["-c", constraints] if constraints else []
    args += ["--exclude-newer", exclude_newer] if exclude_newer else []
    return run_uv(*args, stdin="\n".join(requirements) + "\n", cwd=cwd)


def pinned(constraints: str, name: str) -> str:
    """The exact version a constraints file pins for ``name`` (unconditionally)."""
    m = re.search(rf"^{re.escape(name)}==([^\s;]+)\s*$", constraints, re.M)
    if not m:
        raise ToolError(f"no unconditional pin for {name}")
    return m.group(1)


def lock_tools(layout: Layout = DEFAULT) -> str:
    text = compile_requirements(list(TOOLS), "python -m tools lock --tools")
    layout.constraints.mkdir(parents=True, exist_ok=True)
    (layout.constraints / "tools.txt").write_text(text)
    return text


def lock_line(line: pins.Line, layout: Layout = DEFAULT) -> str:
    tools = (layout.constraints / "tools.txt").read_text()
    reqs = [f"{pins.DISTRIBUTION}=={line.version}", *(f"{p}=={pinned(tools, p)}" for p in TEST_PACKAGES)]
    # why: a line whose Airflow needs a newer Python (3.4 needs 3.11) cannot resolve for 3.10.
    python_version = oldest_python(fetch.ensure_wheel(line, layout))
    text = compile_requirements(reqs, f"python -m tools lock --line {line.name}", python_version)
    (layout.constraints / f"{line.name}.txt").write_text(text)
    return text


def pre_release() -> pins.Line:
    """The line that stands for upstream ``main``: upstream's own test file is written against it."""
    return next(ln for ln in pins.LINES if ln.prerelease)


def lock_upstream_tests(line: pins.Line | None = None, layout: Layout = DEFAULT) -> str:
    """``constraints/upstream-tests-<line>.txt``: what upstream's own executor test file imports
    beyond the line's test packages (``UPSTREAM_TEST_PACKAGES``), resolved within the line's pins."""
    line = line or pre_release()
    python_version = oldest_python(fetch.ensure_wheel(line, layout))
    # why relative: the file records the constraints it was resolved with, the same on every machine
    text = compile_requirements(
        list(UPSTREAM_TEST_PACKAGES),
        f"python -m tools lock --upstream-tests --line {line.name}",
        python_version,
        constraints=f"constraints/{line.name}.txt",
        cwd=layout.root,
    )
    upstream_tests_constraints(line, layout).write_text(text)
    return text


def _cmd_lock(args: argparse.Namespace) -> int:
    if args.upstream_tests:
        line = args.line[0] if args.line else pre_release()
        lock_upstream_tests(line)
        print(f"wrote {DEFAULT.rel(upstream_tests_constraints(line))}")
        return 0
    everything = not args.line and not args.tools
    if args.tools or everything or not (DEFAULT.constraints / "tools.txt").exists():
        lock_tools()
        print("wrote constraints/tools.txt")
    for line in args.line or (pins.LINES if everything else []):
        lock_line(line)
        print(f"wrote constraints/{line.name}.txt")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lock", help="regenerate constraints/ with uv pip compile (needs the index)")
    p.add_argument("--line", action="append", type=pins.line_arg, help="only this line (repeatable)")
    p.add_argument("--tools", action="store_true", help="only constraints/tools.txt")
    p.add_argument(
        "--upstream-tests",
        action="store_true",
        help="only constraints/upstream-tests-<line>.txt (what upstream's test files import; default 3.4)",
    )
    p.set_defaults(func=_cmd_lock)
