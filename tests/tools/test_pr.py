"""Upstream PR preparation against a synthetic Airflow clone and a tiny synthetic series."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from tools import commitmsg
from tools import pr as prmod
from tools.layout import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn

PYTHON = Path(sys.executable)  # has pytest; the synthetic test needs nothing else


def git(repo: Path, *args: str) -> str:
    return syn.run("git", *args, cwd=repo)


def preparer(repo: Path, layout: Layout, tmp_path: Path, **kw: object) -> prmod.PrPreparer:
    return prmod.PrPreparer(
        repo, layout=layout, python=PYTHON, out_dir=tmp_path / "pr", out=io.StringIO(), **kw
    )  # type: ignore[arg-type]


def test_prepare_a_significant_patch_with_tests(
    world: tuple[Path, Layout, list[str]], tmp_path: Path
) -> None:
    repo, layout, names = world
    head_before = git(repo, "rev-parse", "HEAD")
    p = preparer(repo, layout, tmp_path, generated_by="Claude Code").prepare("2")
    assert p.branch == "drain-the-result-queue-before-each-workload-put"
    # One commit on main, DEP-3 lines gone, author kept, newsfragment included.
    assert git(repo, "rev-list", "--count", f"main..{p.branch}").strip() == "1"
    message = git(repo, "log", "-1", "--format=%B", p.branch)
    assert message.startswith(syn.TITLES[2] + "\n\n" + syn.BODIES[2])
    for key in ("Origin:", "Bug:", "Forwarded:", "Applied-Upstream:", "Last-Update:", "Significant:"):
        assert key not in message
    assert git(repo, "log", "-1", "--format=%an <%ae>", p.branch).strip() == syn.AUTHOR
    files = git(repo, "show", "--name-only", "--format=", p.branch).split()
    assert "airflow-core/newsfragments/70545.significant.rst" in files and syn.TEST_PATH in files
    # Patch 2 alone (3-way over main, which lacks patch 1): its change and nothing else.
    bases = syn.all_bases()
    assert bases is not None
    assert git(repo, "show", f"{p.branch}:{syn.REPO_PATH}") == syn.edit2(bases["3.3"].decode(), "3.3")
    # The tests ran there, with plain pytest.
    assert p.tests.ran and p.tests.passed and "1 passed" in p.tests.summary
    # The clone's own checkout is untouched and no worktree is left behind.
    assert git(repo, "rev-parse", "HEAD") == head_before and git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1

    body = (tmp_path / "pr" / f"{names[1].removesuffix('.patch')}.md").read_text()
    assert body.startswith(syn.BODIES[2])
    assert "\ncloses: #70526\n" in body
    assert "### How was this tested" in body and f"python -m pytest {syn.TEST_PATH}` passes" in body
    assert "##### Was generative AI tooling used to co-author this PR?" in body
    assert (
        "- [X] Yes (please specify the tool below)\n\nGenerated-by: Claude Code following [the guidelines]"
        in body
    )
    assert "Origin:" not in body


def test_no_newsfragment_unless_significant_and_no_tests_reported(
    world: tuple[Path, Layout, list[str]], tmp_path: Path
) -> None:
    repo, layout, names = world
    p = preparer(repo, layout, tmp_path).prepare(names[0])
    assert p.newsfragment is None
    files = git(repo, "show", "--name-only", "--format=", p.branch).split()
    assert not any("newsfragments" in f for f in files)
    assert not p.tests.ran and "no test files" in p.tests.summary
    body = p.body_path.read_text()
    assert "related: #70526" in body  # the message does not say it fixes the issue
    assert "Not run by the preparation tool: the patch adds or changes no test files" in body
    assert "- [ ] Yes (please specify the tool below)" in body and "<!--\nGenerated-by: [Tool Name]" in body


def test_falls_back_to_no_conftest_when_airflows_test_env_is_absent(
    world: tuple[Path, Layout, list[str]], tmp_path: Path
) -> None:
    repo, layout, _ = world
    conftest = repo / "airflow-core" / "tests" / "conftest.py"
    conftest.parent.mkdir(parents=True, exist_ok=True)
    conftest.write_text("import tests_common  # only in Airflow's breeze environment\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Add a conftest that needs Airflow's dev env")
    p = preparer(repo, layout, tmp_path).prepare("0002")
    assert p.tests.ran and p.tests.passed and "--noconftest" in p.tests.command
    assert any("cannot run here" in n for n in p.tests.notes)
    assert "--noconftest" in p.body_path.read_text()


def test_failing_tests_are_reported_and_exit_non_zero(
    world: tuple[Path, Layout, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, layout, _ = world
    conftest = repo / "airflow-core" / "tests" / "unit" / "conftest.py"
    conftest.parent.mkdir(parents=True, exist_ok=True)
    conftest.write_text(
        "import pytest\n\n@pytest.fixture(autouse=True)\ndef boom():\n    raise AssertionError('no')\n"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "A conftest that fails every test")
    args = ["--repo", str(repo), "--patches", str(layout.patches), "--python", str(PYTHON)]
    assert prmod.main([*args, "--out-dir", str(tmp_path / "pr"), "2"]) == 1
    assert "tests FAILED" in capsys.readouterr().out


def test_refusals_change_nothing(world: tuple[Path, Layout, list[str]], tmp_path: Path) -> None:
    repo, layout, names = world
    refs_before = git(repo, "for-each-ref")
    with pytest.raises(prmod.PrError, match="no patch '9'"):
        preparer(repo, layout, tmp_path).prepare("9")
    # Patch 2 does not apply to v3-1-test's executor, even 3-way.
    with pytest.raises(
        prmod.PrError, match=rf"{names[1]}: does not apply to v3-1-test .*local_executor.py"
    ) as exc:
        preparer(repo, layout, tmp_path, base="v3-1-test").prepare("2")
    assert "\n" not in str(exc.value)
    assert git(repo, "for-each-ref") == refs_before
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (tmp_path / "pr").exists()

    first = preparer(repo, layout, tmp_path).prepare("3")
    with pytest.raises(prmod.PrError, match="already exists; pass --force"):
        preparer(repo, layout, tmp_path).prepare("3")
    again = preparer(repo, layout, tmp_path).prepare("3", force=True)
    assert again.branch == first.branch


def test_cli_prints_what_to_do_next(
    world: tuple[Path, Layout, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, layout, _ = world
    args = ["--repo", str(repo), "--patches", str(layout.patches), "--python", str(PYTHON)]
    assert prmod.main([*args, "--out-dir", str(tmp_path / "pr"), "--branch", "my-fix", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        "branch my-fix at" in out and "nothing pushed" in out and "gh pr create --repo apache/airflow" in out
    )
    assert prmod.main([*args, "--out-dir", str(tmp_path / "pr"), "--branch", "my-fix", "2"]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_references_closes_only_what_the_message_fixes() -> None:
    msg = commitmsg.parse(
        "Title\n\nThis fixes #70526 for good.\n\n"
        "Origin: upstream, https://github.com/apache/airflow/pull/70545\n"
        "Bug: https://github.com/apache/airflow/issues/70526\n"
        "Bug: https://github.com/apache/airflow/issues/74575\n"
        "Forwarded: no\nApplied-Upstream: no\nLast-Update: 2026-11-30\n"
    )
    assert msg.body == "This fixes #70526 for good."
    assert msg.pr_number == 70545 and msg.upstream_title() == "Title (#70545)"
    assert prmod.references(msg) == ["closes: #70526", "related: #74575"]
