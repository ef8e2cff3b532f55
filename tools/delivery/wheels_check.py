"""``nox -s wheels``: build the patched wheels (tools.delivery.wheels), or with ``--check-install --line 3.3``
install them as users install Airflow and check the result.

In a fresh venv (``python -m venv``, its own pip), one unchanged command an operator types, with the
built folder as ``--find-links`` and the line's constraints as Airflow publishes them::

    pip install --upgrade --find-links dist/wheels -c constraints/e2e-celery-3.3.txt \\
        apache-airflow-core==3.3.2 apache-airflow-task-sdk==1.3.2 apache-airflow-providers-celery==<its pin>

then checks, each failure one line naming what is wrong: both distributions carry the local label,
``pip check`` is clean, every file each wheel's ``lepatch.json`` records is installed with the
hash it records (the supervisor is the overlay's), ``overlay --python`` reports the wheels,
the installed supervisor reaps a task process that closed its sockets within a second (the series'
own test of it, tests/supervisor/, run in that venv), and the way back to PyPI's build
(``pip install --force-reinstall --no-deps 'apache-airflow-task-sdk===1.3.2'`` and the same for
core) leaves the pinned upstream files and a clean ``pip check``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.delivery import wheels
from tools.engine import fetch, venvs
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

CELERY = "apache-airflow-providers-celery"
REAP_TESTS = "tests/supervisor/test_supervisor_exit_wait.py"


class CheckError(ToolError):
    """One check of the installed wheels failed; the message names it."""


def constraints_for(line: pins.Line, layout: Layout = DEFAULT) -> tuple[Path, str | None]:
    """The constraints to install with, and the Celery provider's pin in them (None: core alone)."""
    celery = layout.constraints / f"e2e-celery-{line.name}.txt"
    if celery.is_file():
        m = re.search(rf"^{re.escape(CELERY)}==(\S+)\s*$", celery.read_text(), re.M)
        if m:
            return celery, m.group(1)
    return layout.constraints / f"{line.name}.txt", None


def check_files(python: Path, wheel_records: dict[str, dict[str, Any]]) -> list[str]:
    """Every file each wheel recorded, as installed: one line per file, raising on the first mismatch."""
    site = venvs.purelib(python)
    said = []
    for dist, rec in sorted(wheel_records.items()):
        for entry in rec["files"]:
            path = site / entry["path"]
            got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
            if got != entry["sha256_after"]:
                raise CheckError(f"{path}: sha256 {got}, {dist}'s wheel recorded {entry['sha256_after']}")
            was = entry["sha256_before"][:16]
            said.append(f"{dist}: {entry['path']} sha256 {got[:16]} (the overlay's; upstream's {was})")
    return said


def _wheel(out: Path, dist: str, version: str) -> Path:
    return out / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"


