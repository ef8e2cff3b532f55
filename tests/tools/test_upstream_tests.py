"""Upstream's test_local_executor.py with the series' diffs: records, lint, the runner, the PR table.

Synthetic inputs throughout; the checks of the real diffs against the reference file skip when
``../shared/upstream/`` is absent (a fresh clone in CI)."""

from __future__ import annotations

import argparse
import difflib
import io
import sys
from pathlib import Path

import pytest

from tools.delivery import pr as prmod
from tools.delivery import upstream_tests as ut
from tools.shared.layout import DEFAULT, Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn

PYTHON = Path(sys.executable)

BEFORE = """from __future__ import annotations


def _helper():
    return 1


def _other():
    return 2


class TestThing:
    def test_uses_helper(self):
        assert _helper() == 1

    def test_reads_internal(self):
        assert "result_queue"

    def test_untouched(self):
        assert _other() == 2
"""

AFTER = BEFORE.replace("    return 1\n", '    return int("1")\n').replace(
    'assert "result_queue"', 'assert "public surface"'
)

RECORDS = (
    "# upstream test | what changed | why | now covered by\n"
    "TestThing::test_uses_helper | its helper changed | deliberate change | TestThing::test_uses_helper\n"
    "TestThing::test_reads_internal | reads the public surface | removed internal | "
    "test_slots.py::test_dispatched_workloads_hold_slots_until_their_result\n\n"
)


def make_diff(before: str, after: str) -> str:
    rel = ut.REPO_FILE
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    return "".join(lines)


def synthetic_layout(tmp_path: Path, diff_text: str | None, reference: str | None = BEFORE) -> Layout:
    patches = tmp_path / "patches"
    (patches / ut.DIFFS_DIR).mkdir(parents=True)
    (patches / "series").write_text("0001-first.patch\n0002-second.patch\n")
    if diff_text is not None:
        (patches / ut.DIFFS_DIR / "0002-second.diff").write_text(diff_text)
    if reference is not None:
        target = tmp_path / "upstream" / ut.REPO_FILE
        target.parent.mkdir(parents=True)
        target.write_text(reference)
    return Layout(patches_dir=patches)


def test_touched_tests_follow_changed_helpers() -> None:
    assert ut.touched_tests(BEFORE, AFTER) == {
        "TestThing::test_uses_helper",
        "TestThing::test_reads_internal",
    }
    removed = BEFORE.replace("    def test_untouched(self):\n        assert _other() == 2\n", "")
    assert ut.touched_tests(BEFORE, removed) == {"TestThing::test_untouched"}


def test_parse_records_and_their_problems() -> None:
    records, problems = ut.parse_records(RECORDS + make_diff(BEFORE, AFTER) + "a | b | c | d\n", "x.diff")
    assert [r.test for r in records] == ["TestThing::test_uses_helper", "TestThing::test_reads_internal"]
    assert records[1].why == "removed internal" and problems == []
    _, problems = ut.parse_records(
        "T::t | changed | because | T::t\nT::u | only three | removed internal\n", "y"
    )
    assert problems == [
        "y:1: why 'because' is not one of: removed internal, mock of a changed wait, deliberate change",
        "y:2: a record line has 4 fields: test | change | why | covered by",
    ]


def test_check_matches_records_to_the_diff(tmp_path: Path) -> None:
    layout = synthetic_layout(tmp_path, RECORDS + make_diff(BEFORE, AFTER))
    upstream = tmp_path / "upstream"
    assert ut.check(layout, upstream=upstream) == ([], [])

    short = RECORDS.replace("TestThing::test_uses_helper | its helper", "# dropped")
    extra = RECORDS + "TestThing::test_untouched | nothing | deliberate change | TestThing::test_untouched\n"
    gone = RECORDS.replace("| TestThing::test_uses_helper\n", "| TestThing::test_gone\n")
    for records, expected in (
        (short, "changes TestThing::test_uses_helper but has no record of it"),
        (extra, "records TestThing::test_untouched, which it does not change"),
        (gone, "TestThing::test_uses_helper is covered by TestThing::test_gone, which is not in the file"),
    ):
        layout = synthetic_layout(tmp_path / expected[:7], records + make_diff(BEFORE, AFTER))
        problems, _ = ut.check(layout, upstream=tmp_path / expected[:7] / "upstream")
        assert [p.split(": ", 1)[1] for p in problems] == [expected]


def test_check_reports_a_diff_that_does_not_apply_and_skips_without_the_reference(tmp_path: Path) -> None:
    layout = synthetic_layout(
        tmp_path / "moved", RECORDS + make_diff(BEFORE, AFTER), BEFORE.replace("2", "3")
    )
    problems, _ = ut.check(layout, upstream=tmp_path / "moved" / "upstream")
    assert len(problems) == 1 and "0002-second.diff does not apply to upstream's" in problems[0]

    layout = synthetic_layout(tmp_path / "fresh", RECORDS + make_diff(BEFORE, AFTER), reference=None)
    problems, notes = ut.check(layout, upstream=tmp_path / "fresh" / "upstream")
    assert problems == [] and len(notes) == 1 and "is absent" in notes[0]

    layout = synthetic_layout(tmp_path / "stray", make_diff(BEFORE, AFTER))
    (layout.patches / ut.DIFFS_DIR / "0009-unknown.diff").write_text("")
    problems, _ = ut.check(layout, upstream=tmp_path / "stray" / "upstream")
    assert "patches/upstream-tests/0009-unknown.diff: names no patch of patches/series" in problems
    assert "patches/upstream-tests/0002-second.diff: no record of the upstream tests it changes" in problems


