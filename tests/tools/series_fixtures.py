"""Synthetic release lines and series for the engine tests: small files, real git."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from tools.engine.apply import Engine
from tools.engine.series import SERIES_AUTHOR
from tools.shared.layout import Layout
from tools.shared.pins import REPO_PATH, Line

TESTS = "airflow-core/tests/unit/executors/local_executor"
PRIMARY = Line(name="9.1", version="9.1.0", wheel_sha256="0" * 64, source_sha256="0" * 64, branch="v9-1-test")
OLDER = Line(name="9.0", version="9.0.3", wheel_sha256="1" * 64, source_sha256="1" * 64, branch="v9-0-test")

BASE_PRIMARY = "".join(f"line {i}\n" for i in range(1, 31))
# Line 2 differs: a patch touching line 4 has different context here (strict fails, 3-way
# merges); a patch touching line 2 itself conflicts.
BASE_OLDER = BASE_PRIMARY.replace("line 2\n", "line two\n")

DEP3 = """Origin: vendor
Bug: https://github.com/apache/airflow/issues/70526
Forwarded: no
Applied-Upstream: no
Last-Update: 2026-11-30"""

TESTER = "Ada Tester <ada@example.invalid>"
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Ada Tester",
    "GIT_AUTHOR_EMAIL": "ada@example.invalid",
    "GIT_AUTHOR_DATE": "2026-11-30T10:00:00+0100",
    "GIT_COMMITTER_NAME": "Ada Tester",
    "GIT_COMMITTER_EMAIL": "ada@example.invalid",
    "GIT_COMMITTER_DATE": "2026-11-30T10:00:00+0100",
}


def _git(repo: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV, **(env or {})},
        input=input,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def make_patch(
    before: dict[str, str],
    after: dict[str, str],
    subject: str,
    body: str = "",
    dep3: str = DEP3,
    author: str | None = None,
) -> str:
    """A ``git format-patch --full-index`` mail turning ``before`` into ``after``.

    Its author is ``author``, by default the series' own identity for an ``Origin: vendor``
    patch (lint-series wants it there) and the fixtures' tester for any other."""
    if author is None:
        author = SERIES_AUTHOR if re.search(r"^Origin: vendor$", dep3, flags=re.M) else TESTER
    name, email = re.fullmatch(r"(.+) <(.+)>", author).groups()  # type: ignore[union-attr]
    who = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        _git(repo, "init", "-q")
        for files in (before, after):
            for p in {*before, *after}:
                if p not in files and (repo / p).exists():
                    (repo / p).unlink()
            for p, text in files.items():
                (repo / p).parent.mkdir(parents=True, exist_ok=True)
                (repo / p).write_text(text)
            _git(repo, "add", "-A")
            message = subject + "\n\n" + (body + "\n\n" if body else "") + dep3 if files is after else "base"
            _git(repo, "commit", "-q", "--allow-empty", "-F", "-", input=message, env=who)
        return _git(
            repo, "format-patch", "--full-index", "-N", "--no-signature", "--zero-commit", "--stdout", "-1"
        )


def edit(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


class Project:
    """A repository tree in a temp dir with a patches/ directory and two synthetic lines."""

    def __init__(self, root: Path):
        self.root = root
        self.layout = Layout(root=root)
        (root / "patches").mkdir(parents=True, exist_ok=True)
        self.names: list[str] = []
        self.tree: dict[str, str] = {REPO_PATH: BASE_PRIMARY}

    def add(
        self, name: str, changes: dict[str, str | None], subject: str | None = None, dep3: str = DEP3
    ) -> str:
        """Append a patch made against the primary line's current stage."""
        after = dict(self.tree)
        for p, text in changes.items():
            if text is None:
                after.pop(p, None)
            else:
                after[p] = text
        text = make_patch(self.tree, after, subject or f"Patch {name}", dep3=dep3)
        (self.root / "patches" / name).write_text(text)
        self.names.append(name)
        self.tree = after
        self.write_series()
        return text

    def write_series(self) -> None:
        (self.root / "patches" / "series").write_text(
            "# test series\n" + "".join(n + "\n" for n in self.names)
        )

    def engine(self) -> Engine:
        bases = {PRIMARY.name: BASE_PRIMARY.encode(), OLDER.name: BASE_OLDER.encode()}
        return Engine(self.layout, (PRIMARY, OLDER), base=lambda line: bases[line.name])
