"""Upstream's own ``test_supervisor.py`` of each task-sdk release, on its patched and unpatched supervisor.

Each task-sdk release's sdist on PyPI carries the tests upstream wrote against exactly that
``supervisor.py`` (``tests/task_sdk/execution_time/test_supervisor.py``, with the conftests and the
``task_sdk`` helper package beside it). The sdist is fetched with pip into the cache and refused unless
its sha256 is the one ``pins.SDK_SDIST_SHA256`` records; its ``tests/`` tree is extracted into a
temporary directory for the run and never copied into this repository.

The run uses the line's upstream-tests venv (``venvs.ensure(line, upstream_tests=True, sdk=v)``: the
line's pinned core and task-sdk, plus what the test file imports, ``constraints/upstream-tests-<line>.txt``);
another task-sdk release the line covers gets a venv of its own with the newest core release that
requires it (``build/venvs/upstream-supervisor-<v>``). One ``supervisor.py`` is put in place: the
release's own, then the overlay's for that release. What Airflow's
``tests_common`` gives the file is the project's stand-ins (``tests/upstream_standins/``): the
``conf_vars`` helper, a markers-only ``tests_common.pytest_plugin``, and an import-only
``SerializeValueOnlyXCom``. Upstream's plugin fixtures that need its test DAG machinery
(``create_runtime_ti``, ``mocked_parse``, ``mock_supervisor_comms``) are not stood in for: the tests
using them error the same on both files, and are counted as such.

    python -m tools upstream-supervisor-tests --line 3.3          # 1.3.2: unpatched, then patched
    python -m tools upstream-supervisor-tests --sdk 1.3.0               # another release 3.3 covers
    python -m tools upstream-supervisor-tests --line 3.3 -- -k exit
"""

from __future__ import annotations

import argparse
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from tools.delivery import upstream_tests, wheels
from tools.engine import fetch, venvs
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

TEST_FILE = "task_sdk/execution_time/test_supervisor.py"  # under the sdist's tests/
PER_TEST_TIMEOUT = 120
RUN_TIMEOUT = 3600


class SupervisorTestsError(ToolError):
    pass


def sdist_name(version: str) -> str:
    return f"{pins.SUPERVISOR.distribution.replace('-', '_')}-{version}.tar.gz"


def ensure_sdist(version: str, layout: Layout = DEFAULT) -> Path:
    """The sha256-checked sdist of task-sdk ``version`` in the cache, downloaded with pip if missing."""
    expected = pins.SDK_SDIST_SHA256.get(version)
    if expected is None:
        known = ", ".join(pins.SDK_SDIST_SHA256)
        raise SupervisorTestsError(f"task-sdk {version}: no sdist sha256 pinned (pinned: {known})")
    target = layout.cache / "sdists" / sdist_name(version)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
            fetch.pip_download(version, Path(tmp), pins.SUPERVISOR.distribution, sdist=True)
            got = Path(tmp) / sdist_name(version)
            if not got.is_file():
                raise SupervisorTestsError(f"pip download of task-sdk {version}'s sdist gave no {got.name}")
            os.replace(got, target)
    digest = fetch.sha256_file(target)
    if digest != expected:
        target.unlink()
        raise SupervisorTestsError(
            f"refusing {sdist_name(version)}: sha256 {digest}, pinned {expected} (removed from the cache)"
        )
    return target


def extract_tests(sdist: Path, dest: Path) -> Path:
    """The sdist's ``tests/`` tree under ``dest``; returns ``dest/tests``."""
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/", 1)[0]
        wanted = [m for m in tf.getmembers() if m.name.startswith(f"{root}/tests/")]
        if not any(m.name == f"{root}/tests/{TEST_FILE}" for m in wanted):
            raise SupervisorTestsError(f"{sdist.name} has no tests/{TEST_FILE}")
        for m in wanted:
            m.name = m.name.split("/", 1)[1]
            parts = PurePosixPath(m.name).parts
            # why: tarfile's filter= (3.12, 3.11.4) is missing on Debian 12's 3.11.2; these checks are
            # the part of its "data" filter an sdist's tests/ tree needs: plain files and
            # directories, each staying under dest.
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in parts:
                raise SupervisorTestsError(
                    f"{sdist.name}: refusing member {m.name!r} (not a plain file under tests/)"
                )
            m.mode = 0o755 if m.isdir() else 0o644
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, members=wanted, filter="data")
        else:
            tf.extractall(dest, members=wanted)  # the members were checked above
    return dest / "tests"


def line_of(sdk_version: str) -> pins.Line:
    """The line whose overlay has a supervisor for task-sdk ``sdk_version``."""
    if found := next((line for line in pins.LINES if sdk_version in line.sdk_versions), None):
        return found
    known = ", ".join(v for line in pins.LINES for v in line.sdk_versions)
    raise SupervisorTestsError(f"task-sdk {sdk_version}: no line's overlay has its supervisor ({known})")


