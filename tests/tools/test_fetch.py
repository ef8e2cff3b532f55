"""Wheel cache: a hash mismatch is refused in one line and leaves nothing behind."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tools.engine import fetch
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import Layout


def test_mismatched_cached_wheel_is_refused_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEPATCH_CACHE", str(tmp_path / "cache"))
    layout = Layout(root=tmp_path)
    fake = layout.cache / fetch.wheel_filename("3.3.2")
    fake.parent.mkdir(parents=True)
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(pins.PACKAGE_PATH, "print('not airflow')\n")
    got = fetch.sha256_file(fake)
    with pytest.raises(ToolError) as info:
        fetch.ensure_wheel("3.3", layout)
    message = str(info.value)
    assert "\n" not in message
    assert "3.3.2" in message and pins.PRIMARY.wheel_sha256 in message and got in message
    assert list(layout.cache.iterdir()) == []


def test_mismatched_download_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEPATCH_CACHE", str(tmp_path / "cache"))

    def fake_download(version: str, dest: Path) -> None:
        (dest / fetch.wheel_filename(version)).write_bytes(b"not a wheel")

    monkeypatch.setattr(fetch, "pip_download", fake_download)
    layout = Layout(root=tmp_path)
    with pytest.raises(ToolError, match=r"refusing apache-airflow-core 3\.3\.1: wheel sha256 is"):
        fetch.ensure_wheel("3.3.1", layout)
    assert [p for p in layout.cache.rglob("*") if p.is_file()] == []


def test_covered_versions_resolve_to_their_own_hash() -> None:
    assert fetch.pinned_wheel("3.2.0") == ("3.2.0", pins.get_line("3.2").covers["3.2.0"])
    assert fetch.pinned_wheel("3.2") == ("3.2.2", pins.get_line("3.2").wheel_sha256)
