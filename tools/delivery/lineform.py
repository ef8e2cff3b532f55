"""The series as it stands on one pinned line: each patch's status there and the stage trees.

The backport and PR tools start from Airflow's ``main`` (the 3.4 line, where upstream already
released the first patches of the series) and need, per line, which patches are ``upstream``
(in the base already: stage k is stage k-1) and the line's form of every other patch (the
engine's stage trees, so recorded resolutions and 3-way merges are what they pick up)::

    form = line_form("3.4")
    form.status(1)          # "upstream", "clean", "3-way", "resolution", "FAILED", "-"
    form.change(3, 7)       # {path: (bytes at stage 3 or None, bytes at stage 7 or None)}

Everything comes from the engine (``tools.engine.apply``); on a line where a patch is ``upstream`` its
stage has the patch's test files but the base's code.

The second half is git plumbing on those trees: ``overlay_commit`` writes a commit whose tree
is a given commit's tree with some files replaced, which is how a stage-to-stage change becomes
a commit that ``git cherry-pick`` can merge onto any branch (3-way, conflicts and all).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tools.engine import apply as engine_mod
from tools.engine.series import Patch
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.gitcmd import GitError, git
from tools.shared.layout import DEFAULT, Layout
from tools.shared.pins import Line

UPSTREAM = engine_mod.UPSTREAM
APPLIED = engine_mod.APPLIED

Tree = dict[str, bytes]
Change = dict[str, tuple[bytes | None, bytes | None]]


_ENGINES: dict[Path, engine_mod.Engine] = {}


def engine_for(layout: Layout) -> engine_mod.Engine:
    """One engine per patches directory and process (the default layout shares the engine's own)."""
    key = layout.patches.resolve()
    if key not in _ENGINES:
        _ENGINES[key] = engine_mod.default_engine() if layout == DEFAULT else engine_mod.Engine(layout)
    return _ENGINES[key]


@dataclass
class LineForm:
    """Statuses and stage trees of one line; ``stages[k]`` exists for every applied k."""

    line: Line
    names: list[str]
    statuses: list[str]
    details: list[str]
    stages: list[Tree]
    patches: dict[str, Patch]

    def index(self, name: str) -> int:
        """1-based position of a patch (the stage that first has it)."""
        return self.names.index(name) + 1

    def status(self, k: int) -> str:
        return self.statuses[k - 1]

    def is_upstream(self, k: int) -> bool:
        return self.status(k) == UPSTREAM

    def has_stage(self, k: int) -> bool:
        return 0 <= k < len(self.stages)

    def stage(self, k: int) -> Tree:
        if not self.has_stage(k):
            failed = next(
                (d for s, d in zip(self.statuses, self.details, strict=True) if s not in APPLIED), ""
            )
            raise ToolError(
                f"line {self.line.name} ({self.line.version}) has stages 0..{len(self.stages) - 1}, "
                f"not {k}" + (f": {failed}" if failed else "")
            )
        return self.stages[k]

    def change(self, start: int, end: int) -> Change:
        """Every path that differs between two stages: (before, after), None where absent."""
        a, b = self.stage(start), self.stage(end)
        return {p: (a.get(p), b.get(p)) for p in sorted(set(a) | set(b)) if a.get(p) != b.get(p)}


def line_form(line: Line | str, layout: Layout = DEFAULT) -> LineForm:
    """Apply the series of ``layout`` to ``line`` (the engine's result, computed once)."""
    engine = engine_for(layout)
    result = engine.apply_line(line)
    series = engine.series
    return LineForm(
        line=result.line,
        names=list(series.names),
        statuses=[p.status for p in result.patches],
        details=[p.detail for p in result.patches],
        stages=list(result.stages),
        patches=dict(series.patches),
    )


def line_of_branch(branch: str) -> Line | None:
    """The pinned line whose upstream branch this is (``main`` is the pre-release line)."""
    return next((ln for ln in pins.LINES if ln.branch == branch), None)


def base_line(base: str) -> Line:
    """The pinned line of the branch the series is applied onto (``main``: the pre-release line)."""
    return line_of_branch(base) or line_of_branch("main") or pins.PRIMARY


def patch_message(patch: Patch) -> str:
    """The commit message ``git am`` makes of a patch mail (DEP-3 block included)."""
    return f"{patch.subject}\n\n{patch.message}".strip() + "\n"


# -------------------------------------------------------------------- git plumbing


def tree_with(repo: Path, commit: str, files: Mapping[str, bytes | None]) -> str:
    """The id of ``commit``'s tree with ``files`` replaced (None deletes), written to ``repo``."""
    with tempfile.TemporaryDirectory(prefix="lepatch-index-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git("read-tree", commit, cwd=repo, env=env)
        for path, data in sorted(files.items()):
            if data is None:
                git("update-index", "--force-remove", "--", path, cwd=repo, env=env)
            else:
                blob = git("hash-object", "-w", "--stdin", cwd=repo, input=data).strip()
                git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", cwd=repo, env=env)
        return git("write-tree", cwd=repo, env=env).strip()


def ident_env(author: str, date: str) -> dict[str, str]:
    """git's environment for a commit by ``author`` (``Name <email>``), committed by them at ``date``:
    the same change gives the same commit id."""
    m = re.match(r"^\s*(.*?)\s*<([^>]*)>\s*$", author)
    name, email = (m.group(1), m.group(2)) if m else (author, "")
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }


def overlay_commit(repo: Path, onto: str, change: Change, message: str, *, author: str, date: str) -> str:
    """A commit whose parent has the ``before`` side of ``change`` over ``onto``'s tree and whose
    own tree has the ``after`` side: cherry-picking it merges the change onto any branch.

    ``author`` is ``Name <email>``; committer = author, committer date = ``date``, so the same
    change gives the same id."""
    env = ident_env(author, date)
    before = tree_with(repo, onto, {p: a for p, (a, _) in change.items()})
    after = tree_with(repo, onto, {p: b for p, (_, b) in change.items()})
    parent = git(
        "commit-tree", before, "-p", onto, "-m", "lepatch: the line before the change", cwd=repo, env=env
    )
    return git(
        "commit-tree", after, "-p", parent.strip(), "-F", "-", cwd=repo, env=env, input=message
    ).strip()


@contextlib.contextmanager
def temp_worktree(repo: Path, commit: str, prefix: str) -> Iterator[Path]:
    """A detached worktree of ``repo`` at ``commit`` in a temporary directory, removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        wt = Path(tmp) / "wt"
        git("worktree", "add", "--detach", str(wt), commit, cwd=repo)
        try:
            yield wt
        finally:
            git("worktree", "remove", "--force", str(wt), cwd=repo, check=False)
            git("worktree", "prune", cwd=repo, check=False)


def conflict_line(exc: GitError) -> str | None:
    """The first ``CONFLICT`` or ``error:`` line git printed, if any."""
    text = (exc.stdout + exc.stderr).splitlines()
    return next((ln.strip() for ln in text if ln.startswith(("CONFLICT", "error: "))), None)


def has_path(repo: Path, commit: str, path: str) -> bool:
    return bool(git("ls-tree", "--name-only", commit, "--", path, cwd=repo).strip())


# Where the clone the backport and pr tools work in comes from (README, "Release managers").
AIRFLOW_CLONE = (
    "an Airflow clone: git clone https://github.com/apache/airflow (main; v3-3-test, v3-2-test, "
    "v3-1-test for backport)"
)


def not_airflow(repo: Path, commit: str, ref: str) -> str | None:
    """One line saying ``repo`` is not an Airflow clone (``ref`` lacks the executor); None if it is."""
    if has_path(repo, commit, pins.REPO_PATH):
        return None
    return f"{repo}: {ref} has no {pins.REPO_PATH}, so this is not {AIRFLOW_CLONE}"


def self_contained(change: Change, end: Tree, present: Callable[[str], bool], tests_dir: str) -> Change:
    """``change`` made to apply to a tree that lacks the test files of earlier patches.

    On the base line the patches already upstream add their test files to the stages but not to
    Airflow's ``main``: a file the change edits and the tree lacks is added whole, and the test
    support files (``conftest.py``, helpers: anything in ``tests_dir`` but ``test_*.py``) that
    the stage has and the tree lacks come along, so the change's tests run where it lands."""
    out: Change = {}
    for path, (before, after) in change.items():
        if before is not None and not present(path):
            before = None
        if before is not None or after is not None:
            out[path] = (before, after)
    for path, data in sorted(end.items()):
        name = path.rsplit("/", 1)[-1]
        support = path.startswith(tests_dir + "/") and not name.startswith("test_")
        if support and path not in out and not present(path):
            out[path] = (None, data)
    return out
