"""The e2e lock's cut-off date, from a fake simple-API page; the compile is faked too."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tools.engine import fetch
from tools.measure.e2e import lock
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import Layout

LINE = pins.get_line("3.2")


def page(name: str, files: dict[str, str], sha: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "files": [
            {"filename": fn, "upload-time": t, "hashes": {"sha256": sha if fn.endswith(".whl") else "x"}}
            for fn, t in files.items()
        ],
    }


def pages() -> dict[str, dict[str, Any]]:
    v = LINE.version
    return {
        pins.DISTRIBUTION: page(
            pins.DISTRIBUTION,
            {
                f"apache_airflow_core-{v}-py3-none-any.whl": "2026-05-29T05:20:08.257918Z",
                f"apache_airflow_core-{v}.tar.gz": "2026-05-29T05:20:10Z",
                f"apache_airflow_core-{v}1-py3-none-any.whl": "2027-01-01T00:00:00Z",  # another version
            },
            LINE.wheel_sha256,
        ),
        "apache-airflow": page(
            "apache-airflow", {f"apache_airflow-{v}-py3-none-any.whl": "2026-05-29T05:22:00Z"}, "y"
        ),
    }


def test_cutoff_is_the_last_upload_of_the_release_plus_the_margin() -> None:
    got = lock.release_cutoff(LINE, pages().__getitem__)
    assert got == datetime(2026, 5, 29, 6, 22, 0, tzinfo=timezone.utc)


def test_a_wheel_the_index_lists_with_another_hash_is_refused() -> None:
    fake = pages()
    fake[pins.DISTRIBUTION]["files"][0]["hashes"]["sha256"] = "0" * 64
    with pytest.raises(ToolError, match=r"apache-airflow-core 3\.2\.2: the index lists .* pinned") as info:
        lock.release_cutoff(LINE, fake.__getitem__)
    assert "\n" not in str(info.value)


def test_a_version_without_files_is_an_error() -> None:
    with pytest.raises(ToolError, match=r"apache-airflow 3\.2\.2: no files with an upload time"):
        lock.release_cutoff(LINE, {**pages(), "apache-airflow": {"files": []}}.__getitem__)


def test_lock_line_compiles_as_of_the_cutoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(root=tmp_path)
    monkeypatch.setattr(fetch, "ensure_wheel", lambda line, layout: Path("unused.whl"))
    monkeypatch.setattr(lock, "oldest_python", lambda wheel: "3.10")
    seen: list[dict[str, Any]] = []

    def fake_compile(requirements: list[str], command: str, python_version: str, **kw: str) -> str:
        seen.append({"python_version": python_version, **kw})
        return f"apache-airflow=={LINE.version}\npydantic==2.13.4\n"

    target = lock.lock_line(LINE, layout, pages().__getitem__, fake_compile)
    assert target == tmp_path / "constraints" / "e2e-3.2.txt"
    assert seen == [{"python_version": "3.10", "exclude_newer": "2026-05-29T06:22:00Z"}]
    text = target.read_text()
    assert text.startswith("# The e2e environment of 3.2 (3.2.2), as of 2026-05-29T06:22:00Z")
    assert "pydantic==2.13.4" in text


def test_lock_core_compiles_another_release_as_of_its_own_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(root=tmp_path)
    monkeypatch.setattr(fetch, "ensure_pin", lambda pin, version, layout: Path(f"{version}.whl"))
    monkeypatch.setattr(lock, "oldest_python", lambda wheel: f"from {wheel}")
    fake = {
        pins.DISTRIBUTION: page(
            pins.DISTRIBUTION,
            {
                "apache_airflow_core-3.2.0-py3-none-any.whl": "2026-03-02T10:00:00Z",
                f"apache_airflow_core-{LINE.version}-py3-none-any.whl": "2026-05-29T05:20:08Z",
            },
            LINE.covers["3.2.0"],
        ),
        "apache-airflow": page(
            "apache-airflow", {"apache_airflow-3.2.0-py3-none-any.whl": "2026-03-02T10:05:00Z"}
        ),
    }
    seen: list[tuple[list[str], str, str, str]] = []

    def fake_compile(requirements: list[str], command: str, python_version: str, exclude_newer: str) -> str:
        seen.append((requirements, command, python_version, exclude_newer))
        return "apache-airflow==3.2.0\naiosqlite==0.21.0\n"

    target = lock.lock_line(LINE, layout, fake.__getitem__, fake_compile, core="3.2.0")
    assert target == tmp_path / "constraints" / "e2e-3.2.0.txt"
    assert seen == [
        (
            ["apache-airflow[postgres]==3.2.0", "apache-airflow-core==3.2.0"],
            "python -m tools e2e-lock --line 3.2 --core 3.2.0",
            "from 3.2.0.whl",
            "2026-03-02T11:05:00Z",  # 3.2.0's day, not 3.2.2's
        )
    ]
    assert target.read_text().startswith(
        "# The e2e environment of 3.2 (3.2.2) on apache-airflow-core 3.2.0, as of"
    )
