"""The churn figure: line identity from stage to stage, code-line counting, the lint ratchet."""

from __future__ import annotations

import io
import json
from pathlib import Path

from series_fixtures import BASE_PRIMARY, OLDER, PRIMARY, Project, edit

from tools.engine.apply import run_apply
from tools.engine.churn import (
    TARGET_PERCENT,
    CodeSize,
    FileChurn,
    LineChurn,
    code_size,
    ratchet,
    ratchet_notes,
    render_table,
    track,
)
from tools.lint import churn_problems
from tools.shared.pins import REPO_PATH

UPSTREAM_DEP3 = """Origin: upstream, https://github.com/apache/airflow/pull/67881
Bug: https://github.com/apache/airflow/issues/70526
Forwarded: https://github.com/apache/airflow/pull/67881
Applied-Upstream: 9.1.0
Last-Update: 2026-11-30"""


# -- line identity -------------------------------------------------------------------------


def test_a_line_added_by_one_patch_and_removed_by_a_later_one_counts_for_the_first() -> None:
    base = ["a", "b", "c"]
    versions = [
        base,
        ["a", "b", "c", "u"],  # 1: upstream
        ["a", "x", "b", "c", "u"],  # 2: ours, adds x
        ["a", "x", "b", "c", "u", "y"],  # 3: ours, adds y
        ["a", "b", "c", "u", "y"],  # 4: ours, removes x
    ]
    added, churn = track(versions, [False, True, True, True])
    assert added == {2: 1, 3: 1}
    assert churn == {2: 1}


def test_a_line_changed_in_place_counts_and_its_replacement_is_added() -> None:
    versions = [["a", "b"], ["a", "x = 1", "b"], ["a", "x = 2", "b"]]
    added, churn = track(versions, [True, True])
    assert added == {1: 1, 2: 1}
    assert churn == {1: 1}


def test_base_lines_and_upstream_lines_removed_do_not_count() -> None:
    versions = [
        ["a", "b", "c"],
        ["a", "b", "c", "u1", "u2"],  # 1: upstream adds two lines
        ["b", "c", "u2", "z"],  # 2: ours removes a base line and an upstream one, adds z
    ]
    added, churn = track(versions, [False, True])
    assert added == {2: 1}
    assert churn == {}


def test_a_line_kept_across_patches_keeps_its_tag() -> None:
    # x comes from patch 1 and moves nowhere while 2 and 3 edit around it; 4 removes it.
    versions = [["a"], ["a", "x"], ["p", "a", "x"], ["p", "a", "x", "q"], ["p", "a", "q"]]
    added, churn = track(versions, [True, True, True, True])
    assert churn == {1: 1}
    assert sum(added.values()) == 3


def test_an_upstream_patch_adds_nothing_of_ours() -> None:
    added, churn = track([["a"], ["a", "u"], ["a"]], [False, True])
    assert added == {} and churn == {}


# -- code lines ----------------------------------------------------------------------------

SOURCE = '''"""Module docstring,
over two lines."""

# a comment line
import os  # a trailing comment keeps the line


class C:
    """Class docstring."""

    def method(self) -> str:
        """Method docstring."""
        text = """a multi-line string
        that is code, not a docstring"""
        return text

    async def other(self) -> None:
        pass
        (
            "implicit"
            "concatenation"
        )

        def inner() -> None:
            pass


def f():
    "one" "docstring"
    return os.sep
'''


def test_code_size_skips_blank_comment_and_docstring_lines() -> None:
    size = code_size(SOURCE.encode())
    # import, class, def method, text = (2 rows), return, async def, pass, ( "implicit"
    # "concatenation" ) (4 rows: not first in its body, so no docstring), def inner, pass, def f,
    # return; f's implicitly concatenated docstring is skipped whole
    assert size == CodeSize(code_lines=16, functions=4)


def test_code_size_of_what_does_not_parse_is_none() -> None:
    assert code_size(b"line 1\nline 2\n") is None


# -- the ratchet ---------------------------------------------------------------------------


def figures(line: str, added: int, churned: int) -> LineChurn:
    f = FileChurn("local_executor.py", added, churned, None, None, {}, {})
    return LineChurn(line, (f,))


