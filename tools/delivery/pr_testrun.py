"""An Airflow tree's test files run with pytest, and how it went: the PRs' test runs.

``run_test_files`` runs them in a line's venv (``tools.engine.venvs``) with the tree's upstream
files installed; ``tools.delivery.pr`` shows the outcome in a PR's body and
``tools.delivery.upstream_prs`` checks a standalone PR's Regression-Tests with it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.shared import pins


@dataclass
class TestRun:
    ran: bool
    passed: bool
    command: str
    summary: str
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # node ids pytest reported FAILED or ERROR
    returncode: int | None = None


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run_test_files(
    tree: Path, files: Sequence[str], line: pins.Line = pins.PRIMARY, python: Path | None = None
) -> TestRun:
    """Run test files of an Airflow tree (repo layout) with pytest, and say how it went.

    Without ``python``: in the line's venv (``tools.engine.venvs``) with the tree's ``local_executor.py``
    and task-sdk's ``supervisor.py`` installed, no database. First as Airflow would (its conftest);
    if Airflow's test environment is not installed (collection fails), self-contained, with
    ``--confcutdir`` at the test files."""
    if not files:
        return TestRun(False, False, "", "the patch adds or changes no test files")
    notes = []
    env = None
    if python is None:
        try:
            from tools.engine import venvs  # the engine's venv helper: the line's pinned env

            python = Path(venvs.ensure(line))
            branch_files = [f for f in pins.UPSTREAM_FILES if (tree / f.repo_path).is_file()]
            venvs.install_sources(
                python, {f.package_path: (tree / f.repo_path).read_bytes() for f in branch_files}
            )
            notes.append(
                f"apache-airflow-core {line.version} and apache-airflow-task-sdk {line.sdk_version} "
                f"(the {line.name} line's venv) with this branch's "
                f"{' and '.join(f'`{f.name}`' for f in branch_files)}, no database"
            )
            env = venvs.test_env(tree / ".lepatch-airflow-home")
            env.pop("PYTHONPATH", None)  # the clone's tests, not this project's
        except ImportError:
            return TestRun(
                False, False, "", "no test environment: pass --python (tools.engine.venvs is missing)"
            )
        except Exception as exc:
            return TestRun(False, False, "", f"could not set up the {line.name} test environment: {exc}")
    command = [str(python), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *files]
    shown = "python -m pytest " + " ".join(files)
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode in (2, 3, 4):  # collection or conftest import failed: Airflow's test env is absent
        notes.append(
            f"with Airflow's conftest it cannot run here "
            f"({last_line(proc.stdout + proc.stderr)[:160]}); "
            "run self-contained instead (Airflow's own conftest and pytest settings left out)"
        )
        here = os.path.commonpath([str(Path(f).parent) for f in files])
        ini = tree / ".lepatch-pytest.ini"
        ini.write_text("[pytest]\n")
        extra = ["-c", str(ini), "--rootdir", str(tree), f"--confcutdir={here}"]
        command[5:5] = extra
        shown = f"python -m pytest --confcutdir={here} " + " ".join(files)
        proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        ini.unlink()
    summary = last_line(proc.stdout).strip("= ") or last_line(proc.stderr)
    if proc.returncode == 5:
        return TestRun(False, False, shown, f"no tests collected from {', '.join(files)}", notes)
    if proc.returncode in (2, 3, 4):
        return TestRun(False, False, shown, f"cannot run here: {summary[:200]}", notes)
    failed = [
        ln.split(" - ", 1)[0] for ln in proc.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))
    ]
    notes += [f"{ln.split(' ', 1)[0].lower()}: `{ln.split(' ', 1)[1]}`" for ln in failed[:10]]
    if len(failed) > 10:
        notes.append(f"... and {len(failed) - 10} more")
    ids = [ln.split(" ", 1)[1] for ln in failed]
    return TestRun(True, proc.returncode == 0, shown, summary, notes, ids, proc.returncode)
