"""``nox -s tests``: every line's executor, supervisor and API server tests, and the tooling's.

One pytest run per cell: each pinned line on its final overlay under the default Python (fork and
spawn), 3.3 and 3.4 under Python 3.12+ as well (fork and forkserver), and ``tests/tools``. Most of a
cell's time is waiting (a worker's exit, a scenario's deadline, a venv's install), not CPU, so cells
run ``--jobs`` at a time (default 4: on 2 cores most of a cell's time still waits, and 4 slots
pack the seven cells into two waves), the tooling's first, as the longest; each one's output goes to
``build/tests/<cell>.log`` (``.<cell>.log.<pid>`` while it runs) and is printed whole when it ends,
never interleaved. The venvs are
prepared first, one after another (uv already uses every core). The exit code is non-zero if any
cell failed; the last line sums the cells' counts.

Standard library only: the noxfile runs it with nox's own interpreter.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tools.engine import final_record, venvs
from tools.engine.fixed_by_plugin import RECORD_ENV
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

# The lines whose tests run under Python 3.12+ as well (Airflow's image defaults to 3.13), with
# forkserver (3.14's default on Linux) beside fork; spawn runs under the default Python.
NEWER_PYTHON_LINES = ("3.3", "3.4")
NEWER_PYTHON = "py3.12+"
NEWER_PYTHON_START_METHODS = "fork,forkserver"
TOOLS = "tools"
# pytest's closing line: "3 failed, 110 passed, 2 skipped in 12.3s".
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")


@dataclass
class Cell:
    """One pytest run: a line's tests on its overlay under one Python, or the tooling's."""

    name: str  # "3.3", "3.3-py3.12+", "tools"
    line: str
    newer: bool = False
    python: Path | None = None
    paths: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    record: Path | None = None  # where the fixed_by plugin records outcomes for verify
    has_tests: bool = True  # pytest exits 5 where it collects nothing: not a failure then
    skipped: str = ""  # why the cell does not run
    returncode: int | None = None
    seconds: float = 0.0
    summary: str = ""

    @property
    def failed(self) -> bool:
        return not self.skipped and self.returncode not in ((0,) if self.has_tests else (0, 5))


def cell_names(lines: Sequence[str] = ()) -> list[str]:
    """Every cell, in the order they start, or those of ``lines`` (a line name or ``tools``)."""
    every = [ln.name for ln in pins.LINES]
    names = [TOOLS, *every, *(f"{ln}-{NEWER_PYTHON}" for ln in NEWER_PYTHON_LINES)]
    for wanted in lines:
        if wanted not in (*every, TOOLS):
            raise ToolError(f"--line {wanted!r}: not a pinned line (one of {', '.join(every)}, or tools)")
    return [n for n in names if not lines or n.split("-")[0] in lines]


def prepare(name: str, layout: Layout = DEFAULT) -> Cell:
    """The cell's venv with the line's overlay installed, its paths and environment."""
    line, _, newer = name.partition("-")
    cell = Cell(name, line, newer=bool(newer))
    # Every scenario fails if the executor's process forked while a thread Airflow started was alive.
    cell.env = {"LEPATCH_FORK_CHECK": "1"}
    interpreter = None
    if cell.newer:
        interpreter = venvs.newer_python()
        if interpreter is None:
            cell.skipped = "no Python 3.12+ found (python3.12+ on PATH, or pyenv's versions/)"
            return cell
        cell.env["LEPATCH_START_METHODS"] = NEWER_PYTHON_START_METHODS
    if line == TOOLS:
        cell.python, cell.paths = venvs.ensure_tools(layout), ["tests/tools"]
        # why: the tests that build real Airflow venvs run the uv the tools run with
        cell.env["PATH"] = os.pathsep.join([str(Path(venvs.find_uv()).parent), os.environ.get("PATH", "")])
    else:
        cell.python = venvs.ensure(line, layout, python=interpreter)
        cell.paths = [f.tests_dir for f in pins.UPSTREAM_FILES]
        overlay = layout.overlay_files(line)
        venvs.install_sources(cell.python, overlay)
        # why: verify's final stage is this very code (under the default Python); it reuses what passed
        if not cell.newer:
            cell.record = final_record.prepare(line, overlay, layout)
    cell.has_tests = any(f for p in cell.paths for f in (layout.root / p).rglob("test_*.py"))
    return cell


def run_cell(cell: Cell, pytest_args: Sequence[str], layout: Layout = DEFAULT) -> Cell:
    """Run the cell's pytest, its output to ``build/tests/<cell>.log``."""
    log = layout.build / "tests" / f"{cell.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # why a file of its own, renamed into place at the end: the tooling's tests run `nox -s tests --
    # --line tools` themselves, which would truncate this very log while this run writes it.
    writing = log.with_name(f".{log.name}.{os.getpid()}")
    cmd = [str(cell.python), "-m", "pytest", *cell.paths, "-p", "no:cacheprovider"]
    # -rfEs: failures, errors and every skip with its reason. An exception raised where nothing can
    # catch it (a finalizer, a thread) fails the run: Python 3.13 reports the close() errors of
    # collected files (io.IOBase's finalizer).
    cmd += ["-rfEs", "-W", "error::pytest.PytestUnraisableExceptionWarning"]
    if cell.record is not None:
        cmd += ["-p", "tools.engine.fixed_by_plugin"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lepatch-airflow-home-") as home, writing.open("w") as out:
        env = {**venvs.test_env(Path(home), layout), **cell.env}
        if cell.record is not None:
            env[RECORD_ENV] = str(cell.record)
        out.write(f"$ {' '.join(cmd + list(pytest_args))}\n")
        out.flush()
        proc = subprocess.run(
            [*cmd, *pytest_args], cwd=layout.root, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    os.replace(writing, log)
    cell.returncode, cell.seconds = proc.returncode, time.monotonic() - started
    lines = log.read_text(errors="replace").strip().splitlines()
    cell.summary = next((ln.strip("= ") for ln in reversed(lines) if COUNTS.search(ln)), "no summary")
    return cell


def totals(cells: Sequence[Cell]) -> str:
    """The cells' pytest counts summed: ``12 passed, 1 failed, 3 skipped``."""
    sums: dict[str, int] = {}
    for cell in cells:
        for n, what in COUNTS.findall(cell.summary):
            key = "errors" if what.startswith("error") else what
            sums[key] = sums.get(key, 0) + int(n)
    order = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed", "deselected")
    sums.setdefault("passed", 0)
    sums.setdefault("failed", 0)
    return ", ".join(f"{sums[k]} {k}" for k in order if k in sums)


def run(lines: Sequence[str], jobs: int, pytest_args: Sequence[str], layout: Layout = DEFAULT) -> int:
    cells = [prepare(name, layout) for name in cell_names(lines)]
    todo = [c for c in cells if not c.skipped]
    for cell in cells:
        if cell.skipped:
            print(f"tests {cell.name}: skipped ({cell.skipped})", flush=True)

    def one(cell: Cell) -> Cell:
        run_cell(cell, pytest_args, layout)
        # why whole and at once: two cells' output interleaved line by line is unreadable
        print((layout.build / "tests" / f"{cell.name}.log").read_text(errors="replace"), flush=True)
        verdict = "FAILED" if cell.failed else "ok"
        print(f"tests {cell.name}: {verdict}, {cell.summary} ({cell.seconds:.0f} s)", flush=True)
        return cell

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = list(pool.map(one, todo))
    print("\ncell              result   seconds  pytest")
    for cell in cells:
        verdict = "skipped" if cell.skipped else ("FAILED" if cell.failed else "ok")
        print(f"{cell.name:<17} {verdict:<8} {cell.seconds:>7.0f}  {cell.summary or cell.skipped}")
    failed = [c.name for c in done if c.failed]
    if failed:
        print(f"failed cells: {', '.join(failed)} (logs in {layout.rel(layout.build / 'tests')}/)")
    print(f"tests: {totals(done)}")
    return 1 if failed else 0


def _cmd_tests(args: argparse.Namespace) -> int:
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    return run(args.line, args.jobs, pytest_args)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tests",
        help="every line's tests on its overlay and the tooling's, side by side",
        description=__doc__,
    )
    p.add_argument("--line", action="append", default=[], help="only this line, or 'tools' (repeatable)")
    p.add_argument("--jobs", type=int, default=4, help="cells run side by side (default 4)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: passed to every cell's pytest")
    p.set_defaults(func=_cmd_tests)


def split_posargs(posargs: Sequence[str]) -> list[str]:
    """``nox -s tests -- --line 3.2 -x -k drain`` as this command's arguments: its own options
    first, then ``--`` and what goes to pytest (which has no ``--line`` or ``--jobs``)."""
    own: list[str] = []
    rest: list[str] = []
    args = list(posargs)
    while args:
        arg = args.pop(0)
        if arg in ("--line", "--jobs"):
            own += [arg, args.pop(0) if args else ""]
        elif arg.startswith(("--line=", "--jobs=")):
            own.append(arg)
        else:
            rest.append(arg)
    return [*own, "--", *rest]
