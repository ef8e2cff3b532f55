"""A small stand-in for an Airflow clone and a tiny series, built from the pinned wheels.

The repository has the three lines' ``local_executor.py`` at Airflow's path on
``v3-1-test``, ``v3-2-test`` and ``v3-3-test`` (each branched off ``main`` where that
release's file was committed), and one more commit on ``main`` touching another file.
The series has three patches written against 3.3 (the primary line):

1. ``terminate()``'s docstring: applies cleanly everywhere;
2. a comment in ``_process_workloads`` plus a new test file: conflicts on 3.2 and 3.1,
   whose ``_process_workloads`` differs (a resolution can be recorded for 3.2);
3. the module docstring: applies cleanly everywhere.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

from tools import pins

REPO_PATH = pins.REPO_PATH
TEST_PATH = "airflow-core/tests/unit/executors/local_executor/test_synthetic.py"
WHEELS = Path(os.environ.get("LEPATCH_WHEELS", "/tmp/wheels"))

AUTHOR = "Jane Contributor <jane@example.org>"
ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Release Manager",
    "GIT_AUTHOR_EMAIL": "rm@example.org",
    "GIT_COMMITTER_NAME": "Release Manager",
    "GIT_COMMITTER_EMAIL": "rm@example.org",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}


def base_source(line: pins.Line) -> bytes | None:
    """The pinned ``local_executor.py`` of a line (a local wheel, else the engine's cache/PyPI)."""
    wheel = WHEELS / line.wheel_name
    if wheel.is_file():
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(pins.PACKAGE_PATH)
        if hashlib.sha256(data).hexdigest() == line.source_sha256:
            return data
    try:
        from tools.fetch import read_base

        return read_base(line)
    except Exception:
        return None


def all_bases() -> dict[str, bytes] | None:
    out = {}
    for line in pins.LINES:
        src = base_source(line)
        if src is None:
            return None
        out[line.name] = src
    return out


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, **ENV, **(env or {})}
    return subprocess.run(args, cwd=cwd, env=full, check=True, capture_output=True, text=True).stdout


def commit_file(repo: Path, rel: str, data: bytes, message: str, date: str) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    run("git", "add", rel, cwd=repo)
    run(
        "git",
        "commit",
        "-q",
        "-m",
        message,
        cwd=repo,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
    )


def make_airflow_repo(path: Path, bases: dict[str, bytes]) -> Path:
    path.mkdir(parents=True)
    run("git", "init", "-q", "-b", "main", cwd=path)
    run("git", "config", "user.name", "Release Manager", cwd=path)
    run("git", "config", "user.email", "rm@example.org", cwd=path)
    run("git", "config", "commit.gpgsign", "false", cwd=path)
    (path / "README.md").write_text("synthetic Airflow\n")
    run("git", "add", "README.md", cwd=path)
    run("git", "commit", "-q", "-m", "Initial commit", cwd=path)
    for day, name in enumerate(("3.1", "3.2", "3.3"), start=2):
        line = pins.get_line(name)
        commit_file(
            path,
            REPO_PATH,
            bases[name],
            f"Executor as released in {line.version}",
            f"2026-01-0{day}T00:00:00+0000",
        )
        run("git", "branch", line.branch, cwd=path)
    commit_file(
        path,
        "airflow-core/NEWS.txt",
        b"unrelated main change\n",
        "Unrelated change on main",
        "2026-01-06T00:00:00+0000",
    )
    return path


# --- the three synthetic patches, as edits of a line's file ------------------------------

DOC_OLD = '        """Terminate the executor is not doing anything."""\n'
DOC_NEW = '        """Terminate the executor (synthetic patch 1)."""\n'
MOD_OLD = '"""\nLocalExecutor.\n'
MOD_NEW = '"""\nLocalExecutor (synthetic patch 3).\n'
COMMENT = "        # synthetic patch 2: one comment line\n"


def edit1(text: str) -> str:
    assert DOC_OLD in text
    return text.replace(DOC_OLD, DOC_NEW)


