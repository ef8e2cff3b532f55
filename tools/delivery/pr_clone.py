"""A stand-in Airflow clone for ``pr`` where no clone of apache/airflow is at hand.

``python -m tools pr --make-clone DIR`` makes a git repository at ``DIR`` whose ``main`` is the
pre-release line (3.4.0b2) as far as the series' PRs read it:

- every upstream file the series patches (``pins.UPSTREAM_FILES``), at its path in Airflow's
  repository, as the line's pinned wheels ship it (read and sha256-checked by the engine's
  ``fetch.read_bases``, the same bytes stage 0 is made of);
- upstream's own ``airflow-core/tests/unit/executors/test_local_executor.py`` from
  ``../shared/upstream/`` (``tools.delivery.upstream_tests.reference_dir``) where it is there, in
  a commit of its own, so each PR's diff to it and its whole-file run happen as on a real clone.

``pr`` reads nothing else of ``main``: the PR branches start there, and stacked ones on each
other. What the stand-in lacks is the rest of Airflow: its conftest and ``tests_common`` (the PR's
test files run self-contained, as ``pr_testrun`` falls back to), and the other test files the
removed-internals scan would search (it scans none here). No ``v3-*-test`` branch is made: ``pr``
works on ``main`` only. Commits are dated and authored fixedly, so the same pins give the same ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tools.delivery import lineform, upstream_tests
from tools.engine import fetch
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.gitcmd import git, identity_problem
from tools.shared.layout import DEFAULT, Layout

# Who the stand-in's own commits are by: not upstream's authors, whose history it does not have.
AUTHOR = "lepatch stand-in clone <lepatch@localhost>"
DATE = "2026-01-01T00:00:00+0000"


@dataclass
class Clone:
    path: Path
    line: pins.Line
    files: list[str]  # on main, at Airflow's repository paths
    upstream_test: Path | None  # where upstream's test_local_executor.py came from; None if absent


def main_line() -> pins.Line:
    line = lineform.line_of_branch("main")
    if line is None:
        raise ToolError("no pinned line has upstream branch main (tools/shared/pins.py)")
    return line


def make_clone(
    dest: Path,
    *,
    layout: Layout = DEFAULT,
    line: pins.Line | None = None,
    bases: Mapping[str, bytes] | None = None,
    upstream_dir: Path | None = None,
) -> Clone:
    """Make the stand-in clone at ``dest`` (absent or an empty directory) and return what it holds.

    ``bases`` replaces the pinned files (tests); ``upstream_dir`` the reference directory."""
    line = line or main_line()
    dest = Path(dest).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ToolError(f"{dest}: exists and is not an empty directory; --make-clone makes a new clone")
    files = dict(bases) if bases is not None else fetch.read_bases(line, layout)
    if pins.REPO_PATH not in files:
        raise ToolError(f"the {line.name} line's files lack {pins.REPO_PATH}: no clone to make")
    reference = upstream_tests.reference_file(layout, upstream_dir)
    dest.mkdir(parents=True, exist_ok=True)
    env = lineform.ident_env(AUTHOR, DATE)
    git("init", "--quiet", "--initial-branch", "main", cwd=dest)
    # why: pr commits in the clone (cherry-pick); a machine without a git identity could not
    if identity_problem(dest):
        git("config", "user.name", env["GIT_AUTHOR_NAME"], cwd=dest)
        git("config", "user.email", env["GIT_AUTHOR_EMAIL"], cwd=dest)
    _commit(dest, files, f"{_released(line)} as released (stand-in for main)", env)
    found = None
    if reference.is_file():
        _commit(
            dest,
            {upstream_tests.REPO_FILE: reference.read_bytes()},
            f"Upstream's {upstream_tests.REPO_FILE} (reference copy, {reference})",
            env,
        )
        found = reference
    return Clone(dest, line, sorted([*files, *([upstream_tests.REPO_FILE] if found else [])]), found)


def _released(line: pins.Line) -> str:
    sdk = f" and {pins.SUPERVISOR.distribution} {line.sdk_version}" if line.sdk_version else ""
    return f"{pins.DISTRIBUTION} {line.version}{sdk}"


def _commit(repo: Path, files: Mapping[str, bytes], message: str, env: Mapping[str, str]) -> None:
    for rel, data in sorted(files.items()):
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    git("add", "--", *sorted(files), cwd=repo)
    git("commit", "--quiet", "--no-verify", "-m", message, cwd=repo, env=env)


def describe(clone: Clone) -> list[str]:
    """What was made, for the user: one line each."""
    head = git("rev-parse", "--short", "main", cwd=clone.path).strip()
    out = [f"made {clone.path}: main at {head} is {_released(clone.line)}, {len(clone.files)} files:"]
    out += [f"  {f}" for f in clone.files]
    if clone.upstream_test is None:
        out.append(
            f"  (no {upstream_tests.REPO_FILE}: the reference copy is absent; pass --upstream DIR "
            f"or set {upstream_tests.UPSTREAM_ENV})"
        )
    return out