def _records(out: Path, versions: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The lepatch.json of each built wheel of core and task-sdk at the installed ``versions``."""
    built = {
        d: _wheel(out, d, versions[d])
        for d in (pins.DISTRIBUTION, pins.SUPERVISOR.distribution)
        if d in versions
    }
    return {d: wheels.read_record(w) for d, w in built.items() if w.is_file()}


def check_line(line: pins.Line, out: Path, base_python: str, layout: Layout = DEFAULT) -> None:
    label = wheels.local_label(layout)
    core, sdk = pins.DISTRIBUTION, pins.SUPERVISOR.distribution
    sdk_version = line.core_sdk[line.version]
    expected = {core: f"{line.version}+{label}", sdk: f"{sdk_version}+{label}"}
    if missing := [v for d, v in expected.items() if not _wheel(out, d, v).is_file()]:
        print(f"building the {line.name} wheels into {layout.rel(out)} (missing: {', '.join(missing)})")
        wheels.build([line], out, layout)
    constraints, celery = constraints_for(line, layout)
    # the command `nox -s overlay` prints (tools.delivery.install_commands), with Airflow's constraints
    reqs = [f"{core}=={line.version}", f"{sdk}=={sdk_version}", *([f"{CELERY}=={celery}"] if celery else [])]
    with tempfile.TemporaryDirectory(prefix="lepatch-wheels-check-") as tmp:
        args = ["--upgrade", "--find-links", str(out)]
        print(f"$ {base_python} -m venv VENV; VENV/bin/pip install", *args, "-c", constraints, *reqs)
        python = venvs.make(Path(tmp) / "venv", base_python, [*args, *reqs], constraints, own_pip=True)
        got = venvs.installed(python, own_pip=True)
        for dist, want in expected.items():
            if got.get(dist) != want:
                raise CheckError(f"{dist}: pip installed {got.get(dist)}, expected the patched {want}")
        print(
            f"installed: {', '.join(f'{d} {got[d]}' for d in (core, sdk))}"
            + (f", {CELERY} {got[CELERY]}" if celery else "")
        )
        print(venvs.pip(python, "check", own_pip=True).strip())
        for said in check_files(python, _records(out, got)):
            print(said)
        installed = wheels.inspect(python)
        if set(installed.records) != set(expected) or installed.changed():
            raise CheckError(
                f"overlay --python: expected both patched wheels as built ({installed.describe()})"
            )
        print(f"overlay --python: {installed.describe()}")
        _reap_check(python, layout, Path(tmp))
        _way_back(python, line, sdk_version)


def _reap_check(python: Path, layout: Layout, tmp: Path) -> None:
    """The series' own test of the supervisor's fix, in the installed venv (pytest pinned as the tools)."""
    pin = ["-c", str(layout.constraints / "tools.txt")]
    venvs.pip(python, "install", "--quiet", *pin, *venvs.TEST_PACKAGES, own_pip=True)
    home = tmp / "airflow-home"
    home.mkdir()
    out = venvs.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", layout.root / REAP_TESTS],
        env=venvs.test_env(home, layout),
        cwd=layout.root,
        timeout=venvs.INSTALL_TIMEOUT,
    )
    print(f"{REAP_TESTS}: {out.strip().splitlines()[-1]}")


def _way_back(python: Path, line: pins.Line, sdk_version: str) -> None:
    """What docs/package.md tells an operator: PyPI's builds back, the pinned files in place."""
    core, sdk = pins.DISTRIBUTION, pins.SUPERVISOR.distribution
    back = [f"{sdk}==={sdk_version}", f"{core}==={line.version}"]
    venvs.pip(python, "install", "--quiet", "--force-reinstall", "--no-deps", *back, own_pip=True)
    got = venvs.installed(python, own_pip=True)
    for dist, want in ((core, line.version), (sdk, sdk_version)):
        if got.get(dist) != want:
            raise CheckError(f"way back: {dist} is {got.get(dist)}, expected PyPI's {want}")
    site = venvs.purelib(python)
    pin = line.supervisor_pin(sdk_version)
    for file, expect in (
        (pins.EXECUTOR, line.source_sha256),
        (pins.SUPERVISOR, pin.source_sha256 if pin else ""),
    ):
        digest = hashlib.sha256((site / file.package_path).read_bytes()).hexdigest()
        if digest != expect:
            raise CheckError(f"way back: {file.package_path} sha256 {digest}, pinned upstream {expect}")
    print(venvs.pip(python, "check", own_pip=True).strip())
    if (installed := wheels.inspect(python)).records:
        raise CheckError(f"way back: a patched wheel is still installed ({installed.describe()})")
    print(
        f"way back ({' '.join(back)}): {core} {line.version}, {sdk} {sdk_version}, the pinned upstream files"
    )


# -------------------------------------------------------------------- CLI


def _cmd_wheels(args: argparse.Namespace) -> int:
    lines = pins.selected_lines(args)
    out = args.out.resolve()
    if args.check_install:
        for line in lines:
            check_line(line, out, args.python or sys.executable)
        return 0
    for wheel in wheels.build(lines, out):
        print(f"{DEFAULT.rel(wheel)} sha256 {fetch.sha256_file(wheel)[:16]}")
    print(
        f"index: {DEFAULT.rel(out / 'simple')}; the install command of a release: "
        "`nox -s overlay -- --release <release>`"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "wheels",
        help="rebuild Airflow's own wheels (core, task-sdk) with the series' files, per covered release",
    )
    pins.add_line_options(p)
    p.add_argument("--out", type=Path, default=wheels.DEFAULT_OUT, help="default: dist/wheels/")
    p.add_argument(
        "--check-install",
        action="store_true",
        help="install the built wheels into a fresh venv as users install Airflow, and check them",
    )
    p.add_argument("--python", default=None, help="--check-install: the interpreter of the new venv")
    p.set_defaults(func=_cmd_wheels)
