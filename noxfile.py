"""LocalExecutor patch series: `nox` alone runs `apply`; README.md says which session is for whom.

Arguments after `--` go to the tool or to pytest: `nox -s apply -- --line 3.2`.
"""

# Every install goes through install(), which applies constraints/tools.txt; the per-line test
# venvs come from tools.engine.venvs (constrained by constraints/<line>.txt).

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tools.engine import final_record, venvs  # noqa: E402  (stdlib only, importable before any install)
from tools.engine.fixed_by_plugin import RECORD_ENV  # noqa: E402
from tools.shared import pins  # noqa: E402
from tools.shared.errors import ToolError  # noqa: E402
from tools.shared.layout import DEFAULT as LAYOUT  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["apply"]
nox.options.reuse_venv = "yes"

LINES = [line.name for line in pins.LINES]
# The lines whose executor tests run under Python 3.12+ as well (Airflow's image defaults to 3.13),
# with forkserver (3.14's default on Linux) beside fork; spawn runs under the default Python.
NEWER_PYTHON_LINES = ["3.3", "3.4"]
NEWER_PYTHON = "py3.12+"
NEWER_PYTHON_START_METHODS = "fork,forkserver"
TOOLS_CONSTRAINTS = ROOT / "constraints" / "tools.txt"
LINT_PATHS = ["tools", "tests", "noxfile.py", "airflow_overlay"]
# The interpreter running nox: sessions without a venv run the tools with it.
PYTHON = sys.executable


def install(session: nox.Session, *packages: str) -> None:
    """Install into the session's venv, pinned by constraints/tools.txt (the only install path)."""
    session.install("-c", str(TOOLS_CONSTRAINTS), *packages)


def run_tools(session: nox.Session, *args: str) -> None:
    session.run(PYTHON, "-m", "tools", *args, external=True)


@nox.session(venv_backend="none")
def apply(session: nox.Session) -> None:
    """Apply the series to every pinned line and check the derived files (`-- --write` regenerates)."""
    run_tools(session, "apply", *session.posargs)


@nox.session(venv_backend="none")
@nox.parametrize("line", [*LINES, *(f"{ln}-{NEWER_PYTHON}" for ln in NEWER_PYTHON_LINES), "tools"])
def tests(session: nox.Session, line: str) -> None:
    """Run the executor and supervisor tests on each line's overlay, and the tooling's (`-- --line 3.2`)."""
    posargs = list(session.posargs)
    if "--line" in posargs:  # why: pytest has no --line; pick the parametrization here
        at = posargs.index("--line")
        wanted = posargs[at + 1] if at + 1 < len(posargs) else ""
        del posargs[at : at + 2]
        if wanted not in (*LINES, "tools"):
            session.error(f"--line {wanted!r}: not a pinned line (one of {', '.join(LINES)}, or tools)")
        if wanted != line.split("-")[0]:
            session.skip(f"--line {wanted}")
    record: list[str] = []
    # Every scenario fails if the executor's process forked while a thread Airflow started was alive.
    extra_env: dict[str, str] = {"LEPATCH_FORK_CHECK": "1"}
    line, _, newer = line.partition("-")
    interpreter = None
    if newer:
        interpreter = venvs.newer_python()
        if interpreter is None:
            session.skip("no Python 3.12+ found (python3.12+ on PATH, or pyenv's versions/)")
        extra_env["LEPATCH_START_METHODS"] = NEWER_PYTHON_START_METHODS
    try:
        if line == "tools":
            python, paths = venvs.ensure_tools(), ["tests/tools"]
            # why: the tests that build real Airflow venvs run the uv this nox runs with (beside it)
            extra_env["PATH"] = os.pathsep.join(
                [str(Path(venvs.find_uv()).parent), os.environ.get("PATH", "")]
            )
        else:
            python, paths = venvs.ensure(line, python=interpreter), [f.tests_dir for f in pins.UPSTREAM_FILES]
            overlay = LAYOUT.overlay_files(line)
            venvs.install_sources(python, overlay)
            # why: verify's final stage is this very code (under the default Python); it reuses what
            # passed here.
            if not newer:
                record = ["-p", "tools.engine.fixed_by_plugin"]
                record_to = final_record.prepare(line, overlay)
    except (ToolError, OSError) as exc:
        session.error(str(exc))
    has_tests = any(f for p in paths for f in (ROOT / p).rglob("test_*.py"))
    with tempfile.TemporaryDirectory(prefix="lepatch-airflow-home-") as home:
        env = {**venvs.test_env(Path(home)), **extra_env}
        if record:
            env[RECORD_ENV] = str(record_to)
        session.run(
            str(python),
            "-m",
            "pytest",
            *paths,
            "-p",
            "no:cacheprovider",
            "-rfEs",  # failures, errors and every skip with its reason
            # An exception raised where nothing can catch it (a finalizer, a thread) fails the run:
            # Python 3.13 reports the close() errors of collected files (io.IOBase's finalizer).
            "-W",
            "error::pytest.PytestUnraisableExceptionWarning",
            *record,
            *posargs,
            external=True,
            env=env,
            success_codes=[0] if has_tests else [0, 5],
        )