def edit2(text: str, line: str) -> str:
    """Patch 2 as written for 3.3, and as resolved by hand for 3.2 and 3.1."""
    for sig in (
        "    def _process_workloads(self, workload_list):\n",
        "    def _process_workloads(self, workloads):\n",
    ):
        if sig in text:
            text = text.replace(sig, sig + COMMENT)
            break
    else:
        raise AssertionError("no _process_workloads")
    if line == "3.3":
        old = "            # A valid workload will exist in exactly one of these dicts.\n"
        assert old in text
        text = text.replace(old, "            # A valid workload is in exactly one of these dicts.\n")
    return text


def edit3(text: str) -> str:
    assert MOD_OLD in text
    return text.replace(MOD_OLD, MOD_NEW)


TEST_FILE = b"""from __future__ import annotations


def test_synthetic():
    assert 1 + 1 == 2
"""

DEP3 = {
    1: (
        "Origin: upstream, https://github.com/apache/airflow/pull/67881\n"
        "Bug: https://github.com/apache/airflow/issues/70526\n"
        "Forwarded: https://github.com/apache/airflow/pull/67881\n"
        "Applied-Upstream: no\nLast-Update: 2026-11-30"
    ),
    2: (
        "Origin: upstream, https://github.com/apache/airflow/pull/70545\n"
        "Bug: https://github.com/apache/airflow/issues/70526\n"
        "Forwarded: https://github.com/apache/airflow/pull/70545\n"
        "Applied-Upstream: no\nLast-Update: 2026-11-30\nSignificant: yes"
    ),
    3: "Origin: vendor\nForwarded: no\nApplied-Upstream: no\nLast-Update: 2026-11-30",
}
TITLES = {
    1: "Drain results while joining workers in end()",
    2: "Drain the result queue before each workload put",
    3: "Describe the executor in its module docstring",
}
BODIES = {
    1: "end() joined workers without reading their results.",
    2: "A blocked put could deadlock the scheduler.\n\nFixes #70526.",
    3: "Say who talks to whom.",
}


def make_series(patches: Path, bases: dict[str, bytes], *, resolution_32: bool = True) -> list[str]:
    """Write the three patches, ``series`` and (optionally) the 3.2 resolution of patch 2."""
    scratch = patches.parent / "scratch-series"
    scratch.mkdir(parents=True)
    run("git", "init", "-q", "-b", "main", cwd=scratch)
    commit_file(scratch, REPO_PATH, bases["3.3"], "base", "2026-02-01T00:00:00+0000")
    text = bases["3.3"].decode()
    for n in (1, 2, 3):
        text = edit1(text) if n == 1 else edit2(text, "3.3") if n == 2 else edit3(text)
        (scratch / REPO_PATH).write_text(text)
        run("git", "add", REPO_PATH, cwd=scratch)
        if n == 2:
            (scratch / TEST_PATH).parent.mkdir(parents=True, exist_ok=True)
            (scratch / TEST_PATH).write_bytes(TEST_FILE)
            run("git", "add", TEST_PATH, cwd=scratch)
        msg = f"{TITLES[n]}\n\n{BODIES[n]}\n\n{DEP3[n]}\n"
        date = f"2026-03-0{n}T12:00:00+0000"
        run("git", "commit", "-q", "--author", AUTHOR, "-m", msg, cwd=scratch, env={"GIT_AUTHOR_DATE": date})
    patches.mkdir(parents=True, exist_ok=True)
    names = run("git", "format-patch", "--full-index", "-o", str(patches), "HEAD~3", cwd=scratch).split()
    files = [Path(n).name for n in names]
    (patches / "series").write_text("# synthetic series\n" + "\n".join(files) + "\n")
    if resolution_32:
        write_resolution(patches, bases, "3.2", files[1])
    return files


def write_resolution(patches: Path, bases: dict[str, bytes], line: str, patch_name: str) -> Path:
    """Patch 2's resolution for a line: the diff of its file from stage 1 to the resolved stage 2."""
    scratch = patches.parent / f"scratch-res-{line}"
    scratch.mkdir(parents=True)
    run("git", "init", "-q", "-b", "main", cwd=scratch)
    stage1 = edit1(bases[line].decode())
    commit_file(scratch, REPO_PATH, stage1.encode(), "stage 1", "2026-02-01T00:00:00+0000")
    (scratch / REPO_PATH).write_text(edit2(stage1, line))
    diff = run("git", "diff", "--full-index", "HEAD", "--", REPO_PATH, cwd=scratch)
    out = patches / "resolutions" / line / patch_name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(diff)
    return out
