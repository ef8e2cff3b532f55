"""A small stand-in for an Airflow clone and a tiny series, built from the pinned wheels.

The repository's ``main`` is the 3.4 line (3.4.0b2's ``local_executor.py`` at Airflow's path,
then one more commit touching another file); ``v3-1-test``, ``v3-2-test`` and ``v3-3-test``
branch off ``main`` where that release's file was committed. ``plant_upstream_tests`` adds
test files in upstream's layout that use internals the series renames.

The series has five patches written against 3.3 (the primary line):

1. ``terminate()`` as upstream released it in 3.4.0b2 (a backport: ``upstream`` on 3.4);
2. a comment in ``_process_workloads`` plus a new test file (``Significant: yes``); 3.3 also
   rewords a comment 3.4 does not have, so 3.4 and 3.2 carry resolutions and 3.1 has none
   unless asked for;
3. a seed: a drain batch attribute and helper;
4. ours: removes what 3 added, renames ``_check_workers`` and ``_run_worker``, adds a test
   (``PR-Folds: 0002, 0003``);
5. ours: the module docstring, renames ``_read_results`` (``PR-Stack-On: 0004``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

from tools.shared import pins

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
        from tools.engine.fetch import read_base

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
    for day, name in enumerate(("3.1", "3.2", "3.3", "3.4"), start=2):
        line = pins.get_line(name)
        commit_file(
            path,
            REPO_PATH,
            bases[name],
            f"Executor as released in {line.version}",
            f"2026-01-0{day}T00:00:00+0000",
        )
        if line.branch != "main":
            run("git", "branch", line.branch, cwd=path)
    commit_file(
        path,
        "airflow-core/NEWS.txt",
        b"unrelated main change\n",
        "Unrelated change on main",
        "2026-01-07T00:00:00+0000",
    )
    return path


# --- upstream's own tests, planted in the clone: they use internals patches 4 and 5 rename ----

UPSTREAM_TEST = "airflow-core/tests/unit/executors/test_local_executor_internals.py"
# Upstream's own test_local_executor.py: a PR changes it with its patches/upstream-tests/ diff and runs it
# whole (tools.delivery.upstream_tests), so it is self-contained here.
UPSTREAM_FILE = "airflow-core/tests/unit/executors/test_local_executor.py"
UPSTREAM_FILE_TEXT = b"""from __future__ import annotations


class TestLocalExecutor:
    def test_reads_a_removed_internal(self):
        assert "result_queue"

    def test_is_local(self):
        assert True
"""
UPSTREAM_CHECK_WORKERS_TEST = "airflow-core/tests/unit/executors/test_local_executor_check_workers.py"
UNRELATED_TEST = "airflow-core/tests/unit/jobs/test_scheduler_job.py"
PLANTED = {
    UPSTREAM_TEST: b"""from __future__ import annotations

from unittest import mock

from airflow.executors import local_executor
from airflow.executors.local_executor import LocalExecutor


class TestLocalExecutor:
    def test_sync_checks_workers(self):
        executor = LocalExecutor(parallelism=1)
        with mock.patch.object(executor, "_check_workers") as check:
            executor.sync()
        check.assert_called_once()

    @mock.patch("airflow.executors.local_executor._run_worker")
    def test_spawn_targets_run_worker(self, run_worker):
        assert local_executor._run_worker is run_worker

    def test_read_results_by_name(self):
        assert callable(getattr(LocalExecutor, "_read_results"))

    def test_is_local(self):
        assert LocalExecutor.is_local

    def test_results_arrive_on_the_result_queue(self):
        executor = LocalExecutor(parallelism=1)
        executor.start()
        assert executor.result_queue.empty()
        assert executor._unread_messages.value == 0
        executor.end()

    @mock.patch.object(LocalExecutor, "activity_queue", create=True)
    def test_workloads_go_to_the_activity_queue(self, activity_queue):
        assert activity_queue is LocalExecutor.activity_queue
""",
    UPSTREAM_CHECK_WORKERS_TEST: b"""from __future__ import annotations

from airflow.executors.local_executor import LocalExecutor


def test_check_workers_on_an_unstarted_executor():
    executor = LocalExecutor()
    executor.workers = {}
    executor._check_workers()
""",
    UPSTREAM_FILE: UPSTREAM_FILE_TEXT,
    UNRELATED_TEST: b"""def test_scheduler_checks_workers_interval():
    check_workers_interval = 5
    assert "local_executor_check_workers" and check_workers_interval
