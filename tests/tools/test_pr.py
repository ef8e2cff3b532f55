"""Upstream PR preparation against a synthetic Airflow clone (main = 3.4.0b2) and a synthetic series."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.delivery import pr as prmod
from tools.delivery import pr_evidence, pr_internals, pr_testrun
from tools.shared import commitmsg, pins
from tools.shared.layout import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn

PYTHON = Path(sys.executable)  # has pytest; the synthetic tests need nothing else
EQUIVALENTS = {"_check_workers": ("test_reap.py::test_dead_worker_is_reaped", "test_reap.py::test_not_there")}


def git(repo: Path, *args: str) -> str:
    return syn.run("git", *args, cwd=repo)


def preparer(repo: Path, layout: Layout, tmp_path: Path, **kw: object) -> prmod.PrPreparer:
    return prmod.PrPreparer(
        repo,
        layout=layout,
        python=kw.pop("python", PYTHON),  # type: ignore[arg-type]
        out_dir=tmp_path / "pr",
        out=io.StringIO(),
        evidence_dir=tmp_path / "build",
        equivalents=EQUIVALENTS,
        **kw,  # type: ignore[arg-type]
    )


def changed(repo: Path, branch: str) -> list[str]:
    return git(repo, "show", "--name-only", "--format=", branch).split()


def test_folded_pr_is_one_commit_from_the_last_upstream_stage(
    world: tuple[Path, Layout, list[str]], tmp_path: Path, bases: dict[str, bytes]
) -> None:
    repo, layout, names = world
    syn.plant_upstream_tests(repo)
    head_before = git(repo, "rev-parse", "HEAD")
    p = preparer(repo, layout, tmp_path, generated_by="Claude Code").prepare("4")
    assert p.branch == "reap-dead-workers-in-one-place"
    assert p.plan is not None and (p.plan.start, p.plan.end) == (1, 4) and p.plan.folds == names[1:3]
    assert git(repo, "rev-list", "--count", f"main..{p.branch}").strip() == "1"
    # Exactly the 3.4 line's stage 4: the seed's helper (added by 3, removed by 4) never appears.
    diff = git(repo, "show", p.branch)
    assert "_drain_some" not in diff and "_DRAIN_BATCH" not in diff
    assert git(repo, "show", f"{p.branch}:{syn.REPO_PATH}") == syn.stage_text(bases, "3.4", 4)
    files = changed(repo, p.branch)
    # its tests, plus the test files of upstream patch 1 that they edit or need (main lacks them)
    assert {syn.REAP_TEST_PATH, syn.TEST_PATH, syn.TERMINATE_TEST_PATH, syn.CONFTEST_PATH} <= set(files)
    message = git(repo, "log", "-1", "--format=%B", p.branch)
    assert message.startswith(syn.TITLES[4] + "\n\n" + syn.BODIES[4]) and "PR-Folds" not in message
    assert git(repo, "log", "-1", "--format=%an <%ae>", p.branch).strip() == syn.AUTHOR
    assert p.tests.ran and p.tests.passed and "4 passed" in p.tests.summary
    assert git(repo, "rev-parse", "HEAD") == head_before and git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1

    body = p.body_path.read_text()
    assert body.startswith(syn.BODIES[4])
    assert "from stage 1 to stage 4" in body and "Patch 0001 of the series is upstream already" in body
    assert f'- 0002 "{syn.TITLES[2]}"' in body and f'- 0003 "{syn.TITLES[3]}"' in body
    assert "`conftest.py`, `test_terminate.py`" in body
    # removed internals, derived from the code: two renames
    assert [(r.qualified, r.how) for r in p.removed] == [
        ("local_executor._run_worker", "renamed to _worker_loop"),
        ("LocalExecutor._check_workers", "renamed to _reap_workers"),
    ]
    rows = [(f.hit.path, f.hit.test, f.hit.name, f.hit.how, tuple(f.ours)) for f in p.findings]
    reap = ("test_reap.py::test_dead_worker_is_reaped",)
    spawn = "TestLocalExecutor.test_spawn_targets_run_worker"
    assert rows == [
        (syn.UPSTREAM_CHECK_WORKERS_TEST, "test_check_workers_on_an_unstarted_executor", "_check_workers",
         "attribute", reap),
        (syn.UPSTREAM_TEST, "TestLocalExecutor.test_sync_checks_workers", "_check_workers", "string", reap),
        (syn.UPSTREAM_TEST, spawn, "_run_worker", "string", ()),
        (syn.UPSTREAM_TEST, spawn, "_run_worker", "attribute", ()),
    ]  # fmt: skip
    # the unrelated scheduler test has no hit; upstream's test_local_executor.py is not scanned (its table)
    assert "4 use(s) in 2 of the 3 test files" in body
    assert "### Upstream's test_local_executor.py in this PR" in body
    assert "This PR changes no test in" in body and "The whole file on this branch passes: 2 passed" in body
    assert (
        f"| `{syn.UPSTREAM_CHECK_WORKERS_TEST}:9` | `test_check_workers_on_an_unstarted_executor` | "
        "`LocalExecutor._check_workers` (attribute) | `test_reap.py::test_dead_worker_is_reaped` |"
    ) in body
    assert "`local_executor._run_worker` (string) | no equivalent |" in body
    assert "test_not_there" not in body  # a mapped test the PR does not have is not claimed
    assert "### How this was verified" in body and "`build/verify.json` is absent" in body
    assert "Generated-by: Claude Code" in body and "Origin:" not in body


def test_stacked_pr_prepares_its_base_first(
    world: tuple[Path, Layout, list[str]], tmp_path: Path, bases: dict[str, bytes]
) -> None:
    repo, layout, _ = world
    syn.plant_upstream_tests(repo)
    out = io.StringIO()
    prep = preparer(repo, layout, tmp_path)
    prep.out = out
    p = prep.prepare("0005")
    parent = "reap-dead-workers-in-one-place"
    assert p.stacked_branch == parent and f"preparing its branch {parent} first" in out.getvalue()
    assert git(repo, "rev-parse", f"{p.branch}~1") == git(repo, "rev-parse", parent)
    assert git(repo, "rev-list", "--count", f"main..{parent}").strip() == "1"
    assert git(repo, "show", f"{p.branch}:{syn.REPO_PATH}") == syn.stage_text(bases, "3.4", 5)
    assert changed(repo, p.branch) == [syn.REPO_PATH]
    body = p.body_path.read_text()
    assert f'Stacked on `{parent}`, the PR of 0004 "{syn.TITLES[4]}"' in body
    assert "from stage 4 to stage 5 (0005 alone)" in body
    assert [(r.qualified, r.how) for r in p.removed] == [
        ("LocalExecutor._read_results", "renamed to _drain_results")
    ]
    assert "`TestLocalExecutor.test_read_results_by_name` | `LocalExecutor._read_results` (string)" in body
    # The base branch exists now: a second stacked preparation reuses it.
    again = preparer(repo, layout, tmp_path).prepare("5", force=True)
    assert git(repo, "rev-parse", f"{again.branch}~1") == git(repo, "rev-parse", parent)


def test_tests_run_in_the_base_lines_venv_with_the_branch_executor(
    world: tuple[Path, Layout, list[str]],
    tmp_path: Path,
    bases: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tools.engine import venvs

    repo, layout, _ = world
    seen: dict[str, object] = {}

    def ensure(line: object, *args: object, **kw: object) -> Path:
        seen["line"] = getattr(line, "name", line)
        return PYTHON

    def install(python: object, sources: dict[str, bytes]) -> list[Path]:
        seen["source"] = sources[pins.PACKAGE_PATH]
        return [tmp_path / "unused"]

    monkeypatch.setattr(venvs, "ensure", ensure)
    monkeypatch.setattr(venvs, "install_sources", install)
    p = prmod.PrPreparer(
        repo, layout=layout, out_dir=tmp_path / "pr", out=io.StringIO(), evidence_dir=tmp_path / "b"
    ).prepare("4")
    assert seen["line"] == "3.4" and seen["source"] == syn.stage_text(bases, "3.4", 4).encode()
    assert p.tests.ran and p.tests.passed
    assert any("(the 3.4 line's venv)" in n and "3.4.0b2" in n for n in p.tests.notes)


def test_verified_section_from_verify_and_chaos_json(tmp_path: Path) -> None:
    patch = "0004-Reap-dead-workers-in-one-place.patch"
    cells = {str(k): {"outcome": "fail" if k < 4 else "pass", "unexpected": False} for k in range(6)}
    verify = {
        "series": ["a", "b", "c", patch, "e"],
        "lines": {
            "3.4": {
                "version": "3.4.0b2",
                "stages": list(range(6)),
                "tests": {
                    "tests/executor/test_reap.py::test_dead_worker_is_reaped": {
                        "fixed_by": patch,
                        "cells": cells,
                    },
                    "tests/executor/test_other.py::test_x": {"fixed_by": "other.patch", "cells": cells},
                },
            }
        },
    }
    (tmp_path / "chaos").mkdir()
    (tmp_path / "verify.json").write_text(json.dumps(verify))
    chaos = {
        "version": "3.4.0b2",
        "seed": 2026,
        "stages": [
            {"stage": 0, "runs": 6, "faults": {"idle": 3}, "hangs": 3, "lost_keys": 2,
             "misattributed_keys": 0, "end_over_bound": 0, "errors": 0},
            {"stage": 4, "runs": 6, "faults": {"idle": 2, "run": 2}, "hangs": 0, "lost_keys": 0,
             "misattributed_keys": 0, "end_over_bound": 0, "errors": 0},
        ],
    }  # fmt: skip
    (tmp_path / "chaos" / "3.4.json").write_text(json.dumps(chaos))
    text = pr_evidence.section(tmp_path, [patch], "3.4", 4, "3.3")
    assert (
        "test_reap.py::test_dead_worker_is_reaped  0004      FAIL   FAIL   FAIL   FAIL   pass   pass" in text
    )
    assert "test_other" not in text
    assert "stage 4: 6 seeded runs (seed 2026), 4 faults injected, 0 hangs, 0 lost keys" in text
    (tmp_path / "verify.json").unlink()
    (tmp_path / "chaos" / "3.4.json").unlink()
    text = pr_evidence.section(tmp_path, [patch], "3.4", 4, "3.3")
    assert "`build/verify.json` is absent" in text and "`build/chaos/3.4.json` is absent" in text


def test_removed_internals_from_the_code() -> None:
    before = (
        "import os\nfrom multiprocessing import SimpleQueue\n\n\ndef helper():\n    return 1\n\n\n"
        "class LocalExecutor:\n    result_queue: SimpleQueue\n\n    def start(self):\n"
        "        self.activity_queue = SimpleQueue()\n        self._unread_messages = 0\n\n"
        "    def _check_workers(self):\n        return os.getpid()\n"
    )
    after = (
        "import os\n\n\ndef helper():\n    return 1\n\n\nclass LocalExecutor:\n    def start(self):\n"
        "        self._workers = {}\n\n    def _check_workers(self):\n        return 2\n"
    )
    removed = {(r.qualified, r.how.split(":")[0]) for r in pr_internals.removed_internals(before, after)}
    assert removed == {
        ("local_executor.SimpleQueue", "removed"),
        ("LocalExecutor.result_queue", "removed"),
        ("LocalExecutor.activity_queue", "removed"),
        ("LocalExecutor._unread_messages", "removed"),
        ("LocalExecutor._check_workers", "semantics changed"),
    }


def test_refusals_change_nothing(world: tuple[Path, Layout, list[str]], tmp_path: Path) -> None:
    repo, layout, names = world
    refs_before = git(repo, "for-each-ref")
    with pytest.raises(prmod.PrError, match="no patch '9'"):
        preparer(repo, layout, tmp_path).prepare("9")
    with pytest.raises(prmod.PrError, match=rf"{names[0]}: already upstream in 3.4.0b2") as exc:
        preparer(repo, layout, tmp_path).prepare("1")
    assert "\n" not in str(exc.value)
    # A PR-Folds that leaves out a patch between the upstream stage and this one.
    text = (layout.patches / names[3]).read_text()
    (layout.patches / names[3]).write_text(text.replace("PR-Folds: 0002, 0003", "PR-Folds: 0003"))
    with pytest.raises(prmod.PrError, match=rf"{names[3]}: PR-Folds starts at stage 2, but 0002"):
        preparer(repo, layout, tmp_path).prepare("4")
    (layout.patches / names[3]).write_text(text.replace("PR-Folds: 0002, 0003", "PR-Folds: 0002, 0009"))
    with pytest.raises(prmod.PrError, match=rf"{names[3]}: names '0009', which is not a patch"):
        preparer(repo, layout, tmp_path).prepare("4")
    (layout.patches / names[3]).write_text(text)
    assert git(repo, "for-each-ref") == refs_before
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (tmp_path / "pr").exists()

    first = preparer(repo, layout, tmp_path).prepare("2")
    with pytest.raises(prmod.PrError, match="already exists; pass --force"):
        preparer(repo, layout, tmp_path).prepare("2")
    again = preparer(repo, layout, tmp_path).prepare("2", force=True)
    assert again.branch == first.branch


def test_significant_patch_gets_a_newsfragment(world: tuple[Path, Layout, list[str]], tmp_path: Path) -> None:
    repo, layout, _ = world
    p = preparer(repo, layout, tmp_path).prepare("2")
    assert p.newsfragment == "airflow-core/newsfragments/70545.significant.rst"
    assert p.newsfragment in changed(repo, p.branch)
    body = p.body_path.read_text()
    assert "\ncloses: #70526\n" in body
    assert f"python -m pytest {syn.TEST_PATH}` passes" in body


def test_falls_back_to_self_contained_when_airflows_test_env_is_absent(
    world: tuple[Path, Layout, list[str]], tmp_path: Path
) -> None:
    repo, layout, _ = world
    conftest = repo / "airflow-core" / "tests" / "conftest.py"
    conftest.parent.mkdir(parents=True, exist_ok=True)
    conftest.write_text("import tests_common  # only in Airflow's breeze environment\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Add a conftest that needs Airflow's dev env")
    p = preparer(repo, layout, tmp_path).prepare("0004")
    assert p.tests.ran and p.tests.passed and "--confcutdir=" in p.tests.command
    assert any("cannot run here" in n for n in p.tests.notes)
    assert "--confcutdir=airflow-core/tests/unit/executors/local_executor" in p.body_path.read_text()


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
    body = next((tmp_path / "pr").glob("0002-*.md")).read_text()
    assert f"- error: `{syn.TEST_PATH}::test_synthetic`" in body  # which test, not just a count


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
        "Origin: other, https://github.com/apache/airflow/pull/70545\n"
        "Bug: https://github.com/apache/airflow/issues/70526\n"
        "Bug: https://github.com/apache/airflow/issues/74575\n"
        "Forwarded: no\nApplied-Upstream: no\nLast-Update: 2026-11-30\nPR-Folds: 0004, 0005\n"
    )
    assert msg.body == "This fixes #70526 for good."
    assert msg.pr_number == 70545 and msg.upstream_title() == "Title (#70545)"
    assert msg.get("pr-folds") == "0004, 0005"
    assert prmod.references(msg) == ["closes: #70526", "related: #74575"]
    assert commitmsg.parse(
        "T\n\nOrigin: backport, https://github.com/apache/airflow/pull/67881\n"
    ).backport_note() == ("(backported from apache/airflow#67881)")


def test_real_series_prs_if_present(tmp_path: Path, bases: dict[str, bytes]) -> None:
    """Patches 7 and 8 of the real series as PRs on a 3.4.0b2 main (tests not run: too slow here)."""
    from tools.engine.series import read_patch, read_series_names
    from tools.shared.layout import DEFAULT

    names = read_series_names(DEFAULT.series_file)
    folds = [n for n in names if prmod.pr_folds(read_patch(DEFAULT.patches / n))]
    if not folds:
        pytest.skip("no patch of the real series carries PR-Folds yet")
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    syn.plant_upstream_tests(repo)
    prep = prmod.PrPreparer(repo, out_dir=tmp_path / "pr", out=io.StringIO(), evidence_dir=tmp_path / "b")
    try:
        p = prep.prepare(folds[0], run_tests=False)
    except prmod.PrError as exc:
        pytest.skip(f"the real series does not reach {folds[0]} on 3.4 yet: {exc}")
    assert git(repo, "rev-list", "--count", f"main..{p.branch}").strip() == "1"
    assert p.plan is not None and p.plan.folds and not p.plan.stack_on
    body = p.body_path.read_text()
    assert "### What this PR contains" in body and "### Upstream tests that use internals" in body
    assert {f.hit.path for f in p.findings} <= set(syn.PLANTED) and p.findings
    on = {n: (prmod.pr_stack_on(read_patch(DEFAULT.patches / n)) or "").strip() for n in names}
    stacked = [n for n in names if on[n] and folds[0].startswith(on[n])]
    for name in stacked:
        s = prep.prepare(name, run_tests=False)
        assert git(repo, "rev-parse", f"{s.branch}~1") == git(repo, "rev-parse", p.branch)


def test_pr_body_carries_one_generated_by_line() -> None:
    """A patch whose message says Generated-by, prepared with --generated-by: one line, the option's."""
    msg = commitmsg.parse(
        "Title\n\nWhat and why.\n\nGenerated-by: Claude Code (Opus 5.5)\n\n"
        "Origin: vendor\nBug: https://github.com/apache/airflow/issues/70526\nForwarded: no\n"
        "Applied-Upstream: no\nLast-Update: 2026-12-02\n"
    )
    tests = pr_testrun.TestRun(False, False, "", "skipped (--no-test)")
    body = prmod.pr_body(msg, tests, "Claude Code", None)
    assert [ln for ln in body.splitlines() if ln.startswith("Generated-by:")] == [
        f"Generated-by: Claude Code following {prmod.GENAI_GUIDELINES}"
    ]
    assert body.startswith("What and why.\n\nrelated: #70526\n")


