"""The patched wheels on every core release a line covers, in real venvs with the task-sdk each one pins.

Each apache-airflow-core release requires one task-sdk release exactly, and task-sdk's
supervisor.py differs between most of them: the overlay carries a patched supervisor per task-sdk
release (``airflow_overlay/<line>/task-sdk-<v>/``), and ``nox -s wheels`` puts each into that
release's wheel. Here, for every core release whose task-sdk is not its line's base: the supervisor
regression test fails on the pristine release and passes once the release's two patched wheels are
installed, and the way back (PyPI's wheels reinstalled) brings both files back byte for byte.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.delivery import wheels
from tools.engine import venvs
from tools.shared import pins
from tools.shared.layout import DEFAULT as LAYOUT

UV = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
HAVE_UV = Path(UV).is_file()
SUPERVISOR_TESTS = LAYOUT.root / pins.SUPERVISOR.tests_dir

# Every core release whose task-sdk ships a supervisor.py of its own (the base's, and the same file of
# the releases it covers, are tested against each line's base in `nox -s tests`).
RELEASES = [
    pytest.param(line, core, id=core)
    for line in pins.LINES
    for core, sdk in line.core_sdk.items()
    if sdk in line.sdk_releases
]

pytestmark = [
    pytest.mark.skipif(not HAVE_UV, reason="uv is needed to build real Airflow venvs"),
    pytest.mark.timeout(600),
]


def airflow_env(tmp: Path, core: str, sdk: str) -> Path:
    """A venv with apache-airflow-core ``core`` and task-sdk ``sdk`` from their verified wheels."""
    # why unconstrained: the line's lock is its base's, and older releases need older pins; an operator's
    # `pip install apache-airflow-core==X` resolves the same way
    return venvs.ensure_release(tmp / f"env-{core}", core, sdk, packages=["pytest", "pytest-timeout"])


def supervisor_tests(py: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(py), "-m", "pytest", str(SUPERVISOR_TESTS), "-q", "-p", "no:cacheprovider", "-x"],
        capture_output=True,
        text=True,
        env=venvs.test_env(home),
        cwd=home,
        timeout=300,
    )


@pytest.mark.parametrize(("line", "core"), RELEASES)
def test_each_core_release_gets_its_own_supervisor_fix(tmp_path: Path, line: pins.Line, core: str) -> None:
    sdk = line.core_sdk[core]
    py = airflow_env(tmp_path, core, sdk)
    site = venvs.purelib(py)
    executor, supervisor = site / pins.EXECUTOR.package_path, site / pins.SUPERVISOR.package_path
    originals = (executor.read_bytes(), supervisor.read_bytes())
    home = tmp_path / "home"
    home.mkdir()

    before = supervisor_tests(py, home)
    assert before.returncode == 1, f"the stall does not reproduce on task-sdk {sdk}:\n{before.stdout[-2000:]}"

    built = wheels.build_line(line, tmp_path / "wheels", core=core)
    venvs.pip(py, "install", "--quiet", "--no-deps", *map(str, built))
    env = wheels.inspect(py)
    assert set(env.records) == {pins.DISTRIBUTION, pins.SUPERVISOR.distribution} and not env.changed()
    overlay = wheels.overlay_root(line, pins.SUPERVISOR.distribution, sdk)
    assert supervisor.read_bytes() == (overlay / pins.SUPERVISOR.package_path).read_bytes()
    assert executor.read_bytes() == (LAYOUT.overlay / line.name / pins.EXECUTOR.package_path).read_bytes()
    after = supervisor_tests(py, home)
    assert after.returncode == 0, after.stdout[-2000:]

    # the way back: PyPI's wheels of the same release reinstalled over the patched ones
    venvs.pip(
        py, "install", "--quiet", "--no-deps", "--reinstall", *map(str, venvs.release_wheels(core, sdk))
    )
    assert (executor.read_bytes(), supervisor.read_bytes()) == originals
    assert not wheels.inspect(py).records
    assert hashlib.sha256(originals[1]).hexdigest() == line.supervisor_pin(sdk).source_sha256  # type: ignore[union-attr]