""",
}


def plant_upstream_tests(repo: Path) -> None:
    for rel, data in PLANTED.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
        run("git", "add", rel, cwd=repo)
    run("git", "commit", "-q", "-m", "Upstream's executor tests", cwd=repo)


# --- the synthetic patches, as edits of a line's file ------------------------------------

TERMINATE_33 = '    def terminate(self):\n        """Terminate the executor is not doing anything."""\n\n'
MOD_OLD = '"""\nLocalExecutor.\n'
MOD_NEW = '"""\nLocalExecutor (synthetic patch 5).\n'
COMMENT = "        # synthetic patch 2: one comment line\n"
CLASS_DOC_END = (
    '    :param parallelism: how many parallel processes are run in the executor, must be > 0\n    """\n\n'
)
SEED = (
    "    _DRAIN_BATCH = 64  # synthetic patch 3\n"
    "\n"
    "    def _drain_some(self):\n"
    '        """Read the results waiting (synthetic patch 3)."""\n'
    "        self._read_results()\n"
    "\n"
)


def terminate_34(bases: dict[str, bytes]) -> str:
    text = bases["3.4"].decode()
    start = text.index("    def terminate(self):\n")
    return text[start : text.index("    def _process_workloads(", start)]


def edit1(text: str, bases: dict[str, bytes]) -> str:
    """terminate() as 3.4.0b2 has it; a no-op where it is there already (the 3.4 line)."""
    new = terminate_34(bases)
    if new in text:
        return text
    assert TERMINATE_33 in text
    return text.replace(TERMINATE_33, new)


def edit2(text: str, line: str) -> str:
    """Patch 2 as written for 3.3, and as resolved by hand for the other lines."""
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


def edit_seed(text: str) -> str:
    assert CLASS_DOC_END in text
    return text.replace(CLASS_DOC_END, CLASS_DOC_END + SEED)


def edit_fold(text: str) -> str:
    assert SEED in text
    text = text.replace(SEED, "")
    return (
        text.replace("_check_workers", "_reap_workers")
        .replace("_run_worker(", "_worker_loop(")
        .replace("target=_run_worker", "target=_worker_loop")
    )


def edit3(text: str) -> str:
    assert MOD_OLD in text
    return text.replace(MOD_OLD, MOD_NEW).replace("_read_results", "_drain_results")


def stage_text(bases: dict[str, bytes], line: str, k: int) -> str:
    """The executor of ``line`` after the first ``k`` synthetic patches."""
    text = bases[line].decode()
    for n in range(1, k + 1):
        text = {
            1: lambda t: edit1(t, bases),
            2: lambda t: edit2(t, line),
            3: edit_seed,
            4: edit_fold,
            5: edit3,
        }[n](text)
    return text


TEST_FILE = b"""from __future__ import annotations


def test_synthetic():
    assert 1 + 1 == 2
"""
TESTS_DIR = "airflow-core/tests/unit/executors/local_executor"
CONFTEST_PATH = f"{TESTS_DIR}/conftest.py"
CONFTEST = b"""from __future__ import annotations

import pytest


@pytest.fixture
def executor_source():
    from pathlib import Path

    return (Path(__file__).resolve().parents[4] / "src/airflow/executors/local_executor.py").read_text()
"""
TERMINATE_TEST_PATH = f"{TESTS_DIR}/test_terminate.py"
TERMINATE_TEST = b"""from __future__ import annotations


def test_terminate_stops_workers(executor_source):
    assert "_terminate_worker_process" in executor_source
"""
TERMINATE_TEST_4 = (
    TERMINATE_TEST
    + b"""

def test_terminate_reaps_nothing_twice(executor_source):
    assert "_check_workers" not in executor_source
"""
)
REAP_TEST_PATH = f"{TESTS_DIR}/test_reap.py"
REAP_TEST = b"""from __future__ import annotations


def test_dead_worker_is_reaped(executor_source):
    assert "def _reap_workers(" in executor_source
"""
TEST_FILES = {
    1: [(CONFTEST_PATH, CONFTEST), (TERMINATE_TEST_PATH, TERMINATE_TEST)],
    2: [(TEST_PATH, TEST_FILE)],
    4: [(REAP_TEST_PATH, REAP_TEST), (TERMINATE_TEST_PATH, TERMINATE_TEST_4)],
}

