"""Standalone upstream PRs (patches/upstream-prs/): lint, apply to 3.4.0b2, --check, ``pr --standalone``."""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tools.delivery import pr as prmod
from tools.delivery import pr_testrun, upstream_prs
from tools.engine.series import read_patch
from tools.lint import lint_series
from tools.shared import pins
from tools.shared.layout import DEFAULT, Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn

PYTHON = Path(sys.executable)  # has pytest; the synthetic tests need nothing else
TEST = "airflow-core/tests/unit/executors/test_local_executor_marker.py"
MARKED = "    def _marker(self):\n        return True\n\n"
# A test in the executor's repo layout that reads the executor next to it: fails without the marker.
TEST_FILE = b"""from __future__ import annotations

from pathlib import Path


def test_the_executor_has_the_marker():
    src = Path(__file__).resolve().parents[3] / "src/airflow/executors/local_executor.py"
    assert "def _marker(self):" in src.read_text()


def test_unrelated():
    assert True
"""


def git(repo: Path, *args: str) -> str:
    return syn.run("git", *args, cwd=repo)


def standalone_patches(
    root: Path, base: bytes, *, regression: str = f"{TEST}::test_the_executor_has_the_marker"
) -> Layout:
    """A patches/ dir whose upstream-prs/ holds one standalone PR against ``base``: a method and its test."""
    scratch = root / "scratch-standalone"
    scratch.mkdir(parents=True)
    git(scratch, "init", "-q", "-b", "main")
    syn.commit_file(scratch, pins.REPO_PATH, base, "base", "2026-02-01T00:00:00+0000")
    text = base.decode()
    anchor = "    def _check_workers(self):\n"
    assert anchor in text
    (scratch / pins.REPO_PATH).write_text(text.replace(anchor, MARKED + anchor, 1))
    (scratch / TEST).parent.mkdir(parents=True, exist_ok=True)
    (scratch / TEST).write_bytes(TEST_FILE)
    git(scratch, "add", "-A")
    message = (
        "Mark the LocalExecutor\n\nThe executor had no marker; this adds one. Fixes #70526.\n\n"
        "Origin: vendor\nBug: https://github.com/apache/airflow/issues/70526\nForwarded: no\n"
        f"Applied-Upstream: no\nLast-Update: 2026-12-03\nRegression-Test: {regression}\n"
    )
    git(
        scratch,
        "commit",
        "-q",
        "--author",
        "LocalExecutor series <series@localexecutor.invalid>",
        "-m",
        message,
    )
    out = root / "patches" / "upstream-prs"
    out.mkdir(parents=True)
    names = git(scratch, "format-patch", "--full-index", "--zero-commit", "-o", str(out), "HEAD~1").split()
    (out / "list").write_text("# standalone\n" + "\n".join(Path(n).name for n in names) + "\n")
    (root / "patches" / "series").write_text("# no series\n")
    return Layout(patches_dir=root / "patches")


# ---------------------------------------------------------------- the real standalone PRs


def test_real_standalone_prs_lint_clean_and_apply_to_the_pinned_base(bases: dict[str, bytes]) -> None:
    listed = upstream_prs.names(DEFAULT)
    assert len(listed) == 3 and upstream_prs.lint(DEFAULT) == []
    assert not [e for e in lint_series(DEFAULT) if "upstream-prs" in e]
    for name in listed:
        patch = read_patch(DEFAULT.upstream_prs / name)
        tree = upstream_prs.apply_to(DEFAULT.upstream_prs / name, bases[upstream_prs.line().name])
        assert tree[pins.REPO_PATH] != bases["3.4"]
        assert set(tree) == set(patch.touched)  # the executor and new test files, nothing of the series
        tests = upstream_prs.regression_tests(patch)
        assert tests and all(t.split("::")[0] in tree for t in tests)
        assert all(
            p.startswith("airflow-core/tests/unit/executors/test_local_executor_")
            for p in tree
            if "/tests/" in p
        )


def test_real_standalone_prs_as_one_commit_each_on_main(tmp_path: Path, bases: dict[str, bytes]) -> None:
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    syn.plant_upstream_tests(repo)
    prep = prmod.PrPreparer(repo, out_dir=tmp_path / "pr", out=io.StringIO(), evidence_dir=tmp_path / "b")
    for name in upstream_prs.names(DEFAULT):
        p = prep.prepare_standalone(name, run_tests=False)
        assert git(repo, "rev-list", "--count", f"main..{p.branch}").strip() == "1"
        message = git(repo, "log", "-1", "--format=%B", p.branch)
        assert "Origin:" not in message and "Regression-Test:" not in message and "Last-Update" not in message
        body = p.body_path.read_text()
        assert p.body_path.name == name.removesuffix(".patch") + ".md"
        assert "### What this PR contains" in body and "depends on no other change" in body
        assert "Related upstream" in body or "review" in body
    assert git(repo, "status", "--porcelain") == "" and len(git(repo, "worktree", "list").splitlines()) == 1


# ---------------------------------------------------------------- the tools, on a synthetic one