def no_identity(repo: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """git as on a fresh machine: no user.name/user.email anywhere, and no guessing one."""
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / "gitconfig"))
    (home / "gitconfig").write_text("[user]\n\tuseConfigOnly = true\n")
    for key in ("user.name", "user.email"):
        subprocess.run(["git", "config", "--unset", key], cwd=repo, check=False)


def test_missing_git_identity_is_named_not_does_not_apply(
    world: tuple[Path, Layout, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, layout, _ = world
    no_identity(repo, monkeypatch, tmp_path)
    before = git(repo, "for-each-ref")
    with pytest.raises(prmod.PrError) as exc:
        preparer(repo, layout, tmp_path).prepare("2")
    message = str(exc.value)
    assert "git has no identity" in message and "git config --global user.email" in message
    assert "does not apply" not in message and "\n" not in message
    assert git(repo, "for-each-ref") == before


def test_refuses_a_repo_that_is_not_an_airflow_clone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "not-airflow"
    repo.mkdir()
    syn.run("git", "init", "-q", "-b", "main", cwd=repo)
    syn.run("git", "commit", "-q", "--allow-empty", "-m", "x", cwd=repo)
    assert prmod.main(["--repo", str(repo), "--no-test", "7"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an Airflow clone: git clone https://github.com/apache/airflow" in err
    assert git(repo, "for-each-ref", "--format=%(refname:short)").split() == ["main"]
    assert prmod.main(["--repo", str(tmp_path), "7"]) == 1  # no .git at all
    assert "not a git clone (no .git); --repo takes an Airflow clone" in capsys.readouterr().err
    assert prmod.main(["--repo", str(tmp_path / "airflow"), "7"]) == 1
    assert "airflow: no such directory; --repo takes an Airflow clone" in capsys.readouterr().err


def test_python_that_is_a_venv_directory_is_named(
    world: tuple[Path, Layout, list[str]], tmp_path: Path
) -> None:
    repo, layout, _ = world
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(
        prmod.PrError, match=rf"a directory, not an interpreter; pass --python {venv}/bin/python"
    ):
        preparer(repo, layout, tmp_path, python=venv)


def reference_dir(tmp_path: Path) -> Path:
    """A stand-in for ``../shared/upstream/``: upstream's test_local_executor.py (the synthetic one)."""
    ref = tmp_path / "upstream"
    (ref / syn.UPSTREAM_FILE).parent.mkdir(parents=True)
    (ref / syn.UPSTREAM_FILE).write_bytes(syn.UPSTREAM_FILE_TEXT)
    return ref


def test_make_clone_gives_a_main_the_prs_build_on(
    tmp_path: Path,
    bases: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--make-clone DIR 4``: main is 3.4.0b2's pinned files plus upstream's test file, and the PR
    of a folded patch is made on it, its own tests and upstream's file run."""
    from tools.engine import fetch

    monkeypatch.setenv("LEPATCH_UPSTREAM_DIR", str(reference_dir(tmp_path)))
    syn.make_series(tmp_path / "patches", bases)
    dest = tmp_path / "airflow"
    args = [
        "--patches",
        str(tmp_path / "patches"),
        "--python",
        str(PYTHON),
        "--out-dir",
        str(tmp_path / "pr"),
    ]
    assert prmod.main(["--make-clone", str(dest), *args, "4"]) == 0
    out = capsys.readouterr().out
    assert (
        f"made {dest}: main at " in out
        and "is apache-airflow-core 3.4.0b2 and apache-airflow-task-sdk" in out
    )
    assert "tests passed" in out
    line = pins.get_line("3.4")
    pinned = fetch.read_bases(line)
    assert set(pinned) == {p.file.repo_path for p in line.pins} and pins.REPO_PATH in pinned
    assert git(dest, "ls-tree", "-r", "--name-only", "main").split() == sorted([*pinned, syn.UPSTREAM_FILE])
    for rel, data in pinned.items():
        assert git(dest, "show", f"main:{rel}").encode() == data, rel
    # upstream's file in a commit of its own, on top of the release's files
    assert git(dest, "ls-tree", "-r", "--name-only", "main~1").split() == sorted(pinned)
    assert git(dest, "rev-list", "--count", "main").strip() == "2"
    branch = "reap-dead-workers-in-one-place"
    assert git(dest, "rev-list", "--count", f"main..{branch}").strip() == "1"
    assert git(dest, "show", f"{branch}:{syn.REPO_PATH}") == syn.stage_text(bases, "3.4", 4)
    assert (
        "The whole file on this branch passes: 2 passed"
        in next((tmp_path / "pr").glob("0004-*.md")).read_text()
    )

    # a clone is never made over anything: the existing one is left as it is
    refs = git(dest, "for-each-ref")
    assert prmod.main(["--make-clone", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {dest}: exists and is not an empty directory; --make-clone makes a new clone\n"
    assert git(dest, "for-each-ref") == refs


def test_make_clone_without_upstreams_test_file(tmp_path: Path) -> None:
    from tools.delivery import pr_clone
    from tools.shared.errors import ToolError

    files = {pins.REPO_PATH: b"# executor\n", pins.SUPERVISOR.repo_path: b"# supervisor\n"}
    clone = pr_clone.make_clone(tmp_path / "airflow", bases=files, upstream_dir=tmp_path / "absent")
    assert clone.upstream_test is None and clone.files == sorted(files)
    assert git(clone.path, "ls-tree", "-r", "--name-only", "main").split() == sorted(files)
    assert git(clone.path, "status", "--porcelain") == ""
    said = pr_clone.describe(clone)
    assert said[0].endswith("2 files:") and "the reference copy is absent" in said[-1]
    with pytest.raises(ToolError) as exc:
        pr_clone.make_clone(tmp_path / "other", bases={pins.SUPERVISOR.repo_path: b""})
    assert f"files lack {pins.REPO_PATH}: no clone to make" in str(exc.value)
    assert not (tmp_path / "other").exists()


def test_repo_or_make_clone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["7"], ["--repo", str(tmp_path), "--make-clone", str(tmp_path / "a"), "7"]):
        with pytest.raises(SystemExit):
            prmod.main(args)
    err = capsys.readouterr().err
    assert "one of the arguments --repo --make-clone is required" in err
    assert "argument --make-clone: not allowed with argument --repo" in err
    assert not (tmp_path / "a").exists()


def test_stacked_pr_leaves_out_the_prs_of_their_own_between(
    tmp_path: Path, bases: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real series' 12 stacked on 9: 10 and 11 (other files, PRs of their own on main) stay out
    of its branch; stacked on 8 it would need 9 (the same executor file), and says so."""
    import shutil

    from tools.delivery import pr_clone
    from tools.shared.layout import DEFAULT

    names = {n[:4]: n for n in (p.name for p in DEFAULT.patches.glob("00*.patch"))}
    if not {"0009", "0010", "0011", "0012"} <= set(names):
        pytest.skip("the real series has no patches 9-12")
    patches = tmp_path / "patches"
    shutil.copytree(DEFAULT.patches, patches)
    twelve = patches / names["0012"]
    text = twelve.read_text()
    if "\nPR-Stack-On:" not in text.split("\n---\n", 1)[0]:
        text = text.replace("\nLast-Update:", "\nPR-Stack-On: 0009\nLast-Update:", 1)
    twelve.write_text(text)
    monkeypatch.setenv("LEPATCH_UPSTREAM_DIR", str(tmp_path / "absent"))
    repo = pr_clone.make_clone(tmp_path / "airflow").path
    prep = prmod.PrPreparer(
        repo,
        layout=Layout(patches_dir=patches),
        out_dir=tmp_path / "pr",
        out=io.StringIO(),
        evidence_dir=tmp_path,
    )
    p = prep.prepare("12", run_tests=False)
    assert p.plan is not None and p.plan.stack_on == names["0009"]
    assert (p.plan.start, p.plan.end, p.plan.skipped) == (11, 12, [names["0010"], names["0011"]])
    nine = prmod.default_branch(patches / names["0009"])
    assert git(repo, "rev-parse", f"{p.branch}~1") == git(repo, "rev-parse", nine)
    theirs = {f.repo_path for f in (pins.SUPERVISOR, pins.AUTH_MANAGER)}
    assert pins.REPO_PATH in changed(repo, p.branch) and not theirs & set(changed(repo, p.branch))
    assert (
        "Patches 0010, 0011 of the series, between the two, are PRs of their own" in p.body_path.read_text()
    )

    twelve.write_text(text.replace("\nPR-Stack-On: 0009\n", "\nPR-Stack-On: 0008\n", 1))
    refs = git(repo, "for-each-ref")
    with pytest.raises(prmod.PrError, match=r"would span stages 8\.\.12 but PR-Folds does not name 0009$"):
        prep.prepare("12", run_tests=False, force=True)
    assert git(repo, "for-each-ref") == refs