def test_missing_reference_is_one_line_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        stage=7,
        line=None,
        diffs=True,
        start_method=None,
        upstream=tmp_path / "nowhere",
        pytest_args=[],
        verbose=False,
    )
    assert ut._cmd(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "nowhere" / ut.REPO_FILE) in err


def test_run_text_counts_and_start_method(tmp_path: Path) -> None:
    text = (
        "import multiprocessing\n\nimport pytest\n\n\ndef test_ok():\n    pass\n\n\n"
        "def test_start_method():\n    assert multiprocessing.get_start_method() == 'spawn'\n\n\n"
        "@pytest.mark.db_test\n@pytest.mark.execution_timeout(5)\ndef test_fails():\n    assert False\n\n\n"
        "@pytest.mark.skipif(True, reason='upstream skips it')\ndef test_skipped():\n    pass\n"
    )
    outcome = ut.run_text(text, PYTHON, start_method="spawn")
    assert outcome.counts == {"passed": 2, "failed": 1, "skipped": 1}, outcome.output
    assert outcome.failed == ["test_local_executor.py::test_fails"] and not outcome.passed
    assert outcome.summary() == "2 passed, 1 failed, 1 skipped" and outcome.total == 4
    assert ut.parse_counts("== 56 passed, 1 skipped, 3 errors, 2 warnings in 9.1s ==") == {
        "passed": 56,
        "skipped": 1,
        "error": 3,
    }


def test_render_table() -> None:
    records, _ = ut.parse_records(RECORDS)
    outcome = ut.Outcome("python -m pytest", {"passed": 56, "skipped": 1}, [], 0)
    table = ut.render_table(records, outcome)
    assert table.startswith(f"### {ut.TABLE_TITLE}\n")
    assert "| upstream test | what changed | why | now covered by |" in table
    assert (
        "| `TestThing::test_reads_internal` | reads the public surface | removed internal | "
        "`test_slots.py::test_dispatched_workloads_hold_slots_until_their_result` |"
    ) in table
    assert "The whole file on this branch passes: 56 passed, 1 skipped (57 tests)." in table
    failing = ut.Outcome("x", {"passed": 1, "failed": 1}, ["test_local_executor.py::T::t"], 1)
    assert "FAILS: 1 passed, 1 failed (2 tests)" in ut.render_table([], failing)
    assert "This PR changes no test in" in ut.render_table([], None, "--no-test")


def test_pr_commits_the_diff_runs_the_whole_file_and_shows_the_table(
    world: tuple[Path, Layout, list[str]], tmp_path: Path
) -> None:
    repo, layout, names = world
    syn.plant_upstream_tests(repo)
    after = syn.UPSTREAM_FILE_TEXT.decode().replace('assert "result_queue"', 'assert "get_event_buffer"')
    records = (
        "TestLocalExecutor::test_reads_a_removed_internal | reads the public surface | removed internal | "
        "TestLocalExecutor::test_reads_a_removed_internal\n\n"
    )
    folder = layout.patches / ut.DIFFS_DIR
    folder.mkdir()
    (folder / names[3].replace(".patch", ".diff")).write_text(
        records + make_diff(syn.UPSTREAM_FILE_TEXT.decode(), after)
    )
    p = prmod.PrPreparer(
        repo,
        layout=layout,
        python=PYTHON,
        out_dir=tmp_path / "pr",
        out=io.StringIO(),
        evidence_dir=tmp_path / "build",
        equivalents={},
    ).prepare("4")
    assert syn.run("git", "show", f"{p.branch}:{syn.UPSTREAM_FILE}", cwd=repo) == after
    assert syn.UPSTREAM_FILE in syn.run("git", "show", "--name-only", "--format=", p.branch, cwd=repo).split()
    assert [r.test for r in p.upstream_records] == ["TestLocalExecutor::test_reads_a_removed_internal"]
    assert p.upstream_outcome is not None and p.upstream_outcome.counts == {"passed": 2}
    assert p.tests.passed
    assert all(f.hit.path != syn.UPSTREAM_FILE for f in p.findings)  # the scanner leaves it to the table
    body = p.body_path.read_text()
    assert f"### {ut.TABLE_TITLE}" in body
    assert "| `TestLocalExecutor::test_reads_a_removed_internal` | reads the public surface |" in body
    assert "The whole file on this branch passes: 2 passed (2 tests)." in body


def test_real_diffs_match_their_records_if_the_reference_is_present() -> None:
    if not ut.reference_file(DEFAULT).is_file():
        pytest.skip(f"{ut.reference_file(DEFAULT)} is absent (a fresh clone)")
    problems, notes = ut.check(DEFAULT)
    assert problems == [] and notes == []
    stems = sorted(p.stem.split("-", 1)[0] for p in ut.diffs_dir(DEFAULT).glob("*.diff"))
    assert stems == ["0007", "0008", "0009"]
