"""``verify --own-tests``: its planning, evaluation and start-method filter, without a venv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.engine.own_tests import (
    StageRun,
    dir_keys,
    evaluate,
    first_own_stage,
    origin_kind,
    plan,
    render,
    split_dirs,
    write_tree,
)
from tools.engine.series import load_series
from tools.engine.start_method_plugin import allowed_methods, deselected
from tools.engine.verify import CANNOT_RUN, ERROR, FAIL, FLAKY, PASS, SKIP
from tools.shared.errors import ToolError
from tools.shared.layout import Layout


def test_origin_kind_is_the_field_before_its_url() -> None:
    assert origin_kind("backport, https://github.com/apache/airflow/pull/67881") == "backport"
    assert origin_kind("vendor") == "vendor"
    assert origin_kind("Other, https://x") == "other"
    assert origin_kind(None) == ""


def test_first_own_stage_skips_the_upstream_prefix() -> None:
    assert first_own_stage(["backport, u", "backport, u", "other, u", "vendor"]) == 3
    assert first_own_stage(["upstream, u", "vendor"]) == 2
    assert first_own_stage(["vendor"]) == 1
    assert first_own_stage(["backport, u"]) == 2  # none of our own: past the last stage


def test_the_series_first_own_patch_is_the_first_upstream_draft() -> None:
    series = load_series()
    origins = [series.patches[n].field("Origin") for n in series.names]
    first = first_own_stage(origins)
    assert all(origin_kind(o) == "backport" for o in origins[: first - 1])
    assert origin_kind(origins[first - 1]) in ("other", "vendor")


def test_plan_runs_from_the_first_own_stage_unless_a_range_is_given() -> None:
    assert plan({"3.3": 6, "3.4": 6}, 4, None) == {"3.3": [4, 5, 6], "3.4": [4, 5, 6]}
    assert plan({"3.3": 6}, 4, "2-3") == {"3.3": [2, 3]}
    assert plan({"3.3": 6}, 4, "0-") == {"3.3": list(range(7))}
    assert plan({"3.3": 6}, 7, None) == {"3.3": []}
    with pytest.raises(ToolError):
        plan({"3.3": 6}, 4, "5-9")


def test_a_test_directory_runs_again_only_when_its_files_or_its_tested_code_change() -> None:
    ex, sup = "airflow/executors/local_executor.py", "airflow/sdk/execution_time/supervisor.py"
    tests = {"tests/executor/conftest.py": b"c", "tests/executor/test_x.py": b"t"}
    keys = dir_keys({ex: b"a", sup: b"s"}, tests)
    assert set(keys) == {"tests/executor"}  # no test_*.py in the others: nothing to run there
    assert dir_keys({ex: b"a", sup: b"other"}, tests) == keys  # the supervisor is not what they test
    assert dir_keys({ex: b"b", sup: b"s"}, tests) != keys
    assert dir_keys({ex: b"a"}, {**tests, "tests/executor/conftest.py": b"d"}) != keys
    with_sup = dir_keys({ex: b"a", sup: b"s"}, {**tests, "tests/supervisor/test_s.py": b"s"})
    assert with_sup["tests/executor"] == keys["tests/executor"] and "tests/supervisor" in with_sup


def test_split_dirs_borrows_what_an_earlier_stage_ran() -> None:
    keys = {
        4: {"tests/executor": "e4"},
        5: {"tests/executor": "e4"},  # same code and tests as 4 (3.1's stage 11, say)
        9: {"tests/executor": "e9"},
        10: {"tests/executor": "e9", "tests/supervisor": "s10"},
        11: {"tests/executor": "e9", "tests/supervisor": "s10", "tests/api_server": "a11"},
    }
    run, borrow = split_dirs(keys)
    assert run == {
        4: ["tests/executor"],
        5: [],
        9: ["tests/executor"],
        10: ["tests/supervisor"],
        11: ["tests/api_server"],
    }
    assert borrow[5] == {"tests/executor": 4}
    assert borrow[11] == {"tests/executor": 9, "tests/supervisor": 10}
    assert borrow[4] == {} and borrow[9] == {}


def test_a_stage_fails_on_any_failure_error_or_missing_attribute() -> None:
    run = StageRun("3.4", 7, {"a": PASS, "b": SKIP, "c": FLAKY})
    assert run.ok and run.label() == "3 ok*" and run.flaky == ["c"]
    for bad in (FAIL, ERROR, CANNOT_RUN):
        run = StageRun("3.4", 7, {"a": PASS, "b": bad})
        assert not run.ok and run.failures == ["b"] and run.label() == "1/2 FAIL"
    broken = StageRun("3.4", 7, errors=["pytest exited 2"])
    assert not broken.ok and broken.label() == "ERR"
    assert StageRun("3.4", 5).ok and StageRun("3.4", 5).label() == "none"


def test_evaluate_marks_a_failure_that_passed_again_as_flaky() -> None:
    outcomes = {"a": PASS, "b": FAIL, "c": ERROR, "d": FAIL}
    assert evaluate(outcomes, {"b": PASS, "c": FAIL}) == {"a": PASS, "b": FLAKY, "c": ERROR, "d": FAIL}


def test_render_is_stage_by_line_with_every_failing_node_id() -> None:
    runs = {
        "3.4": {7: StageRun("3.4", 7, {"t::a": PASS, "t::b": FAIL}), 8: StageRun("3.4", 8, {"t::a": PASS})},
        "3.3": {7: StageRun("3.3", 7, {"t::a": PASS, "t::b": PASS})},
    }
    text = render(runs)
    rows = text.splitlines()
    assert rows[0].split() == ["stage", "3.4", "3.3"]
    assert rows[1].split() == ["7", "1/2", "FAIL", "2", "ok"]
    assert rows[2].split() == ["8", "1", "ok", "-"]
    assert "FAIL 3.4 stage 7: t::b (fail)" in text
    assert "3.3 stage 7" not in text


def test_write_tree_puts_the_project_pytest_config_beside_the_stage_tests(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntimeout = 120\n")
    layout = Layout(root=tmp_path)
    dest = tmp_path / "build" / "own-tests" / "3.4" / "stage-7"
    (dest / "tests" / "executor").mkdir(parents=True)
    (dest / "tests" / "executor" / "test_stale.py").write_text("")
    write_tree({"tests/executor/test_x.py": b"x", "tests/supervisor/test_y.py": b"y"}, dest, layout)
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert found == ["pyproject.toml", "tests/executor/test_x.py", "tests/supervisor/test_y.py"]


def test_start_method_filter_keeps_what_the_variable_names() -> None:
    assert allowed_methods("fork") == {"fork"}
    assert allowed_methods(" fork, spawn ,") == {"fork", "spawn"}
    assert allowed_methods("") == frozenset() and allowed_methods(None) == frozenset()
    fork = frozenset({"fork"})
    assert deselected({"start_method": "spawn"}, fork)
    assert not deselected({"start_method": "fork"}, fork)
    assert not deselected({"fork": False}, fork)  # another parameter: left alone
    assert not deselected({"start_method": "spawn"}, frozenset())  # unset: every method runs


def test_verify_takes_own_tests_and_keeps_its_plain_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.__main__ import build_parser
    from tools.engine import own_tests, verify

    called: list[str] = []

    def own(*args: object, **kwargs: object) -> int:
        called.append("own")
        return 0

    def plain(*args: object, **kwargs: object) -> int:
        called.append("plain")
        return 0

    monkeypatch.setattr(own_tests, "run_own_tests", own)
    monkeypatch.setattr(verify, "run_verify", plain)
    monkeypatch.setattr("tools.engine.apply.default_engine", lambda: None)
    for argv in (["verify", "--own-tests", "--line", "3.4", "--stage-range", "7-"], ["verify"]):
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
    assert called == ["own", "plain"]


def test_schedule_starts_the_latest_stages_first_lines_interleaved() -> None:
    from tools.engine.own_tests import schedule

    assert schedule({"3.4": [4, 5, 7], "3.3": [4, 7]}) == [
        ("3.4", 7),
        ("3.3", 7),
        ("3.4", 5),
        ("3.4", 4),
        ("3.3", 4),
    ]
    assert schedule({}) == []


class _Line:
    name = "3.4"


class _Result:
    """The parts of a LineResult a stage run reads."""

    line = _Line()

    def derived_tests(self, k: int | None = None) -> dict[str, bytes]:
        return {"tests/executor/test_x.py": b"x", "tests/supervisor/test_s.py": b"s"}

    def sources(self, k: int | None = None) -> dict[str, bytes]:
        return {"airflow/executors/local_executor.py": b"final" if k is None else f"stage {k}".encode()}


def test_a_stage_reuses_what_passed_in_the_tests_session_where_its_tests_are_the_final_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import json

    from tools.engine import own_tests

    (tmp_path / "pyproject.toml").write_text("")
    layout = Layout(root=tmp_path)
    calls: list[tuple[str, list[str], bool]] = []

    def fake_run_stage(python, sources, out_dir, tag, select, tree, nodeids, collect_only=False, **kw):
        calls.append((tag, list(nodeids) + list(kw.get("extra_args", ())), collect_only))
        out_dir.mkdir(parents=True, exist_ok=True)
        if collect_only:
            collected: dict[str, dict[str, str]] = {
                "tests/executor/test_x.py::a": {},
                "tests/executor/test_x.py::b": {},
            }
            (out_dir / f"{tag}.json").write_text(json.dumps(collected))
            return {}, {}, {}, None
        if tag.endswith("-rerun"):
            return {"tests/executor/test_x.py::b": PASS}, {}, {}, None
        return {"tests/executor/test_x.py::b": FAIL}, {}, {}, None

    monkeypatch.setattr(own_tests, "run_stage", fake_run_stage)
    monkeypatch.setattr(
        "tools.engine.final_record.passed", lambda line, sources, layout: {"tests/executor/test_x.py::a"}
    )
    res: Any = _Result()
    run = own_tests._run_stage(
        res, 9, Path("python"), layout, None, ["tests/executor"], {}, io.StringIO(), ["tests/executor"]
    )
    assert run.outcomes == {"tests/executor/test_x.py::a": PASS, "tests/executor/test_x.py::b": FLAKY}
    assert [c[0] for c in calls] == ["stage-9-collect", "stage-9", "stage-9-rerun"]
    assert calls[1][1] == ["tests/executor", "--deselect", "tests/executor/test_x.py::a"]
    assert "reused" in run.note
    calls.clear()
    # Not the final stage's tests: nothing reused, no collection.
    run = own_tests._run_stage(
        res, 7, Path("python"), layout, None, [], {}, io.StringIO(), ["tests/executor"]
    )
    assert [c[0] for c in calls] == ["stage-7", "stage-7-rerun"] and run.ok
