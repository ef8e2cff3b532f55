"""The ``upstream`` status: a line whose base already carries patches of the series."""

from __future__ import annotations

from pathlib import Path

from series_fixtures import BASE_PRIMARY, OLDER, PRIMARY, TESTS, Project, edit

from tools.engine.apply import CLEAN, FAILED, THREE_WAY, UPSTREAM, Engine, upstream_unmatched
from tools.engine.faithful import compare, functions, touched
from tools.engine.series import Series, applied_line, check_applied_upstream
from tools.shared.pins import REPO_PATH, Line

NEWER = Line(name="9.2", version="9.2.0b1", wheel_sha256="2" * 64, source_sha256="2" * 64, branch="main")

# Twenty lines a "backport" adds; the newer base has them all, one worded for its own API.
FEATURE = "".join(f"feature {i}\n" for i in range(20))
BASE_NEWER = edit(
    BASE_PRIMARY, "line 10\n", "line 10\n" + FEATURE.replace("feature 3\n", "feature 3 (new api)\n")
)


def _engine(proj: Project, newer_base: str = BASE_NEWER) -> Engine:
    bases = {PRIMARY.name: BASE_PRIMARY.encode(), NEWER.name: newer_base.encode()}
    return Engine(proj.layout, (PRIMARY, NEWER), base=lambda line: bases[line.name])


def test_a_base_that_carries_the_change_shows_upstream_and_still_gets_the_tests(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add(
        "0001-feature.patch",
        {
            REPO_PATH: edit(BASE_PRIMARY, "line 10\n", "line 10\n" + FEATURE),
            f"{TESTS}/test_feature.py": "def test_it():\n    pass\n",
        },
    )
    proj.add("0002-more.patch", {REPO_PATH: edit(proj.tree[REPO_PATH], "line 20\n", "line twenty\n")})
    res = _engine(proj).apply_line(NEWER)
    assert [p.status for p in res.patches] == [UPSTREAM, CLEAN]
    assert res.patches[0].unmatched == ("+ feature 3",)
    # Its code is the base's; its test file is applied all the same.
    assert res.code(1) == BASE_NEWER.encode()
    assert f"{TESTS}/test_feature.py" in res.stage(1)
    assert b"line twenty" in res.code(2)


def test_a_base_missing_part_of_the_change_is_not_upstream(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add("0001-feature.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 10\n", "line 10\n" + FEATURE)})
    partial = edit(BASE_PRIMARY, "line 10\n", "line 10\n" + "".join(f"feature {i}\n" for i in range(10)))
    res = _engine(proj, partial).apply_line(NEWER)
    assert res.patches[0].status in (CLEAN, THREE_WAY, FAILED)
    assert res.patches[0].status != UPSTREAM


def test_a_one_line_change_must_be_found_whole() -> None:
    before = BASE_PRIMARY.encode()
    after = edit(BASE_PRIMARY, "line 4\n", "line four\n").encode()
    assert upstream_unmatched(before, after, before) is None
    assert upstream_unmatched(before, after, after) == []


def test_applied_upstream_is_checked_against_the_engine() -> None:
    assert applied_line("3.4.0b2") == (3, 4) and applied_line("no") is None

    class _P:
        def __init__(self, applied: str) -> None:
            self.applied = applied

        def field(self, name: str) -> str | None:
            return {"Applied-Upstream": self.applied}.get(name)

    series = Series.__new__(Series)
    series.names = ["0001-a.patch", "0002-b.patch"]
    series.patches = {"0001-a.patch": _P("9.2.0b1"), "0002-b.patch": _P("no")}  # type: ignore[dict-item]
    ok = {"9.1": ["clean", "clean"], "9.2": ["upstream", "clean"]}
    assert check_applied_upstream(series, ok) == []
    wrong = {"9.1": ["clean", "clean"], "9.2": ["clean", "upstream"]}
    errors = check_applied_upstream(series, wrong)
    assert any("0001-a.patch: Applied-Upstream '9.2.0b1' covers the 9.2 line" in e for e in errors)
    assert any("0002-b.patch: the 9.2 line's base already carries it" in e for e in errors)


SOURCE = """
import os


class E:
    def a(self):
        key = workload.key
        return key

    def b(self):
        return 2


def worker():
    pass
"""


def test_faithful_lists_only_the_lines_that_differ() -> None:
    upstream = SOURCE.replace("key = workload.key", "key = self.get_workload_key(workload)")
    assert set(functions(SOURCE)) == {"E.a", "E.b", "worker", "<module>"}
    assert touched(SOURCE, SOURCE.replace("return 2", "return 3")) == ["E.b"]
    (a, b) = compare(SOURCE, upstream, ["E.a", "E.b"])
    assert (a.status, b.status) == ("differs", "same")
    assert a.lines == ["-    key = workload.key", "+    key = self.get_workload_key(workload)"]


def test_the_older_line_is_untouched_by_the_upstream_status(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add("0001-four.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")})
    assert [p.status for p in proj.engine().apply_line(OLDER).patches] == [THREE_WAY]
