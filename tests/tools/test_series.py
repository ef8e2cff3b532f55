"""Parsing format-patch mails and linting the series."""

from __future__ import annotations

from pathlib import Path

from series_fixtures import BASE_PRIMARY, DEP3, TESTER, Project, edit, make_patch

from tools.engine.series import SERIES_AUTHOR, load_series, parse_dep3, parse_patch
from tools.lint import lint_series
from tools.shared.layout import Layout
from tools.shared.pins import REPO_PATH


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
    assert p.author == SERIES_AUTHOR  # a vendor patch: the series' own identity
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


OTHER = "Origin: other, https://github.com/apache/airflow/pull/70545\n" + DEP3.split("\n", 1)[1]


def test_lint_keeps_one_author_for_the_series_own_patches(tmp_path: Path) -> None:
    """Origin: vendor patches and their resolutions carry SERIES_AUTHOR; other patches keep theirs."""
    proj = Project(tmp_path)
    four = {REPO_PATH: BASE_PRIMARY}, {REPO_PATH: edit(BASE_PRIMARY, "line 4\n", "line four\n")}
    patches = tmp_path / "patches"
    (patches / "0001-seed.patch").write_text(make_patch(*four, "A seed", dep3=OTHER))  # by TESTER
    (patches / "0002-ours.patch").write_text(make_patch(*four, "Ours", author=TESTER))
    (patches / "0003-relabelled.patch").write_text(
        make_patch(*four, "Relabelled", dep3=OTHER, author=SERIES_AUTHOR)
    )
    (patches / "0004-fine.patch").write_text(make_patch(*four, "Fine"))
    proj.names = ["0001-seed.patch", "0002-ours.patch", "0003-relabelled.patch", "0004-fine.patch"]
    proj.write_series()
    res = patches / "resolutions" / "3.2"
    res.mkdir(parents=True)
    (res / "0004-fine.patch").write_text(make_patch(*four, "Fine", author=TESTER))
    (res / "0001-seed.patch").write_text(make_patch(*four, "A seed", dep3=OTHER))
    errors = lint_series(proj.layout)
    assert all("\n" not in e for e in errors)
    assert [e.split(":", 1)[0] for e in errors] == [
        "patches/0002-ours.patch",
        "patches/0003-relabelled.patch",
        "patches/resolutions/3.2/0004-fine.patch",
    ]
    assert f"From must be the series' identity {SERIES_AUTHOR!r}, not {TESTER!r}" in errors[0]
    assert "keep the real author" in errors[1]
    assert f"is by {SERIES_AUTHOR!r}" in errors[2]


def test_the_real_series_has_one_author_for_its_own_patches() -> None:
    from tools.engine.series import check_authors
    from tools.shared.layout import DEFAULT

    series = load_series(DEFAULT)
    assert check_authors(series) == []
    vendor = [p for p in series.ordered() if p.field("Origin") == "vendor"]
    assert vendor and {p.author for p in vendor} == {SERIES_AUTHOR}
    others = [p for p in series.ordered() if p.field("Origin") != "vendor"]
    assert others and SERIES_AUTHOR not in {p.author for p in others}
