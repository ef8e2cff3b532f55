"""The apply engine on synthetic lines: statuses, stages, failures, derived files."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from series_fixtures import BASE_OLDER, BASE_PRIMARY, OLDER, PRIMARY, TESTS, Project, edit, make_patch

from tools.engine.apply import (
    CLEAN,
    FAILED,
    NOT_APPLICABLE,
    NOT_TRIED,
    RESOLUTION,
    THREE_WAY,
    Engine,
    describe_apply_error,
    run_apply,
)
from tools.engine.series import parse_patch
from tools.shared import pins
from tools.shared.pins import REPO_PATH

OVERLAY = "airflow/executors/local_executor.py"


def statuses(proj: Project) -> dict[str, list[str]]:
    engine = proj.engine()
    return {name: [p.status for p in r.patches] for name, r in engine.apply_all().items()}


def test_empty_series_gives_the_base_everywhere(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    (tmp_path / "patches" / "series").unlink(missing_ok=True)
    engine = proj.engine()
    res = engine.apply_line(OLDER)
    assert res.ok and res.final == 0 and res.code() == BASE_OLDER.encode()
    out = io.StringIO()
    assert run_apply(engine, write=True, out=out) == 0
    assert "lists no patches" in out.getvalue()
    assert (tmp_path / "airflow_overlay" / "9.0" / OVERLAY).read_text() == BASE_OLDER


def test_clean_and_three_way(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add("0001-four.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")})
    assert statuses(proj) == {"9.1": [CLEAN], "9.0": [THREE_WAY]}
    older = proj.engine().apply_line(OLDER)
    assert older.code(1) == edit(BASE_OLDER, "line 4\n", "line four\n").encode()
    assert older.code(0) == BASE_OLDER.encode()


def test_conflict_fails_with_hunk_line_and_reproduction(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add("0001-two.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 25\n", "line 25b\n")})
    proj.add("0002-two.patch", {REPO_PATH: edit(proj.tree[REPO_PATH], "line 2\n", "line 2b\n")})
    proj.add("0003-later.patch", {REPO_PATH: edit(proj.tree[REPO_PATH], "line 20\n", "line 20b\n")})
    engine = proj.engine()
    res = engine.apply_line(OLDER)
    assert [p.status for p in res.patches] == [CLEAN, FAILED, NOT_TRIED]
    failed = res.patches[1]
    assert failed.detail == (
        f"FAILED: 0002-two.patch does not apply to 9.0 (9.0.3): hunk #1 at {REPO_PATH}:1"
        f" (3-way merge conflicts in {REPO_PATH})"
    )
    patch = tmp_path / "patches" / "0002-two.patch"
    assert f"python -m tools checkout --line 9.0 --upto 1 DIR && git -C DIR am -3 {patch}" in failed.hint
    assert res.final == 1  # stages stop before the failed patch
    with pytest.raises(Exception, match=r"stages 0\.\.1"):
        res.stage(2)


def test_resolution_wins_and_is_applied_after_the_rest(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    test_file = f"{TESTS}/test_a.py"
    proj.add(
        "0001-two.patch",
        {REPO_PATH: edit(BASE_PRIMARY, "line 2\n", "line 2b\n"), test_file: "def test_a():\n    pass\n"},
    )
    resolved = edit(BASE_OLDER, "line two\n", "line two b\n")
    res_text = make_patch({REPO_PATH: BASE_OLDER}, {REPO_PATH: resolved}, "Patch 0001-two.patch")
    (tmp_path / "patches" / "resolutions" / "9.0").mkdir(parents=True)
    (tmp_path / "patches" / "resolutions" / "9.0" / "0001-two.patch").write_text(res_text)
    engine = proj.engine()
    res = engine.apply_line(OLDER)
    assert [p.status for p in res.patches] == [RESOLUTION]
    assert res.code() == resolved.encode()
    assert res.tests() == {"test_a.py": b"def test_a():\n    pass\n"}  # from the main patch


def test_failure_writes_nothing(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add(
        "0001-two.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 2\n", "line 2b\n"), f"{TESTS}/t.py": "x = 1\n"}
    )
    out = io.StringIO()
    assert run_apply(proj.engine(), write=True, out=out) == 1
    assert "FAILED: 0001-two.patch does not apply to 9.0" in out.getvalue()
    assert "nothing written" in out.getvalue()
    assert not (tmp_path / "airflow_overlay").exists()
    assert not (tmp_path / "tests").exists()
    report = json.loads((tmp_path / "build" / "apply.json").read_text())
    assert report["ok"] is False
    assert report["lines"]["9.0"]["patches"][0]["status"] == FAILED


def test_drift_detection_and_write(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add(
        "0001-four.patch",
        {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n"), f"{TESTS}/t.py": "x = 1\n"},
    )
    out = io.StringIO()
    assert run_apply(proj.engine(), out=out) == 1
    assert f"drift: airflow_overlay/9.1/{OVERLAY} is missing" in out.getvalue()
    assert run_apply(proj.engine(), write=True, out=io.StringIO()) == 0
    assert (tmp_path / "tests" / "executor" / "t.py").read_text() == "x = 1\n"
    assert run_apply(proj.engine(), out=io.StringIO()) == 0

    (tmp_path / "airflow_overlay" / "9.0" / OVERLAY).write_text("edited by hand\n")
    (tmp_path / "tests" / "executor" / "stray.py").write_text("")
    (tmp_path / "tests" / "executor" / "__pycache__").mkdir()
    (tmp_path / "tests" / "executor" / "__pycache__" / "t.cpython-311.pyc").write_bytes(b"")
    out = io.StringIO()
    assert run_apply(proj.engine(), out=out) == 1
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("drift:")]
    assert lines == [
        f"drift: airflow_overlay/9.0/{OVERLAY} differs from base + series",
        "drift: tests/executor/stray.py is not produced by the series",
    ]
    assert run_apply(proj.engine(), write=True, out=io.StringIO()) == 0
    assert not (tmp_path / "tests" / "executor" / "stray.py").exists()
    assert run_apply(proj.engine(), out=io.StringIO()) == 0


def test_test_trees_must_match_across_lines(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    test_file = f"{TESTS}/test_a.py"
    proj.add("0001-two.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 2\n", "line 2b\n"), test_file: "a = 1\n"})
    res_text = make_patch(
        {REPO_PATH: BASE_OLDER},
        {REPO_PATH: edit(BASE_OLDER, "line two\n", "line two b\n"), test_file: "a = 2\n"},
        "Patch 0001-two.patch",
    )
    (tmp_path / "patches" / "resolutions" / "9.0").mkdir(parents=True)
    (tmp_path / "patches" / "resolutions" / "9.0" / "0001-two.patch").write_text(res_text)
    out = io.StringIO()
    assert run_apply(proj.engine(), write=True, out=out) == 1
    assert f"tests differ: {test_file} on 9.0 is not the same as on 9.1" in out.getvalue()


def test_build_stage_writes_the_tree(tmp_path: Path) -> None:
    proj = Project(tmp_path / "proj")
    proj.add("0001-four.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")})
    engine = proj.engine()
    dest = engine.build_stage(PRIMARY, 0, tmp_path / "stage")
    assert (dest / REPO_PATH).read_text() == BASE_PRIMARY
    engine.build_stage(PRIMARY, 1, dest)  # rewrites a tree it wrote itself
    assert "line four" in (dest / REPO_PATH).read_text()
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("")
    with pytest.raises(Exception, match="not empty"):
        engine.build_stage(PRIMARY, 1, other)


def test_describe_apply_error_maps_line_to_hunk() -> None:
    text = make_patch(
        {REPO_PATH: BASE_PRIMARY},
        {REPO_PATH: edit(edit(BASE_PRIMARY, "line 4\n", "line four\n"), "line 25\n", "line 25b\n")},
        "Two hunks",
    )
    patch = parse_patch("0001-x.patch", text)
    stderr = f"error: patch failed: {REPO_PATH}:22\nerror: {REPO_PATH}: patch does not apply\n"
    assert describe_apply_error(patch, stderr) == f"hunk #2 at {REPO_PATH}:22"
    assert (
        describe_apply_error(patch, "error: foo: does not exist in index\n") == "foo: does not exist in index"
    )


def test_real_primary_base_when_cached() -> None:
    from tools.engine import fetch
    from tools.shared import pins
    from tools.shared.layout import DEFAULT

    if not (DEFAULT.cache / fetch.wheel_filename(pins.PRIMARY.version)).exists():
        pytest.skip("the primary wheel is not in build/cache")
    data = fetch.read_base(pins.PRIMARY)
    assert fetch.sha256_bytes(data) == pins.PRIMARY.source_sha256
    assert b"class LocalExecutor" in data


def test_a_patch_of_a_file_a_line_does_not_pin_is_not_applicable_there(tmp_path: Path) -> None:
    """3.1 has no revoked-token check: the API server's patch is ``n/a``, its tests still applied."""
    auth = pins.AUTH_MANAGER.repo_path
    test_file = f"{pins.AUTH_MANAGER.repo_tests_dir}/test_check.py"
    with_auth = dataclasses.replace(PRIMARY, auth_source_sha256="2" * 64)
    proj = Project(tmp_path)
    proj.tree[auth] = "check 1\ncheck 2\n"
    proj.add("0001-auth.patch", {auth: "check 1\ncheck 2b\n", test_file: "def test_check():\n    pass\n"})
    proj.add(
        "0002-both.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n"), auth: "check 1b\n"}
    )
    bases = {
        with_auth.name: {REPO_PATH: BASE_PRIMARY.encode(), auth: b"check 1\ncheck 2\n"},
        OLDER.name: {REPO_PATH: BASE_OLDER.encode()},
    }
    engine = Engine(proj.layout, (with_auth, OLDER), bases=lambda line: bases[line.name])

    older = engine.apply_line(OLDER)
    primary = engine.apply_line(with_auth)

    assert [p.status for p in primary.patches] == [CLEAN, CLEAN]
    assert older.patches[0].status == NOT_APPLICABLE
    assert older.patches[0].detail == "9.0.3 has no base_auth_manager.py: nothing to fix"
    assert older.stage(1)[REPO_PATH] == BASE_OLDER.encode() and auth not in older.stage(1)
    assert older.stage(1)[test_file] == b"def test_check():\n    pass\n"
    # A patch that also changes a file the line pins is the line's to apply, whole or not at all.
    assert older.patches[1].status == FAILED
    assert f"{auth}: does not exist" in older.patches[1].detail