def test_check_runs_the_tests_without_and_with_the_patch(tmp_path: Path, bases: dict[str, bytes]) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"])
    assert upstream_prs.lint(layout) == []
    results = upstream_prs.check(layout, base=bases["3.4"], python=PYTHON)
    (r,) = results
    assert r.applies == "clean" and r.ok, upstream_prs.render(results, "3.4.0b2")
    assert r.base is not None and r.base.returncode == 1 and "1 failed, 1 passed" in r.base.summary
    assert r.fixed is not None and r.fixed.passed
    table = upstream_prs.render(results, "3.4.0b2")
    assert (
        "FAIL (1 failed, 1 passed" in table and "test_the_executor_has_the_marker: fails unpatched" in table
    )


def test_check_is_not_ok_when_the_regression_test_does_not_fail(
    tmp_path: Path, bases: dict[str, bytes]
) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"], regression=f"{TEST}::test_unrelated")
    (r,) = upstream_prs.check(layout, base=bases["3.4"], python=PYTHON)
    assert not r.ok  # test_unrelated passes unpatched; the failing one is not named
    assert "DOES NOT FAIL" in upstream_prs.render([r], "3.4.0b2")


def test_check_reports_a_patch_that_does_not_apply(tmp_path: Path, bases: dict[str, bytes]) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"])
    seen: list[Sequence[str]] = []

    def runner(tree: Path, files: Sequence[str], line: pins.Line, python: Path | None) -> pr_testrun.TestRun:
        seen.append(files)
        return pr_testrun.TestRun(True, True, "", "")

    (r,) = upstream_prs.check(layout, base=bases["3.3"], runner=runner)
    assert r.applies.startswith("hunk #1 at airflow-core/src/airflow/executors/local_executor.py:")
    assert not r.ok and not seen  # nothing runs for a patch that does not apply


def test_lint_names_what_is_wrong(tmp_path: Path, bases: dict[str, bytes]) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"], regression="airflow-core/tests/unit/other.py::test_x")
    (layout.upstream_prs / "0009-stray.patch").write_text("")
    problems = upstream_prs.lint(layout)
    assert any("0009-stray.patch is not listed in" in p for p in problems)
    assert any(
        "Regression-Test airflow-core/tests/unit/other.py::test_x is not in a test file" in p
        for p in problems
    )


def test_pr_standalone_shows_the_test_failing_on_main_and_passing_on_the_branch(
    tmp_path: Path, bases: dict[str, bytes]
) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"])
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    syn.plant_upstream_tests(repo)
    head_before = git(repo, "rev-parse", "HEAD")
    out = io.StringIO()
    prep = prmod.PrPreparer(
        repo, layout=layout, python=PYTHON, out_dir=tmp_path / "pr", out=out, evidence_dir=tmp_path / "b"
    )
    p = prep.prepare_standalone("1", branch="mark-it")
    assert git(repo, "rev-list", "--count", "main..mark-it").strip() == "1"
    assert set(git(repo, "show", "--name-only", "--format=", "mark-it").split()) == {pins.REPO_PATH, TEST}
    assert git(repo, "log", "-1", "--format=%an <%ae>", "mark-it").strip() == (
        "LocalExecutor series <series@localexecutor.invalid>"
    )
    assert p.tests.ran and p.tests.passed
    body = p.body_path.read_text()
    assert "closes: #70526" in body and "Regression-Test" not in body
    assert f"- `python -m pytest {TEST}` passes: 2 passed" in body
    assert (
        f"- on `main` (3.4.0b2) without the fix, `python -m pytest {TEST}` fails as it should: "
        "1 failed, 1 passed"
    ) in body
    assert "(`test_the_executor_has_the_marker` failed)" in body
    assert "This PR removes no module-level name" in body
    assert "tests passed" in out.getvalue() and "nothing pushed" in out.getvalue()
    # the clone as it was: its checkout, no worktree left, main's executor untouched
    assert git(repo, "rev-parse", "HEAD") == head_before and git(repo, "status", "--porcelain") == ""
    assert git(repo, "show", f"main:{pins.REPO_PATH}") == bases["3.4"].decode()
    with pytest.raises(prmod.PrError, match="already exists; pass --force"):
        prep.prepare_standalone("1", branch="mark-it")


def test_pr_standalone_refuses_a_base_it_does_not_apply_to(tmp_path: Path, bases: dict[str, bytes]) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"])
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    refs = git(repo, "for-each-ref")
    prep = prmod.PrPreparer(
        repo, layout=layout, base="v3-3-test", python=PYTHON, out_dir=tmp_path / "pr", out=io.StringIO()
    )
    with pytest.raises(prmod.PrError, match=r"does not apply to v3-3-test \(\w+\): hunk #1 at ") as exc:
        prep.prepare_standalone("0001")
    assert "\n" not in str(exc.value)
    with pytest.raises(prmod.PrError, match="no standalone PR '7'"):
        prep.prepare_standalone("7")
    assert git(repo, "for-each-ref") == refs and len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (tmp_path / "pr").exists()


def test_pr_cli_takes_a_series_patch_or_standalone(
    tmp_path: Path, bases: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    layout = standalone_patches(tmp_path, bases["3.4"])
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    args = ["--repo", str(repo), "--patches", str(layout.patches), "--python", str(PYTHON)]
    args += ["--out-dir", str(tmp_path / "pr")]
    assert prmod.main([*args, "--standalone", "1"]) == 0
    assert "branch mark-the-localexecutor at" in capsys.readouterr().out
    assert prmod.main(args) == 1
    assert "name a patch of the series or --standalone NAME" in capsys.readouterr().err
    assert prmod.main([*args, "2", "--standalone", "1"]) == 1