def test_ratchet_fails_above_the_ceiling_with_one_line_naming_line_figures_and_target() -> None:
    churns = [figures("3.4", 1288, 340), figures("3.3", 1288, 331)]
    errors = ratchet(churns, {"3.4": 332, "3.3": 331})
    assert errors == [
        "churn: 3.4 local_executor.py: 340 of 1,288 added lines removed again by a later patch (26.4 %), "
        f"above the ceiling 332 (target {TARGET_PERCENT} %: 64 lines): a patch takes out what an earlier "
        "one of ours added; fold the change back"
    ]


def test_ratchet_passes_at_the_ceiling_and_says_when_it_can_come_down() -> None:
    churns = [figures("3.4", 1288, 332), figures("3.3", 1000, 100)]
    ceilings = {"3.4": 332, "3.3": 331}
    assert ratchet(churns, ceilings) == []
    notes = ratchet_notes(churns, ceilings)
    assert "lower" not in notes[0]
    assert notes[1].endswith("lower CEILINGS['3.3'] in tools/engine/churn.py to 100 to keep the gain")


def test_ratchet_fails_on_a_line_without_a_ceiling() -> None:
    (error,) = ratchet([figures("3.5", 100, 0)], {"3.4": 332})
    assert error.startswith("churn: 3.5 local_executor.py: 0 of 100 added") and "no ceiling" in error


def series_with_churn(tmp_path: Path) -> Project:
    """Upstream adds line U, ours add X and Y, a later one of ours removes X and a base line."""
    proj = Project(tmp_path)
    proj.add(
        "0001-up.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 10\n", "line 10\nline U\n")}, dep3=UPSTREAM_DEP3
    )
    proj.add("0002-x.patch", {REPO_PATH: edit(proj.tree[REPO_PATH], "line 20\n", "line 20\nline X\n")})
    proj.add("0003-y.patch", {REPO_PATH: edit(proj.tree[REPO_PATH], "line 5\n", "line 5\nline Y\n")})
    gone = edit(edit(proj.tree[REPO_PATH], "line X\n", ""), "line 25\n", "")
    proj.add("0004-drop.patch", {REPO_PATH: edit(gone, "line U\n", "")})
    return proj


def test_lint_ratchet_on_a_real_series_fails_above_the_ceiling(tmp_path: Path) -> None:
    engine = series_with_churn(tmp_path).engine()
    results = engine.apply_all()
    notes: list[str] = []
    ok = {PRIMARY.name: 1, OLDER.name: 1}
    assert churn_problems(engine, results, notes, ok) == []
    assert len(notes) == 2
    errors = churn_problems(engine, results, None, {PRIMARY.name: 0, OLDER.name: 1})
    assert errors == [
        "churn: 9.1 local_executor.py: 1 of 2 added lines removed again by a later patch (50.0 %), "
        f"above the ceiling 0 (target {TARGET_PERCENT} %: 0 lines): a patch takes out what an earlier "
        "one of ours added; fold the change back"
    ]


def test_apply_prints_the_table_and_writes_it_to_the_json(tmp_path: Path) -> None:
    engine = series_with_churn(tmp_path).engine()
    out = io.StringIO()
    assert run_apply(engine, write=True, out=out) == 0
    table = out.getvalue().split("churn: ", 1)[1]
    assert "9.1   local_executor.py      2      1   50.0 %" in table
    assert "code lines" in table and "-" in table  # the synthetic base is no Python
    report = json.loads((tmp_path / "build" / "apply.json").read_text())
    fig = report["churn"]["9.0"]["local_executor.py"]
    assert (fig["added"], fig["churn"], fig["churn_percent"]) == (2, 1, 50.0)
    assert fig["churn_by_patch"] == {"0002-x.patch": 1}


def test_render_table_shows_sizes_base_to_final() -> None:
    f = FileChurn("local_executor.py", 1288, 332, CodeSize(232, 18), CodeSize(772, 58), {}, {})
    table = render_table([LineChurn("3.4", (f,))])
    row = "3.4   local_executor.py  1,288    332   25.8 %  232 -> 772   18 -> 58"
    assert table.splitlines()[-1] == row
