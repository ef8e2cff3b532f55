"""LocalExecutor patch series: `nox` alone runs `apply`; README.md says which session is for whom.

Arguments after `--` go to the tool or to pytest: `nox -s apply -- --line 3.2`.
"""

# Every install goes through install(), which applies constraints/tools.txt; the per-line test
# venvs come from tools.engine.venvs (constrained by constraints/<line>.txt).

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tools.engine import testrun, venvs  # noqa: E402  (stdlib and packaging, which nox brings)
from tools.shared import pins  # noqa: E402
from tools.shared.errors import ToolError  # noqa: E402

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


def run_tools(session: nox.Session, *args: str, **kwargs: Any) -> None:
    session.run(PYTHON, "-m", "tools", *args, external=True, **kwargs)


def install_psutil(session: nox.Session) -> None:
    """psutil into nox's own interpreter (the e2e driver runs with it, without a venv), pinned by
    constraints/tools.txt: the driver reads the stack's processes with it (tools.measure.e2e.procfs)."""
    if importlib.util.find_spec("psutil") is None:
        uv = ["pip", "install", "--python", PYTHON, "-c", str(TOOLS_CONSTRAINTS), "psutil"]
        session.run(venvs.find_uv(), *uv, external=True)


@nox.session(venv_backend="none")
def apply(session: nox.Session) -> None:
    """Apply the series to every pinned line and check the derived files (`-- --write` regenerates)."""
    run_tools(session, "apply", *session.posargs)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run each line's tests on its overlay and the tooling's, four at a time (`-- --line 3.2`)."""
    run_tools(session, "tests", *testrun.split_posargs(session.posargs))


@nox.session(venv_backend="none")
def verify(session: nox.Session) -> None:
    """Show each regression test failing before its patch and passing from it on, on every line."""
    run_tools(session, "verify", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Check code style (ruff), stdlib calls newer than Python 3.10 (vermin) and the patches (lint-series)."""
    install(session, "ruff", "vermin")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)
    # why: ruff's target-version checks syntax only; vermin knows when each stdlib module, member and
    # keyword argument arrived (not on an object whose type it cannot tell, such as tarfile.open()'s:
    # .ci/run runs Debian's python3 for those). airflow_overlay/ is upstream's, run by each line's Python.
    # str.decode: vermin takes a bytes variable's .decode() for Python 2's str.
    # 3.10: the oldest Python README.md promises (pyproject.toml's ruff target-version).
    vermin = ["vermin", "--target=3.10-", "--violations", "--no-tips", "--eval-annotations"]
    session.run(*vermin, "--exclude", "str.decode", "tools", "tests", "noxfile.py")
    run_tools(session, "lint-series")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type-check each line's overlay against its Airflow, and the tooling (mypy)."""
    from tools.engine import fetch
    from tools.lint import new_type_errors

    install(session, "mypy", "nox", "pytest")
    for line in LINES:
        try:
            python = venvs.ensure(line)
            bases = fetch.read_bases(line)
        except ToolError as exc:
            session.error(str(exc))
        overlay = ROOT / "airflow_overlay" / line
        files = [f.package_path for f in pins.UPSTREAM_FILES if (overlay / f.package_path).is_file()]
        # why: an overlay file imports the series' names from its siblings (the scheduler's loop waits
        # through base_executor's wait_for_executor_events), which mypy reads from the installed package.
        venvs.install_sources(python, {f: (overlay / f).read_bytes() for f in files})
        # why: the overlay's files at their installed paths, checked against the line's installed
        # Airflow and task-sdk (imports followed silently); then the same files as released, so
        # that only what the series adds is reported (upstream's own errors are upstream's).
        base_tree = ROOT / "build" / "mypy" / f"{line}-released"
        for f in pins.UPSTREAM_FILES:
            if f.package_path in files:
                target = base_tree / f.package_path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bases[f.repo_path])
        reports = []
        for tree, cache in ((overlay, line), (base_tree, f"{line}-released-cache")):
            with session.chdir(tree):
                mypy = ["mypy", "--config-file=", "--python-executable", str(python)]
                mypy += ["--follow-imports=silent", "--ignore-missing-imports"]
                mypy += ["--cache-dir", str(ROOT / "build" / "mypy" / cache), *files]
                reports.append(session.run(*mypy, silent=True, success_codes=[0, 1]) or "")
        if added := new_type_errors(*reports):
            session.error(f"mypy: the {line} overlay adds {len(added)} error(s): " + "; ".join(added))
        session.log(f"mypy: the {line} overlay adds no error to {', '.join(Path(f).name for f in files)}")
    session.run("mypy", "--cache-dir", str(ROOT / "build" / "mypy" / "tools"))
    # why: tests/tools/conftest.py is the module "conftest" too; mypy takes one of them per run.
    session.run("mypy", "--cache-dir", str(ROOT / "build" / "mypy" / "tools"), "tests/executor/conftest.py")


@nox.session
def changelog(session: nox.Session) -> None:
    """Check newsfragments/ and draft the changelog (towncrier): `nox -s changelog -- VERSION`."""
    install(session, "towncrier")
    run_tools(session, "check-newsfragments")
    version = session.posargs[0] if session.posargs else "unreleased"
    session.run("towncrier", "build", "--draft", "--version", version)


# why: on Ctrl-C nox SIGTERMs then SIGKILLs its child within 0.5 s by default; an e2e or soak session
# needs time to stop its stacks and servers (tools/measure/e2e/session.py), or they would be left running.
STACK_STOP_TIMEOUTS = {"interrupt_timeout": 120, "terminate_timeout": 30}


@nox.session(venv_backend="none")
def e2e(session: nox.Session) -> None:
    """Run a real Airflow with the overlay and kill its workers on purpose (2-10 min; see docs/e2e.md)."""
    install_psutil(session)
    run_tools(session, "e2e", *session.posargs, **STACK_STOP_TIMEOUTS)


@nox.session(venv_backend="none")
def soak(session: nox.Session) -> None:
    """A real stack under load and seeded faults, the release against the series (10 min x 2; docs/e2e.md)."""
    install_psutil(session)
    run_tools(session, "soak", *session.posargs, **STACK_STOP_TIMEOUTS)


@nox.session(venv_backend="none")
def overlay(session: nox.Session) -> None:
    """Print the pip commands that install the fix on every host: `-- --release 3.3.2` or `-- --python PY`."""
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