def supervisors(line: pins.Line, sdk_version: str, layout: Layout = DEFAULT) -> dict[str, bytes]:
    """``unpatched``: the release's own supervisor.py from its verified wheel, checked against the pin;
    ``patched``: the overlay's for the same release."""
    pin = line.supervisor_pin(sdk_version)
    if pin is None:
        raise SupervisorTestsError(f"line {line.name} has no verified supervisor for task-sdk {sdk_version}")
    unpatched = fetch.read_source(fetch.ensure_pin(pin, sdk_version, layout), pin.file.package_path)
    if fetch.sha256_bytes(unpatched) != pin.source_sha256:
        raise SupervisorTestsError(f"task-sdk {sdk_version}'s {pin.file.package_path} is not the pinned one")
    root = wheels.overlay_root(line, pin.file.distribution, sdk_version, layout)
    patched = root / pin.file.package_path
    if not patched.is_file():
        raise SupervisorTestsError(f"{layout.rel(patched)}: no overlay; run `nox -s apply -- --write` first")
    return {"unpatched": unpatched, "patched": patched.read_bytes()}


def run_once(
    python: Path, tests: Path, layout: Layout = DEFAULT, extra: Sequence[str] = ()
) -> upstream_tests.Outcome:
    """pytest on the extracted file, from the sdist's tests/ as root (its conftest is the top one)."""
    (tests / "pytest.ini").write_text("[pytest]\n")
    home = tests.parent / "airflow-home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": venvs.JWT_SECRET,
        # as upstream's test config (unit_tests.cfg) has it: task-sdk 1.4's own parser has no default
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        # the sdist's helpers (``task_sdk``), then the stand-ins for upstream's ``tests_common``
        "PYTHONPATH": os.pathsep.join([str(tests), str(upstream_tests.standins_dir(layout))]),
    }
    env.pop(upstream_tests.START_METHOD_ENV, None)
    args = ["-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", f"--timeout={PER_TEST_TIMEOUT}"]
    cmd = [str(python), *args, TEST_FILE, *extra]
    return upstream_tests.run_pytest(cmd, tests, env, "python -m pytest " + TEST_FILE, RUN_TIMEOUT)


def run(
    sdk_version: str, layout: Layout = DEFAULT, extra: Sequence[str] = ()
) -> dict[str, upstream_tests.Outcome]:
    """Upstream's test_supervisor.py of ``sdk_version`` on its unpatched, then its patched supervisor.py."""
    line = line_of(sdk_version)
    sdist = ensure_sdist(sdk_version, layout)
    files = supervisors(line, sdk_version, layout)
    python = venvs.ensure(line, layout, upstream_tests=True, sdk=sdk_version)
    out = {}
    with tempfile.TemporaryDirectory(prefix="lepatch-supervisor-tests-") as tmp:
        for which, data in files.items():
            work = Path(tmp) / which
            tests = extract_tests(sdist, work)
            venvs.install_sources(python, {pins.SUPERVISOR.package_path: data})
            out[which] = run_once(python, tests, layout, extra)
            shutil.rmtree(work, ignore_errors=True)
    # why: the venv is shared with the executor's upstream tests; leave its task-sdk as pinned
    venvs.install_sources(python, {pins.SUPERVISOR.package_path: files["unpatched"]})
    return out


def changed(outcomes: dict[str, upstream_tests.Outcome]) -> tuple[list[str], list[str]]:
    """(tests failing only when patched, tests failing only when unpatched)."""
    unpatched, patched = set(outcomes["unpatched"].failed), set(outcomes["patched"].failed)
    return sorted(patched - unpatched), sorted(unpatched - patched)


def _cmd(args: argparse.Namespace) -> int:
    versions = [*(args.sdk or []), *(line.sdk_version for line in args.line or [])]
    if not versions:
        versions = [line.sdk_version for line in pins.LINES if line.sdk_version]
    worse = False
    for version in versions:
        outcomes = run(version, extra=args.pytest_args or [])
        for which, outcome in outcomes.items():
            if args.verbose or not outcome.counts:
                print(outcome.output.rstrip())
            print(f"task-sdk {version} {which}: {outcome.summary()} ({outcome.total} tests)")
        only_patched, only_unpatched = changed(outcomes)
        for test in only_patched:
            print(f"  fails only patched: {test}")
        for test in only_unpatched:
            print(f"  fails only unpatched: {test}")
        worse |= bool(only_patched) or not outcomes["patched"].counts
    return 1 if worse else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "upstream-supervisor-tests",
        help="run each task-sdk release's own test_supervisor.py (from its sdist) unpatched and patched",
    )
    p.add_argument(
        "--line", action="append", type=pins.line_arg, help="the line's base task-sdk release (repeatable)"
    )
    p.add_argument("--sdk", action="append", help="a task-sdk release the lines cover (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true", help="print pytest's whole output")
    p.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (-k, -x)")
    p.set_defaults(func=_cmd)
