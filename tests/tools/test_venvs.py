"""``venvs``: the one builder (``make``, uv or an operator's pip), its installs, and the venvs over it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tools.engine import fetch, venvs
from tools.shared import pins
from tools.shared.errors import ToolError


def test_release_pins_find_the_core_and_task_sdk_pins_wherever_they_are() -> None:
    core, sdk = venvs.release_pins("3.3.0")
    assert (core.version, "3.3.0" in core.covers) == ("3.3.2", True)
    assert (sdk.file, sdk.version) == (pins.SUPERVISOR, "1.3.0")  # its own supervisor.py
    core, sdk = venvs.release_pins("3.1.6")
    assert (core.version, sdk.version, "1.1.6" in sdk.covers) == ("3.1.8", "1.1.8", True)
    assert venvs.release_pins("3.3.2", "1.2.2")[1].version == "1.2.2"  # another line's task-sdk
    with pytest.raises(ToolError, match=r"^apache-airflow-core 3\.1\.3 is not a release any line pins$"):
        venvs.release_pins("3.1.3")
    with pytest.raises(
        ToolError, match=r"^apache-airflow-task-sdk 1\.0\.0 \(for apache-airflow-core 3\.3\.0\)"
    ):
        venvs.release_pins("3.3.0", "1.0.0")


def test_ensure_release_installs_both_verified_wheels_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uv: list[tuple[str, ...]] = []

    def fake_uv(*args: str, env: object = None) -> str:
        uv.append(args)
        if args[0] == "venv":
            (Path(args[-1]) / "bin").mkdir(parents=True)
            (Path(args[-1]) / "bin" / "python").touch()
        return ""

    monkeypatch.setattr(venvs, "run_uv", fake_uv)
    monkeypatch.setattr(
        fetch, "ensure_pin", lambda pin, version, layout: Path(f"/cache/{pin.file.name}-{version}")
    )
    lock = tmp_path / "e2e-3.3.0.txt"
    lock.write_text("aiosqlite==0.21.0\n")
    said: list[str] = []
    venv = tmp_path / "env"
    kw = {"packages": ["apache-airflow[postgres]==3.3.0"], "constraints": lock, "python": sys.executable}
    py = venvs.ensure_release(venv, "3.3.0", say=said.append, **kw)  # type: ignore[arg-type]
    assert py == venv / "bin" / "python"
    wheels = ("/cache/local_executor.py-3.3.0", "/cache/supervisor.py-1.3.0")
    install = ("pip", "install", "--python", str(py), "--quiet")
    assert uv[1] == (*install, "-c", str(lock), *wheels, "apache-airflow[postgres]==3.3.0")
    what = "apache-airflow-core 3.3.0, apache-airflow-task-sdk 1.3.0, apache-airflow[postgres]==3.3.0"
    assert said == [f"creating {venv}: {what} (uv)"]
    stamp = json.loads((venv / "lepatch-stamp.json").read_text())
    # the keys venvs made before make() composed the stamp carry: those venvs are reused as they are
    assert set(stamp) == {"python", "release", "wheel_sha256", "packages", "constraints_sha256"}
    assert stamp["release"] == ["3.3.0", "1.3.0"]
    assert stamp["wheel_sha256"] == [
        pins.get_line("3.3").covers["3.3.0"],
        pins.get_line("3.3").sdk_releases["1.3.0"],
    ]
    venvs.ensure_release(venv, "3.3.0", **kw)  # type: ignore[arg-type]
    assert len(uv) == 2  # the same inputs: reused
    lock.write_text("aiosqlite==0.20.0\n")
    venvs.ensure_release(venv, "3.3.0", **kw)  # type: ignore[arg-type]
    assert len(uv) == 4  # another lock: made again
    venvs.ensure_release(tmp_path / "bare", "3.3.0", python=sys.executable)
    assert "-c" not in uv[-1]  # no constraints: an operator's plain resolution


def test_a_venv_for_the_operators_pip_is_made_afresh_by_python_m_venv_and_its_own_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(cmd: list[object], *, env: dict[str, str] | None = None, **kw: object) -> str:
        ran.append(([str(c) for c in cmd], env or {}))
        return '[{"name": "Apache-Airflow-Core", "version": "3.3.2+lepatch.10"}]'

    monkeypatch.setattr(venvs, "run", fake_run)
    monkeypatch.setattr(venvs, "run_uv", lambda *a, **k: pytest.fail("uv is not the operator's pip"))
    monkeypatch.setenv("PIP_CONSTRAINT", "/elsewhere.txt")
    lock, venv, args = tmp_path / "c.txt", tmp_path / "v", ["--find-links", "dist/wheels", "x==1"]
    py = venvs.make(venv, sys.executable, args, lock, own_pip=True)
    venvs.make(venv, sys.executable, args, lock, own_pip=True)  # no stamp: made afresh each time
    assert [cmd for cmd, _ in ran] == 2 * [
        [sys.executable, "-m", "venv", str(venv)],
        [str(py), "-m", "pip", "install", "--quiet", "-c", str(lock), *args],
    ]
    assert "PIP_CONSTRAINT" not in ran[1][1]  # the line's constraints alone decide
    assert venvs.installed(py, own_pip=True) == {"apache-airflow-core": "3.3.2+lepatch.10"}
    assert ran[-1][0] == [str(py), "-m", "pip", "list", "--format", "json"]


def test_a_failed_command_is_named_with_the_end_of_its_output_from_the_error_on() -> None:
    script = "import sys; print('Resolved 3 packages'); sys.exit('error: no version of x\\n  hint: y')"
    with pytest.raises(ToolError) as info:
        venvs.run([sys.executable, "-c", script, "extra", "args"])
    name = f"{Path(sys.executable).name} -c {script} extra ..."
    assert str(info.value) == f"`{name}` failed with exit 1: error: no version of x\n  hint: y"
    with pytest.raises(ToolError, match=r"gave no result within 0 s$"):
        venvs.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.2)


def test_another_task_sdk_release_gets_its_own_upstream_tests_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[object, ...]] = []

    def make(venv: Path, *a: object, wheels: object, **k: object) -> Path:
        made.append((*a[:3], wheels))
        return venv

    monkeypatch.setattr(venvs, "make", make)
    monkeypatch.setattr(fetch, "ensure_pin", lambda pin, version=None, layout=None: Path(f"/{version}"))
    monkeypatch.setattr(venvs, "interpreter_for", lambda wheel, python=None: "py")
    line, tests = pins.get_line("3.3"), [*venvs.TEST_PACKAGES, *venvs.UPSTREAM_TEST_PACKAGES]
    assert venvs.ensure(line, upstream_tests=True, sdk="1.3.2").name == "3.3-upstream-tests"
    assert venvs.ensure(line, upstream_tests=True, sdk="1.3.0").name == "upstream-supervisor-1.3.0"
    # core 3.3.0 (the one requiring 1.3.0), the test packages pinned as for the line, the rest resolved
    wheels = [Path("/3.3.0"), Path("/1.3.0")]
    assert made[1] == ("py", tests, [venvs.upstream_tests_constraints(line)], wheels)
