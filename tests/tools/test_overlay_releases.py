"""The overlay on every core release a line covers, in real venvs with the task-sdk each one pins.

Each apache-airflow-core release requires one task-sdk release exactly, and task-sdk's
supervisor.py differs between most of them: the overlay carries a patched supervisor per task-sdk
release (``airflow_overlay/<line>/task-sdk-<v>/``). Here, for every core release whose task-sdk is
not its line's base: the supervisor regression test fails on the pristine release and passes once
the overlay is installed, and ``restore`` brings both files back byte for byte. Then each kind of
refusal is followed as it advises, command and all, and must end in an installed overlay.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.delivery import overlay_install as oi
from tools.engine import fetch, venvs
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


def airflow_env(tmp: Path, core: str, sdk: str, *, no_deps_sdk: bool = False) -> Path:
    """A venv with apache-airflow-core ``core`` and task-sdk ``sdk`` from their verified wheels;
    ``no_deps_sdk``: core with the task-sdk it requires, then ``sdk`` forced in over it."""
    # why unconstrained: the line's lock is its base's, and older releases need older pins; an operator's
    # `pip install apache-airflow-core==X` resolves the same way
    py = venvs.ensure_release(
        tmp / f"env-{core}", core, None if no_deps_sdk else sdk, packages=["pytest", "pytest-timeout"]
    )
    if no_deps_sdk:  # a pair pip would refuse: forced, as a hand-edited environment has it
        _, sdk_pin = venvs.release_pins(core, sdk)
        sdk_wheel = fetch.ensure_pin(sdk_pin, sdk)
        venvs.run_uv("pip", "install", "--quiet", "--no-deps", "--python", str(py), str(sdk_wheel))
    return py


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
    inst = oi.OverlayInstaller(py, out=io.StringIO())
    env = inst.inspect()
    targets = {f.file: f.target for f in env.files}
    executor, supervisor = targets[pins.EXECUTOR], targets[pins.SUPERVISOR]
    originals = (executor.read_bytes(), supervisor.read_bytes())
    home = tmp_path / "home"
    home.mkdir()

    before = supervisor_tests(py, home)
    assert before.returncode == 1, f"the stall does not reproduce on task-sdk {sdk}:\n{before.stdout[-2000:]}"

    # the supervisor alone, as on a Celery worker's host: the executor stays as released
    alone = oi.OverlayInstaller(py, out=io.StringIO(), only=pins.SUPERVISOR)
    st = alone.install()
    assert [f.file for f in st.record.files] == ["supervisor.py"]  # type: ignore[union-attr]
    assert supervisor.read_bytes() == inst.overlay_path(line, pins.SUPERVISOR, sdk).read_bytes()
    assert executor.read_bytes() == originals[0]
    after = supervisor_tests(py, home)
    assert after.returncode == 0, after.stdout[-2000:]
    alone.restore()
    assert (executor.read_bytes(), supervisor.read_bytes()) == originals

    # both files, with the smoke dispatch
    assert inst.install().state is oi.OverlayState.INSTALLED
    assert supervisor.read_bytes() == inst.overlay_path(line, pins.SUPERVISOR, sdk).read_bytes()
    assert executor.read_bytes() == inst.overlay_path(line).read_bytes()
    inst.restore()
    assert (executor.read_bytes(), supervisor.read_bytes()) == originals
    assert oi.sha256(originals[1]) == line.supervisor_pin(sdk).source_sha256  # type: ignore[union-attr]


def _advice(message: str) -> list[str]:
    """The commands a refusal names, in backticks, minus the tools' own (nox) ones."""
    return [c for c in re.findall(r"`([^`]+)`", message) if not c.startswith("nox ")]


def _follow(command: str, uv_dir: Path) -> None:
    """Run an operator's command as written, with uv on PATH as an operator who has it would."""
    env = {
        **os.environ,
        "PATH": f"{uv_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "UV_PYTHON_DOWNLOADS": "never",
    }
    proc = subprocess.run(shlex.split(command), capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"`{command}` failed: {proc.stderr[-1500:]}"


def test_a_task_sdk_refusal_followed_as_written_ends_installed(tmp_path: Path) -> None:
    """core 3.3.2 beside another line's task-sdk (forced): both ways out the refusal names work."""
    py = airflow_env(tmp_path, "3.3.2", "1.2.2", no_deps_sdk=True)
    inst = oi.OverlayInstaller(py, out=io.StringIO())
    with pytest.raises(oi.OverlayError) as exc:
        inst.install()
    message = str(exc.value)
    assert "\n" not in message and message.endswith("refusing, nothing changed")
    # core 3.3.2 does not even import beside task-sdk 1.2.2: the executor alone is no way out here
    assert "--only executor" not in message

    # the pair core 3.3.2 requires
    (command,) = _advice(message)
    assert "'apache-airflow-core==3.3.2' 'apache-airflow-task-sdk==1.3.2'" in command
    _follow(command, Path(UV).parent)
    assert inst.install().state is oi.OverlayState.INSTALLED


def test_an_unverified_core_refusal_followed_as_written_ends_installed(tmp_path: Path) -> None:
    """3.1.3 ships another local_executor.py: the advice names 3.1.5 with its task-sdk, and it installs."""
    venv = tmp_path / "env-3.1.3"
    venvs.run_uv("venv", "--quiet", "-p", sys.executable, str(venv))
    py = venv / "bin" / "python"
    requirement = "apache-airflow-core==3.1.3"  # not pinned: from the index, as an operator has it
    venvs.run_uv("pip", "install", "--quiet", "--python", str(py), requirement)
    inst = oi.OverlayInstaller(py, out=io.StringIO())
    with pytest.raises(oi.OverlayError) as exc:
        inst.install()
    (command,) = _advice(str(exc.value))
    assert "'apache-airflow-core==3.1.5' 'apache-airflow-task-sdk==1.1.5'" in command
    _follow(command, Path(UV).parent)
    st = inst.install()
    assert st.state is oi.OverlayState.INSTALLED
    assert [(f.file, f.version) for f in st.record.files] == [  # type: ignore[union-attr]
        ("local_executor.py", "3.1.5"),
        ("supervisor.py", "1.1.5"),
    ]
