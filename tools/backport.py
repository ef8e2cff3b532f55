"""Backport the series onto Airflow's release branches the way ``cherry_picker`` does it.

The commits cherry-picked are the series applied onto the clone's ``main`` (``git am -3``,
one commit per patch, DEP-3 lines dropped and ``(#PR)`` appended to the title, as the
squash merge upstream would have it) on a branch ``lepatch-series``. Committer date =
author date, so the same series on the same ``main`` by the same person gives the same
commit ids and re-runs reuse the branch. Its tip names the backport branches::

    main ── 0001 ── 0002 ── 0003          lepatch-series (the "(cherry picked from commit ...)" ids)
    v3-2-test ── 0001' ── 0002' ── 0003'  backport-<tip sha7>-v3-2-test

Each pick is ``git cherry-pick -x <sha>`` and then the message is rewritten exactly as
cherry_picker does with Airflow's configuration (``fix_commit_msg = false``)::

    [v3-2-test] <original title> (#PR)

    <original body>
    (cherry picked from commit <sha>)

    Co-authored-by: <original author> <email>

A conflict uses the recorded resolution of that line (``patches/resolutions/<line>/<patch>``,
the diff of just the files that need it) or stops with a report in the style of the stable
kernel's "FAILED: patch ... failed to apply" mails. The run's state is a JSON file in the
clone's git directory (``.git/lepatch-backport.json``), so ``--status``, ``--continue`` and
``--abort`` work from another shell; ``--abort`` always returns to the branch the run
started on, with this run's branches deleted and no cherry-pick in progress. Nothing is
ever pushed.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tools import commitmsg, pins
from tools.errors import ToolError
from tools.gitcmd import GitError, git
from tools.layout import DEFAULT as LAYOUT
from tools.layout import Layout
from tools.series import read_series_names

STATE_FILE = "lepatch-backport.json"
SERIES_BRANCH = "lepatch-series"
NOX = "nox -s backport --"


class BackportError(ToolError):
    """A refusal or failure; nothing was changed unless the message says otherwise."""


class BackportPaused(ToolError):
    """A pick stopped on a conflict; the message is the full FAILED report."""


class RunState(enum.Enum):
    """The saved state of a run; the file is removed when a run finishes or is aborted."""

    BUILDING_SERIES = "building-series"  # applying the series onto main (a temporary worktree)
    PICKING = "picking"  # cherry-picking onto a backport branch; seen at start = interrupted
    PAUSED = "paused"  # stopped on a conflict: --continue, or --abort
    TESTING = "testing"  # running the line's tests against a finished branch


class BranchStatus(enum.Enum):
    PENDING = "pending"
    IN_PROGRESS = "in-progress"
    PAUSED = "paused"
    DONE = "done"
    TESTS_PASSED = "tests-passed"
    TESTS_FAILED = "tests-failed"

    @property
    def finished(self) -> bool:
        return self in (BranchStatus.DONE, BranchStatus.TESTS_PASSED, BranchStatus.TESTS_FAILED)


@dataclass
class SourceCommit:
    patch: str  # file name in patches/
    sha: str  # the commit on lepatch-series
    title: str


@dataclass
class BranchRun:
    branch: str
    start: str  # commit the backport branch was made from
    backport_branch: str
    line: str | None  # the pinned line of this branch, if any
    status: str = BranchStatus.PENDING.value
    next_patch: int = 0
    created: bool = False
    head_before_pick: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class State:
    state: str
    repo: str
    original_branch: str  # "" when the run started on a detached HEAD
    original_head: str
    base: str
    series_branch: str
    series_branch_created: bool
    source: list[SourceCommit]
    branches: list[BranchRun]
    test: bool = False
    patches: str = ""  # the patches directory of the run (resolutions are looked up there)
    schema: int = 1

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        data = dict(data)
        data["source"] = [SourceCommit(**s) for s in data["source"]]
        data["branches"] = [BranchRun(**b) for b in data["branches"]]
        return cls(**data)

    @property
    def current(self) -> BranchRun | None:
        return next((b for b in self.branches if not BranchStatus(b.status).finished), None)

    @property
    def remaining(self) -> list[BranchRun]:
        return [b for b in self.branches if not BranchStatus(b.status).finished]


def read_series(layout: Layout) -> list[Path]:
    """The patch files of ``patches/series`` in order."""
    names = read_series_names(layout.series_file)
    if not names:
        raise BackportError(f"{layout.series_file}: no series file, or it lists no patch")
    for name in names:
        if not (layout.patches / name).is_file():
            raise BackportError(f"{layout.patches / name}: listed in {layout.series_file} but missing")
    return [layout.patches / name for name in names]


def cherry_picker_message(repo: Path, source_sha: str, branch: str) -> str:
    """The message cherry_picker writes for ``source_sha`` on ``branch`` (``fix_commit_msg = false``)."""
    original = git("show", "-s", "--format=%B", source_sha, cwd=repo).strip()
    author = git("log", "-1", "--format=%aN <%ae>", source_sha, cwd=repo).strip()
    # cherry_picker's remove_commit_prefix: drop "[X.Y] " prefixes before adding ours.
    while m := re.match(r"\[\d+(?:\.\d+)+\] *", original):
        original = original[m.end() :]
    message = f"[{branch}] {original}"
    info = f"(cherry picked from commit {source_sha})\n:"
    # As cherry_picker: interpret-trailers inserts the Co-authored-by trailer at the start
    # of the trailer block, with the "cherry picked" line abused as a pseudo-trailer before it.
    out = git(
        "interpret-trailers",
        "--where",
        "start",
        "--trailer",
        f"Co-authored-by: {author}",
        "--trailer",
        info,
        cwd=repo,
        input=message,
    )
    before, after = out.strip().rsplit(f"\n{info}", 1)
    if not before.endswith("\n"):
        info = f"\n{info}"
    return info[:-1].join((before, after))


class Backport:
    """One backport run in one Airflow clone; the CLI's start/continue/abort/status call these."""

    def __init__(
        self,
        repo: Path,
        *,
        layout: Layout = LAYOUT,
        out: TextIO | None = None,
        tester: Callable[[str, bytes], tuple[bool, str]] | None = None,
    ) -> None:
        self.repo = Path(repo).resolve()
        self.layout = layout
        self.out = out or sys.stdout
        self.tester = tester or run_line_tests
        if not (self.repo / ".git").exists():
            raise BackportError(f"{self.repo}: not a git clone (no .git)")
        self.git_dir = Path(git("rev-parse", "--absolute-git-dir", cwd=self.repo).strip())
        self.state_path = self.git_dir / STATE_FILE

    # ------------------------------------------------------------ helpers

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def g(self, *args: str, **kwargs: Any) -> str:
        return git(*args, cwd=self.repo, **kwargs)

    def rev(self, ref: str) -> str | None:
        out = self.g("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip()
        return out or None

    def resolve_branch(self, name: str) -> str:
        """A branch, a remote-tracking one (upstream/, origin/), or a pinned line name like 3.2."""
        for line in pins.LINES:
            if name == line.name:
                name = line.branch
        for ref in (f"refs/heads/{name}", f"refs/remotes/upstream/{name}", f"refs/remotes/origin/{name}"):
            if sha := self.rev(ref):
                return sha
        raise BackportError(f"{self.repo}: no branch {name!r} (looked in local, upstream/ and origin/)")

    def branch_name(self, name: str) -> str:
        return next((ln.branch for ln in pins.LINES if ln.name == name), name)

    def current_branch(self) -> str:
        return self.g("symbolic-ref", "--quiet", "--short", "HEAD", check=False).strip()

    def in_progress(self) -> str | None:
        for marker, what in (
            ("CHERRY_PICK_HEAD", "a cherry-pick"),
            ("MERGE_HEAD", "a merge"),
            ("REVERT_HEAD", "a revert"),
            ("rebase-merge", "a rebase"),
            ("rebase-apply", "a rebase or git am"),
        ):
            if (self.git_dir / marker).exists():
                return what
        return None

    def unmerged(self) -> list[str]:
        return self.g("diff", "--name-only", "--diff-filter=U").split()

    def ensure_clean(self) -> None:
        if what := self.in_progress():
            raise BackportError(f"{self.repo}: {what} is in progress; finish or abort it first")
        dirty = self.g("status", "--porcelain", "--untracked-files=normal").splitlines()
        if dirty:
            raise BackportError(
                f"{self.repo}: the work tree is dirty ({dirty[0].strip()}"
                f"{f' and {len(dirty) - 1} more' if len(dirty) > 1 else ''}); commit or stash first"
            )

    def load(self) -> State:
        if not self.state_path.exists():
            raise BackportError(f"{self.state_path}: no backport in progress")
        try:
            return State.from_json(json.loads(self.state_path.read_text()))
        except (ValueError, TypeError, KeyError) as exc:
            raise BackportError(f"{self.state_path}: unreadable state ({exc}); fix or delete it") from exc

    def save(self, st: State, state: RunState | None = None) -> None:
        if state is not None:
            st.state = state.value
        tmp = self.state_path.with_name(STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(st), indent=2) + "\n")
        os.replace(tmp, self.state_path)

    # ------------------------------------------------------------ the source commits

    def build_series(
        self, base_sha: str, base_name: str, series_branch: str
    ) -> tuple[list[SourceCommit], bool]:
        """Apply the series onto ``base`` in a temporary worktree; return its commits and
        whether the series branch was created (False: it existed with exactly these commits)."""
        patches = read_series(self.layout)
        with tempfile.TemporaryDirectory(prefix="lepatch-series-") as tmp:
            wt = Path(tmp) / "wt"
            self.g("worktree", "add", "--detach", str(wt), base_sha)
            try:
                source = []
                for patch in patches:
                    try:
                        git("am", "-3", "--quiet", str(patch), cwd=wt)
                    except GitError as exc:
                        git("am", "--abort", cwd=wt, check=False)
                        raise BackportError(
                            f"{patch}: does not apply to {base_name} ({base_sha[:10]}), the source of the "
                            f"backport: {exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else exc}"
                        ) from exc
                    msg = commitmsg.parse(git("log", "-1", "--format=%B", cwd=wt))
                    date = git("log", "-1", "--format=%aI", cwd=wt).strip()
                    # Committer date = author date: the same series on the same base gives the same ids.
                    git(
                        "commit", "--amend", "--quiet", "--no-verify", "-m", msg.upstream_message(),
                        cwd=wt, env={"GIT_COMMITTER_DATE": date},
                    )  # fmt: skip
                    sha = git("rev-parse", "HEAD", cwd=wt).strip()
                    source.append(SourceCommit(patch.name, sha, msg.upstream_title()))
            finally:
                self.g("worktree", "remove", "--force", str(wt), check=False)
                self.g("worktree", "prune", check=False)
        tip = source[-1].sha
        existing = self.rev(f"refs/heads/{series_branch}")
        if existing and existing != tip:
            raise BackportError(
                f"{self.repo}: branch {series_branch} exists at {existing[:10]}, but the series on "
                f"{base_name} gives {tip[:10]}; delete it (git branch -D {series_branch}) "
                "or pass --series-branch"
            )
        if not existing:
            self.g("branch", series_branch, tip)
        return source, not existing

    # ------------------------------------------------------------ start / continue / abort

    def start(
        self,
        branches: list[str],
        *,
        base: str = "main",
        series_branch: str = SERIES_BRANCH,
        test: bool = False,
    ) -> State:
        if self.state_path.exists():
            st = self.load()
            raise BackportError(
                f"{self.state_path}: a backport is already in progress ({st.state}, remaining: "
                f"{', '.join(b.branch for b in st.remaining) or 'none'}); use --status, --continue or --abort"
            )
        if not branches:
            raise BackportError("no branches given (e.g. v3-3-test v3-2-test v3-1-test)")
        self.ensure_clean()
        names = [self.branch_name(b) for b in branches]
        if len(set(names)) != len(names):
            raise BackportError(f"branch given twice: {' '.join(branches)}")
        starts = {name: self.resolve_branch(name) for name in names}
        base_sha = self.resolve_branch(base)
        lines = {ln.branch: ln.name for ln in pins.LINES}
        if test and (unknown := [n for n in names if n not in lines]):
            raise BackportError(
                f"--test: {unknown[0]} is not the branch of a pinned line; its tests cannot run"
            )
        original_branch = self.current_branch()
        original_head = self.rev("HEAD") or ""

        source, created = self.build_series(base_sha, base, series_branch)
        sha7 = source[-1].sha[:7]
        runs = [BranchRun(name, starts[name], f"backport-{sha7}-{name}", lines.get(name)) for name in names]
        if clash := next(
            (r.backport_branch for r in runs if self.rev(f"refs/heads/{r.backport_branch}")), None
        ):
            if created:
                self.g("branch", "-D", series_branch, check=False)
            raise BackportError(
                f"{self.repo}: branch {clash} already exists; delete it or finish that backport"
            )
        st = State(
            state=RunState.PICKING.value,
            repo=str(self.repo),
            original_branch=original_branch,
            original_head=original_head,
            base=base,
            series_branch=series_branch,
            series_branch_created=created,
            source=source,
            branches=runs,
            test=test,
            patches=str(self.layout.patches),
        )
        self.save(st)
        self.say(
            f"series: {len(source)} patch(es) on {series_branch} ({base} + series, tip {source[-1].sha[:10]})"
        )
        return self._run(st)

    def resume(self) -> State:
        """--continue: commit the hand-resolved pick, then carry on with the rest of the run."""
        st = self.load()
        if st.patches and Path(st.patches) != self.layout.patches:
            self.layout = Layout(root=self.layout.root, patches_dir=Path(st.patches))
        run = st.current
        if run is None:
            return self._finish(st)
        if st.state in (RunState.PAUSED.value, RunState.PICKING.value) and run.created:
            here = self.current_branch()
            if here != run.backport_branch:
                raise BackportError(
                    f"{self.repo}: on {here or 'a detached HEAD'}, but the paused pick is on "
                    f"{run.backport_branch}; git checkout {run.backport_branch}"
                )
            if files := self.unmerged():
                raise BackportError(
                    f"{self.repo}: unresolved conflicts remain in {', '.join(files)}; git add them when fixed"
                )
            patch = st.source[run.next_patch]
            if (self.git_dir / "CHERRY_PICK_HEAD").exists():
                if not self.g("diff", "--cached", "--name-only").strip():
                    self.g("cherry-pick", "--skip")
                    run.notes.append(f"{patch.patch}: skipped by hand (resolved to no change)")
                else:
                    self.g("-c", "core.editor=true", "cherry-pick", "--continue")
                    self._amend(run, patch)
                    run.notes.append(f"{patch.patch}: resolved by hand")
            elif self.rev("HEAD") != run.head_before_pick:
                self._amend(run, patch)  # the user committed it themselves
                run.notes.append(f"{patch.patch}: resolved by hand")
            else:
                raise BackportError(
                    f"{self.repo}: no cherry-pick in progress and no new commit on {run.backport_branch}: "
                    f"{patch.patch} is not applied; pick it by hand "
                    f"(git cherry-pick -x {patch.sha[:10]}) or --abort"
                )
            run.next_patch += 1
            run.status = BranchStatus.IN_PROGRESS.value
            self.save(st, RunState.PICKING)
        return self._run(st)

    def abort(self) -> list[str]:
        """Back to the starting branch, this run's branches deleted, no pick in progress."""
        st = self.load()
        problems: list[str] = []

        def attempt(*args: str) -> bool:
            try:
                self.g(*args)
                return True
            except GitError as exc:
                problems.append(str(exc))
                return False

        ours = {b.backport_branch for b in st.branches if b.created}
        if (self.git_dir / "CHERRY_PICK_HEAD").exists() and not attempt("cherry-pick", "--abort"):
            attempt("reset", "--merge")
        if self.current_branch() in ours:
            attempt("reset", "--hard", "--quiet")  # this branch is about to go: drop the half-done pick
        target = st.original_branch or st.original_head
        if self.current_branch() != st.original_branch or not st.original_branch:
            attempt("checkout", "--quiet", target)
        for name in sorted(ours):
            if self.rev(f"refs/heads/{name}"):
                attempt("branch", "-D", name)
        if st.series_branch_created and self.rev(f"refs/heads/{st.series_branch}"):
            attempt("branch", "-D", st.series_branch)
        self.g("worktree", "prune", check=False)
        self.state_path.unlink(missing_ok=True)
        self.say(f"aborted: back on {target}; deleted {', '.join(sorted(ours)) or 'no branches'}")
        for problem in problems:
            self.say(f"warning: {problem}")
        return problems

    def status(self) -> str:
        if not self.state_path.exists():
            return f"no backport in progress in {self.repo}"
        st = self.load()
        rows = [
            f"backport {st.state} in {st.repo} (started on {st.original_branch or st.original_head[:10]}; "
            f"source {st.series_branch} {st.source[-1].sha[:10]})",
            "",
            f"  {'branch':<14} {'backport branch':<34} {'status':<13} patches",
        ]
        for b in st.branches:
            rows.append(
                f"  {b.branch:<14} {b.backport_branch:<34} {b.status:<13} {b.next_patch}/{len(st.source)}"
            )
        remaining = st.remaining
        rows.append("")
        rows.append(f"remaining: {', '.join(b.branch for b in remaining) or 'none'}")
        if (run := st.current) and run.next_patch < len(st.source):
            rows.append(f"next: {st.source[run.next_patch].patch} onto {run.branch}")
        if files := self.unmerged():
            rows.append(f"unresolved conflicts: {', '.join(files)}")
        return "\n".join(rows)

    # ------------------------------------------------------------ the loop

    def _run(self, st: State) -> State:
        while (run := st.current) is not None:
            if not run.created:
                self.g("checkout", "--quiet", "-b", run.backport_branch, run.start)
                run.created = True
                run.status = BranchStatus.IN_PROGRESS.value
                self.save(st, RunState.PICKING)
                self.say(f"\n{run.branch}: {run.backport_branch} from {run.start[:10]}")
            while run.next_patch < len(st.source):
                self._pick(st, run)
                run.next_patch += 1
                self.save(st, RunState.PICKING)
            if st.test:
                self.save(st, RunState.TESTING)
                ok = self._test(run)
                run.status = (BranchStatus.TESTS_PASSED if ok else BranchStatus.TESTS_FAILED).value
            else:
                run.status = BranchStatus.DONE.value
            self.save(st, RunState.PICKING)
        return self._finish(st)

    def _pick(self, st: State, run: BranchRun) -> None:
        src = st.source[run.next_patch]
        run.head_before_pick = self.rev("HEAD") or ""
        self.save(st, RunState.PICKING)
        try:
            self.g("cherry-pick", "-x", src.sha)
        except GitError as exc:
            if not (self.git_dir / "CHERRY_PICK_HEAD").exists():
                raise BackportError(
                    f"{run.backport_branch}: cherry-pick of {src.patch} failed: {exc}"
                ) from exc
            conflicts = self.unmerged()
            if not conflicts and not self.g("diff", "--cached", "--name-only").strip():
                self.g("cherry-pick", "--skip")
                run.notes.append(f"{src.patch}: already on {run.branch}, skipped")
                self.say(f"  {src.patch}: already on {run.branch}; skipped")
                return
            how = self._use_resolution(st, run, src, conflicts)
            if how is None:
                run.status = BranchStatus.PAUSED.value
                self.save(st, RunState.PAUSED)
                raise BackportPaused(self.failed_report(st, run, src, conflicts)) from None
            self.g("-c", "core.editor=true", "cherry-pick", "--continue")
            self._amend(run, src)
            run.notes.append(f"{src.patch}: {how}")
            self.say(f"  {src.patch}: {how}")
            return
        self._amend(run, src)
        self.say(f"  {src.patch}: clean")

    def _amend(self, run: BranchRun, src: SourceCommit) -> None:
        message = cherry_picker_message(self.repo, src.sha, run.branch)
        self.g("commit", "--amend", "--quiet", "--no-verify", "-m", message)

    def resolution_path(self, run: BranchRun, src: SourceCommit) -> Path | None:
        return self.layout.resolutions / run.line / src.patch if run.line else None

    def _use_resolution(
        self, st: State, run: BranchRun, src: SourceCommit, conflicts: list[str]
    ) -> str | None:
        """Apply the recorded resolution of this line; None when there is none or it does not fit."""
        path = self.resolution_path(run, src)
        if path is None or not path.is_file():
            return None
        text = path.read_text()
        files = sorted(set(re.findall(r"^diff --git a/\S+ b/(\S+)$", text, flags=re.M)))
        if not set(conflicts) <= set(files):
            return None
        for name in files:  # the branch's version of each file the resolution covers
            self.g("checkout", "HEAD", "--", name, check=False)
        try:
            self.g("apply", "--index", str(path))
        except GitError:
            for name in files:  # back to the conflicted state the report describes
                self.g("checkout", "-m", "--", name, check=False)
            return None
        if self.unmerged():
            return None
        return f"recorded resolution {self.layout.rel(path)}"

    def _test(self, run: BranchRun) -> bool:
        assert run.line is not None
        source = self.g("show", f"{run.backport_branch}:{pins.REPO_PATH}").encode("utf-8", "surrogateescape")
        self.say(f"  testing {run.backport_branch} against the {run.line} line")
        ok, summary = self.tester(run.line, source)
        run.notes.append(f"tests: {summary}")
        self.say(f"  tests {'passed' if ok else 'FAILED'}: {summary}")
        return ok

    def _finish(self, st: State) -> State:
        target = st.original_branch or st.original_head
        if target and (self.current_branch() != st.original_branch or not st.original_branch):
            self.g("checkout", "--quiet", target)
        self.state_path.unlink(missing_ok=True)
        self.say("")
        self.say(f"  {'branch':<14} {'backport branch':<34} {'status':<13} notes")
        for b in st.branches:
            notes = "; ".join(b.notes) or "-"
            self.say(f"  {b.branch:<14} {b.backport_branch:<34} {b.status:<13} {notes}")
        self.say(f"\nnothing pushed; back on {target}")
        return st

    # ------------------------------------------------------------ the FAILED report

    def base_commit(self, st: State) -> str:
        """The commit the series was applied onto: the parent of the first source commit."""
        return self.rev(f"{st.source[0].sha}^") or st.source[0].sha

    def failed_report(self, st: State, run: BranchRun, src: SourceCommit, conflicts: list[str]) -> str:
        res = self.resolution_path(run, src)
        if res is None:
            res_line = (
                f"{run.branch} is not the branch of a pinned line, so no resolution is recorded for it."
            )
        elif res.is_file():
            res_line = f"The recorded resolution {self.layout.rel(res)} did not resolve it (stale?)."
        else:
            res_line = f"No resolution is recorded for line {run.line} ({self.layout.rel(res)})."
        deps = self.g(
            "log", "--no-merges", "-n", "10", "--format=%h (\"%s\")", f"{run.start}..{self.base_commit(st)}",
            "--", *conflicts,
        ).strip()  # fmt: skip
        repo = shlex.quote(str(self.repo))
        remaining = [b.branch for b in st.remaining if b is not run]
        later = [p.patch for p in st.source[run.next_patch + 1 :]]
        lines = [
            f'FAILED: patch "{src.title}" failed to apply to {run.branch}',
            "",
            f"The patch {src.patch} does not apply to the {run.branch} branch"
            + (f" (release line {run.line})." if run.line else "."),
            f"`git cherry-pick -x {src.sha[:10]}` stopped with conflicts in:",
            "",
            *(f"    {name}" for name in conflicts),
            "",
            res_line,
            "",
            "Possible dependencies (commits on "
            f"{st.base} that touch these files and {run.branch} does not have):",
            "",
            *(f"    {dep}" for dep in (deps.splitlines() or ["(none found)"])),
            "",
            f"To finish by hand, in {self.repo} (you are on {run.backport_branch}):",
            "",
            "    git status",
            "    # resolve the conflicts, then",
            f"    git add {' '.join(shlex.quote(c) for c in conflicts)}",
            f"    {NOX} --repo {repo} --continue",
            "",
            "To keep the resolution for the next run, after --continue:",
            "",
            f"    git diff $(git log -1 --format=%H --grep='cherry picked from commit {src.sha}' "
            f"{run.backport_branch})^! -- {' '.join(shlex.quote(c) for c in conflicts)} > "
            f"{shlex.quote(str(res or self.layout.resolutions / '<line>' / src.patch))}",
            "",
            f"To give up (back to {st.original_branch or st.original_head[:10]}, "
            "this run's branches deleted):",
            "",
            f"    {NOX} --repo {repo} --abort",
            "",
            f"Still to do: {', '.join(later) or 'no further patches'} on {run.branch}"
            + (f"; then {', '.join(remaining)}" if remaining else ""),
            "",
            f"------------------ original commit in {st.series_branch} ------------------",
            self.g("show", "--stat", "--format=fuller", src.sha).rstrip(),
        ]
        return "\n".join(lines)


