"""verify's expectations as a pure function over a results dict."""

from __future__ import annotations

import pytest

from tools.engine.verify import (
    FAIL,
    FLAKY,
    NOT_RUN,
    PASS,
    _should_pass,
    edge_stages,
    evaluate,
    expected_outcome,
    parse_stage_range,
    plan_stages,
    render,
)
from tools.shared.errors import ToolError

SERIES = ["0001-a.patch", "0002-b.patch", "0003-c.patch"]


def test_expected_outcome_flips_at_the_fixing_patch() -> None:
    assert [expected_outcome(k, 2) for k in range(4)] == [FAIL, FAIL, PASS, PASS]


def test_evaluate_marks_only_unexpected_cells() -> None:
    outcomes = {
        0: {"t::a": "fail", "t::b": "fail"},
        1: {"t::a": "fail", "t::b": "pass"},
        2: {"t::a": "pass", "t::b": "pass"},
        3: {"t::a": "pass", "t::b": "fail"},
    }
    ev = evaluate(outcomes, {"t::a": "0002-b.patch", "t::b": "0001-a.patch"}, SERIES)
    assert [c.label() for c in ev.rows["t::a"].values()] == ["FAIL", "FAIL", "pass", "pass"]
    assert [c.label() for c in ev.rows["t::b"].values()] == ["FAIL", "pass", "pass", "FAIL!"]
    assert not ev.ok
    table = render("9.1 (9.1.0)", ev, SERIES)
    assert table.splitlines()[0].split() == ["9.1", "(9.1.0)", "fixed", "by", "0", "1", "2", "3"]
    assert "FAIL!" in table.splitlines()[2]


def test_passing_before_the_fix_is_unexpected_too() -> None:
    ev = evaluate({0: {"t::a": "pass"}, 1: {"t::a": "pass"}}, {"t::a": "0001-a.patch"}, SERIES)
    assert [c.unexpected for c in ev.rows["t::a"].values()] == [True, False]


def test_errors_skips_and_missing_results_are_unexpected() -> None:
    ev = evaluate(
        {0: {"t::a": "error", "t::b": "skip"}},
        {"t::a": "0001-a.patch", "t::b": "0001-a.patch", "t::c": "0001-a.patch"},
        SERIES,
    )
    assert [ev.rows[t][0].label() for t in ("t::a", "t::b", "t::c")] == ["ERR!", "skip!", "-!"]


def test_unknown_patch_is_an_error() -> None:
    ev = evaluate({0: {"t::a": "fail"}}, {"t::a": "0009-nope.patch"}, SERIES)
    assert not ev.ok and "0009-nope.patch" in ev.errors[0] and "t::a" not in ev.rows


def test_all_as_expected() -> None:
    ev = evaluate({0: {"t::a": "fail"}, 1: {"t::a": "pass"}}, {"t::a": "0001-a.patch"}, SERIES)
    assert ev.ok


def test_stage_range() -> None:
    assert parse_stage_range(None, 3) == [0, 1, 2, 3]
    assert parse_stage_range("2", 3) == [2]
    assert parse_stage_range("1-2", 3) == [1, 2]
    assert parse_stage_range("2-", 3) == [2, 3]
    assert parse_stage_range("-1", 3) == [0, 1]
    with pytest.raises(ToolError):
        parse_stage_range("2-5", 3)


def test_introduced_by_expects_failure_only_between_the_two_patches() -> None:
    assert [expected_outcome(k, 3, introduced_index=2) for k in range(5)] == [PASS, PASS, FAIL, PASS, PASS]
    ev = evaluate(
        {0: {"t": PASS}, 1: {"t": PASS}, 2: {"t": FAIL}, 3: {"t": PASS}},
        {"t": SERIES[2]},
        SERIES,
        {"t": SERIES[1]},
    )
    assert ev.ok


def test_a_cell_that_passed_on_its_rerun_is_expected_but_labelled() -> None:
    ev = evaluate({0: {"t": FAIL}, 1: {"t": FLAKY}}, {"t": SERIES[0]}, SERIES)
    assert ev.ok
    assert ev.rows["t"][1].label() == "pass*"
    assert "pass*" in render("3.3", ev, SERIES)


