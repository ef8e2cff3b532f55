"""Backport the series onto Airflow's release branches the way ``cherry_picker`` does it.

``main`` is the pre-release line (3.4), which already ships the first patches of the series.
The series is applied onto the clone's ``main`` as the engine has it for that line, one
commit per patch on a branch ``lepatch-series`` (DEP-3 lines dropped, ``(#PR)`` appended to
the title, as upstream's squash merge would have it); a patch the engine reports
``upstream`` there gets no commit. Committer date = author date, so the same series on the
same ``main`` gives the same commit ids and re-runs reuse the branch. Its tip names the
backport branches::

    main ── 0004 ── ... ── 0008                    lepatch-series (0001-0003: upstream in 3.4.0b2)
    v3-2-test ── 0001' ── 0002' ── ... ── 0008'    backport-<tip sha7>-v3-2-test

Each patch lands on a branch as a cherry-pick of the branch line's form of it (the engine's
stage k-1 -> k of that line, recorded resolutions included, merged 3-way onto the branch,
so a branch that moved past its pinned release still merges), and the message is written
exactly as cherry_picker does with Airflow's configuration (``fix_commit_msg = false``)::

    [v3-2-test] <original title> (#PR)

    <original body>
    (cherry picked from commit <lepatch-series sha>)

    Co-authored-by: <original author> <email>

A patch already upstream has no lepatch-series commit: its line names the upstream commit,
``(cherry picked from commit <sha>)``, when the patch records ``Upstream-Commit:``, else the
PR it backports, ``(backported from apache/airflow#N)`` (from ``Origin: backport, <url>``).

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
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tools.delivery import lineform
from tools.engine.series import Patch, read_patch, read_series_names
from tools.shared import commitmsg, pins
from tools.shared.errors import ToolError
from tools.shared.gitcmd import GitError, git, identity_problem
from tools.shared.layout import DEFAULT as LAYOUT
from tools.shared.layout import REPO_TESTS_DIR, Layout

STATE_FILE = "lepatch-backport.json"
SERIES_BRANCH = "lepatch-series"
NOX = "nox -s backport --"
WIDTH = 100  # the summary's notes are wrapped at this width


class BackportError(ToolError):
    """A refusal or failure; nothing was changed unless the message says otherwise."""


class BackportPaused(ToolError):
    """A pick stopped on a conflict; the message is the full FAILED report."""


class RunState(enum.Enum):
    """The saved state of a run; the file is removed when a run finishes or is aborted."""

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
    sha: str  # the commit on lepatch-series; "" for a patch already upstream on the base
    title: str
    index: int = 0  # 1-based position in the series (stage k of a line has it)
    upstream: str = ""  # the base's version when the patch is already there ("3.4.0b2")
    upstream_commit: str = ""  # Upstream-Commit: of the patch, when recorded
    note: str = ""  # the line naming where an upstream patch comes from, in place of "cherry picked"


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
    carrier: str = ""  # the commit being picked for the current patch (its line's form if upstream)


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
    base_sha: str = ""  # the commit the series was applied onto
    base_line: str = ""  # the pinned line of the base ("3.4" for main)
    schema: int = 2

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        data = dict(data)
        data["source"] = [SourceCommit(**s) for s in data["source"]]
        data["branches"] = [BranchRun(**b) for b in data["branches"]]
        return cls(**data)

    @property
    def current(self) -> BranchRun | None:
        return next(iter(self.remaining), None)

    @property
    def remaining(self) -> list[BranchRun]:
        return [b for b in self.branches if not BranchStatus(b.status).finished]

    @property
    def tip(self) -> str:
        """The tip of the series branch (the base itself when every patch is upstream)."""
        return next((s.sha for s in reversed(self.source) if s.sha), self.base_sha)


def read_series(layout: Layout) -> list[Path]:
    """The patch files of ``patches/series`` in order."""
    names = read_series_names(layout.series_file)
    if not names:
        raise BackportError(f"{layout.series_file}: no series file, or it lists no patch")
    for name in names:
        if not (layout.patches / name).is_file():
            raise BackportError(f"{layout.patches / name}: listed in {layout.series_file} but missing")
    return [layout.patches / name for name in names]


def source_commit(patch: Patch, index: int) -> SourceCommit:
    msg = commitmsg.parse(lineform.patch_message(patch))
    commit = (msg.get("upstream-commit") or "").strip()
    if commit and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise BackportError(
            f"patches/{patch.name}: Upstream-Commit must be a 40-hex commit id, not {commit!r}"
        )
    return SourceCommit(
        patch.name, "", msg.upstream_title(), index=index, upstream_commit=commit, note=msg.backport_note()
    )


def _first_line(exc: GitError) -> str:
    text = (exc.stdout + exc.stderr).strip().splitlines()
    return lineform.conflict_line(exc) or (text[-1] if text else str(exc))


def cherry_picker_message(repo: Path, source_sha: str, branch: str, origin: str | None = None) -> str:
    """The message cherry_picker writes for ``source_sha`` on ``branch`` (``fix_commit_msg = false``).

    ``origin`` replaces the ``(cherry picked from commit <source_sha>)`` line: a patch already
    upstream is applied from the series, so its line names the upstream commit or PR instead."""
    original = git("show", "-s", "--format=%B", source_sha, cwd=repo).strip()
    author = git("log", "-1", "--format=%aN <%ae>", source_sha, cwd=repo).strip()
    # cherry_picker's remove_commit_prefix: drop "[X.Y] " prefixes before adding ours.
    while m := re.match(r"\[\d+(?:\.\d+)+\] *", original):
        original = original[m.end() :]
    message = f"[{branch}] {original}"
    info = f"{origin or f'(cherry picked from commit {source_sha})'}\n:"
    # As cherry_picker: interpret-trailers inserts the Co-authored-by trailer at the start
    # of the trailer block, with the "cherry picked" line abused as a pseudo-trailer before it.
    out = git(
        "interpret-trailers", "--where", "start", "--trailer", f"Co-authored-by: {author}", "--trailer", info,
        cwd=repo, input=message,
    )  # fmt: skip
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
            what = "not a git clone (no .git)" if self.repo.is_dir() else "no such directory"
            raise BackportError(f"{self.repo}: {what}; --repo takes {lineform.AIRFLOW_CLONE}")
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
        name = self.branch_name(name)
        for ref in (f"refs/heads/{name}", f"refs/remotes/upstream/{name}", f"refs/remotes/origin/{name}"):
            if sha := self.rev(ref):
                return sha
        raise BackportError(
            f"{self.repo}: no branch {name!r} (looked in local, upstream/ and origin/); "
            f"--repo takes {lineform.AIRFLOW_CLONE}"
        )

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
        whether the series branch was created (False: it existed with exactly these commits).

        Each patch is the base line's form of it (the engine's stage k-1 -> k of that line,
        picked 3-way, so a recorded resolution of the line is what lands); a patch the engine
        reports ``upstream`` there gets no commit."""
        patches = read_series(self.layout)
        line = lineform.base_line(base_name)
        form = lineform.line_form(line, self.layout)
        source: list[SourceCommit] = []
        with lineform.temp_worktree(self.repo, base_sha, "lepatch-series-") as wt:
            for k, path in enumerate(patches, 1):
                patch = read_patch(path)
                src = source_commit(patch, k)
                if form.has_stage(k) and form.is_upstream(k):
                    src.upstream = line.version
                    source.append(src)
                    continue
                if not form.has_stage(k):
                    raise BackportError(
                        f"{path}: does not apply to {base_name} ({base_sha[:10]}), the source of the "
                        f"backport: {form.details[k - 1] or 'an earlier patch failed'} "
                        f"(python -m tools apply --line {line.name})"
                    )
                msg = commitmsg.parse(lineform.patch_message(patch))
                head = git("rev-parse", "HEAD", cwd=wt).strip()
                change = lineform.self_contained(
                    form.change(k - 1, k), form.stage(k),
                    functools.partial(lineform.has_path, self.repo, head), REPO_TESTS_DIR,
                )  # fmt: skip
                carrier = lineform.overlay_commit(
                    self.repo, head, change, msg.upstream_message(),
                    author=patch.author, date=patch.date,
                )  # fmt: skip
                try:
                    git("cherry-pick", "--allow-empty", carrier, cwd=wt)
                except GitError as exc:
                    git("cherry-pick", "--abort", cwd=wt, check=False)
                    raise BackportError(
                        f"{path}: does not apply to {base_name} ({base_sha[:10]}), the source of the "
                        f"backport, as the {line.name} line has it: {_first_line(exc)}"
                    ) from exc
                date = git("log", "-1", "--format=%aI", cwd=wt).strip()
                # Committer date = author date: the same series on the same base gives the same ids.
                git(
                    "commit", "--amend", "--quiet", "--no-verify", "--allow-empty", "-m",
                    msg.upstream_message(), cwd=wt, env={"GIT_COMMITTER_DATE": date},
                )  # fmt: skip
                src.sha = git("rev-parse", "HEAD", cwd=wt).strip()
                source.append(src)
            tip = git("rev-parse", "HEAD", cwd=wt).strip()
        if tip == base_sha:
            return source, False  # every patch is upstream: no series branch to make
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
        # why: checked first, else a foreign repo or a missing git identity reads as "does not apply".
        for ref, sha in {base: base_sha, **starts}.items():
            if problem := lineform.not_airflow(self.repo, sha, ref):
                raise BackportError(problem)
        if problem := identity_problem(self.repo):
            raise BackportError(problem)
        lines = {ln.branch: ln.name for ln in pins.LINES}
        if test and (unknown := [n for n in names if n not in lines]):
            raise BackportError(
                f"--test: {unknown[0]} is not the branch of a pinned line; its tests cannot run"
            )
        original_branch = self.current_branch()
        original_head = self.rev("HEAD") or ""

        source, created = self.build_series(base_sha, base, series_branch)
        tip = next((s.sha for s in reversed(source) if s.sha), base_sha)
        sha7 = tip[:7]
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
            base_sha=base_sha,
            base_line=lineform.base_line(base).name,
        )
        self.save(st)
        ups = [s.patch.split("-", 1)[0] for s in source if s.upstream]
        self.say(
            f"series: {len(source) - len(ups)} patch(es) on {series_branch} ({base} + series, tip {tip[:10]})"
            + (f"; {', '.join(ups)} already upstream in {source[0].upstream or base}" if ups else "")
        )
        return self._run(st)

    def resume(self) -> State:
        """--continue: commit the hand-resolved pick, then carry on with the rest of the run."""
        st = self.load()
        if problem := identity_problem(self.repo):
            raise BackportError(problem)
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
                    f"(git cherry-pick -x {(run.carrier or patch.sha)[:10]}) or --abort"
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
            f"source {st.series_branch} {st.tip[:10]})",
            "",
            f"  {'branch':<14} {'backport branch':<34} {'status':<13} patches",
        ]
        rows += [
            f"  {b.branch:<14} {b.backport_branch:<34} {b.status:<13} {b.next_patch}/{len(st.source)}"
            for b in st.branches
        ]
        rows += ["", f"remaining: {', '.join(b.branch for b in st.remaining) or 'none'}"]
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

    def pick_line(self, run: BranchRun) -> pins.Line:
        """The line whose form of the series a branch gets (the primary for an unpinned branch)."""
        return pins.get_line(run.line) if run.line else pins.PRIMARY

    def form(self, line: pins.Line) -> lineform.LineForm:
        return lineform.line_form(line, self.layout)  # the engine applies each line once per process

    def origin_line(self, src: SourceCommit) -> str | None:
        """What replaces ``(cherry picked from commit ...)`` for a patch already upstream."""
        if not src.upstream:
            return None
        if src.upstream_commit:
            return f"(cherry picked from commit {src.upstream_commit})"
        return src.note

    def marker(self, src: SourceCommit) -> str:
        """The line of the backported commit's message that names its source."""
        return (self.origin_line(src) or f"(cherry picked from commit {src.sha})").strip("()")

    def _carrier(self, st: State, run: BranchRun, src: SourceCommit) -> tuple[str, str]:
        """The commit picked for a patch: the branch line's form of it (the engine's stage k-1 -> k
        over the branch), so each line gets what was verified for it and a branch that moved on
        gets a real 3-way merge. A line the series does not reach this far gets the base line's
        form (what ``lepatch-series`` has), or the patch as written if that is upstream."""
        k = src.index
        form = self.form(self.pick_line(run))
        if not form.has_stage(k):
            form = self.form(pins.PRIMARY if src.upstream else pins.get_line(st.base_line or "3.4"))
            if not form.has_stage(k):
                raise BackportError(
                    f"{src.patch}: the series does not reach it on {form.line.name}; "
                    f"python -m tools apply --line {form.line.name}"
                )
        patch = read_patch(self.layout.patches / src.patch)
        msg = commitmsg.parse(lineform.patch_message(patch))
        head = self.rev("HEAD") or ""
        sha = lineform.overlay_commit(
            self.repo,
            head,
            form.change(k - 1, k),
            msg.upstream_message(),
            author=patch.author,
            date=patch.date,
        )
        return sha, f"the {form.line.name} line's form ({form.status(k)})"

    def _pick(self, st: State, run: BranchRun) -> None:
        src = st.source[run.next_patch]
        run.head_before_pick = self.rev("HEAD") or ""
        line = self.pick_line(run)
        form = self.form(line)
        if src.upstream and form.has_stage(src.index) and form.is_upstream(src.index):
            run.notes.append(f"{src.patch}: already in {line.version}, skipped")
            self.say(f"  {src.patch}: already in {line.version}; skipped")
            return
        run.carrier, done = self._carrier(st, run, src)
        self.save(st, RunState.PICKING)
        try:
            self.g("cherry-pick", "--allow-empty", run.carrier)
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
        if (form.has_stage(src.index) and form.status(src.index) != "clean") or src.upstream:
            run.notes.append(f"{src.patch}: {done}")
        self._amend(run, src)
        self.say(f"  {src.patch}: {done}")

    def _amend(self, run: BranchRun, src: SourceCommit) -> None:
        source = src.sha or run.carrier  # a series patch names its lepatch-series commit
        message = cherry_picker_message(self.repo, source, run.branch, self.origin_line(src))
        self.g("commit", "--amend", "--quiet", "--no-verify", "--allow-empty", "-m", message)

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
        self.say(f"  {'branch':<14} {'backport branch':<34} status")
        for b in st.branches:
            self.say(f"  {b.branch:<14} {b.backport_branch:<34} {b.status}")
            for note in b.notes:
                self.say(textwrap.fill(note, WIDTH, initial_indent="    - ", subsequent_indent="      "))
        self.say(f"\nnothing pushed; back on {target}")
        return st

    # ------------------------------------------------------------ the FAILED report

    def base_commit(self, st: State) -> str:
        """The commit the series was applied onto."""
        if st.base_sha:
            return st.base_sha
        first = next((s.sha for s in st.source if s.sha), "")
        return self.rev(f"{first}^") or first

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
            f"`git cherry-pick -x {run.carrier[:10]}` stopped with conflicts in:"
            + (
                f" (the {self.pick_line(run).name} line's form of a patch already upstream in {src.upstream})"
                if src.upstream
                else ""
            ),
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
            f"    git diff $(git log -1 --format=%H --grep={shlex.quote(self.marker(src))} -F "
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
            f"------------------ original commit in {st.series_branch if src.sha else 'the series'} "
            "------------------",
            self.g("show", "--stat", "--format=fuller", run.carrier).rstrip(),
        ]
        return "\n".join(lines)


def run_line_tests(line_name: str, source: bytes) -> tuple[bool, str]:
    """Install ``source`` as local_executor.py into the line's venv and run tests/executor there."""
    from tools.engine import venvs  # the venv helper of the engine; imported late: only --test needs it

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
