"""Sessions: thin wrappers over ``python -m tools``; ``nox`` alone runs ``apply``.

Every install goes through :func:`install`, which applies ``constraints/tools.txt``; the
per-line test venvs come from ``tools.venvs`` (constrained by ``constraints/<line>.txt``).
``session.posargs`` go straight to the tool: ``nox -s apply -- --line 3.2``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tools import final_record, pins, venvs  # noqa: E402  (stdlib only, importable before any install)
from tools.errors import ToolError  # noqa: E402
from tools.fixed_by_plugin import RECORD_ENV  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["apply"]
nox.options.reuse_venv = "yes"

LINES = [line.name for line in pins.LINES]
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
    """Apply the series to every pinned line; check (or --write) overlays and tests/executor."""
    run_tools(session, "apply", *session.posargs)


@nox.session(venv_backend="none")
@nox.parametrize("line", [*LINES, "tools"])
def tests(session: nox.Session, line: str) -> None:
    """Run the executor and supervisor tests on a line's overlay (its pinned venv), or the tools' tests."""
    record: list[str] = []
    try:
        if line == "tools":
            python, paths = venvs.ensure_tools(), ["tests/tools"]
        else:
            python, paths = venvs.ensure(line), [f.tests_dir for f in pins.UPSTREAM_FILES]
            overlay = {
                f.package_path: (ROOT / "airflow_overlay" / line / f.package_path).read_bytes()
                for f in pins.UPSTREAM_FILES
                if (ROOT / "airflow_overlay" / line / f.package_path).exists()
            }
            venvs.install_sources(python, overlay)
            # why: verify's final stage is this very code; it reuses what passed here.
            record = ["-p", "tools.fixed_by_plugin"]
            record_to = final_record.prepare(line, overlay)
    except (ToolError, OSError) as exc:
        session.error(str(exc))
    has_tests = any(f for p in paths for f in (ROOT / p).rglob("test_*.py"))
    with tempfile.TemporaryDirectory(prefix="lepatch-airflow-home-") as home:
        env = venvs.test_env(Path(home))
        if record:
            env[RECORD_ENV] = str(record_to)
        session.run(
            str(python),
            "-m",
            "pytest",
            *paths,
            "-p",
            "no:cacheprovider",
            *record,
            *session.posargs,
            external=True,
            env=env,
            success_codes=[0] if has_tests else [0, 5],
        )


@nox.session(venv_backend="none")
def verify(session: nox.Session) -> None:
    """Every fixed_by test fails before its patch and passes from it on, on every line."""
    run_tools(session, "verify", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (check and format) and the series' own lint."""
    install(session, "ruff")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)
    session.run("python", "-m", "tools", "lint-series")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on each overlay against its line's installed Airflow, then on tools/, tests/ and noxfile.py."""
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
    """Check newsfragments/ and draft the changelog: ``nox -s changelog -- VERSION``."""
    install(session, "towncrier")
    session.run("python", "-m", "tools", "check-newsfragments")
    version = session.posargs[0] if session.posargs else "unreleased"
    session.run("towncrier", "build", "--draft", "--version", version)


@nox.session(venv_backend="none")
def e2e(session: nox.Session) -> None:
    """A real Airflow (api-server, scheduler, dag-processor) with workers killed on purpose.

    ``nox -s e2e -- --stage 0 --scenario kill-queued --db postgres``; not part of ``tests``.
    """
    run_tools(session, "e2e", *session.posargs)


@nox.session(venv_backend="none")
def overlay(session: nox.Session) -> None:
    """Install, inspect or restore the overlay: ``nox -s overlay -- install --python ENV/bin/python``."""
    run_tools(session, "overlay", *session.posargs)


@nox.session(venv_backend="none")
def backport(session: nox.Session) -> None:
    """Backport the series: ``nox -s backport -- --repo ../airflow v3-3-test v3-2-test v3-1-test``."""
    run_tools(session, "backport", *session.posargs)


@nox.session(venv_backend="none")
def pr(session: nox.Session) -> None:
    """Prepare one patch as an upstream PR: ``nox -s pr -- --repo ../airflow 3``."""
    run_tools(session, "pr", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Dispatch cost, throughput, recovery of every stage as ratios to base: ``nox -s bench -- --quick``."""
    run_tools(session, "bench", *session.posargs)


@nox.session(venv_backend="none")
def chaos(session: nox.Session) -> None:
    """Seeded SIGKILL/SIGTERM soak of every stage: ``nox -s chaos -- --runs 20 --seed 7``."""
    run_tools(session, "chaos", *session.posargs)


@nox.session(venv_backend="none")
def model(session: nox.Session) -> None:
    """SPIN checks of the dispatch protocol (final, stages 0 and 3): ``nox -s model -- --stage final``."""
    if shutil.which("spin") is None:
        session.run("sh", "-c", "apt-get update -qq && apt-get install -y -qq spin", external=True)
    run_tools(session, "model", *session.posargs)