@nox.session(venv_backend="none")
def verify(session: nox.Session) -> None:
    """Show each regression test failing before its patch and passing from it on, on every line."""
    run_tools(session, "verify", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Check code style (ruff) and the patches' headers, order and resolutions (lint-series)."""
    install(session, "ruff")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)
    session.run("python", "-m", "tools", "lint-series")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type-check each line's overlay against its Airflow, and the tooling (mypy)."""
    install(session, "mypy", "nox", "pytest")
    for line in LINES:
        try:
            python = venvs.ensure(line)
        except ToolError as exc:
            session.error(str(exc))
        # why: from the overlay root the files are at their installed paths, checked against the
        # line's installed Airflow and task-sdk (imports followed silently, not reported).
        with session.chdir(ROOT / "airflow_overlay" / line):
            session.run(
                "mypy",
                "--config-file=",
                "--python-executable",
                str(python),
                "--follow-imports=silent",
                "--ignore-missing-imports",
                "--cache-dir",
                str(ROOT / "build" / "mypy" / line),
                *(f.package_path for f in pins.UPSTREAM_FILES),
            )
    session.run("mypy", "--cache-dir", str(ROOT / "build" / "mypy" / "tools"))
    # why: tests/tools/conftest.py is the module "conftest" too; mypy takes one of them per run.
    session.run("mypy", "--cache-dir", str(ROOT / "build" / "mypy" / "tools"), "tests/executor/conftest.py")


@nox.session
def changelog(session: nox.Session) -> None:
    """Check newsfragments/ and draft the changelog (towncrier): `nox -s changelog -- VERSION`."""
    install(session, "towncrier")
    session.run("python", "-m", "tools", "check-newsfragments")
    version = session.posargs[0] if session.posargs else "unreleased"
    session.run("towncrier", "build", "--draft", "--version", version)


@nox.session(venv_backend="none")
def e2e(session: nox.Session) -> None:
    """Run a real Airflow with the overlay and kill its workers on purpose (2-10 min; see docs/e2e.md)."""
    run_tools(session, "e2e", *session.posargs)


@nox.session(venv_backend="none")
def overlay(session: nox.Session) -> None:
    """Install, check or remove the fix in your Airflow: `-- install --python ENV/bin/python`."""
    run_tools(session, "overlay", *session.posargs)


@nox.session(venv_backend="none")
def package(session: nox.Session) -> None:
    """Build one wheel per line into dist/ (pip install it, [core] executor = its class): `-- --line 3.3`."""
    run_tools(session, "package", *session.posargs)


# why venv: it seeds pip, which fetches the pinned source wheels (uv's venvs have none)
@nox.session(venv_backend="venv")
def wheels(session: nox.Session) -> None:
    """Airflow's core and task-sdk wheels with the series' files into dist/wheels/ (`-- --check-install`)."""
    install(session, "wheel")
    session.run("python", "-m", "tools", "wheels", *session.posargs, env={"PYTHONPATH": str(ROOT)})


@nox.session(venv_backend="none")
def backport(session: nox.Session) -> None:
    """Cherry-pick the series onto an Airflow clone's v3-*-test branches: `-- --repo ../airflow v3-3-test`."""
    run_tools(session, "backport", *session.posargs)


@nox.session(venv_backend="none")
def pr(session: nox.Session) -> None:
    """Make one patch an upstream PR branch and PR body in an Airflow clone: `-- --repo ../airflow 7`."""
    run_tools(session, "pr", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Measure every stage's speed as ratios to the unpatched base (docs/performance.md): `-- --quick`."""
    run_tools(session, "bench", *session.posargs)


@nox.session(venv_backend="none")
def chaos(session: nox.Session) -> None:
    """Soak every stage with seeded SIGKILL/SIGTERM runs and check no task is lost or hung."""
    run_tools(session, "chaos", *session.posargs)


@nox.session(venv_backend="none")
def model(session: nox.Session) -> None:
    """Model-check the dispatch protocol with SPIN (final stage, 0 and 3): `-- --stage final`."""
    if shutil.which("spin") is None:
        session.run("sh", "-c", "apt-get update -qq && apt-get install -y -qq spin", external=True)
    run_tools(session, "model", *session.posargs)
