"""The backport driver against a synthetic Airflow clone and a tiny synthetic series."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import backport as bp
from tools import pins
from tools.layout import DEFAULT, Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn

BRANCHES = ["v3-3-test", "v3-2-test", "v3-1-test"]


def git(repo: Path, *args: str) -> str:
    return syn.run("git", *args, cwd=repo)


def branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def expected(bases: dict[str, bytes], line: str) -> str:
    return syn.edit3(syn.edit2(syn.edit1(bases[line].decode()), line))


def assert_clean_on_main(repo: Path, before: set[str]) -> None:
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "CHERRY_PICK_HEAD").exists()
    assert not (repo / ".git" / bp.STATE_FILE).exists()
    assert branches(repo) == before


def test_commit_format_matches_cherry_picker(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    st = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-3-test"])
    run = st.branches[0]
    assert run.status == "done" and run.backport_branch == f"backport-{st.source[-1].sha[:7]}-v3-3-test"
    first = git(repo, "log", "--reverse", "--format=%H", f"v3-3-test..{run.backport_branch}").split()[0]
    message = git(repo, "log", "-1", "--format=%B", first).strip()
    assert message == (
        "[v3-3-test] Drain results while joining workers in end() (#67881)\n"
        "\n"
        "end() joined workers without reading their results.\n"
        f"(cherry picked from commit {st.source[0].sha})\n"
        "\n"
        "Co-authored-by: Jane Contributor <jane@example.org>"
    )
    assert git(repo, "log", "-1", "--format=%an <%ae>", first).strip() == syn.AUTHOR
    # The source commit looks like a squash merge on main: (#PR) in the title, no DEP-3 lines.
    source = git(repo, "log", "-1", "--format=%B", st.source[1].sha)
    assert source.startswith("Drain the result queue before each workload put (#70545)\n")
    assert "Origin:" not in source and "Last-Update:" not in source
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert not (repo / ".git" / bp.STATE_FILE).exists()


def test_message_keeps_existing_trailers_after_the_new_ones(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "f").write_text("x\n")
    git(repo, "add", "f")
    syn.run(
        "git", "commit", "-q", "--author", syn.AUTHOR, "-m",
        "[3.2] Fix it (#123)\n\nBody.\n\nCo-authored-by: Other <o@example.org>", cwd=repo,
    )  # fmt: skip
    sha = git(repo, "rev-parse", "HEAD").strip()
    # As cherry_picker's own test_get_updated_commit_message_with_trailers expects.
    assert bp.cherry_picker_message(repo, sha, "v3-2-test") == (
        "[v3-2-test] Fix it (#123)\n\nBody.\n"
        f"(cherry picked from commit {sha})\n\n"
        "Co-authored-by: Jane Contributor <jane@example.org>\n"
        "Co-authored-by: Other <o@example.org>"
    )


def test_recorded_resolution_is_used(world: tuple[Path, Layout, list[str]], bases: dict[str, bytes]) -> None:
    repo, layout, names = world
    st = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["3.2"])  # a line name works too
    run = st.branches[0]
    assert run.branch == "v3-2-test" and run.status == "done"
    assert any("recorded resolution" in n and names[1] in n for n in run.notes)
    assert git(repo, "show", f"{run.backport_branch}:{pins.REPO_PATH}") == expected(bases, "3.2")
    assert git(repo, "show", f"{run.backport_branch}:{syn.TEST_PATH}").encode() == syn.TEST_FILE


def test_conflict_stops_then_continue_after_hand_resolution(
    world: tuple[Path, Layout, list[str]], bases: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, layout, _ = world
    args = ["--repo", str(repo), "--patches", str(layout.patches)]
    assert bp.main([*args, *BRANCHES]) == 2
    report = capsys.readouterr().err
    assert report.startswith(f'FAILED: patch "{syn.TITLES[2]} (#70545)" failed to apply to v3-1-test')
    assert f"    {pins.REPO_PATH}" in report
    assert "No resolution is recorded for line 3.1" in report
    assert '("Executor as released in 3.2.2")' in report  # a likely prerequisite on main
    assert "--continue" in report and "--abort" in report and "git add" in report

    state = json.loads((repo / ".git" / bp.STATE_FILE).read_text())
    assert state["state"] == "paused"
    assert [b["status"] for b in state["branches"]] == ["done", "done", "paused"]
    assert bp.main([*args, "--status"]) == 0
    status = capsys.readouterr().out
    assert "remaining: v3-1-test" in status and "unresolved conflicts" in status

    assert bp.main([*args, "--continue"]) == 1  # conflicts not resolved yet
    assert "unresolved conflicts remain" in capsys.readouterr().err

    (repo / pins.REPO_PATH).write_text(syn.edit2(syn.edit1(bases["3.1"].decode()), "3.1"))
    git(repo, "add", pins.REPO_PATH)
    assert bp.main([*args, "--continue"]) == 0
    out = capsys.readouterr().out
    assert "resolved by hand" in out and "nothing pushed; back on main" in out
    sha7 = state["source"][-1]["sha"][:7]
    for branch, line in zip(BRANCHES, ("3.3", "3.2", "3.1"), strict=True):
        assert git(repo, "show", f"backport-{sha7}-{branch}:{pins.REPO_PATH}") == expected(bases, line)
        log = git(repo, "log", "--format=%s", f"{branch}..backport-{sha7}-{branch}").splitlines()
        assert log == [
            f"[{branch}] {t}"
            for t in (syn.TITLES[3], syn.TITLES[2] + " (#70545)", syn.TITLES[1] + " (#67881)")
        ]
    continued = git(repo, "log", "-1", "--format=%B", f"backport-{sha7}-v3-1-test~1")
    assert f"(cherry picked from commit {state['source'][1]['sha']})" in continued
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert not (repo / ".git" / bp.STATE_FILE).exists()


def test_abort_gets_back_to_a_clean_state(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    before = branches(repo)
    b = bp.Backport(repo, layout=layout, out=io.StringIO())
    with pytest.raises(bp.BackportPaused):
        b.start(["v3-1-test", "v3-3-test"])
    (repo / pins.REPO_PATH).write_text("half-done hand edit\n")  # abort must discard this too
    (repo / "scratch.txt").write_text("untracked\n")
    assert b.abort() == []
    (repo / "scratch.txt").unlink()
    assert_clean_on_main(repo, before)


def test_abort_from_another_starting_branch(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    git(repo, "checkout", "-q", "v3-2-test")
    before = branches(repo)
    b = bp.Backport(repo, layout=layout, out=io.StringIO())
    with pytest.raises(bp.BackportPaused):
        b.start(["v3-1-test"])
    assert bp.main(["--repo", str(repo), "--abort"]) == 0
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "v3-2-test"
    assert branches(repo) == before and git(repo, "status", "--porcelain") == ""


def test_refuses_a_dirty_tree(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    before = branches(repo)
    (repo / "README.md").write_text("local change\n")
    with pytest.raises(bp.BackportError, match=r"work tree is dirty \(M README.md\)") as exc:
        bp.Backport(repo, layout=layout, out=io.StringIO()).start(BRANCHES)
    assert "\n" not in str(exc.value)
    assert branches(repo) == before and not (repo / ".git" / bp.STATE_FILE).exists()


def test_refuses_an_unknown_branch_and_a_second_run(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    before = branches(repo)
    b = bp.Backport(repo, layout=layout, out=io.StringIO())
    with pytest.raises(bp.BackportError, match="no branch 'v2-10-test'"):
        b.start(["v3-3-test", "v2-10-test"])
    assert branches(repo) == before
    with pytest.raises(bp.BackportPaused):
        b.start(["v3-1-test"])
    with pytest.raises(bp.BackportError, match=r"already in progress .*remaining: v3-1-test"):
        b.start(["v3-3-test"])
    b.abort()


def test_rerun_reuses_the_series_branch(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    first = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-3-test"])
    git(repo, "branch", "-D", first.branches[0].backport_branch)
    second = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-3-test"])
    assert [s.sha for s in second.source] == [s.sha for s in first.source]
    assert not second.series_branch_created
    with pytest.raises(bp.BackportError, match="already exists"):
        bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-3-test"])


def test_test_option_runs_the_line_tests(
    world: tuple[Path, Layout, list[str]], bases: dict[str, bytes]
) -> None:
    repo, layout, _ = world
    seen: list[tuple[str, bytes]] = []

    def tester(line: str, source: bytes) -> tuple[bool, str]:
        seen.append((line, source))
        return line != "3.2", "1 passed" if line != "3.2" else "1 failed"

    st = bp.Backport(repo, layout=layout, out=io.StringIO(), tester=tester).start(
        ["v3-3-test", "v3-2-test"], test=True
    )
    assert [s[0] for s in seen] == ["3.3", "3.2"]
    assert seen[0][1].decode() == expected(bases, "3.3")
    assert [b.status for b in st.branches] == ["tests-passed", "tests-failed"]


def test_real_series_if_present(tmp_path: Path, bases: dict[str, bytes]) -> None:
    if not bp.read_series_names(DEFAULT.series_file):
        pytest.skip("no real series yet")
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    before = branches(repo)
    b = bp.Backport(repo, out=io.StringIO())
    try:
        st = b.start(BRANCHES)
    except bp.BackportPaused as paused:
        report = str(paused)
        assert report.startswith("FAILED: patch") and "--continue" in report
        b.abort()
        assert_clean_on_main(repo, before)
        return
    assert all(run.status == "done" for run in st.branches)
    primary = st.branches[0]
    overlay = DEFAULT.overlay / "3.3" / pins.PACKAGE_PATH
    if overlay.is_file():
        shown = subprocess.run(
            ["git", "show", f"{primary.backport_branch}:{pins.REPO_PATH}"],
            cwd=repo,
            capture_output=True,
            check=True,
        ).stdout
        assert shown == overlay.read_bytes()
