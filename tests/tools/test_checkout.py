"""checkout + refresh: an unchanged round trip is a no-op; edits and resolutions come back."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from series_fixtures import BASE_OLDER, BASE_PRIMARY, OLDER, PRIMARY, TESTS, Project, _git, edit

from tools.engine.apply import RESOLUTION, THREE_WAY
from tools.engine.checkout import checkout, refresh
from tools.shared.errors import ToolError
from tools.shared.pins import REPO_PATH


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "patches").rglob("*")) if p.is_file()
    }


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    p = Project(tmp_path / "proj")
    p.add("0001-four.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")}, "Fix line four")
    p.add(
        "0002-tests.patch",
        {REPO_PATH: edit(p.tree[REPO_PATH], "line 20\n", "line twenty\n"), f"{TESTS}/test_a.py": "a = 1\n"},
        "Fix line twenty",
    )
    return p


def test_round_trip_is_a_no_op(proj: Project, tmp_path: Path) -> None:
    before = snapshot(proj.root)
    n = checkout(proj.engine(), PRIMARY, tmp_path / "co")
    assert n == 2
    log = _git(tmp_path / "co", "log", "--format=%an|%s", "lepatch-base..HEAD")
    assert log.splitlines() == ["LocalExecutor series|Fix line twenty", "LocalExecutor series|Fix line four"]
    report = refresh(proj.engine(), tmp_path / "co")
    assert report.written == [] and report.removed == []
    assert snapshot(proj.root) == before


def test_amended_and_added_commits_come_back(proj: Project, tmp_path: Path) -> None:
    co = tmp_path / "co"
    checkout(proj.engine(), PRIMARY, co)
    code = co / REPO_PATH
    code.write_text(code.read_text().replace("line twenty\n", "line 20 fixed\n"))
    _git(co, "commit", "-qa", "--amend", "--no-edit")
    code.write_text(code.read_text().replace("line 28\n", "line 28 fixed\n"))
    _git(
        co,
        "commit",
        "-qa",
        "-m",
        "Fix line 28\n\nOrigin: vendor\nBug: https://example.invalid/1\n"
        "Forwarded: no\nApplied-Upstream: no\nLast-Update: 2026-12-01",
    )
    report = refresh(proj.engine(), co)
    assert report.written == ["patches/0002-tests.patch", "patches/0003-Fix-line-28.patch", "patches/series"]
    assert (proj.root / "patches" / "series").read_text().splitlines()[1:] == [
        "0001-four.patch",
        "0002-tests.patch",
        "0003-Fix-line-28.patch",
    ]
    res = proj.engine().apply_line(PRIMARY)
    assert res.ok and b"line 28 fixed" in res.code() and b"line 20 fixed" in res.code()
    assert refresh(proj.engine(), co).written == []  # idempotent


def test_resolution_recorded_for_another_line(tmp_path: Path) -> None:
    proj = Project(tmp_path / "proj")
    proj.add("0001-four.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")})
    proj.add("0002-two.patch", {REPO_PATH: edit(proj.tree[REPO_PATH], "line 2\n", "line 2b\n")})
    engine = proj.engine()
    assert not engine.apply_line(OLDER).ok
    with pytest.raises(ToolError, match=r"0002-two\.patch does not apply to 9\.0"):
        checkout(engine, OLDER, tmp_path / "full")

    co = tmp_path / "co"
    checkout(engine, OLDER, co, upto=1)
    am = subprocess.run(
        ["git", "am", "-3", str(proj.root / "patches" / "0002-two.patch")], cwd=co, capture_output=True
    )
    assert am.returncode != 0
    (co / REPO_PATH).write_text(
        edit(edit(BASE_OLDER, "line 4\n", "line four\n"), "line two\n", "line two b\n")
    )
    _git(co, "add", REPO_PATH)
    _git(co, "am", "--continue")

    report = refresh(proj.engine(), co)  # the checkout remembers its line
    assert report.written == ["patches/resolutions/9.0/0002-two.patch"]
    res = proj.engine().apply_line(OLDER)
    assert [p.status for p in res.patches] == [THREE_WAY, RESOLUTION]
    assert b"line two b" in res.code()
    assert refresh(proj.engine(), co).written == []
    fresh = tmp_path / "again"
    checkout(proj.engine(), OLDER, fresh)
    assert (fresh / REPO_PATH).read_bytes() == res.code()
    assert refresh(proj.engine(), fresh).written == []


def test_refresh_refuses_a_repository_it_did_not_make(tmp_path: Path) -> None:
    proj = Project(tmp_path / "proj")
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")
    with pytest.raises(ToolError, match="no lepatch-base tag"):
        refresh(proj.engine(), other)
