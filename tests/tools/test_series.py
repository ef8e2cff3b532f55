"""Parsing format-patch mails and linting the series."""

from __future__ import annotations

from pathlib import Path

from series_fixtures import BASE_PRIMARY, DEP3, Project, edit, make_patch

from tools.layout import Layout
from tools.pins import REPO_PATH
from tools.series import lint_series, load_series, parse_dep3, parse_patch


def test_parse_format_patch_mail() -> None:
    long_subject = "Drain results while joining workers in end() so that a full pipe cannot wedge shutdown"
    text = make_patch(
        {REPO_PATH: BASE_PRIMARY},
        {REPO_PATH: edit(edit(BASE_PRIMARY, "line 4\n", "line four\n"), "line 25\n", "line 25b\n")},
        long_subject,
        body="Why it matters.\n\n--- not a separator",
    )
    p = parse_patch("0001-x.patch", text)
    assert p.subject == long_subject  # folded over two header lines, [PATCH] stripped
    assert p.author == "Ada Tester <ada@example.invalid>"
    assert p.date == "Mon, 30 Nov 2026 10:00:00 +0100"
    assert p.message.startswith("Why it matters.")
    assert p.fields["Origin"] == "vendor"
    assert p.field("last-update") == "2026-11-30"
    assert p.touched == [REPO_PATH]
    assert p.full_index
    assert [(h.number, h.old_start) for h in p.files[0].hunks] == [(1, 1), (2, 22)]
    assert p.hunk_at(REPO_PATH, 22).number == 2  # type: ignore[union-attr]
    assert p.diff.startswith("diff --git ") and p.diff.endswith("line 28\n")


def test_dep3_only_when_the_whole_last_paragraph_is_fields() -> None:
    assert parse_dep3("Text.\n\n" + DEP3)["Forwarded"] == "no"
    assert parse_dep3("Text.\n\nOrigin: vendor\nand some prose") == {}
    assert parse_dep3("Origin: vendor\n continued") == {"Origin": "vendor continued"}


def test_clean_series_lints_clean(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    proj.add("0001-a.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")})
    assert lint_series(proj.layout) == []
    assert load_series(proj.layout).index("0001-a.patch") == 1


def test_empty_or_missing_series_lints_clean(tmp_path: Path) -> None:
    assert lint_series(Layout(root=tmp_path)) == []
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series").write_text("# nothing yet\n\n")
    assert lint_series(Layout(root=tmp_path)) == []


def test_lint_reports_each_problem_on_one_line(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    good = edit(BASE_PRIMARY, "line 4\n", "line four\n")
    text = make_patch(
        {REPO_PATH: BASE_PRIMARY}, {REPO_PATH: good}, "No bug field", dep3=DEP3.replace("Bug: ", "Bugs: ")
    )
    (tmp_path / "patches" / "0001-a.patch").write_text(text)
    proj.names = ["0001-a.patch", "0002-missing.patch"]
    proj.write_series()
    (tmp_path / "patches" / "0003-stray.patch").write_text(text)
    res = tmp_path / "patches" / "resolutions"
    (res / "3.2").mkdir(parents=True)
    (res / "3.2" / "0009-gone.patch").write_text(text)
    (res / "7.7").mkdir()
    tests = tmp_path / "tests" / "executor"
    tests.mkdir(parents=True)
    (tests / "test_x.py").write_text(
        'import pytest\nFIX = "0004-later.patch"\n\n\n@pytest.mark.fixed_by(FIX)\ndef test_a(): ...\n\n\n'
        '@pytest.mark.fixed_by("0001-a.patch")\ndef test_b(): ...\n'
    )
    errors = lint_series(proj.layout)
    assert all("\n" not in e for e in errors)
    joined = "\n".join(errors)
    assert "patches/0001-a.patch: missing required header Bug" in joined
    assert "patches/series lists 0002-missing.patch, but patches/0002-missing.patch does not exist" in joined
    assert "patches/0003-stray.patch is not listed in patches/series" in joined
    assert "patches/resolutions/3.2/0009-gone.patch resolves a patch not in patches/series" in joined
    assert "patches/resolutions/7.7/ is for an unknown line" in joined
    assert (
        "tests/executor/test_x.py:5: fixed_by('0004-later.patch') names a patch not in patches/series"
        in joined
    )
    assert "0001-a.patch')" not in joined
    assert len(errors) == 6


def test_lint_wants_full_blob_ids(tmp_path: Path) -> None:
    proj = Project(tmp_path)
    text = proj.add("0001-a.patch", {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")})
    short = "\n".join(
        ln[:13] + ".." + ln.split("..")[1][:7] + ln[ln.index(" ", 10) :] if ln.startswith("index ") else ln
        for ln in text.splitlines()
    )
    (tmp_path / "patches" / "0001-a.patch").write_text(short + "\n")
    assert lint_series(proj.layout) == [
        "patches/0001-a.patch: no full blob ids (export with git format-patch --full-index)"
    ]
