"""``venvs.ensure_release``: a venv of any core release a line covers, with the task-sdk it requires."""

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
    assert uv[1] == (
        "pip",
        "install",
        "--quiet",
        "--python",
        str(py),
        "-c",
        str(lock),
        "/cache/local_executor.py-3.3.0",
        "/cache/supervisor.py-1.3.0",
        "apache-airflow[postgres]==3.3.0",
    )
    what = "apache-airflow-core 3.3.0, apache-airflow-task-sdk 1.3.0, apache-airflow[postgres]==3.3.0"
    assert said == [f"creating {venv}: {what} (uv)"]
    stamp = json.loads((venv / "lepatch-stamp.json").read_text())
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