UPSTREAM_AUTHOR = "Upstream Author <upstream@example.org>"
UPSTREAM_SHA = "0123456789abcdef0123456789abcdef01234567"
DEP3 = {
    1: (
        "Origin: backport, https://github.com/apache/airflow/pull/67881\n"
        "Bug: https://github.com/apache/airflow/issues/67870\n"
        "Forwarded: not-needed\n"
        "Applied-Upstream: 3.4.0b2\nLast-Update: 2026-11-30"
    ),
    2: (
        "Origin: other, https://github.com/apache/airflow/pull/70545\n"
        "Bug: https://github.com/apache/airflow/issues/70526\n"
        "Forwarded: https://github.com/apache/airflow/pull/70545\n"
        "Applied-Upstream: no\nLast-Update: 2026-11-30\nSignificant: yes"
    ),
    3: (
        "Origin: other, https://github.com/apache/airflow/issues/70526\n"
        "Bug: https://github.com/apache/airflow/issues/70526\n"
        "Forwarded: no\nApplied-Upstream: no\nLast-Update: 2026-11-30"
    ),
    4: (
        "Origin: vendor\n"
        "Bug: https://github.com/apache/airflow/issues/74575\n"
        "Forwarded: https://github.com/apache/airflow/pull/74588\n"
        "Applied-Upstream: no\nLast-Update: 2026-11-30\n"
        "PR-Folds: 0002, 0003"
    ),
    5: (
        "Origin: vendor\nBug: https://github.com/apache/airflow/issues/74575\n"
        "Forwarded: no\nApplied-Upstream: no\nLast-Update: 2026-11-30\nPR-Stack-On: 0004"
    ),
}
TITLES = {
    1: "Terminate LocalExecutor worker processes in terminate()",
    2: "Drain the result queue before each workload put",
    3: "Read results in batches while dispatching",
    4: "Reap dead workers in one place",
    5: "Describe the executor in its module docstring",
}
BODIES = {
    1: "terminate() did nothing; it now stops every worker.",
    2: "A blocked put could deadlock the scheduler.\n\nFixes #70526.",
    3: "Keep the result pipe from filling.",
    4: "One method reaps dead workers; the drain helper is gone again.",
    5: "Say who talks to whom.",
}
AUTHORS = {1: UPSTREAM_AUTHOR}
N = len(TITLES)


def make_series(
    patches: Path,
    bases: dict[str, bytes],
    *,
    resolutions: tuple[str, ...] = ("3.4", "3.2"),
    upstream_commit: bool = False,
) -> list[str]:
    """Write the patches, ``series`` and the resolutions of the given lines."""
    scratch = patches.parent / "scratch-series"
    scratch.mkdir(parents=True)
    run("git", "init", "-q", "-b", "main", cwd=scratch)
    commit_file(scratch, REPO_PATH, bases["3.3"], "base", "2026-02-01T00:00:00+0000")
    for n in range(1, N + 1):
        (scratch / REPO_PATH).write_text(stage_text(bases, "3.3", n))
        run("git", "add", REPO_PATH, cwd=scratch)
        for rel, data in TEST_FILES.get(n, []):
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            (scratch / rel).write_bytes(data)
            run("git", "add", rel, cwd=scratch)
        dep3 = DEP3[n] + (f"\nUpstream-Commit: {UPSTREAM_SHA}" if n == 1 and upstream_commit else "")
        msg = f"{TITLES[n]}\n\n{BODIES[n]}\n\n{dep3}\n"
        date = f"2026-03-0{n}T12:00:00+0000"
        author = AUTHORS.get(n, AUTHOR)
        run("git", "commit", "-q", "--author", author, "-m", msg, cwd=scratch, env={"GIT_AUTHOR_DATE": date})
    patches.mkdir(parents=True, exist_ok=True)
    names = run(
        "git", "format-patch", "--full-index", "-U2", "-o", str(patches), f"HEAD~{N}", cwd=scratch
    ).split()
    files = [Path(n).name for n in names]
    (patches / "series").write_text("# synthetic series\n" + "\n".join(files) + "\n")
    for line in resolutions:
        for k in range(1, N + 1):
            before, after = stage_text(bases, line, k - 1), stage_text(bases, line, k)
            if before != after and not applies(patches / files[k - 1], before):
                write_resolution(patches, line, files[k - 1], before, after)
    return files


def applies(patch: Path, executor: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / REPO_PATH).parent.mkdir(parents=True)
        (Path(tmp) / REPO_PATH).write_text(executor)
        proc = subprocess.run(
            ["git", "apply", "--check", f"--include={REPO_PATH}", str(patch)], cwd=tmp, capture_output=True
        )
        return proc.returncode == 0


def write_resolution(patches: Path, line: str, patch_name: str, before: str, after: str) -> Path:
    """A patch's resolution for a line: the diff of its executor from stage k-1 to stage k."""
    scratch = patches.parent / f"scratch-res-{line}-{patch_name[:4]}"
    scratch.mkdir(parents=True)
    run("git", "init", "-q", "-b", "main", cwd=scratch)
    commit_file(scratch, REPO_PATH, before.encode(), "stage k-1", "2026-02-01T00:00:00+0000")
    (scratch / REPO_PATH).write_text(after)
    diff = run("git", "diff", "--full-index", "HEAD", "--", REPO_PATH, cwd=scratch)
    out = patches / "resolutions" / line / patch_name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(diff)
    return out