def test_only_cells_that_should_pass_are_run_again() -> None:
    fixed = {"t": SERIES[1]}
    assert not _should_pass("t", 1, fixed, {}, SERIES)
    assert _should_pass("t", 2, fixed, {}, SERIES)
    assert not _should_pass("unknown", 2, fixed, {}, SERIES)


def test_edge_stages_are_the_stage_before_the_patch_and_every_one_from_it() -> None:
    assert edge_stages(9, 3) == {2, 3, 4, 5, 6, 7, 8, 9}
    assert edge_stages(9, 9) == {8, 9}
    assert edge_stages(9, 1) == set(range(10))
    # A bug the series introduced at 5 and fixed at 8: passes at 4, fails at 5-7, passes from 8.
    assert edge_stages(9, 8, 5) == {4, 5, 6, 7, 8, 9}
    assert edge_stages(9, 2, upstream=True) == set(range(10))


def test_plan_runs_each_test_from_the_stage_before_its_patch() -> None:
    fixed = {"t::a": "0002-b.patch", "t::b": "0003-c.patch", "t::c": "0009-gone.patch"}
    plan = plan_stages(fixed, {}, SERIES, 3, frozenset({"0001-a.patch"}))
    assert plan == {"t::a": {1, 2, 3}, "t::b": {2, 3}, "t::c": set()}
    assert plan_stages({"t::u": "0001-a.patch"}, {}, SERIES, 3, frozenset({"0001-a.patch"})) == {
        "t::u": {0, 1, 2, 3}
    }


def test_cells_not_run_by_the_plan_are_never_unexpected() -> None:
    outcomes = {
        0: {"t::a": NOT_RUN},
        1: {"t::a": "fail"},
        2: {"t::a": "pass"},
        3: {"t::a": "pass"},
    }
    ev = evaluate(outcomes, {"t::a": "0002-b.patch"}, SERIES)
    assert ev.ok
    assert [c.label() for c in ev.rows["t::a"].values()] == [".", "FAIL", "pass", "pass"]
    assert "not run" in render("9.1 (9.1.0)", ev, SERIES)
    # A planned stage whose result is missing still is.
    outcomes[2] = {}
    assert not evaluate(outcomes, {"t::a": "0002-b.patch"}, SERIES).ok


def test_a_bug_reproduced_on_the_rerun_is_expected_but_labelled() -> None:
    from tools.engine.verify import FLAKY_FAIL

    outcomes = {0: {"t::a": FLAKY_FAIL}, 1: {"t::a": "pass"}}
    ev = evaluate(outcomes, {"t::a": "0001-a.patch"}, SERIES)
    assert ev.ok
    assert [c.label() for c in ev.rows["t::a"].values()] == ["FAIL*", "pass"]


def test_a_bug_of_other_lines_must_pass_here() -> None:
    """``fixed_by(..., lines=("3.4",))`` on another line: expected to pass where it runs, shown ``-``."""
    outcomes = {0: {"t::a": NOT_RUN}, 1: {"t::a": NOT_RUN}, 2: {"t::a": "pass"}}
    ev = evaluate(outcomes, {"t::a": "0002-b.patch"}, SERIES, elsewhere={"t::a"})
    assert [c.label() for c in ev.rows["t::a"].values()] == [".", ".", "pass"] and ev.ok
    ev = evaluate({2: {"t::a": "fail"}}, {"t::a": "0002-b.patch"}, SERIES, elsewhere={"t::a"})
    assert not ev.ok
    assert "0002 -" in render("9.1 (9.1.0)", ev, SERIES).splitlines()[1]


def test_a_test_is_matched_with_the_upstream_file_its_directory_tests() -> None:
    """Verify reuses a test's outcome on a stage whose file of that test is unchanged (see _tested_file)."""
    from tools.engine.verify import _tested_file
    from tools.shared import pins

    assert _tested_file("tests/supervisor/test_x.py::test_a") == pins.SUPERVISOR.package_path
    assert _tested_file("tests/executor/test_x.py::test_a[fork]") == pins.EXECUTOR.package_path
