"""The backport driver against a synthetic Airflow clone (main = 3.4.0b2) and a small synthetic series."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.delivery import backport as bp
from tools.engine.series import read_series_names
from tools.shared import pins
from tools.shared.layout import DEFAULT, Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn

BRANCHES = ["v3-3-test", "v3-2-test", "v3-1-test"]
LINES = {"v3-3-test": "3.3", "v3-2-test": "3.2", "v3-1-test": "3.1"}


def git(repo: Path, *args: str) -> str:
    return syn.run("git", *args, cwd=repo)


def branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def expected(bases: dict[str, bytes], line: str, k: int = syn.N) -> str:
    return syn.stage_text(bases, line, k)


def assert_clean_on_main(repo: Path, before: set[str]) -> None:
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "CHERRY_PICK_HEAD").exists()
    assert not (repo / ".git" / bp.STATE_FILE).exists()
    assert branches(repo) == before


def commits(repo: Path, branch: str, backport_branch: str) -> list[str]:
    return git(repo, "log", "--reverse", "--format=%H", f"{branch}..{backport_branch}").split()


def test_series_on_main_skips_what_is_upstream(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    out = io.StringIO()
    st = bp.Backport(repo, layout=layout, out=out).start(["v3-3-test"])
    # Patch 1 is in 3.4.0b2 (the engine says "upstream" on the 3.4 line): no commit on lepatch-series.
    assert st.source[0].upstream == "3.4.0b2" and st.source[0].sha == ""
    assert all(s.sha and not s.upstream for s in st.source[1:])
    assert git(repo, "rev-list", "--count", f"main..{bp.SERIES_BRANCH}").strip() == str(syn.N - 1)
    assert "0001 already upstream in 3.4.0b2" in out.getvalue()
    # main's form of the series: the 3.4 line's stages (its recorded resolutions included).
    assert git(repo, "show", f"{bp.SERIES_BRANCH}:{pins.REPO_PATH}") == expected(syn_bases(), "3.4")
    # The source commits look like squash merges on main: (#PR) in the title, no DEP-3 lines.
    source = git(repo, "log", "-1", "--format=%B", st.source[1].sha)
    assert source.startswith("Drain the result queue before each workload put (#70545)\n")
    assert "Origin:" not in source and "Last-Update:" not in source and "PR-Folds" not in source
    # The test files that upstream patch 1 brings (main lacks them) come with the first commit
    # whose tests need them, so lepatch-series' tests run on main.
    assert git(repo, "show", f"{bp.SERIES_BRANCH}:{syn.CONFTEST_PATH}").encode() == syn.CONFTEST


def syn_bases() -> dict[str, bytes]:
    found = syn.all_bases()
    assert found is not None
    return found


def test_upstream_patch_is_applied_from_the_series_with_a_backported_note(
    world: tuple[Path, Layout, list[str]], bases: dict[str, bytes]
) -> None:
    repo, layout, _ = world
    st = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-2-test"])
    run = st.branches[0]
    first, second = commits(repo, "v3-2-test", run.backport_branch)[:2]
    assert git(repo, "log", "-1", "--format=%B", first).strip() == (
        f"[v3-2-test] {syn.TITLES[1]} (#67881)\n"
        "\n"
        f"{syn.BODIES[1]}\n"
        "(backported from apache/airflow#67881)\n"
        "\n"
        f"Co-authored-by: {syn.UPSTREAM_AUTHOR}"
    )
    assert git(repo, "log", "-1", "--format=%an <%ae>", first).strip() == syn.UPSTREAM_AUTHOR
    assert "cherry picked" not in git(repo, "log", "-1", "--format=%B", first)
    # The 3.2 line's form of patch 1 (the engine's stage 0 -> 1 of 3.2), tests included.
    assert git(repo, "show", f"{first}:{pins.REPO_PATH}") == expected(bases, "3.2", 1)
    assert git(repo, "show", f"{first}:{syn.TERMINATE_TEST_PATH}").encode() == syn.TERMINATE_TEST
    # A patch that is not upstream keeps cherry_picker's format, naming its lepatch-series commit.
    assert git(repo, "log", "-1", "--format=%B", second).strip() == (
        f"[v3-2-test] {syn.TITLES[2]} (#70545)\n"
        "\n"
        "A blocked put could deadlock the scheduler.\n\nFixes #70526.\n"
        f"(cherry picked from commit {st.source[1].sha})\n"
        "\n"
        f"Co-authored-by: {syn.AUTHOR}"
    )
    assert git(repo, "show", f"{run.backport_branch}:{pins.REPO_PATH}") == expected(bases, "3.2")
    assert any("3.2 line's form (resolution)" in n for n in run.notes)


def test_upstream_commit_header_gives_the_cherry_picked_line(tmp_path: Path, bases: dict[str, bytes]) -> None:
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    syn.make_series(tmp_path / "patches", bases, upstream_commit=True)
    layout = Layout(patches_dir=tmp_path / "patches")
    st = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-3-test"])
    first = commits(repo, "v3-3-test", st.branches[0].backport_branch)[0]
    message = git(repo, "log", "-1", "--format=%B", first)
    assert f"\n{syn.BODIES[1]}\n(cherry picked from commit {syn.UPSTREAM_SHA})\n\nCo-authored-by: " in message
    assert "backported from" not in message
    assert st.source[0].upstream_commit == syn.UPSTREAM_SHA


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


def test_every_branch_gets_its_lines_form(
    world: tuple[Path, Layout, list[str]], bases: dict[str, bytes], tmp_path: Path
) -> None:
    repo = syn.make_airflow_repo(tmp_path / "airflow2", bases)
    syn.make_series(tmp_path / "p2" / "patches", bases, resolutions=("3.4", "3.2", "3.1"))
    layout = Layout(patches_dir=tmp_path / "p2" / "patches")
    st = bp.Backport(repo, layout=layout, out=io.StringIO()).start(["3.3", "3.2", "3.1"])  # line names work
    for run in st.branches:
        assert run.status == "done"
        line = LINES[run.branch]
        assert git(repo, "show", f"{run.backport_branch}:{pins.REPO_PATH}") == expected(bases, line)
        log = git(repo, "log", "--format=%s", f"{run.branch}..{run.backport_branch}").splitlines()
        assert log == [
            f"[{run.branch}] {syn.TITLES[n]}" + {1: " (#67881)", 2: " (#70545)", 4: " (#74588)"}.get(n, "")
            for n in range(syn.N, 0, -1)
        ]


def test_conflict_stops_then_continue_after_hand_resolution(
    world: tuple[Path, Layout, list[str]], bases: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, layout, _ = world  # no resolution for 3.1: the engine fails there from patch 2 on
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

    (repo / pins.REPO_PATH).write_text(expected(bases, "3.1", 2))
    git(repo, "add", pins.REPO_PATH)
    code = bp.main([*args, "--continue"])
    while code == 2:  # later patches may stop too (3.1 has no line form past patch 1)
        capsys.readouterr()
        st = json.loads((repo / ".git" / bp.STATE_FILE).read_text())
        k = st["branches"][2]["next_patch"] + 1
        (repo / pins.REPO_PATH).write_text(expected(bases, "3.1", k))
        for rel, data in syn.TEST_FILES.get(k, []):
            (repo / rel).write_bytes(data)
        git(repo, "add", "-A")
        code = bp.main([*args, "--continue"])
    assert code == 0
    out = capsys.readouterr().out
    assert "nothing pushed; back on main" in out
    sha7 = state["source"][-1]["sha"][:7]
    for branch in BRANCHES:
        assert git(repo, "show", f"backport-{sha7}-{branch}:{pins.REPO_PATH}") == expected(
            bases, LINES[branch]
        )
    continued = git(repo, "log", "-1", "--format=%B", f"backport-{sha7}-v3-1-test~{syn.N - 2}")
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


def test_refuses_a_bad_upstream_commit_header(tmp_path: Path, bases: dict[str, bytes]) -> None:
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    names = syn.make_series(tmp_path / "patches", bases, upstream_commit=True)
    first = tmp_path / "patches" / names[0]
    first.write_text(first.read_text().replace(syn.UPSTREAM_SHA, "abc123"))
    before = branches(repo)
    with pytest.raises(bp.BackportError, match=rf"{names[0]}: Upstream-Commit must be a 40-hex") as exc:
        bp.Backport(repo, layout=Layout(patches_dir=tmp_path / "patches"), out=io.StringIO()).start(
            ["v3-3-test"]
        )
    assert "\n" not in str(exc.value) and branches(repo) == before


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
    if not read_series_names(DEFAULT.series_file):
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
    except bp.BackportError as exc:
        pytest.skip(f"the real series does not apply to main (3.4) yet: {exc}")
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


def test_summary_notes_are_wrapped(world: tuple[Path, Layout, list[str]]) -> None:
    repo, layout, _ = world
    out = io.StringIO()
    bp.Backport(repo, layout=layout, out=out).start(BRANCHES[:2])
    summary = out.getvalue().split("backport branch", 1)[1].splitlines()
    assert max(len(ln) for ln in summary) <= bp.WIDTH
    assert any(ln.startswith("    - ") for ln in summary)


def test_refuses_a_repo_that_is_not_an_airflow_clone(tmp_path: Path) -> None:
    repo = tmp_path / "not-airflow"
    repo.mkdir()
    for args in (
        ("init", "-q", "-b", "main"),
        ("commit", "-q", "--allow-empty", "-m", "x"),
        ("branch", "v3-3-test"),
    ):
        git(repo, *args)
    with pytest.raises(
        bp.BackportError, match=r"main has no .* not an Airflow clone: git clone https://"
    ) as exc:
        bp.Backport(repo, out=io.StringIO()).start(["v3-3-test"])
    assert "\n" not in str(exc.value)
    assert branches(repo) == {"main", "v3-3-test"} and not (repo / ".git" / bp.STATE_FILE).exists()


def test_missing_git_identity_is_named_not_does_not_apply(
    world: tuple[Path, Layout, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, layout, _ = world
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    (tmp_path / "gitconfig").write_text("[user]\n\tuseConfigOnly = true\n")
    for key in ("user.name", "user.email"):
        subprocess.run(["git", "config", "--unset", key], cwd=repo, check=False)
    before = branches(repo)
    with pytest.raises(bp.BackportError, match="git has no identity to commit with") as exc:
        bp.Backport(repo, layout=layout, out=io.StringIO()).start(["v3-3-test"])
    assert "does not apply" not in str(exc.value) and "\n" not in str(exc.value)
    assert branches(repo) == before and not (repo / ".git" / bp.STATE_FILE).exists()