def run_line_tests(line_name: str, source: bytes) -> tuple[bool, str]:
    """Install ``source`` as local_executor.py into the line's venv and run tests/executor there."""
    from tools import venvs  # the venv helper of the engine; imported late: only --test needs it

    line = pins.get_line(line_name)
    python = venvs.ensure(line)
    venvs.install_executor(python, source)
    with tempfile.TemporaryDirectory(prefix="lepatch-backport-home-") as home:
        proc = subprocess.run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(LAYOUT.tests_executor)],
            cwd=LAYOUT.root,
            env=venvs.test_env(Path(home)),
            capture_output=True,
            text=True,
        )
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    return proc.returncode == 0, last


# -------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, required=True, help="the Airflow git clone")
    parser.add_argument(
        "branches", nargs="*", help="release branches (v3-3-test v3-2-test ...) or line names (3.2)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--continue", dest="resume", action="store_true", help="go on after resolving a conflict"
    )
    mode.add_argument("--abort", action="store_true", help="undo the run: original branch, branches deleted")
    mode.add_argument("--status", action="store_true", help="show the run's state and remaining branches")
    parser.add_argument(
        "--test", action="store_true", help="run the line's tests against each finished branch"
    )
    parser.add_argument(
        "--base", default="main", help="the branch the series is applied onto (default: main)"
    )
    parser.add_argument("--series-branch", default=SERIES_BRANCH, help=f"default: {SERIES_BRANCH}")
    parser.add_argument(
        "--patches", type=Path, default=None, help="the patches directory (default: patches/)"
    )


def run(args: argparse.Namespace) -> int:
    layout = Layout(patches_dir=args.patches.resolve()) if args.patches else LAYOUT
    try:
        bp = Backport(args.repo, layout=layout)
        if args.status:
            print(bp.status())
            return 0
        if args.abort:
            return 1 if bp.abort() else 0
        if args.branches and args.resume:
            raise BackportError("--continue takes no branches: the saved state lists them")
        st = (
            bp.resume()
            if args.resume
            else bp.start(args.branches, base=args.base, series_branch=args.series_branch, test=args.test)
        )
    except BackportPaused as exc:
        print(exc, file=sys.stderr)
        return 2
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 1 if any(b.status == BranchStatus.TESTS_FAILED.value for b in st.branches) else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backport", help="cherry-pick the series onto release branches of an Airflow clone")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools backport", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
